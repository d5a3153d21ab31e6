// SPDX-License-Identifier: GPL-2.0

//! `ibext_faults`: allocation failures on the create and grow paths (debug kernel only).
//!
//! A fail-nth sweep: for n = 1, 2, ... the n-th slab allocation of the test's own task fails
//! (`current->fail_nth`, which failslab honours before any of its other settings), then the
//! path runs. Every allocation the path makes in this task is reached in turn: ibext's own,
//! ib_core's and rxe's. Each failure must come back as a clean errno with the pool exactly as
//! before; the sweep ends when n is past the last allocation and the path succeeds.
//!
//! On the normal test kernel (no `CONFIG_FAILSLAB`) the cases are skipped.

use crate::tests::fixtures::guest::cqp;
use crate::tests::fixtures::guest::{
    self, debugfs_exists, link_add_with_fail_nth, link_delete, restore_links, DeviceRef,
};
use crate::{
    api::CqEntries,
    bindings,
    capi::{ibext_cq_pool_get, ibext_srq_pool_create, ibext_srq_pool_destroy},
    engine::PollCtx,
    kunit::{bad_input_ok, kassert, kassert_eq, kunit_suite, skip, Failed, TestResult},
    ledger::{self, Kind},
    policy::moderation::Moderation,
};
use kernel::{c_str, fmt, prelude::*, str::CString};

/// Arms the n-th allocation of this task to fail; returns what was left of the last arming.
fn fail_nth(n: u32) -> u32 {
    // SAFETY: FFI call; only touches the current task.
    unsafe { bindings::ibext_test_set_fail_nth(n) }
}

/// Growth of a pool (one set: a CQ per vector, each with its engine, and the set) under a
/// sweep.
fn cq_pool_grow_sweep() -> TestResult {
    if !cfg!(CONFIG_FAILSLAB) {
        skip("needs the debug kernel (CONFIG_FAILSLAB)");
        return Ok(());
    }
    // rxe1: no test has made pooled CQs on it, so every attempt grows the pool.
    let dev = DeviceRef::get(c_str!("rxe1"));
    kassert!(dev.is_some(), "rxe1 is not registered");
    let dev = dev.ok_or(Failed)?;
    let state = crate::device::device_state(dev.device()).ok_or(Failed)?;
    let ctx = PollCtx::Softirq;
    kassert_eq!(state.cq_pools().nr_cqs(ctx), 0);
    let vectors = state.comp_vectors() as usize;
    // Requests of max_cqe entries never fit a CQ that holds any: every attempt grows the pool.
    let max_cqe = dev.device().attrs().max_cqe as u32;

    let mut injected = 0u32;
    let mut absorbed = 0u32;
    // A success in spite of the fault (a fallback absorbed it, such as kvmalloc's vmalloc) is
    // kept until the end, so that its CQ on vector 0 stays full and the next attempt grows the
    // pool again.
    let mut held = KVec::new();
    let mut done = false;
    for n in 1..=500u32 {
        let nr_cqs = state.cq_pools().nr_cqs(ctx);
        let (cqs_live, sets_live) = (
            ledger::counts(Kind::PooledCq).live(),
            ledger::counts(Kind::CqSet).live(),
        );
        fail_nth(n);
        let r = CqEntries::get(dev.device(), max_cqe, 0, ctx, Moderation::Dim);
        let left = fail_nth(0);
        match r {
            Err(e) => {
                kassert_eq!(
                    left,
                    0,
                    "n={}: failed ({:?}) without the injected fault",
                    n,
                    e
                );
                kassert!(e == ENOMEM, "n={}: {:?} instead of ENOMEM", n, e);
                kassert_eq!(
                    state.cq_pools().nr_cqs(ctx),
                    nr_cqs,
                    "n={}: a CQ was left",
                    n
                );
                kassert_eq!(ledger::counts(Kind::PooledCq).live(), cqs_live, "n={}", n);
                kassert_eq!(ledger::counts(Kind::CqSet).live(), sets_live, "n={}", n);
                injected += 1;
            }
            Ok(cq) => {
                kassert_eq!(state.cq_pools().nr_cqs(ctx), nr_cqs + vectors, "n={}", n);
                if left == 0 {
                    absorbed += 1;
                    held.push(cq, GFP_KERNEL)?;
                    continue;
                }
                done = true;
                break;
            }
        }
    }
    drop(held);
    kassert!(done, "the sweep never got past the last allocation");
    kassert!(injected > 0);
    pr_info!(
        "failslab sweep over CQ pool growth: {} faults failed cleanly, {} absorbed by fallbacks\n",
        injected,
        absorbed
    );
    // The pool is usable after the sweep.
    let cq = CqEntries::get(dev.device(), 16, 1, ctx, Moderation::Dim)?;
    kassert_eq!(
        cqp(cq.as_raw()).and_then(|c| state.cq_pools().used(c)),
        Some(16)
    );
    Ok(())
}

/// Points failslab's stacktrace filter at `[start, end)`: only allocations with a caller in
/// that range are counted by fail-nth.
fn failslab_filter(start: u64, end: u64) -> Result {
    let cmd = CString::try_from_fmt(fmt!(
        "echo {} > /sys/kernel/debug/failslab/require-start && echo {} > /sys/kernel/debug/failslab/require-end",
        start,
        end
    ))?;
    let rc = guest::run(&[c_str!("/bin/sh"), c_str!("-c"), &cmd])?;
    if rc != 0 {
        return Err(EIO);
    }
    Ok(())
}

/// ibext's client `add` under a sweep, through the real path: `rdma link add rxe1` with its
/// n-th allocation made inside ibext failing. A failed `add` must leave nothing behind, and
/// the APIs must then answer `-ENODEV` for the device (row `cq_get.not_attached`).
fn client_add_sweep() -> TestResult {
    if !cfg!(CONFIG_FAILSLAB) {
        skip("needs the debug kernel (CONFIG_FAILSLAB)");
        return Ok(());
    }
    let (mut start, mut end) = (0usize, 0usize);
    // SAFETY: Both pointers are valid for writes.
    unsafe { bindings::ibext_test_text_range(&mut start, &mut end) };
    failslab_filter(start as u64, end as u64)?;
    let r = client_add_sweep_checks();
    let reset = failslab_filter(0, u64::MAX);
    // Leave rxe1 attached for the suites after this one.
    let attached = DeviceRef::get(c_str!("rxe1"))
        .is_some_and(|d| crate::device::device_state(d.device()).is_some());
    if !attached {
        let _ = link_delete(c_str!("rxe1"));
    }
    restore_links();
    r?;
    kassert!(reset.is_ok(), "cannot reset the failslab filter");
    Ok(())
}

fn client_add_sweep_checks() -> TestResult {
    let rxe1 = c_str!("rxe1");
    let (mut failed, mut absorbed, mut done) = (0u32, 0u32, false);
    for n in 1..=200u32 {
        kassert_eq!(link_delete(rxe1)?, 0);
        let live = ledger::counts(Kind::DeviceState).live();
        // Only ibext's allocations are counted, so rxe itself always succeeds.
        kassert_eq!(link_add_with_fail_nth(rxe1, n)?, 0, "n={}", n);
        let dev = DeviceRef::get(rxe1);
        kassert!(dev.is_some(), "n={}: rxe1 is not registered", n);
        let dev = dev.ok_or(Failed)?;
        match crate::device::device_state(dev.device()) {
            None => {
                // `add` failed: nothing of it is left, and the device is not ibext's.
                kassert_eq!(ledger::counts(Kind::DeviceState).live(), live, "n={}", n);
                kassert!(!debugfs_exists(&[rxe1]), "n={}: debugfs left behind", n);
                // SAFETY: rxe1 is held.
                let cq = unsafe {
                    ibext_cq_pool_get(
                        dev.device().as_raw(),
                        16,
                        0,
                        bindings::ib_poll_context_IB_POLL_SOFTIRQ,
                    )
                };
                kassert_eq!(cq as isize, ENODEV.to_errno() as isize, "n={}", n);
                failed += 1;
            }
            Some(_) if !debugfs_exists(&[rxe1, c_str!("cq_pools")]) => {
                // A debugfs failure: not an error for ibext, the device is still served.
                kassert_eq!(
                    ledger::counts(Kind::DeviceState).live(),
                    live + 1,
                    "n={}",
                    n
                );
                absorbed += 1;
            }
            Some(_) => {
                done = true;
                break;
            }
        }
    }
    kassert!(done, "the sweep never got past the last allocation");
    kassert!(failed > 0, "no allocation of ibext's add failed it");
    bad_input_ok("cq_get.not_attached");
    pr_info!(
        "failslab sweep over the client add: {} faults failed the add cleanly, {} absorbed (debugfs)\n",
        failed,
        absorbed
    );
    Ok(())
}

/// The pool's `recv_done` for the sweep: no receive ever completes.
///
/// # Safety
///
/// Never called: nothing is sent.
unsafe extern "C" fn no_recv(
    _srq: *mut bindings::ib_srq,
    _wc: *mut bindings::ib_wc,
    _buf: *mut core::ffi::c_void,
    _ctx: *mut core::ffi::c_void,
) -> bindings::ibext_recv_action {
    bindings::ibext_recv_action_IBEXT_RECV_REPOST
}

/// Making an SRQ pool with managed buffers (2 SRQs of 8) under a sweep: every allocation on the
/// path, ibext's, ib_core's and rxe's, fails in turn; each must come back as -ENOMEM with no
/// pool left, and the PD is deallocated cleanly at the end (no SRQ left on it).
fn srq_pool_create_sweep() -> TestResult {
    if !cfg!(CONFIG_FAILSLAB) {
        skip("needs the debug kernel (CONFIG_FAILSLAB)");
        return Ok(());
    }
    let dev = DeviceRef::get(c_str!("rxe0"));
    kassert!(dev.is_some(), "rxe0 is not registered");
    let dev = dev.ok_or(Failed)?;
    // SAFETY: `dev` is registered and held.
    let pd = unsafe { bindings::ibext_test_alloc_pd(dev.device().as_raw()) };
    let pd = kernel::error::from_err_ptr(pd)?;
    let attr = bindings::ibext_srq_pool_attr {
        nr_srqs: 2,
        srq_size: 8,
        max_sge: 1,
        buf_size: 64,
        recv_done: Some(no_recv),
        ctx: core::ptr::null_mut(),
        max_srq_size: 0,
        pressure: None,
    };
    let res = (|| -> TestResult {
        let (mut failed, mut absorbed, mut done) = (0u32, 0u32, false);
        for n in 1..=2000u32 {
            let live = ledger::counts(Kind::SrqPool).live();
            fail_nth(n);
            // SAFETY: `pd` is live until after the sweep; `attr` is valid.
            let p = unsafe { ibext_srq_pool_create(pd, &attr) };
            let left = fail_nth(0);
            match kernel::error::from_err_ptr(p) {
                Err(e) => {
                    kassert_eq!(left, 0, "n={}: failed ({:?}) without the fault", n, e);
                    kassert!(e == ENOMEM, "n={}: {:?} instead of ENOMEM", n, e);
                    kassert_eq!(ledger::counts(Kind::SrqPool).live(), live, "n={}", n);
                    failed += 1;
                }
                Ok(p) => {
                    // SAFETY: A live pool without references.
                    let r = unsafe { ibext_srq_pool_destroy(p) };
                    kassert_eq!(r, 0);
                    if left == 0 {
                        absorbed += 1;
                        continue;
                    }
                    done = true;
                    break;
                }
            }
        }
        kassert!(done, "the sweep never got past the last allocation");
        kassert!(failed > 0);
        pr_info!(
            "failslab sweep over SRQ pool create: {} faults failed cleanly, {} absorbed by fallbacks\n",
            failed,
            absorbed
        );
        Ok(())
    })();
    // SAFETY: Ours; every pool made on it was destroyed (ib_core warns otherwise).
    unsafe { bindings::ibext_test_dealloc_pd(pd) };
    res
}

kunit_suite!(
    ibext_faults,
    [cq_pool_grow_sweep, client_add_sweep, srq_pool_create_sweep]
);
