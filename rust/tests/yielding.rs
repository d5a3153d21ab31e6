// SPDX-License-Identifier: GPL-2.0

//! `ibext_yield`: a pooled CQ in polling mode (the adaptive mode's, or DIM's "poll again at
//! once") must give the CPU back, as NAPI does, and must never keep the device's own completion
//! producer (rxe's `rxe_wq` workers, which post every completion) from running.
//!
//! Two cases. One forces polling mode on a softirq CQ under traffic and watches where each
//! repoll runs: a pass that asks to be polled again must let irq_poll end its run of the softirq
//! first (`tests::hooks::RepollWatch`), which holds whatever the guest's speed. The other
//! oversubscribes the guest (a busy thread per CPU, twice as many streaming QPs as CPUs, every
//! CQ forced into polling mode) in every poll context and asserts that every QP gets its work
//! done. The second did not fail before the fix in this guest (a producer that shares a CPU with
//! its poller starves it of completions, and polling mode ends): it guards the property, the
//! first forces the mechanism.

use crate::tests::fixtures::{
    guest::{distinct_cqs, required, softirq_cq, wait_for},
    stream::{now_ns, Stream},
};
use crate::{
    api::CqEntries,
    bindings,
    engine::{CqStat, PollCtx, PooledCq},
    kunit::{kassert, kassert_eq, kunit_suite, Failed, TestResult},
    policy::moderation::{Moderation, ADAPTIVE_POLL_PROFILE},
    tests::hooks::RepollWatch,
};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use kernel::{c_str, prelude::*, sync::Arc, workqueue};

/// Busy threads, one per online CPU, that spin (with `cond_resched()`, as a well-behaved
/// CPU-bound kernel thread does) until dropped: every CPU of the guest has a nice-0 task that
/// always wants it.
struct Busy {
    stop: Arc<AtomicBool>,
    running: Arc<AtomicU32>,
}

impl Busy {
    /// Starts `n` spinners and waits until all of them run.
    fn start(n: u32) -> core::result::Result<Busy, Failed> {
        let busy = Busy {
            stop: Arc::new(AtomicBool::new(false), GFP_KERNEL).map_err(|_| Failed)?,
            running: Arc::new(AtomicU32::new(0), GFP_KERNEL).map_err(|_| Failed)?,
        };
        for i in 0..n {
            let (stop, running) = (busy.stop.clone(), busy.running.clone());
            let r = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
                running.fetch_add(1, Ordering::AcqRel);
                while !stop.load(Ordering::Acquire) {
                    core::hint::spin_loop();
                    // SAFETY: FFI call in process context.
                    unsafe { bindings::ibext_shim_cond_resched() };
                }
                running.fetch_sub(1, Ordering::AcqRel);
            });
            kassert!(r.is_ok(), "cannot start busy thread {}", i);
        }
        kassert!(
            wait_for(60_000, || busy.running.load(Ordering::Acquire) == n),
            "the busy threads did not all start"
        );
        Ok(busy)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        wait_for(60_000, || self.running.load(Ordering::Acquire) == 0);
    }
}

/// Polling mode on a softirq CQ under streaming traffic: every pass that asks to be polled again
/// without re-arming stays on irq_poll's list as one that spent its budget, so the next pass runs
/// in a later run of `IRQ_POLL_SOFTIRQ` (after the softirq core's restarts, in `ksoftirqd`).
/// Polling mode is forced: before each round the CQ's DIM profile is set to the adaptive mode's
/// threshold, so the next pass that finds a completion enters it. Before the fix the pass left
/// the list and scheduled itself again, and irq_poll ran it in the same run, as long as it found
/// a completion and the jiffy lasted.
fn softirq_repoll_ends_the_run() -> TestResult {
    const DEPTH: usize = 16;
    const REPOLLS: u64 = 32;
    let dev = required(c_str!("rxe0"))?;
    let cq = softirq_cq(dev.device(), (3 * DEPTH) as u32, Moderation::Adaptive)?;
    let engine = cq.get().ok_or(Failed)?;
    let raw = engine.raw();
    let watch = RepollWatch::arm(raw.cast());
    let stream = Stream::start(dev.device(), &[raw], DEPTH, None, 0)?;
    let mut rounds = 0u32;
    while watch.counts().0 < REPOLLS && rounds < 1000 {
        let before = watch.counts().0;
        engine.test_force_profile(ADAPTIVE_POLL_PROFILE);
        wait_for(10_000, || watch.counts().0 > before);
        rounds += 1;
    }
    let (repolls, same_run) = watch.counts();
    drop(watch);
    kernel::kunit::info(format_args!(
        "    # {} repolls in {} rounds, {} in the run that asked for them\n",
        repolls, rounds, same_run
    ));
    let stream = stream.stop();
    kassert!(stream.is_ok(), "the stream did not drain");
    let run = stream.as_ref().map(|s| s.run()).map_err(|_| Failed)?;
    kassert_eq!(run.errors(), 0);
    kassert!(
        repolls >= REPOLLS,
        "only {} repolls in {} rounds",
        repolls,
        rounds
    );
    kassert_eq!(
        same_run,
        0,
        "{} of {} repolls ran in the softirq run of the pass that asked for them",
        same_run,
        repolls
    );
    kassert!(engine.snapshot().get(CqStat::ModeSwitches) >= 2);
    drop(stream);
    drop(cq);
    Ok(())
}

/// More busy QPs than CPUs, and a busy thread on every CPU: in every poll context, with every CQ
/// forced into the adaptive mode's polling mode at the start, every QP completes its sends and
/// polling mode was entered. A poller that kept the CPUs from rxe's producers would leave QPs
/// without progress. The bound is a hang bound: the run takes seconds.
fn adaptive_polling_with_more_busy_qps_than_cpus() -> TestResult {
    const DEPTH: usize = 16;
    const OPS: u64 = 2000;
    // SAFETY: FFI call without preconditions.
    let cpus = unsafe { bindings::ibext_shim_num_online_cpus() }.max(1);
    let qps = 2 * cpus as usize;
    let dev = required(c_str!("rxe0"))?;
    for ctx in PollCtx::ALL {
        let mut cqs = KVec::with_capacity(qps, GFP_KERNEL)?;
        for i in 0..qps {
            cqs.push(
                CqEntries::get(
                    dev.device(),
                    (3 * DEPTH) as u32,
                    i as i32,
                    ctx,
                    Moderation::Adaptive,
                )?,
                GFP_KERNEL,
            )?;
        }
        let distinct = distinct_cqs(cqs.iter().map(|c| c.as_raw()))?;
        let engines = || {
            distinct.iter().filter_map(|&cq| {
                // SAFETY: The CQs are pooled and held by `cqs` for the whole case.
                unsafe { PooledCq::of_cq(cq) }
            })
        };
        kassert_eq!(engines().count(), distinct.len());
        let switches = || -> u64 {
            engines()
                .map(|e| e.snapshot().get(CqStat::ModeSwitches))
                .sum()
        };
        let before = switches();
        let busy = Busy::start(cpus)?;
        for e in engines() {
            e.test_force_profile(ADAPTIVE_POLL_PROFILE);
        }
        let mut streams = KVec::with_capacity(qps, GFP_KERNEL)?;
        for c in cqs.iter() {
            streams.push(
                Stream::start(dev.device(), &[c.as_raw()], DEPTH, Some(OPS), 0)?,
                GFP_KERNEL,
            )?;
        }
        let start = now_ns();
        let all = wait_for(180_000, || {
            streams.iter().all(|s| s.run().sends_done() >= OPS)
        });
        let ms = (now_ns() - start) / 1_000_000;
        let stalled = streams
            .iter()
            .filter(|s| s.run().sends_done() < OPS)
            .count();
        let idle = streams.iter().filter(|s| s.run().sends_done() == 0).count();
        drop(busy);
        let entered = switches() - before;
        let mut errors = 0;
        for s in streams.into_iter() {
            match s.stop() {
                Ok(s) => errors += s.run().errors() + s.run().late(),
                Err(_) => errors += 1,
            }
        }
        kernel::kunit::info(format_args!(
            "    # {}: {} QPs on {} CQs, {} busy threads: {} sends each in {} ms; {} mode switches\n",
            ctx.name(),
            qps,
            distinct.len(),
            cpus,
            OPS,
            ms,
            entered
        ));
        kassert!(
            all,
            "{}: {} of {} QPs did not finish, {} made no progress",
            ctx.name(),
            stalled,
            qps,
            idle
        );
        kassert_eq!(errors, 0, "{}", ctx.name());
        kassert!(entered >= 2, "{}: polling mode never entered", ctx.name());
        drop(cqs);
    }
    Ok(())
}

kunit_suite!(
    ibext_yield,
    [
        softirq_repoll_ends_the_run,
        adaptive_polling_with_more_busy_qps_than_cpus
    ]
);
