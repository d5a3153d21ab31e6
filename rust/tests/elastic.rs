// SPDX-License-Identifier: GPL-2.0

//! `ibext_elastic`: pools that follow the machine, on rxe0 with real loopback traffic. Idle
//! pooled CQs age out down to one per vector; the vector count follows CPUs going offline and
//! coming back (written to `/sys/devices/system/cpu/cpuN/online`, as an administrator would).
//!
//! Aging is forced, not waited for: a pass is run with a time one period ahead
//! ([`CqPools::age`]), so no case depends on how fast the guest runs.
//!
//! [`CqPools::age`]: crate::cq_pool::CqPools::age

use crate::tests::fixtures::{
    guest::{msleep, required, run, short_sleep, XorShift},
    srq::Pd,
    traffic::Loopback,
};
use crate::tests::hooks::HoldPasses;
use crate::{
    api::CqEntries,
    backport::workqueue::now_ms,
    device::DeviceState,
    engine::{PollCtx, PooledCq},
    ib::verbs::Pd as PdView,
    kunit::{kassert, kassert_eq, kunit_suite, Failed, TestResult},
    ledger::{self, Kind},
    policy::{cq_pool::AGE_MS, moderation::Moderation},
    srq_pool::{CreateArgs, OwnedSrqPool},
    tests::hooks::a_period_later,
    tunables,
};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use kernel::{
    c_str, fmt,
    prelude::*,
    str::{CStr, CString},
    sync::Arc,
    workqueue,
};

/// rxe0's state.
fn rxe0_state(
    dev: &crate::tests::fixtures::guest::DeviceRef,
) -> core::result::Result<Arc<DeviceState>, Failed> {
    let state = crate::device::device_state(dev.device());
    kassert!(state.is_some(), "no ibext state for rxe0");
    state.ok_or(Failed)
}

/// Ages every pool as if a whole period had passed since now.
fn age_all(state: &DeviceState) -> usize {
    state.cq_pools().age(now_ms() + AGE_MS).0
}

/// 64 QPs' worth of CQ entries taken and put back in each poll context: the last put queues the
/// aging work; a pass at the real time destroys nothing (nothing is old enough), a pass a
/// period later leaves exactly one CQ per vector in each pool, and gets find room there without
/// growing.
fn burst_then_aging_leaves_the_floor() -> TestResult {
    const QPS: usize = 64;
    // 64 x 2 x 1024 entries over the vectors: several CQs of rxe's 8191 per vector.
    const NR: u32 = 1024;
    let dev = required(c_str!("rxe0"))?;
    let state = rxe0_state(&dev)?;
    let pools = state.cq_pools();
    let vectors = state.comp_vectors();
    for ctx in PollCtx::ALL {
        let mut held = KVec::new();
        for _ in 0..2 * QPS {
            held.push(
                CqEntries::get(dev.device(), NR, -1, ctx, Moderation::None)?,
                GFP_KERNEL,
            )?;
        }
        let burst = (0..vectors).map(|v| pools.live_on(ctx, Moderation::None, v));
        kassert!(
            burst.clone().all(|n| n >= 2),
            "{}: the burst should need several CQs per vector",
            ctx.name()
        );
        drop(held);
        kassert!(pools.aging_pending(), "{}: no aging queued", ctx.name());
        kassert_eq!(pools.age(now_ms()).0, 0, "{}: aged too early", ctx.name());
        let aged_before = pools.aged();
        let destroyed = age_all(&state);
        kassert!(destroyed > 0);
        kassert_eq!(pools.aged(), aged_before + destroyed as u64);
        for v in 0..vectors {
            kassert_eq!(
                pools.live_on(ctx, Moderation::None, v),
                1,
                "{} vector {}",
                ctx.name(),
                v
            );
        }
        // The floor serves the common get without growing, and a second pass keeps it.
        let cqs = pools.nr_cqs(ctx);
        let mut again = KVec::new();
        for hint in 0..vectors as i32 {
            again.push(
                CqEntries::get(dev.device(), NR, hint, ctx, Moderation::None)?,
                GFP_KERNEL,
            )?;
        }
        kassert_eq!(pools.nr_cqs(ctx), cqs, "{}: grew after aging", ctx.name());
        drop(again);
        age_all(&state);
        kassert_eq!(
            pools.nr_cqs(ctx),
            cqs,
            "{}: aged below the floor",
            ctx.name()
        );
    }
    Ok(())
}

/// Writes `val` to `ibext.age_ms` through the parameter's own setter; its return.
fn set_age_ms(val: &CStr) -> i32 {
    // SAFETY: `val` is a NUL-terminated string that outlives the call; the setter only reads it.
    unsafe { crate::bindings::ibext_test_set_age_ms(val.as_char_ptr()) }
}

/// `ibext.age_ms` refuses what is not 1 s to 1 h and keeps its value. Set to 2 s, a pass ages
/// out the idle CQs of a burst 2 s after they went idle and not 1 ms before, and says the next
/// pass is due within 2 s. Passes are called with chosen times (the aging work is held), so
/// nothing depends on the guest's speed.
fn aging_follows_ibext_age_ms() -> TestResult {
    for bad in [c_str!("999"), c_str!("3600001"), c_str!("0"), c_str!("two")] {
        kassert_eq!(set_age_ms(bad), EINVAL.to_errno(), "{:?} taken", bad);
        kassert_eq!(tunables::age_ms(), AGE_MS, "{:?} changed the period", bad);
    }
    kassert_eq!(set_age_ms(c_str!("2000")), 0);
    let res = (|| -> TestResult {
        const NR: u32 = 1024;
        let dev = required(c_str!("rxe0"))?;
        let state = rxe0_state(&dev)?;
        let pools = state.cq_pools();
        let ctx = PollCtx::Workqueue;
        // Idle CQs left by other cases go first, so that only the burst's can age below.
        age_all(&state);
        let mut held = KVec::new();
        for _ in 0..128 {
            held.push(
                CqEntries::get(dev.device(), NR, -1, ctx, Moderation::None)?,
                GFP_KERNEL,
            )?;
        }
        kassert!(
            (0..state.comp_vectors()).all(|v| pools.live_on(ctx, Moderation::None, v) >= 2),
            "the burst should need several CQs per vector"
        );
        let before = now_ms();
        drop(held);
        let after = now_ms();
        let (n, next) = pools.age(before + 1999);
        kassert_eq!(n, 0, "aged before 2 s");
        kassert!(
            next.is_some_and(|d| d <= 2000),
            "next pass due in {:?}",
            next
        );
        kassert!(pools.age(after + 2000).0 > 0, "nothing aged after 2 s");
        Ok(())
    })();
    kassert_eq!(set_age_ms(c_str!("60000")), 0);
    kassert_eq!(tunables::age_ms(), AGE_MS);
    res
}

/// The aging work itself (not a pass called by the test): queued by the last put, run with its
/// clock a period ahead (`AGING_SHIFT_MS`), it shrinks a burst to the floor and counts what it
/// destroyed.
fn the_aging_work_shrinks_the_pool() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let state = rxe0_state(&dev)?;
    let pools = state.cq_pools();
    let vectors = state.comp_vectors();
    let mut held = KVec::new();
    for _ in 0..4 * vectors {
        held.push(
            CqEntries::get(
                dev.device(),
                6000,
                -1,
                PollCtx::UnboundWorkqueue,
                Moderation::Dim,
            )?,
            GFP_KERNEL,
        )?;
    }
    drop(held);
    kassert!(pools.aging_pending());
    let aged = pools.aged();
    a_period_later(|| pools.test_run_aging());
    kassert!(pools.aged() >= aged + 3 * u64::from(vectors));
    for v in 0..vectors {
        kassert_eq!(
            pools.live_on(PollCtx::UnboundWorkqueue, Moderation::Dim, v),
            1
        );
    }
    Ok(())
}

/// A busy CQ is never aged, whatever its age: traffic on it stays exactly once across passes.
fn busy_cqs_survive_aging() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let state = rxe0_state(&dev)?;
    let mut cqs = KVec::new();
    let mut raw = KVec::new();
    for i in 0..4 {
        // Large requests: each pair needs CQs of its own beyond each vector's floor.
        let s = CqEntries::get(dev.device(), 6000, i, PollCtx::Softirq, Moderation::None)?;
        let r = CqEntries::get(dev.device(), 6000, i, PollCtx::Softirq, Moderation::None)?;
        raw.push((s.as_raw(), r.as_raw()), GFP_KERNEL)?;
        cqs.push((s, r), GFP_KERNEL)?;
    }
    let mut lb = Loopback::new(dev.device(), 8, &raw)?;
    for round in 0..6u32 {
        age_all(&state);
        let res = lb.round(round, round % 2 == 1, 20_000);
        kassert!(res.is_ok(), "round {}: {:?}", round, res);
    }
    kassert_eq!(lb.completions(), 6 * 2 * 4 * 8);
    // Each request of 6000 fills a CQ of rxe's 8191 entries alone.
    for (s, r) in cqs.iter() {
        kassert_eq!(state.cq_pools().used(s.cq()), Some(6000));
        kassert_eq!(state.cq_pools().used(r.cq()), Some(6000));
    }
    drop(lb);
    Ok(())
}

/// Four workers get and put (sizes that make the pools grow) while a fifth runs aging passes
/// a period ahead, and loopback traffic runs on CQs held throughout, until the pools have both
/// grown and been aged [`RACE_EVENTS`] times during the race. Every get returns a CQ that is in
/// its pool with the entries taken (never one taken out to be destroyed), traffic is exactly
/// once, and every entry comes back.
fn aging_races_gets() -> TestResult {
    const WORKERS: u32 = 4;
    /// Growths and CQs aged out, each, that the race must see before it stops.
    const RACE_EVENTS: usize = 40;
    let dev = required(c_str!("rxe0"))?;
    let state = rxe0_state(&dev)?;
    let a = CqEntries::get(dev.device(), 64, 0, PollCtx::Softirq, Moderation::None)?;
    let b = CqEntries::get(dev.device(), 64, 1, PollCtx::Workqueue, Moderation::None)?;
    let mut lb = Loopback::new(dev.device(), 16, &[(a.as_raw(), b.as_raw())])?;
    let done = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let errors = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let stop = Arc::new(AtomicBool::new(false), GFP_KERNEL)?;
    let passes = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    {
        let (state, stop, passes, done) =
            (state.clone(), stop.clone(), passes.clone(), done.clone());
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            while !stop.load(Ordering::Acquire) {
                age_all(&state);
                passes.fetch_add(1, Ordering::AcqRel);
                short_sleep();
            }
            done.fetch_add(1, Ordering::AcqRel);
        });
        kassert!(res.is_ok(), "cannot start the ager");
    }
    for w in 0..WORKERS {
        let (state, done, errors, stop) =
            (state.clone(), done.clone(), errors.clone(), stop.clone());
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            let mut rng = XorShift::new(0x85eb_ca6bu32.wrapping_mul(w + 1));
            let mut rnd = move || rng.next();
            let mut held: [Option<CqEntries>; 6] = core::array::from_fn(|_| None);
            while !stop.load(Ordering::Acquire) {
                // The kernel does not preempt (PREEMPT_NONE): a worker that never sleeps would
                // starve RCU's grace-period kthread, which every aging pass waits for.
                short_sleep();
                let k = (rnd() % 6) as usize;
                if held[k].is_some() {
                    // Put back.
                    held[k] = None;
                    continue;
                }
                let ctx = PollCtx::ALL[(rnd() % 3) as usize];
                let nr = 1 + rnd() % 3000;
                let hint = (rnd() % 5) as i32 - 1;
                match CqEntries::get(state.device(), nr, hint, ctx, Moderation::None) {
                    Ok(cq) => {
                        // Still in the pool, with at least our entries: not aged out.
                        if !state.cq_pools().used(cq.cq()).is_some_and(|u| u >= nr) {
                            errors.fetch_add(1, Ordering::AcqRel);
                        }
                        held[k] = Some(cq);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
            drop(held);
            done.fetch_add(1, Ordering::AcqRel);
        });
        kassert!(res.is_ok(), "cannot start worker {}", w);
    }
    let (grown0, aged0) = (ledger::counts(Kind::CqSet).made, state.cq_pools().aged());
    let raced = || {
        ledger::counts(Kind::CqSet).made - grown0 >= RACE_EVENTS
            && state.cq_pools().aged() - aged0 >= RACE_EVENTS as u64
    };
    let mut round = 0u32;
    let mut failed = None;
    let start = now_ms();
    while !raced() && now_ms() - start < 300_000 {
        if let Err(e) = lb.round(round, round % 2 == 1, 20_000) {
            failed = Some(e);
            break;
        }
        round += 1;
    }
    stop.store(true, Ordering::Release);
    let (grown, aged) = (
        ledger::counts(Kind::CqSet).made - grown0,
        state.cq_pools().aged() - aged0,
    );
    let all_done = crate::tests::fixtures::guest::wait_for(120_000, || {
        done.load(Ordering::Acquire) == WORKERS + 1
    });
    kassert!(all_done, "workers or ager did not finish");
    kassert!(failed.is_none(), "round {}: {:?}", round, failed);
    kassert_eq!(errors.load(Ordering::Acquire), 0);
    kassert!(
        failed.is_some() || (grown >= RACE_EVENTS && aged >= RACE_EVENTS as u64),
        "the race saw {} growths and {} CQs aged out in {} rounds",
        grown,
        aged,
        round
    );
    kassert!(passes.load(Ordering::Acquire) > 0);
    kassert_eq!(lb.completions(), u64::from(round) * 2 * 16);
    drop(lb);
    drop((a, b));
    kassert_eq!(state.cq_pools().total_used(), 0);
    // What the race left idle goes in one more pass, down to the floor.
    age_all(&state);
    for ctx in PollCtx::ALL {
        for v in 0..state.comp_vectors() {
            kassert!(state.cq_pools().live_on(ctx, Moderation::None, v) <= 1);
        }
    }
    Ok(())
}

/// Writes `online` (0 or 1) to `/sys/devices/system/cpu/cpu<cpu>/online`.
fn set_cpu_online(cpu: u32, online: u32) -> Result<i32> {
    let cmd = CString::try_from_fmt(fmt!(
        "echo {} > /sys/devices/system/cpu/cpu{}/online",
        online,
        cpu
    ))?;
    run(&[c_str!("/bin/sh"), c_str!("-c"), &cmd])
}

/// Returns the vectors of `n` round-robin gets (hint -1) in `ctx`, holding them in `held`.
fn rr_vectors(
    dev: &crate::tests::fixtures::guest::DeviceRef,
    ctx: PollCtx,
    n: u32,
    held: &mut KVec<CqEntries>,
) -> Result<KVec<u32>> {
    let mut out = KVec::new();
    for _ in 0..n {
        let cq = CqEntries::get(dev.device(), 4, -1, ctx, Moderation::None)?;
        // SAFETY: The CQ is alive while `cq` holds entries on it.
        out.push(unsafe { (*cq.as_raw()).comp_vector }, GFP_KERNEL)?;
        held.push(cq, GFP_KERNEL)?;
    }
    Ok(out)
}

/// The last CPU goes offline while completions are held in CQs on its vector, then comes back.
/// Offline: the usable vectors drop by one for CQ and SRQ pools alike, round-robin and hints
/// stay below the count, the held completions and a further round on the old CQs arrive
/// exactly once. Online again: the count and the round-robin cover every vector.
fn vectors_follow_cpu_hotplug() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let state = rxe0_state(&dev)?;
    let n = state.comp_vectors();
    kassert!(
        n >= 2,
        "the guest needs two CPUs (rxe has one vector per CPU)"
    );
    if n < 2 {
        return Ok(());
    }
    let last = n - 1;
    let r = hotplug_checks(&dev, &state, last);
    // Whatever happened, the CPU comes back for the suites after this one.
    let back = set_cpu_online(last, 1);
    kassert!(
        crate::tests::fixtures::guest::wait_for(10_000, || state.comp_vectors() == n),
        "cpu{} did not come back: {:?}",
        last,
        back
    );
    r
}

fn hotplug_checks(
    dev: &crate::tests::fixtures::guest::DeviceRef,
    state: &DeviceState,
    last: u32,
) -> TestResult {
    let n = last + 1;
    let mut raw = KVec::new();
    let mut cqs = KVec::new();
    for ctx in PollCtx::ALL {
        let s = CqEntries::get(dev.device(), 32, last as i32, ctx, Moderation::None)?;
        let r = CqEntries::get(dev.device(), 32, last as i32, ctx, Moderation::None)?;
        raw.push((s.as_raw(), r.as_raw()), GFP_KERNEL)?;
        cqs.push((s, r), GFP_KERNEL)?;
    }
    let mut lb = Loopback::new(dev.device(), 8, &raw)?;
    kassert!(lb.round(0, false, 20_000).is_ok());
    let engines = || {
        raw.iter().flat_map(|&(s, r)| [s, r]).filter_map(|cq| {
            // SAFETY: Pooled CQs, alive while `cqs` holds entries on them.
            unsafe { PooledCq::of_cq(cq) }
        })
    };
    // Completions of round 1 wait in the CQs (no pass may run) while the CPU goes offline.
    for e in engines() {
        e.test_hold();
    }
    let mut offlined = None;
    let res = lb.round_polled(1, true, 60_000, &mut || {
        if offlined.is_none() {
            offlined = Some(set_cpu_online(last, 0));
            for e in engines() {
                e.test_release();
            }
        }
        msleep(1);
    });
    kassert!(
        offlined.is_some(),
        "round 1 completed before the CPU went offline"
    );
    kassert_eq!(
        offlined.and_then(|r| r.ok()),
        Some(0),
        "offlining cpu{} failed",
        last
    );
    kassert!(res.is_ok(), "round 1 across the offlining: {:?}", res);
    kassert_eq!(state.comp_vectors(), n - 1);
    kassert_eq!(state.device().usable_comp_vectors(), n - 1);
    // Old CQs on the vector beyond the count keep working.
    let res = lb.round(2, false, 20_000);
    kassert!(res.is_ok(), "round 2 with cpu{} offline: {:?}", last, res);
    kassert_eq!(lb.completions(), 3 * 2 * 8 * 3);

    // New gets stay below the count: hints wrap, round-robin cycles over n - 1 vectors.
    let mut held = KVec::new();
    let cq = CqEntries::get(
        dev.device(),
        4,
        last as i32,
        PollCtx::Softirq,
        Moderation::None,
    )?;
    // SAFETY: Alive while `cq` holds entries on it.
    let v = unsafe { (*cq.as_raw()).comp_vector };
    kassert_eq!(Some(v), last.checked_rem(n - 1));
    held.push(cq, GFP_KERNEL)?;
    let vs = rr_vectors(dev, PollCtx::Softirq, 2 * (n - 1), &mut held)?;
    kassert!(
        vs.iter().all(|&v| v < n - 1),
        "round-robin gave {:?}",
        &vs[..]
    );
    for w in vs.windows(2) {
        kassert_eq!(
            Some(w[1]),
            (w[0] + 1).checked_rem(n - 1),
            "round-robin order {:?}",
            &vs[..]
        );
    }
    // An SRQ pool made now has one SRQ per usable vector.
    {
        let pd = Pd::new(dev.device())?;
        let args = CreateArgs {
            req: crate::policy::srq_pool::Request {
                nr_srqs: 0,
                srq_size: 16,
                max_sge: 1,
                buf_size: 0,
                has_recv_done: false,
                max_srq_size: 0,
            },
            recv_done: None,
            pressure: None,
        };
        // SAFETY: `pd` is live and outlives the pool, dropped at the end of this block.
        let view = unsafe { PdView::from_raw(pd.as_raw()) };
        let pool = OwnedSrqPool::new(view, args)?;
        kassert_eq!(pool.pool()?.nr_srqs(), (n - 1) as usize);
    }

    // Back online: every vector again, in round-robin order.
    kassert_eq!(set_cpu_online(last, 1)?, 0);
    kassert_eq!(state.comp_vectors(), n);
    let vs = rr_vectors(dev, PollCtx::Workqueue, 2 * n, &mut held)?;
    kassert!(
        vs.contains(&last),
        "round-robin skips vector {}: {:?}",
        last,
        &vs[..]
    );
    for w in vs.windows(2) {
        kassert_eq!(
            Some(w[1]),
            (w[0] + 1).checked_rem(n),
            "round-robin order {:?}",
            &vs[..]
        );
    }
    let res = lb.round(3, true, 20_000);
    kassert!(res.is_ok(), "round 3 with cpu{} back: {:?}", last, res);
    drop(lb);
    Ok(())
}

kunit_suite!(
    ibext_elastic,
    [
        burst_then_aging_leaves_the_floor,
        the_aging_work_shrinks_the_pool,
        busy_cqs_survive_aging,
        aging_races_gets,
        aging_follows_ibext_age_ms,
        vectors_follow_cpu_hotplug,
    ]
);
