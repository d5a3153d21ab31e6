// SPDX-License-Identifier: GPL-2.0

//! `ibext_dim`: moderation of pooled and legacy CQs on rxe: DIM applied in software (rxe has no
//! `modify_cq`) and through a recording `modify_cq` given to rxe0, the adaptive mode, and
//! exactly-once delivery in every mode. Every behaviour asserted is forced by the test (held
//! pollers, forced DIM decisions); what only load would show (profiles rising, fewer events) is
//! measured by `make bench`, not asserted here.
//!
//! About 740 lines: pooled and legacy CQs, the recording `modify_cq` and the adaptive mode share
//! the held-poller fixtures here.

use crate::engine::CqStat;
use crate::tests::fixtures::guest::cqp;
use crate::tests::fixtures::{guest::DeviceRef, traffic::Loopback};
use crate::tests::hooks::HoldPasses;
use crate::{
    api::CqEntries,
    backport::bug::expect_warnings,
    bindings,
    capi::{ibext_dim_attach, ibext_dim_detach, ibext_dim_profile, ibext_dim_sample},
    engine::{PollCtx, PooledCq},
    ib::cq::UlpCq,
    kunit::{bad_input_ok, kassert, kassert_eq, kunit_suite, Failed, TestResult},
    ledger::{self, Kind},
    legacy_dim,
    policy::{moderation::Moderation, profiles::RDMA_DIM_PROFILES},
};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use kernel::{c_str, prelude::*};

/// Pooled CQs for `qps` loopback QPs on `dev` with `depth` entries each for sends and for
/// receives: QP `i` gets a send and a receive CQ on vector hint `i`, polled in `ctx(i)` and
/// moderated by `mode`. Returns the references and their raw pointers.
#[expect(clippy::type_complexity, reason = "a test helper's pair of lists")]
fn cq_pairs(
    dev: &DeviceRef,
    qps: usize,
    depth: usize,
    ctx: impl Fn(usize) -> PollCtx,
    mode: Moderation,
) -> Result<(
    KVec<(CqEntries, CqEntries)>,
    KVec<(*mut bindings::ib_cq, *mut bindings::ib_cq)>,
)> {
    let mut cqs = KVec::with_capacity(qps, GFP_KERNEL)?;
    let mut raw = KVec::with_capacity(qps, GFP_KERNEL)?;
    for i in 0..qps {
        let s = CqEntries::get(dev.device(), depth as u32, i as i32, ctx(i), mode)?;
        let r = CqEntries::get(dev.device(), depth as u32, i as i32, ctx(i), mode)?;
        raw.push((s.as_raw(), r.as_raw()), GFP_KERNEL)?;
        cqs.push((s, r), GFP_KERNEL)?;
    }
    Ok((cqs, raw))
}

/// The adaptive mode switches between interrupt and polling mode *during* rounds whose every
/// completion is checked: none is lost, duplicated or misdelivered across a switch.
///
/// The switch is forced, not hoped for: each round holds the CQs' pollers (the tests' gate)
/// until every CQ has at least a softirq pass's polling threshold (budget / 8) of completions
/// waiting, so the first pass after the release is heavy and switches to polling mode, and the
/// empty pass that ends the round switches back. However slow the guest, every round switches.
fn adaptive_switches_lose_nothing() -> TestResult {
    const QPS: usize = 8;
    const DEPTH: usize = 32;
    const ROUNDS: u32 = 12;
    let threshold = (crate::engine::BUDGET_SOFTIRQ
        / crate::policy::moderation::ADAPTIVE_POLL_BUDGET_DIV) as i32;
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    let state = crate::device::device_state(dev.device()).ok_or(Failed)?;
    let (_cqs, raw) = cq_pairs(&dev, QPS, DEPTH, |_| PollCtx::Softirq, Moderation::Adaptive)?;
    let distinct =
        crate::tests::fixtures::guest::distinct_cqs(raw.iter().flat_map(|&(s, r)| [s, r]))?;
    let engines = || {
        distinct.iter().filter_map(|&cq| {
            // SAFETY: The CQs are pooled and held by `_cqs` for the whole test.
            unsafe { PooledCq::of_cq(cq) }
        })
    };
    kassert_eq!(engines().count(), distinct.len());
    // Every CQ must see at least `threshold` completions per round for the release to be heavy.
    // `checked_div`: no panic path in a test (objtool flagged the divide-by-zero call).
    let per_cq_min = (QPS * DEPTH * 2).checked_div(distinct.len()).unwrap_or(0);
    kassert!(per_cq_min >= threshold as usize, "{} CQs", distinct.len());
    let switches = || -> u64 {
        distinct
            .iter()
            .filter_map(|&cq| cqp(cq).and_then(|c| state.cq_pools().info(c)))
            .map(|i| i.get(CqStat::ModeSwitches))
            .sum()
    };
    let mut lb = Loopback::new(dev.device(), DEPTH, &raw)?;
    let mut rounds_with_switches = 0u32;
    for round in 0..ROUNDS {
        // Every CQ back in interrupt mode (an even number of switches: the empty pass that ends
        // polling mode has run and re-armed), so no pass is running or due when the gate closes.
        let idle = crate::tests::fixtures::guest::wait_for(20_000, || {
            distinct
                .iter()
                .filter_map(|&cq| cqp(cq).and_then(|c| state.cq_pools().info(c)))
                .all(|i| i.get(CqStat::ModeSwitches) % 2 == 0)
        });
        kassert!(idle, "round {}: a CQ stayed in polling mode", round);
        let before = switches();
        for e in engines() {
            e.test_hold();
        }
        let mut held = true;
        let mut waited = 0u32;
        let res = lb.round_polled(round, round % 2 == 1, 30_000, &mut || {
            if held {
                // SAFETY: The CQs are live (held by `_cqs`).
                let ready = distinct
                    .iter()
                    .all(|&cq| unsafe { bindings::ibext_test_peek_cq(cq, threshold) >= threshold });
                // The hang guard only: a round that never fills fails below.
                if ready || waited >= 20_000 {
                    for e in engines() {
                        e.test_release();
                    }
                    held = false;
                }
            }
            crate::tests::fixtures::guest::msleep(1);
            waited += 1;
        });
        kassert!(res.is_ok(), "round {}: {:?}", round, res);
        kassert!(waited < 20_000, "round {}: the CQs never filled", round);
        if switches() > before {
            rounds_with_switches += 1;
        }
    }
    kassert_eq!(
        lb.completions(),
        u64::from(ROUNDS) * 2 * (QPS * DEPTH) as u64
    );
    pr_info!(
        "dim: adaptive: {} of {} checked rounds switched modes\n",
        rounds_with_switches,
        ROUNDS
    );
    kassert_eq!(rounds_with_switches, ROUNDS);
    Ok(())
}

/// The adaptive mode's polling mode on rxe defers its next pass once SoftDim is on, and a
/// deferred pass that finds the CQ empty ends polling mode (`policy::moderation::soft_poll`).
///
/// Every pass is the test's: the CQ is held (`HoldPasses`), so what the engine asks for (the
/// event, a pass at once, the timer's pass) waits, and the test runs each pass itself once the
/// completions it should find are in the CQ. So the passes are exactly these, however fast the
/// guest runs: a first pass that finds the polling threshold (budget / 8) enters polling mode;
/// polling passes that find one exchange (2 completions) each fill SoftDim's first window,
/// whose last pass turns it on and is deferred by its period; deferred passes that find an
/// exchange are deferred again; the deferred pass that finds nothing re-arms. Every completion
/// is checked once. With polling mode polling again at once in software (the rule before
/// SoftDim), no pass was deferred.
fn adaptive_polling_defers_in_software() -> TestResult {
    use crate::policy::{
        moderation::ADAPTIVE_POLL_BUDGET_DIV,
        profiles,
        soft_dim::{ON_PROFILE, WINDOW},
    };
    use crate::tests::fixtures::guest::{msleep, pass_here, softirq_cq, wait_for};
    const DEFERRED: u64 = 3;
    let threshold = crate::engine::BUDGET_SOFTIRQ / ADAPTIVE_POLL_BUDGET_DIV;
    let period = u64::from(profiles::profile(ON_PROFILE).usec);
    // Each exchange's 2 completions are fewer than the profile's count: the pass defers.
    kassert!(u32::from(profiles::profile(ON_PROFILE).comps) > 2);
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    kassert!(!dev.device().has_modify_cq(), "rxe0 has a modify_cq");
    let cq = softirq_cq(dev.device(), 2 * threshold, Moderation::Adaptive)?;
    let engine = cq.get().ok_or(Failed)?;
    let raw = engine.raw();
    let stat = |s| engine.snapshot().get(s);
    // Loopback QPs on the one CQ: `fill`'s round leaves `threshold` completions, `one`'s 2.
    let mut fill = Loopback::new(dev.device(), (threshold / 2) as usize, &[(raw, raw)])?;
    let mut one = Loopback::new(dev.device(), 1, &[(raw, raw)])?;
    engine.test_hold();
    let mut round = 0u32;
    // A round of `lb` whose completions the test's own pass finds, once all `n` are in the CQ.
    let mut stepped = |lb: &mut Loopback, n: i32| -> TestResult {
        let mut ran = false;
        let res = lb.round_polled(round, false, 20_000, &mut || {
            // SAFETY: `raw` is live (held by `cq`).
            if !ran && unsafe { bindings::ibext_test_peek_cq(raw, n) } >= n {
                pass_here(engine);
                ran = true;
            }
            msleep(1);
        });
        kassert!(res.is_ok(), "round {}: {:?}", round, res);
        kassert!(ran, "round {}", round);
        round += 1;
        Ok(())
    };
    let passes0 = stat(CqStat::Passes);
    stepped(&mut fill, threshold as i32)?;
    kassert_eq!(
        stat(CqStat::ModeSwitches),
        1,
        "the full pass entered polling mode"
    );
    for i in 1..WINDOW - 1 {
        stepped(&mut one, 2)?;
        kassert_eq!(stat(CqStat::DeferredAskedUs), 0, "polling pass {}", i);
    }
    // The window's last sample turns SoftDim on: its pass is deferred.
    stepped(&mut one, 2)?;
    kassert_eq!(stat(CqStat::DeferredAskedUs), period);
    for d in 1..=DEFERRED {
        kassert!(
            wait_for(20_000, || stat(CqStat::DeferredPolls) == d),
            "deferral {}",
            d
        );
        if d < DEFERRED {
            stepped(&mut one, 2)?;
            kassert_eq!(stat(CqStat::DeferredAskedUs), (d + 1) * period);
        } else {
            pass_here(engine);
        }
    }
    kassert_eq!(
        stat(CqStat::ModeSwitches),
        2,
        "the empty deferred pass left polling mode"
    );
    kassert_eq!(stat(CqStat::DeferredAskedUs), DEFERRED * period);
    kassert!(stat(CqStat::DeferredWaitedUs) >= DEFERRED * period);
    kassert_eq!(stat(CqStat::Passes) - passes0, u64::from(WINDOW) + DEFERRED);
    // Let go: the pass the engine asked for while held finds nothing and re-arms; the next
    // exchange raises an event of the device's.
    engine.test_release();
    let events = stat(CqStat::Events);
    let res = one.round(round, false, 20_000);
    kassert!(res.is_ok(), "after the release: {:?}", res);
    kassert!(stat(CqStat::Events) > events);
    kassert_eq!(stat(CqStat::ModeSwitches), 2);
    kassert_eq!(
        fill.completions() + one.completions(),
        u64::from(threshold) + 2 * (u64::from(WINDOW) - 1 + DEFERRED - 1 + 1)
    );
    drop((fill, one));
    drop(cq);
    Ok(())
}

/// What the recording `modify_cq` saw last, and whether it refuses.
static REC_CALLS: AtomicU32 = AtomicU32::new(0);
static REC_CQ: AtomicPtr<bindings::ib_cq> = AtomicPtr::new(core::ptr::null_mut());
static REC_COUNT: AtomicU32 = AtomicU32::new(0);
static REC_PERIOD: AtomicU32 = AtomicU32::new(0);
static REC_REFUSE: AtomicBool = AtomicBool::new(false);

/// A `modify_cq` for rxe0 that records its arguments (and refuses with `-EINVAL` on request).
///
/// # Safety
///
/// Called by ibext through the device's ops only.
unsafe extern "C" fn recording_modify_cq(
    cq: *mut bindings::ib_cq,
    cq_count: u16,
    cq_period: u16,
) -> core::ffi::c_int {
    REC_CQ.store(cq, Ordering::Release);
    REC_COUNT.store(cq_count.into(), Ordering::Release);
    REC_PERIOD.store(cq_period.into(), Ordering::Release);
    REC_CALLS.fetch_add(1, Ordering::AcqRel);
    if REC_REFUSE.load(Ordering::Acquire) {
        EINVAL.to_errno()
    } else {
        0
    }
}

/// rxe0's `ops.modify_cq` swapped for [`recording_modify_cq`] (6.12 copies the ops into every
/// `ib_device`, so this changes rxe0 only); the original (none, on rxe) is put back on drop.
struct ModifyCqSwap {
    dev: *mut bindings::ib_device,
    saved: Option<unsafe extern "C" fn(*mut bindings::ib_cq, u16, u16) -> core::ffi::c_int>,
}

impl ModifyCqSwap {
    fn install(dev: &crate::ib::Device) -> Self {
        let dev = dev.as_raw();
        // SAFETY: `dev` is held by the test; a pointer-sized aligned store that readers see
        // whole. Nothing but ibext's DIM work calls `modify_cq` on rxe.
        let saved = unsafe {
            let op = core::ptr::addr_of_mut!((*dev).ops.modify_cq);
            let saved = op.read_volatile();
            op.write_volatile(Some(recording_modify_cq));
            saved
        };
        ModifyCqSwap { dev, saved }
    }
}

impl Drop for ModifyCqSwap {
    fn drop(&mut self) {
        // SAFETY: As in `install`.
        unsafe { core::ptr::addr_of_mut!((*self.dev).ops.modify_cq).write_volatile(self.saved) };
    }
}

/// DIM's chosen profiles reach the device's own `modify_cq` with the profile's values, for a
/// pooled CQ (which ib_core's `rdma_set_cq_moderation()` would refuse, as it is marked shared)
/// and for a legacy CQ; a device that refuses a profile hands the CQ to software moderation,
/// which then defers polls. rxe has no `modify_cq`, so the test gives rxe0 a recording one, and
/// forces lib/dim's decisions (as `rdma_dim()` makes them) so that every profile is applied.
fn modify_cq_reaches_the_device() -> TestResult {
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    kassert!(
        !dev.device().has_modify_cq(),
        "rxe0 has a modify_cq of its own"
    );
    let state = crate::device::device_state(dev.device()).ok_or(Failed)?;
    let cq = CqEntries::get(dev.device(), 16, 0, PollCtx::Softirq, Moderation::Dim)?;
    let raw = cq.as_raw();
    // SAFETY: Pooled, with entries held by `cq` for the whole test.
    let engine = unsafe { PooledCq::of_cq(raw) }.ok_or(Failed)?;
    let info = || {
        cqp(raw)
            .and_then(|c| state.cq_pools().info(c))
            .unwrap_or_default()
    };
    let mut seen: KVec<(u8, u32, u32)> = KVec::new();
    {
        let _swap = ModifyCqSwap::install(dev.device());
        REC_REFUSE.store(false, Ordering::Release);
        for ix in 1..=8u8 {
            let calls = REC_CALLS.load(Ordering::Acquire);
            engine.test_force_profile(ix);
            let p = crate::policy::profiles::profile(ix);
            kassert_eq!(
                REC_CALLS.load(Ordering::Acquire),
                calls + 1,
                "profile {}",
                ix
            );
            kassert!(REC_CQ.load(Ordering::Acquire) == raw, "profile {}", ix);
            let got = (
                REC_COUNT.load(Ordering::Acquire),
                REC_PERIOD.load(Ordering::Acquire),
            );
            kassert_eq!(
                got,
                (u32::from(p.comps), u32::from(p.usec)),
                "profile {}",
                ix
            );
            kassert!(info().hw_moderation, "profile {}", ix);
            seen.push((ix, got.0, got.1), GFP_KERNEL)?;
        }
        kassert_eq!(info().get(CqStat::HwApplied), 8);
        // A legacy CQ's profile goes the same way.
        with_legacy_cq(64, |_, lcq| {
            // SAFETY: Our live CQ, made by `ib_create_cq`.
            kassert_eq!(unsafe { ibext_dim_attach(lcq) }, 0);
            // SAFETY: Attached above, detached by `with_legacy_cq`.
            let hw = legacy_dim::test_force_profile(unsafe { UlpCq::from_raw(lcq) }, 6);
            kassert_eq!(hw, Some(true));
            kassert!(REC_CQ.load(Ordering::Acquire) == lcq);
            let p = crate::policy::profiles::profile(6);
            kassert_eq!(
                (
                    REC_COUNT.load(Ordering::Acquire),
                    REC_PERIOD.load(Ordering::Acquire)
                ),
                (u32::from(p.comps), u32::from(p.usec))
            );
            REC_REFUSE.store(true, Ordering::Release);
            // SAFETY: As above.
            let hw = legacy_dim::test_force_profile(unsafe { UlpCq::from_raw(lcq) }, 2);
            REC_REFUSE.store(false, Ordering::Release);
            kassert_eq!(hw, Some(false));
            Ok(())
        })?;
        // The device refuses: software moderation takes over.
        REC_REFUSE.store(true, Ordering::Release);
        engine.test_force_profile(2);
        REC_REFUSE.store(false, Ordering::Release);
        kassert!(!info().hw_moderation);
        kassert_eq!(info().get(CqStat::HwRefused), 1);
    }
    kernel::kunit::info(format_args!(
        "    # modify_cq: profiles (ix, comps, usec) applied on rxe0: {:?}\n",
        &seen[..]
    ));
    // Software moderation at profile 2 (2 us, 4 completions) defers polls instead of re-arming.
    let deferred = info().get(CqStat::DeferredPolls);
    let mut lb = Loopback::new(dev.device(), 4, &[(raw, raw)])?;
    for round in 0..2u32 {
        let res = lb.round(round, false, 20_000);
        kassert!(res.is_ok(), "round {}: {:?}", round, res);
    }
    drop(lb);
    let did = crate::tests::fixtures::guest::wait_for(20_000, || {
        info().get(CqStat::DeferredPolls) > deferred
    });
    kassert!(did, "no deferred poll after the device refused");
    // The original op (none) is back: the next profile is applied in software.
    let calls = REC_CALLS.load(Ordering::Acquire);
    engine.test_force_profile(0);
    kassert_eq!(REC_CALLS.load(Ordering::Acquire), calls);
    kassert!(!info().hw_moderation);
    Ok(())
}

/// Every completion is delivered exactly once, to the right `wr_cqe`, in all three modes.
fn exactly_once_in_every_mode() -> TestResult {
    const QPS: usize = 6;
    const DEPTH: usize = 16;
    let dev = DeviceRef::get(c_str!("rxe0"));
    kassert!(dev.is_some(), "rxe0 is not registered");
    let dev = dev.ok_or(Failed)?;
    for mode in Moderation::ALL {
        let (_cqs, raw) = cq_pairs(&dev, QPS, DEPTH, |i| PollCtx::ALL[i % 3], mode)?;
        let mut lb = Loopback::new(dev.device(), DEPTH, &raw)?;
        for round in 0..8u32 {
            let res = lb.round(round, round % 2 == 1, 20_000);
            kassert!(res.is_ok(), "{} round {}: {:?}", mode.name(), round, res);
        }
    }
    Ok(())
}

/// The legacy API on a CQ made with `ib_create_cq`, including every misuse.
fn legacy_api_on_own_cq() -> TestResult {
    with_legacy_cq(64, legacy_checks)
}

/// Runs `f` on rxe0 with a legacy ULP's CQ of `cqe` entries: made with `ib_create_cq`, no
/// handlers (the ULP polls it itself). Afterwards detaches ibext's DIM if `f` left it attached,
/// and destroys the CQ.
fn with_legacy_cq(
    cqe: u32,
    f: impl FnOnce(&DeviceRef, *mut bindings::ib_cq) -> TestResult,
) -> TestResult {
    let dev = DeviceRef::get(c_str!("rxe0"));
    kassert!(dev.is_some(), "rxe0 is not registered");
    let dev = dev.ok_or(Failed)?;
    let attr = bindings::ib_cq_init_attr {
        cqe,
        comp_vector: 0,
        flags: 0,
    };
    // SAFETY: rxe0 is held; no handlers; `attr` and the name outlive the call.
    let cq = kernel::error::from_err_ptr(unsafe {
        bindings::__ib_create_cq(
            dev.device().as_raw(),
            None,
            None,
            core::ptr::null_mut(),
            &attr,
            c"ibext_test".as_ptr().cast(),
        )
    })?;
    let r = f(&dev, cq);
    // SAFETY: Our CQ, whose QPs `f` destroyed; DIM detached here if `f` stopped early.
    unsafe {
        let ucq = UlpCq::from_raw(cq);
        if legacy_dim::counters(ucq).is_some() {
            legacy_dim::detach(ucq);
        }
        bindings::ib_destroy_cq_user(cq, core::ptr::null_mut());
    }
    r
}

fn legacy_checks(dev: &DeviceRef, cq: *mut bindings::ib_cq) -> TestResult {
    // Safe wrappers of the C entry points for this test: every CQ passed is our live CQ, a live
    // pooled CQ, or null, and every out pointer is null or valid; the entry points accept all.
    let attach = |c: *mut bindings::ib_cq| {
        // SAFETY: See above.
        unsafe { ibext_dim_attach(c) }
    };
    let sample = |c: *mut bindings::ib_cq, n: u32| {
        // SAFETY: See above; the test samples from one thread and detaches after.
        unsafe { ibext_dim_sample(c, n) }
    };
    let detach = |c: *mut bindings::ib_cq| {
        // SAFETY: See above; sampling has stopped when the test detaches.
        unsafe { ibext_dim_detach(c) }
    };
    let profile = |c: *mut bindings::ib_cq, u: *mut u32, k: *mut u32| {
        // SAFETY: See above.
        unsafe { ibext_dim_profile(c, u, k) }
    };
    let counters = || {
        // SAFETY: `cq` is our live CQ.
        legacy_dim::counters(unsafe { UlpCq::from_raw(cq) })
    };
    let null = core::ptr::null_mut();
    let einval = EINVAL.to_errno();
    let (mut usec, mut comps) = (0u32, 0u32);
    let live = ledger::counts(Kind::LegacyDim).live();

    kassert_eq!(profile(cq, &mut usec, &mut comps), einval);
    bad_input_ok("dim_profile.not_attached");
    kassert_eq!(expect_warnings(|| sample(cq, 4)), 1);
    bad_input_ok("dim_sample.not_attached");
    kassert_eq!(expect_warnings(|| detach(cq)), 1);
    bad_input_ok("dim_detach.not_attached");
    kassert_eq!(attach(null), einval);
    bad_input_ok("dim_attach.null");
    kassert_eq!(expect_warnings(|| sample(null, 1)), 1);
    bad_input_ok("dim_sample.null");
    kassert_eq!(expect_warnings(|| detach(null)), 1);
    bad_input_ok("dim_detach.null");
    let pooled = CqEntries::get(dev.device(), 4, 0, PollCtx::Softirq, Moderation::Dim)?;
    kassert_eq!(attach(pooled.as_raw()), einval);
    bad_input_ok("dim_attach.pooled");
    kassert_eq!(ledger::counts(Kind::LegacyDim).live(), live);

    kassert_eq!(attach(cq), 0);
    kassert_eq!(ledger::counts(Kind::LegacyDim).live(), live + 1);
    kassert_eq!(attach(cq), EBUSY.to_errno());
    bad_input_ok("dim_attach.twice");
    kassert_eq!(profile(cq, null.cast(), &mut comps), einval);
    kassert_eq!(profile(null, &mut usec, &mut comps), einval);
    bad_input_ok("dim_profile.null");

    // A ULP's poll loops: samples of rising size, with time passing between them, so that the
    // profile choice runs (software's on rxe, which has no modify_cq; it decides every 64
    // samples, as lib/dim does).
    for i in 0..1024u32 {
        sample(cq, 1 + i / 32);
        if i % 16 == 0 {
            // SAFETY: FFI call in process context.
            unsafe { bindings::msleep(1) };
        }
    }
    kassert_eq!(counters().map(|c| c.samples), Some(1024));
    kassert_eq!(profile(cq, &mut usec, &mut comps), 0);
    let in_table = RDMA_DIM_PROFILES
        .iter()
        .any(|p| u32::from(p.usec) == usec && u32::from(p.comps) == comps);
    kassert!(in_table, "({}, {}) is not a DIM profile", usec, comps);
    pr_info!(
        "dim: legacy CQ after 1024 samples: profile ({} usec, {} comps), {} profile changes\n",
        usec,
        comps,
        counters().map_or(0, |c| c.profile_changes)
    );

    detach(cq);
    kassert_eq!(ledger::counts(Kind::LegacyDim).live(), live);
    kassert!(counters().is_none());
    drop(pooled);
    Ok(())
}

/// A legacy ULP: QPs on its own `ib_create_cq` CQ, which it polls itself and dispatches, with
/// ibext's DIM attached and sampled after every poll loop; every completion still arrives
/// exactly once.
fn legacy_ulp_traffic() -> TestResult {
    const QPS: usize = 4;
    const DEPTH: usize = 16;
    with_legacy_cq((4 * QPS * DEPTH) as u32, |dev, cq| {
        // SAFETY: `cq` is our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        let raw = [(cq, cq); QPS];
        let mut lb = Loopback::new(dev.device(), DEPTH, &raw)?;
        let mut wcs: [bindings::ib_wc; 16] = Default::default();
        // The ULP's poll loop: poll a batch, dispatch it, sample DIM.
        let mut poll = || {
            // SAFETY: `cq` is live and `wcs` holds 16 entries.
            let n = unsafe { bindings::ibext_test_poll_cq(cq, 16, wcs.as_mut_ptr()) };
            let n = u32::try_from(n).unwrap_or(0);
            for wc in wcs.iter_mut().take(n as usize) {
                // SAFETY: A completion of the loopback's work requests: its `wr_cqe` is a live
                // context whose `done` expects this CQ and completion.
                unsafe {
                    let cqe = wc.__bindgen_anon_1.wr_cqe;
                    if let Some(done) = (*cqe).done {
                        done(cq, wc);
                    }
                }
            }
            // SAFETY: `cq` has ibext's DIM attached; one sampler.
            unsafe { ibext_dim_sample(cq, n) };
            if n == 0 {
                // SAFETY: FFI call in process context.
                unsafe { bindings::msleep(1) };
            }
        };
        for round in 0..8u32 {
            let res = lb.round_polled(round, round % 2 == 1, 20_000, &mut poll);
            kassert!(res.is_ok(), "legacy round {}: {:?}", round, res);
        }
        drop(lb);
        // SAFETY: `cq` is our live CQ.
        let samples = legacy_dim::counters(unsafe { UlpCq::from_raw(cq) }).map_or(0, |c| c.samples);
        kassert!(samples > 0);
        pr_info!(
            "dim: legacy ULP loop: {} samples over 8 checked rounds\n",
            samples
        );
        Ok(())
    })
}

/// Makes a legacy ULP's CQ on `dev` (as [`with_legacy_cq`] does), or null.
fn create_legacy_cq(dev: &crate::ib::Device) -> *mut bindings::ib_cq {
    let attr = bindings::ib_cq_init_attr {
        cqe: 16,
        comp_vector: 0,
        flags: 0,
    };
    // SAFETY: `dev` is registered; no handlers; `attr` and the name outlive the call.
    let cq = unsafe {
        bindings::__ib_create_cq(
            dev.as_raw(),
            None,
            None,
            core::ptr::null_mut(),
            &attr,
            c"ibext_test".as_ptr().cast(),
        )
    };
    kernel::error::from_err_ptr(cq).unwrap_or(core::ptr::null_mut())
}

/// Legacy attach/detach under concurrency: three workers race to attach to one CQ (exactly
/// one wins, the others get -EBUSY), and three more run attach, 200 samples, profile reads and
/// detach on CQs of their own, 30 rounds each; nothing is left attached and every profile read
/// is one of the RDMA table's.
fn legacy_attach_detach_stress() -> TestResult {
    use core::sync::atomic::{AtomicU32, Ordering};
    use kernel::{sync::Arc, workqueue};
    const ROUNDS: u32 = 30;
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    let live = ledger::counts(Kind::LegacyDim).live();
    let errors = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let done = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let valid = |u: u32, c: u32| {
        RDMA_DIM_PROFILES
            .iter()
            .any(|p| (u32::from(p.usec), u32::from(p.comps)) == (u, c))
    };
    // Own-CQ workers.
    for w in 0..3u32 {
        let (errors, done) = (errors.clone(), done.clone());
        let dev_raw = dev.device().as_raw() as usize;
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            // SAFETY: The test holds rxe0 until every worker is done.
            let dev = unsafe { crate::ib::Device::from_raw(dev_raw as *mut bindings::ib_device) };
            for r in 0..ROUNDS {
                let cq = create_legacy_cq(dev);
                if cq.is_null() {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // SAFETY: Our CQ; one sampler (this worker); detached before it is destroyed.
                unsafe {
                    if ibext_dim_attach(cq) != 0 {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    for i in 0..200u32 {
                        ibext_dim_sample(cq, (i * (w + 1) + r) % 64);
                    }
                    let (mut u, mut c) = (0u32, 0u32);
                    if ibext_dim_profile(cq, &mut u, &mut c) != 0 || !valid(u, c) {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    ibext_dim_detach(cq);
                    bindings::ib_destroy_cq_user(cq, core::ptr::null_mut());
                }
            }
            done.fetch_add(1, Ordering::AcqRel);
        });
        kassert!(res.is_ok(), "cannot start worker {}", w);
    }
    // Racing attachers on one CQ per round.
    let mut won_total = 0;
    for r in 0..ROUNDS {
        let cq = create_legacy_cq(dev.device());
        kassert!(!cq.is_null(), "round {}: no CQ", r);
        // An address that may cross to the attachers.
        let ptr = crate::ib::cq::CqPtr::from_raw(cq).ok_or(Failed)?;
        let (won, busy, finished) = (
            Arc::new(AtomicU32::new(0), GFP_KERNEL)?,
            Arc::new(AtomicU32::new(0), GFP_KERNEL)?,
            Arc::new(AtomicU32::new(0), GFP_KERNEL)?,
        );
        for _ in 0..3 {
            let (won, busy, finished) = (won.clone(), busy.clone(), finished.clone());
            let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
                // SAFETY: A live CQ the test owns until every attacher finished.
                match unsafe { ibext_dim_attach(ptr.as_raw()) } {
                    0 => won.fetch_add(1, Ordering::AcqRel),
                    e if e == EBUSY.to_errno() => busy.fetch_add(1, Ordering::AcqRel),
                    _ => 0,
                };
                finished.fetch_add(1, Ordering::AcqRel);
            });
            kassert!(res.is_ok());
        }
        kassert!(crate::tests::fixtures::guest::wait_for(10_000, || finished
            .load(Ordering::Acquire)
            == 3));
        kassert_eq!(won.load(Ordering::Acquire), 1, "round {}", r);
        kassert_eq!(busy.load(Ordering::Acquire), 2, "round {}", r);
        won_total += 1;
        // SAFETY: Our CQ with ibext's DIM attached (once); nobody samples it.
        unsafe {
            ibext_dim_detach(cq);
            bindings::ib_destroy_cq_user(cq, core::ptr::null_mut());
        }
    }
    kassert!(crate::tests::fixtures::guest::wait_for(60_000, || done
        .load(Ordering::Acquire)
        == 3));
    kassert_eq!(errors.load(Ordering::Acquire), 0);
    kassert_eq!(won_total, ROUNDS);
    kassert_eq!(ledger::counts(Kind::LegacyDim).live(), live);
    Ok(())
}

kunit_suite!(
    ibext_dim,
    [
        legacy_api_on_own_cq,
        legacy_ulp_traffic,
        legacy_attach_detach_stress,
        adaptive_switches_lose_nothing,
        adaptive_polling_defers_in_software,
        exactly_once_in_every_mode,
        modify_cq_reaches_the_device,
    ]
);
