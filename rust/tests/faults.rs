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

use super::guest::DeviceRef;
use crate::{
    api::PooledCq,
    bindings, client,
    cq_engine::PollCtx,
    kunit::{kassert, kassert_eq, kunit_suite, skip, Failed, TestResult},
    ledger::{self, Kind},
};
use kernel::{c_str, prelude::*};

/// Arms the n-th allocation of this task to fail; returns what was left of the last arming.
fn fail_nth(n: u32) -> u32 {
    // SAFETY: FFI call; only touches the current task.
    unsafe { bindings::ibext_test_set_fail_nth(n) }
}

/// Growth of an empty pool (one set: a CQ per vector, its engine, the set) under a sweep.
fn cq_pool_grow_sweep() -> TestResult {
    if !cfg!(CONFIG_FAILSLAB) {
        skip("needs the debug kernel (CONFIG_FAILSLAB)");
        return Ok(());
    }
    // rxe1: no test has made pooled CQs on it, so every attempt grows the pool.
    let dev = DeviceRef::get(c_str!("rxe1"));
    kassert!(dev.is_some(), "rxe1 is not registered");
    let dev = dev.ok_or(Failed)?;
    let state = client::device_state(dev.device()).ok_or(Failed)?;
    let ctx = PollCtx::Softirq;
    kassert_eq!(state.cq_pools().nr_cqs(ctx), 0);
    let cqs_live = ledger::counts(Kind::PooledCq).live();
    let sets_live = ledger::counts(Kind::CqSet).live();

    let mut injected = 0u32;
    let mut done = false;
    for n in 1..=500u32 {
        fail_nth(n);
        let r = PooledCq::get(dev.device(), 16, 0, ctx);
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
                    0,
                    "n={}: a CQ was left behind",
                    n
                );
                kassert_eq!(ledger::counts(Kind::PooledCq).live(), cqs_live, "n={}", n);
                kassert_eq!(ledger::counts(Kind::CqSet).live(), sets_live, "n={}", n);
                injected += 1;
            }
            Ok(cq) => {
                kassert!(
                    left > 0,
                    "n={}: succeeded although the fault was injected",
                    n
                );
                kassert_eq!(state.cq_pools().nr_cqs(ctx), state.comp_vectors() as usize);
                drop(cq);
                done = true;
                break;
            }
        }
    }
    kassert!(done, "the sweep never got past the last allocation");
    kassert!(injected > 0);
    pr_info!(
        "failslab sweep over CQ pool growth: {} faults injected and survived\n",
        injected
    );
    // The pool is usable after the sweep.
    let cq = PooledCq::get(dev.device(), 16, 1, ctx)?;
    kassert_eq!(state.cq_pools().used(cq.as_raw()), Some(16));
    Ok(())
}

kunit_suite!(ibext_faults, [cq_pool_grow_sweep]);
