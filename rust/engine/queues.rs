// SPDX-License-Identifier: GPL-2.0

//! The completion engine's budgets, its workqueues, and the waits that teardown relies on.

use crate::bindings;
use core::sync::atomic::{AtomicPtr, Ordering};
use kernel::prelude::*;

/// Completions polled per `ib_poll_cq` call (upstream `IB_POLL_BATCH`).
pub(crate) const POLL_BATCH: usize = crate::policy::engine::POLL_BATCH as usize;
/// Completions per pass in softirq context (upstream `IB_POLL_BUDGET_IRQ`).
pub(crate) const BUDGET_SOFTIRQ: u32 = 256;
/// Completions per pass in workqueue context (upstream `IB_POLL_BUDGET_WORKQUEUE`).
pub(crate) const BUDGET_WORKQUEUE: u32 = 65536;

/// ibext's completion workqueues, bound and unbound; published while a [`CompQueues`] lives.
static COMP_WQ: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(core::ptr::null_mut());
static COMP_UNBOUND_WQ: AtomicPtr<bindings::workqueue_struct> =
    AtomicPtr::new(core::ptr::null_mut());

/// Owns ibext's completion workqueues (`ibext_comp`, `ibext_comp_unbound`, with ib_core's
/// `ib_comp_wq` flags).
///
/// # Invariants
///
/// While a `CompQueues` lives, `COMP_WQ` and `COMP_UNBOUND_WQ` hold the queues it allocated.
pub(crate) struct CompQueues(());

impl CompQueues {
    /// Allocates and publishes both workqueues.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: FFI call without preconditions.
        let bound = unsafe { bindings::ibext_shim_alloc_comp_wq(false) };
        if bound.is_null() {
            return Err(ENOMEM);
        }
        // SAFETY: FFI call without preconditions.
        let unbound = unsafe { bindings::ibext_shim_alloc_comp_wq(true) };
        if unbound.is_null() {
            // SAFETY: `bound` was allocated above and nothing has used it.
            unsafe { bindings::destroy_workqueue(bound) };
            return Err(ENOMEM);
        }
        COMP_WQ.store(bound, Ordering::Release);
        COMP_UNBOUND_WQ.store(unbound, Ordering::Release);
        // INVARIANT: both are published.
        Ok(CompQueues(()))
    }

    /// Keeps the queues forever: polled CQs that were leaked may still queue work on them.
    pub(crate) fn leak(self) {
        core::mem::forget(self);
    }
}

/// Returns ibext's bound or unbound completion workqueue; null while no [`CompQueues`] lives.
pub(crate) fn comp_queue(unbound: bool) -> *mut bindings::workqueue_struct {
    if unbound { &COMP_UNBOUND_WQ } else { &COMP_WQ }.load(Ordering::Acquire)
}

impl Drop for CompQueues {
    fn drop(&mut self) {
        for wq in [&COMP_WQ, &COMP_UNBOUND_WQ] {
            let q = wq.swap(core::ptr::null_mut(), Ordering::AcqRel);
            if !q.is_null() {
                // SAFETY: `q` was allocated by `new`. Every polled CQ that queued work on it was
                // destroyed, its work cancelled, before its owner lets the queues go (the
                // module drops its `CompQueues` after unregistering the client, or leaks them).
                unsafe { bindings::destroy_workqueue(q) };
            }
        }
    }
}

/// Waits until every `wr_cqe->done` that any polled CQ's pass is running, in any poll context,
/// has returned. Completions polled after this returns are dispatched afresh.
pub(crate) fn wait_for_dispatch() {
    // SAFETY: FFI call; callers are in process context.
    unsafe { bindings::ibext_shim_handlers_wait() };
}

/// Waits until every completion handler that may have missed a `dying` mark has returned.
pub(crate) fn wait_for_handlers() {
    // SAFETY: FFI call; we may sleep here (teardown is process context).
    unsafe { bindings::synchronize_rcu() };
}
