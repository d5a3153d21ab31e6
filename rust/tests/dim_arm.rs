// SPDX-License-Identifier: GPL-2.0

//! `ibext_dim_arm`: software moderation of a legacy ULP's own CQ on rxe, which has no
//! `modify_cq`. The ULP here is the one RDS is: a CQ made with `ib_create_cq` and a completion
//! handler, polled by the ULP, sampled with `ibext_dim_sample()` and re-armed with
//! `ibext_dim_arm()` instead of `ib_req_notify_cq()`, or both in one call,
//! `ibext_dim_poll_done()`, as the RDS port does.
//!
//! What is asserted is forced: profiles are set by the test (as the selection sets them), or
//! follow from the runs the test makes (`software_choice_follows_what_deferrals_find`), and a
//! deferred pass is held (`tests::hooks::LEGACY_DEFER_US`) until the test runs it, after the
//! completions it must report are in the CQ. How much batching the deferral buys under load is
//! measured by `make bench` (the RDS benchmark), not asserted here.

use crate::{
    backport::bug::expect_warnings,
    bindings,
    capi::{
        ibext_dim_arm, ibext_dim_attach, ibext_dim_detach, ibext_dim_poll_done, ibext_dim_sample,
    },
    ib::cq::UlpCq,
    kunit::{bad_input_ok, kassert, kassert_eq, kunit_suite, TestResult},
    legacy_dim::{self, Counters},
    tests::{
        fixtures::{
            guest::{msleep, required, DeviceRef},
            traffic::Loopback,
        },
        hooks::LEGACY_DEFER_US,
    },
};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
};
use kernel::{c_str, prelude::*};

const NEXT_COMP: u32 = bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP;
const SOLICITED: u32 = bindings::ib_cq_notify_flags_IB_CQ_SOLICITED;
const MISSED: u32 = bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS;

/// The completion handler of the tests' CQs: counts the events the device (or ibext, at the end
/// of a deferral) raised, in the `AtomicU32` the CQ's context points to.
///
/// # Safety
///
/// Called by the driver or ibext only, with the context [`with_cq`] gave the CQ.
unsafe extern "C" fn count_event(cq: *mut bindings::ib_cq, ctx: *mut c_void) {
    // SAFETY: `ctx` is the counter `with_cq` keeps alive until the CQ is destroyed.
    unsafe { &*ctx.cast::<AtomicU32>() }.fetch_add(1, Ordering::AcqRel);
    if RUN_IN_HANDLER.load(Ordering::Acquire) {
        ulp_run(cq);
    }
}

/// While set, [`count_event`] also does the ULP's run ([`ulp_run`]) itself, as a ULP that polls
/// in its handler does. Set only around ibext's own handler call ([`expire`]): rxe calls the
/// handler under its CQ lock, which polling would take again.
static RUN_IN_HANDLER: AtomicBool = AtomicBool::new(false);

/// Runs `f` on rxe0 with a legacy ULP's CQ of `cqe` entries and the event counter of its
/// completion handler ([`count_event`], or none if `!handler`); afterwards detaches ibext's DIM
/// if `f` left it attached, and destroys the CQ.
fn with_cq(
    cqe: u32,
    handler: bool,
    f: impl FnOnce(&DeviceRef, *mut bindings::ib_cq, &AtomicU32) -> TestResult,
) -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let events = KBox::new(AtomicU32::new(0), GFP_KERNEL)?;
    let attr = bindings::ib_cq_init_attr {
        cqe,
        comp_vector: 0,
        flags: 0,
    };
    let ctx: *const AtomicU32 = &*events;
    // SAFETY: rxe0 is held; the handler and its context outlive the CQ; `attr` and the name
    // outlive the call.
    let cq = kernel::error::from_err_ptr(unsafe {
        bindings::__ib_create_cq(
            dev.device().as_raw(),
            if handler { Some(count_event) } else { None },
            None,
            ctx.cast_mut().cast(),
            &attr,
            c"ibext_test".as_ptr().cast(),
        )
    })?;
    let r = f(&dev, cq, &events);
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

/// `ibext_dim_arm()` on `cq`, which is null or one of the tests' live CQs.
fn arm(cq: *mut bindings::ib_cq, flags: u32) -> i32 {
    // SAFETY: `cq` is null or live; the tests arm from one thread and never while detaching.
    unsafe { ibext_dim_arm(cq, flags) }
}

/// `ibext_dim_poll_done()` on `cq`, which is null or one of the tests' live CQs.
fn poll_done(cq: *mut bindings::ib_cq, n: u32, flags: u32) -> i32 {
    // SAFETY: `cq` is null or live; the tests arm from one thread and never while detaching.
    unsafe { ibext_dim_poll_done(cq, n, flags) }
}

/// The counters of `cq`'s DIM (all zero without it).
fn counters(cq: *mut bindings::ib_cq) -> Counters {
    // SAFETY: `cq` is one of the tests' live CQs.
    legacy_dim::counters(unsafe { UlpCq::from_raw(cq) }).unwrap_or_default()
}

/// The ULP's poll loop: polls `cq` empty, hands every completion to its `wr_cqe`, and samples
/// DIM if it is attached. Returns the completions handled.
fn drain(cq: *mut bindings::ib_cq, sample: bool) -> u32 {
    let mut wcs: [bindings::ib_wc; 16] = Default::default();
    let mut total = 0;
    loop {
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
        total += n;
        if n < 16 {
            break;
        }
    }
    if sample {
        // SAFETY: `cq` has ibext's DIM attached; one sampler.
        unsafe { ibext_dim_sample(cq, total) };
    }
    total
}

/// Forces profile `ix` on `cq` (software's choice on rxe); returns whether the device
/// moderates it itself.
fn force_profile(cq: *mut bindings::ib_cq, ix: u8) -> Option<bool> {
    // SAFETY: `cq` is one of the tests' live CQs.
    legacy_dim::test_force_profile(unsafe { UlpCq::from_raw(cq) }, ix)
}

/// Runs `cq`'s deferred pass now.
fn expire(cq: *mut bindings::ib_cq) -> bool {
    // SAFETY: `cq` is one of the tests' live CQs; nothing arms it meanwhile.
    legacy_dim::test_expire_deferred(unsafe { UlpCq::from_raw(cq) })
}

/// Holds every deferred pass for an hour, until the test runs it; let go on drop.
struct HeldDeferrals;

impl HeldDeferrals {
    fn new() -> Self {
        LEGACY_DEFER_US.store(3_600_000_000, Ordering::Release);
        HeldDeferrals
    }
}

impl Drop for HeldDeferrals {
    fn drop(&mut self) {
        LEGACY_DEFER_US.store(0, Ordering::Release);
    }
}

/// One loopback round on `cq` that drains it (sampling if `sample`) whenever `events` has
/// passed `from`: the ULP's run on each event of a CQ armed for real.
fn round_drained_on_events(
    lb: &mut Loopback,
    round: u32,
    write_imm: bool,
    cq: *mut bindings::ib_cq,
    events: &AtomicU32,
    from: u32,
    sample: bool,
) -> core::result::Result<(), &'static str> {
    lb.round_polled(round, write_imm, 20_000, &mut || {
        if events.load(Ordering::Acquire) > from {
            drain(cq, sample);
        }
        msleep(1);
    })
}

/// `rearm`, an `ibext_dim_arm()` or `ibext_dim_poll_done()` of `cq` without ibext's DIM, warns
/// once and arms `cq` at once, for real: the next completion raises one event.
fn unattached_rearm_warns_and_arms(
    dev: &DeviceRef,
    cq: *mut bindings::ib_cq,
    events: &AtomicU32,
    mut rearm: impl FnMut() -> i32,
) -> TestResult {
    let mut ret = -1;
    kassert_eq!(expect_warnings(|| ret = rearm()), 1);
    kassert_eq!(ret, 0);
    let e0 = events.load(Ordering::Acquire);
    let mut lb = Loopback::new(dev.device(), 2, &[(cq, cq)])?;
    let res = round_drained_on_events(&mut lb, 0, false, cq, events, e0, false);
    kassert!(res.is_ok(), "{:?}", res);
    kassert_eq!(events.load(Ordering::Acquire), e0 + 1);
    Ok(())
}

/// Every misuse of `ibext_dim_arm()` gives its errno and changes nothing; without ibext's DIM
/// it warns once and arms at once, for real: the next completion raises an event.
fn arm_bad_input() -> TestResult {
    let einval = EINVAL.to_errno();
    kassert_eq!(arm(core::ptr::null_mut(), NEXT_COMP), einval);
    bad_input_ok("dim_arm.null");
    with_cq(16, false, |_, cq, _| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(arm(cq, NEXT_COMP), einval);
        kassert_eq!(counters(cq), Counters::default());
        bad_input_ok("dim_arm.no_handler");
        Ok(())
    })?;
    with_cq(16, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(force_profile(cq, 4), Some(false));
        for flags in [0, SOLICITED | NEXT_COMP, MISSED, 8, NEXT_COMP | 0x100] {
            kassert_eq!(arm(cq, flags), einval, "flags {:#x}", flags);
        }
        kassert_eq!(counters(cq).deferred_arms, 0);
        bad_input_ok("dim_arm.bad_flags");
        // SAFETY: Attached above; nobody samples or arms it meanwhile.
        unsafe { ibext_dim_detach(cq) };
        unattached_rearm_warns_and_arms(dev, cq, events, || arm(cq, NEXT_COMP))?;
        bad_input_ok("dim_arm.not_attached");
        Ok(())
    })
}

/// At profile 0 the re-arm is `ib_req_notify_cq()` at once: nothing is deferred, and the first
/// completion raises the CQ's event.
fn arms_at_once_at_profile_zero() -> TestResult {
    let _held = HeldDeferrals::new();
    with_cq(16, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(force_profile(cq, 0), Some(false));
        let mut lb = Loopback::new(dev.device(), 2, &[(cq, cq)])?;
        for round in 0..4u32 {
            let e0 = events.load(Ordering::Acquire);
            kassert_eq!(arm(cq, NEXT_COMP), 0);
            let res = round_drained_on_events(&mut lb, round, round % 2 == 1, cq, events, e0, true);
            kassert!(res.is_ok(), "round {}: {:?}", round, res);
            kassert_eq!(events.load(Ordering::Acquire), e0 + 1, "round {}", round);
        }
        kassert_eq!(counters(cq).deferred_arms, 0);
        Ok(())
    })
}

/// A poll run that found at least the profile's completion count re-arms at once (a device
/// would raise the next event at once); a shorter one defers the re-arm.
fn full_run_arms_at_once() -> TestResult {
    let _held = HeldDeferrals::new();
    with_cq(16, true, |_dev, cq, _events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        // Profile 5: 16 usec or 8 completions, forced after the sample (a sample may move the
        // profile).
        // SAFETY: Attached above; nobody else samples or arms it.
        unsafe { ibext_dim_sample(cq, 8) };
        kassert_eq!(force_profile(cq, 5), Some(false));
        kassert_eq!(arm(cq, NEXT_COMP), 0);
        kassert_eq!(counters(cq).deferred_arms, 0);
        // SAFETY: As above.
        unsafe { ibext_dim_sample(cq, 7) };
        kassert_eq!(force_profile(cq, 5), Some(false));
        kassert_eq!(arm(cq, NEXT_COMP), 0);
        kassert_eq!(counters(cq).deferred_arms, 1);
        kassert!(expire(cq));
        Ok(())
    })
}

/// The ULP's run after an event: poll and sample, re-arm through ibext, poll again (what that
/// finds raced the arm and is in no sample). Returns the first poll's count. With
/// [`ONE_CALL`], as the RDS port's tasklets: poll, `ibext_dim_poll_done()` asking for missed
/// completions, and poll again only if it reports some.
fn ulp_run(cq: *mut bindings::ib_cq) -> u32 {
    if ONE_CALL.load(Ordering::Acquire) {
        let n = drain(cq, false);
        if poll_done(cq, n, NEXT_COMP | MISSED) > 0 {
            drain(cq, false);
        }
        return n;
    }
    let n = drain(cq, true);
    let _ = arm(cq, NEXT_COMP);
    drain(cq, false);
    n
}

/// While set, [`ulp_run`] samples and re-arms with one `ibext_dim_poll_done()`.
static ONE_CALL: AtomicBool = AtomicBool::new(false);

/// Runs `f` with [`ONE_CALL`] set.
fn with_one_call(f: fn() -> TestResult) -> TestResult {
    ONE_CALL.store(true, Ordering::Release);
    let r = f();
    ONE_CALL.store(false, Ordering::Release);
    r
}

/// Every misuse of `ibext_dim_poll_done()` gives its errno and changes nothing, not even the
/// samples; without ibext's DIM it warns once and arms at once, for real.
fn poll_done_bad_input() -> TestResult {
    let einval = EINVAL.to_errno();
    kassert_eq!(poll_done(core::ptr::null_mut(), 1, NEXT_COMP), einval);
    bad_input_ok("dim_poll_done.null");
    with_cq(16, false, |_, cq, _| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(poll_done(cq, 1, NEXT_COMP), einval);
        kassert_eq!(counters(cq), Counters::default());
        bad_input_ok("dim_poll_done.no_handler");
        Ok(())
    })?;
    with_cq(16, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(force_profile(cq, 4), Some(false));
        for flags in [0, SOLICITED | NEXT_COMP, MISSED, 8, NEXT_COMP | 0x100] {
            kassert_eq!(poll_done(cq, 1, flags), einval, "flags {:#x}", flags);
        }
        kassert_eq!(counters(cq), Counters::default());
        bad_input_ok("dim_poll_done.bad_flags");
        // SAFETY: Attached above; nobody samples or arms it meanwhile.
        unsafe { ibext_dim_detach(cq) };
        unattached_rearm_warns_and_arms(dev, cq, events, || poll_done(cq, 0, NEXT_COMP))?;
        bad_input_ok("dim_poll_done.not_attached");
        Ok(())
    })
}

/// [`soft_moderation_exactly_once`], each run ending in `ibext_dim_poll_done()`.
fn soft_moderation_exactly_once_poll_done() -> TestResult {
    with_one_call(soft_moderation_exactly_once)
}

/// [`software_choice_follows_what_deferrals_find`], the ULP's runs ending in
/// `ibext_dim_poll_done()`: one call chooses as the two do.
fn software_choice_with_poll_done() -> TestResult {
    with_one_call(software_choice_follows_what_deferrals_find)
}

/// A deferred pass loses nothing and raises no event twice: while it waits the CQ is not
/// armed, so the device raises nothing for what arrives; when its time comes ibext calls the
/// handler once, without arming. The pass that call starts decides: one that found fewer than
/// the profile's completions defers again, one that found nothing arms the CQ, so the device
/// raises the next event itself. Arms deferred together become one; detaching with one pending
/// arms the widest asked (a solicited-only arm joined by a next-completion arm reports an
/// unsolicited completion) and raises the event of what is waiting at once.
fn deferred_pass_raises_once_without_arming() -> TestResult {
    let _held = HeldDeferrals::new();
    with_cq(16, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        // rxe has no modify_cq: profile 5 (16 usec or 8 completions) is applied in software.
        kassert_eq!(force_profile(cq, 5), Some(false));
        // Two receives and two sends: four completions per round on `cq`.
        let mut lb = Loopback::new(dev.device(), 2, &[(cq, cq)])?;
        let ready = || {
            // SAFETY: `cq` is live.
            unsafe { bindings::ibext_test_peek_cq(cq, 4) >= 4 }
        };

        // Completions arrive while the pass waits; running it calls the handler once.
        kassert_eq!(arm(cq, NEXT_COMP), 0);
        kassert_eq!(counters(cq).deferred_arms, 1);
        let e0 = events.load(Ordering::Acquire);
        let (mut phase, mut quiet, mut expired, mut found) = (0, false, false, 0);
        let res = lb.round_polled(0, false, 20_000, &mut || {
            match phase {
                0 if ready() => {
                    // The CQ is not armed: the device raised nothing for them.
                    quiet = events.load(Ordering::Acquire) == e0;
                    expired = expire(cq);
                    phase = 1;
                }
                1 if events.load(Ordering::Acquire) > e0 => {
                    found = ulp_run(cq);
                    phase = 2;
                }
                2 => {
                    drain(cq, false);
                }
                _ => (),
            }
            msleep(1);
        });
        kassert!(res.is_ok(), "missed completions: {:?}", res);
        kassert!(expired);
        kassert!(quiet, "an event was raised for an unarmed CQ");
        kassert_eq!(found, 4);
        kassert_eq!(events.load(Ordering::Acquire), e0 + 1);
        kassert_eq!(counters(cq).raised, 1);
        // Four is fewer than the profile's eight: that pass deferred again.
        kassert_eq!(counters(cq).deferred_arms, 2);

        // That pass ends in a handler call too; finding nothing, the ULP's run arms the CQ,
        // and the device raises the next event itself.
        kassert!(expire(cq));
        kassert_eq!(events.load(Ordering::Acquire), e0 + 2);
        kassert_eq!(ulp_run(cq), 0);
        kassert_eq!(counters(cq).deferred_arms, 2);
        let e1 = events.load(Ordering::Acquire);
        let res = round_drained_on_events(&mut lb, 1, true, cq, events, e1, true);
        kassert!(res.is_ok(), "armed after a quiet pass: {:?}", res);
        kassert_eq!(events.load(Ordering::Acquire), e1 + 1);
        kassert_eq!(counters(cq).raised, 2);

        // Two arms deferred together, then detached with completions waiting: the
        // solicited-only one joined by a next-completion one is armed as the latter, so the
        // (unsolicited) completions raise their event at once.
        // SAFETY: Attached; one sampler.
        unsafe { ibext_dim_sample(cq, 1) };
        kassert_eq!(arm(cq, SOLICITED), 0);
        kassert_eq!(arm(cq, NEXT_COMP | MISSED), 0);
        kassert_eq!(counters(cq).deferred_arms, 4);
        let e2 = events.load(Ordering::Acquire);
        let (mut phase, mut quiet) = (0, false);
        let res = lb.round_polled(2, false, 20_000, &mut || {
            if phase == 0 && ready() {
                quiet = events.load(Ordering::Acquire) == e2;
                // SAFETY: Attached; nobody samples or arms it meanwhile.
                unsafe { ibext_dim_detach(cq) };
                phase = 1;
            } else if phase == 1 && events.load(Ordering::Acquire) > e2 {
                drain(cq, false);
            }
            msleep(1);
        });
        kassert!(res.is_ok(), "detach with joined arms pending: {:?}", res);
        kassert!(quiet, "an event was raised for an unarmed CQ");
        kassert_eq!(events.load(Ordering::Acquire), e2 + 1);
        Ok(())
    })
}

/// ibext's call at the end of a deferral counts as ibext's before the handler runs: a ULP run
/// inside that call (here the handler's own; a ULP's tasklet on another CPU may run as early)
/// that finds the CQ quiet arms it at once, instead of taking the call for the device's and
/// deferring again.
fn quiet_run_in_the_call_arms() -> TestResult {
    let _held = HeldDeferrals::new();
    with_cq(16, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(force_profile(cq, 5), Some(false));
        let mut lb = Loopback::new(dev.device(), 2, &[(cq, cq)])?;
        kassert_eq!(arm(cq, NEXT_COMP), 0);
        kassert_eq!(counters(cq).deferred_arms, 1);
        RUN_IN_HANDLER.store(true, Ordering::Release);
        let expired = expire(cq);
        RUN_IN_HANDLER.store(false, Ordering::Release);
        kassert!(expired);
        kassert_eq!(events.load(Ordering::Acquire), 1);
        kassert_eq!(counters(cq).raised, 1);
        // The run in the call found nothing and armed the CQ: no second deferral.
        kassert_eq!(counters(cq).deferred_arms, 1);
        // Armed for real: the device raises the next completions' event itself.
        let res = round_drained_on_events(&mut lb, 0, false, cq, events, 1, false);
        kassert!(res.is_ok(), "armed by the run in the call: {:?}", res);
        kassert_eq!(events.load(Ordering::Acquire), 2);
        kassert_eq!(counters(cq).raised, 1);
        Ok(())
    })
}

/// A legacy ULP on software moderation, as RDS runs: on each event it polls, samples, re-arms
/// with `ibext_dim_arm()` and polls again. At the highest profile (32 usec, forced), passes are
/// deferred by the real timer, and every completion of 8 checked rounds still arrives exactly
/// once.
fn soft_moderation_exactly_once() -> TestResult {
    const QPS: usize = 4;
    const DEPTH: usize = 16;
    with_cq((4 * QPS * DEPTH) as u32, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        kassert_eq!(force_profile(cq, 8), Some(false));
        let mut lb = Loopback::new(dev.device(), DEPTH, &[(cq, cq); QPS])?;
        let (d0, a0, w0) = legacy_dim::totals();
        // The loop reacts to every handler call after this read, including the one that ends
        // the first deferral: that one comes at once here, as it may come on its own (a slow
        // guest; the debug kernel once) before the loop starts, and it is the only call the
        // CQ will get, since a deferred pass leaves the CQ unarmed.
        let mut handled = events.load(Ordering::Acquire);
        kassert_eq!(arm(cq, NEXT_COMP), 0);
        kassert!(expire(cq));
        let mut polls = 0u64;
        for round in 0..8u32 {
            let res = lb.round_polled(round, round % 2 == 1, 20_000, &mut || {
                let now = events.load(Ordering::Acquire);
                if now != handled {
                    handled = now;
                    ulp_run(cq);
                    polls += 1;
                }
                msleep(1);
            });
            kassert!(res.is_ok(), "round {}: {:?}", round, res);
        }
        drop(lb);
        let c = counters(cq);
        kassert!(c.deferred_arms > 0);
        // The debugfs totals count every timer started, at least 1 us asked each (profile 1 or
        // more), and each timer's wait, never shorter than asked, except the first deferral's
        // (ended at once above) and perhaps a last one still pending: at most 32 us each.
        let (d1, a1, w1) = legacy_dim::totals();
        kassert!(d1 > d0 && a1 - a0 >= d1 - d0, "{} {} {} {}", d0, d1, a0, a1);
        kassert!(
            w1 - w0 + 64 >= a1 - a0,
            "waited {} us for {} asked",
            w1 - w0,
            a1 - a0
        );
        pr_info!(
            "dim_arm: 8 rounds, {} completions: {} events, {} ULP runs, {} deferred passes, {} raised by ibext\n",
            8 * 2 * QPS * DEPTH,
            events.load(Ordering::Acquire),
            polls,
            c.deferred_arms,
            c.raised
        );
        Ok(())
    })
}

/// On rxe, software chooses the profile by what its deferrals find (`policy::soft_dim`), not
/// lib/dim: a new CQ starts at profile 0 and tries the highest after one window of runs;
/// the first `MIN_RAISED` deferrals whose runs find the CQ empty (depth 1: the peer waits for
/// the reply) turn it off at once, until a back-off of one window has passed; deferrals whose
/// runs find completions waiting keep it on; deferrals whose runs find one completion each
/// double its period. Every deferred pass is ended by the test. The completions are real ones,
/// but for the last window's, which are the counts the ULP reports.
fn software_choice_follows_what_deferrals_find() -> TestResult {
    use crate::policy::{
        profiles,
        soft_dim::{MIN_RAISED, ON_PROFILE, WINDOW},
    };
    let _held = HeldDeferrals::new();
    with_cq(16, true, |dev, cq, events| {
        // SAFETY: Our live CQ.
        kassert_eq!(unsafe { ibext_dim_attach(cq) }, 0);
        let prof = || {
            // SAFETY: `cq` is our live CQ.
            legacy_dim::profile(unsafe { UlpCq::from_raw(cq) }).ok()
        };
        let top = profiles::profile(ON_PROFILE);
        let (top, zero) = (Some((top.usec, top.comps)), Some((1, 1)));
        let runs = u64::from(WINDOW);

        // A window of runs at profile 0, each arming at once; the window's last sample turns
        // on the highest profile.
        let last_of_window = || {
            kassert_eq!(prof(), zero);
            // SAFETY: Attached; one sampler.
            unsafe { ibext_dim_sample(cq, 0) };
            kassert_eq!(prof(), top);
            Ok(())
        };
        for _ in 0..WINDOW - 1 {
            kassert_eq!(ulp_run(cq), 0);
        }
        kassert_eq!(counters(cq).deferred_arms, 0);
        last_of_window()?;

        // Depth 1: the run that handled the reply defers; ibext's call then finds nothing
        // (and arms the CQ). The window's first MIN_RAISED deferred runs of that turn
        // moderation off at once.
        for i in 0..MIN_RAISED {
            kassert_eq!(prof(), top, "deferral {}", i);
            // SAFETY: Attached; one sampler.
            unsafe { ibext_dim_sample(cq, 1) };
            kassert_eq!(arm(cq, NEXT_COMP), 0);
            kassert!(expire(cq));
            kassert_eq!(ulp_run(cq), 0);
        }
        let tried = u64::from(MIN_RAISED);
        kassert_eq!(prof(), zero);
        kassert_eq!(counters(cq).deferred_arms, tried);
        kassert_eq!(counters(cq).raised, tried);
        // A window of back-off, each run arming at once.
        for _ in 0..WINDOW - 1 {
            kassert_eq!(ulp_run(cq), 0);
        }
        kassert_eq!(counters(cq).deferred_arms, tried);
        last_of_window()?;

        // Load: completions wait for every deferred pass (four a round); a window of that
        // keeps moderation on. The CQ is armed (the last run above was at profile 0): the
        // device raises the first round's event, and its run defers; from then on the only
        // events are ibext's, one a round.
        let mut lb = Loopback::new(dev.device(), 2, &[(cq, cq)])?;
        let ready = || {
            // SAFETY: `cq` is live.
            unsafe { bindings::ibext_test_peek_cq(cq, 4) >= 4 }
        };
        let e0 = events.load(Ordering::Acquire);
        for round in 0..u32::from(WINDOW) {
            let (mut done, mut expired, mut found) = (false, round == 0, 0);
            let res = lb.round_polled(round, false, 20_000, &mut || {
                if !done && ready() && (round > 0 || events.load(Ordering::Acquire) > e0) {
                    if round > 0 {
                        expired = expire(cq);
                    }
                    found = ulp_run(cq);
                    done = true;
                }
                msleep(1);
            });
            kassert!(res.is_ok(), "round {}: {:?}", round, res);
            kassert!(expired, "round {}", round);
            kassert_eq!(found, 4, "round {}", round);
            kassert_eq!(prof(), top, "round {}", round);
        }
        kassert_eq!(events.load(Ordering::Acquire), e0 + u32::from(WINDOW));
        kassert_eq!(counters(cq).raised, tried + runs - 1);
        kassert_eq!(counters(cq).deferred_arms, tried + runs);
        drop(lb);

        // Slower arrivals: a window of deferred runs that find one completion each (what the
        // ULP reports; the CQ is empty) doubles the period. The last round's arm deferred.
        for i in 0..WINDOW {
            kassert!(expire(cq), "run {}", i);
            // SAFETY: Attached; one sampler.
            unsafe { ibext_dim_sample(cq, 1) };
            kassert_eq!(arm(cq, NEXT_COMP), 0, "run {}", i);
        }
        let slow = profiles::profile(ON_PROFILE);
        kassert_eq!(prof(), Some((2 * slow.usec, slow.comps)));
        // Then ibext's call finds nothing, and the CQ is armed.
        kassert!(expire(cq));
        kassert_eq!(ulp_run(cq), 0);
        kassert_eq!(counters(cq).deferred_arms, tried + 2 * runs);
        Ok(())
    })
}

kunit_suite!(
    ibext_dim_arm,
    [
        arm_bad_input,
        arms_at_once_at_profile_zero,
        full_run_arms_at_once,
        deferred_pass_raises_once_without_arming,
        quiet_run_in_the_call_arms,
        soft_moderation_exactly_once,
        software_choice_follows_what_deferrals_find,
        poll_done_bad_input,
        soft_moderation_exactly_once_poll_done,
        software_choice_with_poll_done,
    ]
);
