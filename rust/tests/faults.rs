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
    let state = client::device_state(dev.device()).ok_or(Failed)?;
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
        let r = PooledCq::get(dev.device(), max_cqe, 0, ctx);
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
    let cq = PooledCq::get(dev.device(), 16, 1, ctx)?;
    kassert_eq!(state.cq_pools().used(cq.as_raw()), Some(16));
    Ok(())
}

kunit_suite!(ibext_faults, [cq_pool_grow_sweep]);
