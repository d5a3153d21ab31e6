// SPDX-License-Identifier: GPL-2.0

//! `ibext_races`: a polled CQ's softirq pass against its teardown and against a second pass of
//! the same CQ, each race forced at one point instead of hoped for.
//!
//! The pass is held in softirq (`tests::hooks`, `Point::PassTail`) right after it left
//! irq_poll's list (`irq_poll_complete`) and before it re-arms the CQ: from there on,
//! `irq_poll_disable()` no longer waits for it, and another CPU may schedule the CQ again. The
//! passes run on bound workers, with bottom halves disabled around the scheduling, so that a
//! held pass spins on another CPU than the test's (`guest::pass_on_worker`).

use crate::tests::fixtures::guest::{pass_on_worker, required, softirq_cq, wait_for, PassCpu};
use crate::{
    engine::{wait_for_handlers, CqStat},
    kunit::{kassert, kassert_eq, kunit_suite, Failed, TestResult},
    policy::moderation::Moderation,
    tests::hooks::{Parking, Point},
};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicU32, Ordering},
};
use kernel::{c_str, prelude::*, sync::Arc, workqueue};

/// Teardown of a softirq CQ while a pass is in its tail. The test takes teardown's first step
/// itself (the CQ marked dying, handlers waited for, as `destroy_cqs` does), then runs the pass
/// that an event before the mark scheduled and whose softirq ran only after that wait, and holds
/// it at its tail. The drop, on a worker, must not destroy the CQ under the held pass: it stops
/// the poller, then waits for the pass (`Point::PollerStopped` is where it starts waiting). The
/// test lets the pass go once the drop is waiting or has returned. Before the fix the drop
/// returned, the CQ and its memory freed, and the pass then re-armed the freed CQ (KASAN
/// use-after-free on the debug kernel).
fn teardown_waits_for_a_pass_tail() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let cq = softirq_cq(dev.device(), 64, Moderation::None)?;
    let engine = cq.get().ok_or(Failed)?;
    let raw: *const c_void = engine.raw().cast();
    cq.mark_dying();
    wait_for_handlers();
    let parking = Parking::arm(Point::PassTail, raw);
    let passed = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    pass_on_worker(engine, &passed, PassCpu::Other)?;
    kassert!(
        parking.wait_parked(60_000),
        "the pass never reached its tail"
    );
    let dropped = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let d = dropped.clone();
    let r = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
        drop(cq);
        d.store(1, Ordering::Release);
    });
    kassert!(r.is_ok(), "cannot start the dropper");
    let waiting = wait_for(60_000, || {
        Parking::was_reached(Point::PollerStopped) || dropped.load(Ordering::Acquire) == 1
    });
    kassert!(waiting, "the drop neither waited nor returned");
    kassert!(parking.release(), "the pass was held too long");
    kassert!(wait_for(60_000, || dropped.load(Ordering::Acquire) == 1));
    kassert!(wait_for(60_000, || passed.load(Ordering::Acquire) == 1));
    Ok(())
}

/// A second pass of one softirq CQ while the first is in its tail (it left irq_poll's list, so
/// an event on another CPU may schedule the CQ there). Everything the first pass writes as the
/// CQ's only poller (its counters, the moderation state) must be written before it leaves the
/// list: while it is held there, its pass is counted already, and the second pass runs to its
/// end beside it without sharing anything (on the debug kernel, the "one pass at a time"
/// assertion checks the same). Before the fix the first pass counted itself only at its very
/// end.
fn second_pass_beside_a_pass_tail() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let cq = softirq_cq(dev.device(), 64, Moderation::None)?;
    let engine = cq.get().ok_or(Failed)?;
    let passes = || engine.snapshot().get(CqStat::Passes);
    let parking = Parking::arm(Point::PassTail, engine.raw().cast());
    let first = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    pass_on_worker(engine, &first, PassCpu::Other)?;
    kassert!(
        parking.wait_parked(60_000),
        "the first pass never reached its tail"
    );
    kassert_eq!(passes(), 1, "the held pass has not counted itself");
    let second = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    pass_on_worker(engine, &second, PassCpu::Here)?;
    let ran = wait_for(60_000, || second.load(Ordering::Acquire) == 1);
    let beside = parking.parked();
    kassert!(parking.release(), "the first pass was held too long");
    kassert!(ran, "the second pass did not run");
    kassert!(beside, "the first pass was not held while the second ran");
    kassert_eq!(passes(), 2);
    kassert!(wait_for(60_000, || first.load(Ordering::Acquire) == 1));
    drop(cq);
    Ok(())
}

kunit_suite!(
    ibext_races,
    [
        teardown_waits_for_a_pass_tail,
        second_pass_beside_a_pass_tail
    ]
);
