// SPDX-License-Identifier: GPL-2.0

//! CQs as ibext uses them: the poll contexts and budgets, ibext's completion workqueues, the
//! waits that teardown relies on, and [`UlpCq`], the view of a CQ a ULP made and polls itself.
//! A CQ that ibext polls itself is `ib::polled_cq::PolledCq`.

use crate::{bindings, ib::Device, policy::engine};
use core::sync::atomic::{AtomicPtr, Ordering};
use kernel::{prelude::*, types::Opaque};

/// Completions polled per `ib_poll_cq` call (upstream `IB_POLL_BATCH`).
pub(crate) const POLL_BATCH: usize = engine::POLL_BATCH as usize;
/// Completions per pass in softirq context (upstream `IB_POLL_BUDGET_IRQ`).
pub(crate) const BUDGET_SOFTIRQ: u32 = 256;
/// Completions per pass in workqueue context (upstream `IB_POLL_BUDGET_WORKQUEUE`).
pub(crate) const BUDGET_WORKQUEUE: u32 = 65536;

/// The contexts a polled CQ can be polled in; `IB_POLL_DIRECT` cannot be pooled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PollCtx {
    /// `IB_POLL_SOFTIRQ`: irq_poll, budget 256.
    Softirq,
    /// `IB_POLL_WORKQUEUE`: ibext's bound workqueue, budget 65536.
    Workqueue,
    /// `IB_POLL_UNBOUND_WORKQUEUE`: ibext's unbound workqueue, budget 65536.
    UnboundWorkqueue,
}

impl PollCtx {
    /// Every pooled context, in the order of `enum ib_poll_context`.
    pub(crate) const ALL: [PollCtx; 3] = [
        PollCtx::Softirq,
        PollCtx::Workqueue,
        PollCtx::UnboundWorkqueue,
    ];

    /// Converts a C `enum ib_poll_context`; `IB_POLL_DIRECT` and unknown values are `EINVAL`.
    pub(crate) fn from_raw(ctx: bindings::ib_poll_context) -> Result<Self> {
        match ctx {
            bindings::ib_poll_context_IB_POLL_SOFTIRQ => Ok(PollCtx::Softirq),
            bindings::ib_poll_context_IB_POLL_WORKQUEUE => Ok(PollCtx::Workqueue),
            bindings::ib_poll_context_IB_POLL_UNBOUND_WORKQUEUE => Ok(PollCtx::UnboundWorkqueue),
            _ => Err(EINVAL),
        }
    }

    /// The C value.
    pub(crate) fn raw(self) -> bindings::ib_poll_context {
        match self {
            PollCtx::Softirq => bindings::ib_poll_context_IB_POLL_SOFTIRQ,
            PollCtx::Workqueue => bindings::ib_poll_context_IB_POLL_WORKQUEUE,
            PollCtx::UnboundWorkqueue => bindings::ib_poll_context_IB_POLL_UNBOUND_WORKQUEUE,
        }
    }

    /// The name shown in debugfs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PollCtx::Softirq => "softirq",
            PollCtx::Workqueue => "workqueue",
            PollCtx::UnboundWorkqueue => "unbound_workqueue",
        }
    }
}

/// The address of a CQ, as a handle: compared, stored and handed to C, never dereferenced
/// outside `rust/ib/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct CqPtr(core::ptr::NonNull<bindings::ib_cq>);

// SAFETY: An address; what it points to is reached only by `rust/ib/` code, under the rules
// of the object it belongs to.
unsafe impl Send for CqPtr {}
// SAFETY: As for `Send`.
unsafe impl Sync for CqPtr {}

impl CqPtr {
    /// Wraps an address (nothing is assumed of it); `None` for null.
    pub(crate) fn from_raw(cq: *mut bindings::ib_cq) -> Option<Self> {
        core::ptr::NonNull::new(cq).map(CqPtr)
    }

    /// Returns the address, for ib_core and C callers.
    pub(crate) fn as_raw(self) -> *mut bindings::ib_cq {
        self.0.as_ptr()
    }
}

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
pub(super) fn comp_queue(unbound: bool) -> *mut bindings::workqueue_struct {
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

/// A CQ that a ULP made itself (`ib_create_cq`) and polls itself, as ibext's DIM for legacy
/// ULPs (`legacy_dim.rs`) sees it.
///
/// # Invariants
///
/// For the lifetime of a `&UlpCq`, the CQ is alive, and the ULP's contract for `ibext_dim_*`
/// holds: it samples from one context at a time, and does not detach ibext's DIM while it
/// samples or reads the profile.
#[repr(transparent)]
pub(crate) struct UlpCq(Opaque<bindings::ib_cq>);

// SAFETY: A `&UlpCq` gives only reads of fields fixed at creation, and the DIM entry points,
// whose concurrency the type invariant describes.
unsafe impl Sync for UlpCq {}

impl UlpCq {
    /// Returns the view of `cq`.
    ///
    /// # Safety
    ///
    /// `cq` is a live CQ for `'a`, and the caller keeps the ULP's contract (type invariants).
    pub(crate) unsafe fn from_raw<'a>(cq: *mut bindings::ib_cq) -> &'a Self {
        // SAFETY: `UlpCq` is a transparent wrapper of `ib_cq`; the caller's guarantee.
        unsafe { &*cq.cast::<Self>() }
    }

    /// Returns the CQ, for ib_core calls.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_cq {
        self.0.get()
    }

    /// Returns the CQ's device.
    pub(crate) fn device(&self) -> &Device {
        // SAFETY: A live CQ's device is registered at least as long as the CQ exists (ib_core
        // destroys a device's CQs, through their owners, before it unregisters it).
        unsafe { Device::from_raw((*self.as_raw()).device) }
    }

    /// Whether the CQ is one of a pool's (ib_core's or ibext's), marked `shared`.
    pub(crate) fn is_pooled(&self) -> bool {
        // SAFETY: The CQ is alive (type invariant).
        unsafe { bindings::ibext_shim_cq_is_pooled(self.as_raw()) }
    }

    /// Whether ib_core polls the CQ itself (made by `ib_alloc_cq`, which gives it a `wc`).
    pub(crate) fn polled_by_core(&self) -> bool {
        // SAFETY: The CQ is alive (type invariant).
        unsafe { bindings::ibext_shim_cq_polled_by_core(self.as_raw()) }
    }

    /// The CQ's `dim` pointer, as an atomic.
    pub(super) fn dim_slot(&self) -> &core::sync::atomic::AtomicPtr<bindings::dim> {
        // SAFETY: `dim` is a pointer-sized, aligned field of the live CQ; ib_core touches it
        // only for CQs it made with DIM (`ib_alloc_cq` on `use_cq_dim` devices, which ibext
        // refuses to attach to), and ibext changes it only atomically.
        unsafe {
            core::sync::atomic::AtomicPtr::from_ptr(core::ptr::addr_of_mut!((*self.as_raw()).dim))
        }
    }
}
