// SPDX-License-Identifier: GPL-2.0

//! `ibext_bench`: side-by-side benchmarks in one boot (`make bench`; not part of `make check`).
//!
//! Every case prints one line `ibext-bench: {json}`; the harness collects them into a results
//! file. TCG makes absolute numbers meaningless: compare setups within one run.
//!
//! CQ pool workload: `qps` loopback RC QPs on rxe0, each keeping `depth` sends outstanding
//! until `ops` sends completed in all ([`Stream`]).
//! Setups, all polled in softirq context:
//!
//! - `per_qp`: one CQ per QP from `ib_alloc_cq` (send and receive share it);
//! - `upstream_pool`: `ib_cq_pool_get`, one request per QP for its send and receive entries;
//! - `ibext_pool`: `ibext_cq_pool_get` (through [`CqEntries`]), the same requests.
//!
//! Completion events of ib_core's own CQs are counted by a tap: the CQ's `comp_handler` is
//! swapped for one that counts and then calls ib_core's handler, and restored afterwards.
//! ibext's CQs count their events themselves.

use crate::engine::CqStat;
use crate::tests::fixtures::guest::cqp;
mod drain;
mod gid;
mod srq;

use crate::tests::fixtures::{
    guest::DeviceRef,
    stream::{now_ns, Stream},
    REPS,
};
use crate::{
    api::{self, CqEntries},
    bindings,
    engine::PollCtx,
    kunit::{kassert, kunit_suite, Failed, TestResult},
    policy::{cq_pool::AGE_MS, moderation::Moderation},
    tests::hooks::{AGING_OFF, AGING_SHIFT_MS},
};
use core::sync::atomic::{AtomicU64, Ordering};
use drain::cq_drain_bench;
use gid::gid_bench;
use kernel::{c_str, prelude::*};
use srq::srq_bench;

/// Counts completion events of ib_core CQs, then hands them to ib_core's handler.
struct Tap {
    events: AtomicU64,
    orig: bindings::ib_comp_handler,
}

/// # Safety
///
/// Installed only as `comp_handler` of a CQ whose `cq_context` is a live [`Tap`].
unsafe extern "C" fn tap_handler(cq: *mut bindings::ib_cq, ctx: *mut core::ffi::c_void) {
    // SAFETY: `ctx` is the tap (installation contract), alive until the handler is restored.
    let tap = unsafe { &*ctx.cast::<Tap>() };
    tap.events.fetch_add(1, Ordering::Relaxed);
    if let Some(orig) = tap.orig {
        // SAFETY: ib_core's softirq handler ignores its context argument.
        unsafe { orig(cq, core::ptr::null_mut()) };
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Setup {
    /// One CQ per QP from `ib_alloc_cq`, softirq.
    PerQp,
    /// Upstream `ib_cq_pool_get`, softirq.
    UpstreamPool,
    /// ibext's pool in a poll context and moderation mode.
    Ibext(PollCtx, Moderation),
    /// The same with aging switched off (`hooks::AGING_OFF`), as before aging existed.
    IbextAgingOff(PollCtx, Moderation),
}

impl Setup {
    /// The poll context and moderation of an ibext setup.
    fn ibext(self) -> Option<(PollCtx, Moderation)> {
        match self {
            Setup::Ibext(c, m) | Setup::IbextAgingOff(c, m) => Some((c, m)),
            _ => None,
        }
    }
}

/// The CQs of one case, whoever made them; gives them back when dropped.
struct Cqs {
    setup: Setup,
    per_qp: KVec<*mut bindings::ib_cq>,
    /// ib_core CQs whose handler is swapped for the tap.
    tapped: KVec<*mut bindings::ib_cq>,
    ibext: KVec<CqEntries>,
    nr_cqe: u32,
    tap: KBox<Tap>,
}

impl Cqs {
    fn new(dev: &crate::ib::Device, setup: Setup, qps: usize, nr_cqe: u32) -> Result<Self> {
        let mut c = Cqs {
            setup,
            per_qp: KVec::with_capacity(qps, GFP_KERNEL)?,
            tapped: KVec::with_capacity(qps, GFP_KERNEL)?,
            ibext: KVec::with_capacity(qps, GFP_KERNEL)?,
            nr_cqe,
            tap: KBox::new(
                Tap {
                    events: AtomicU64::new(0),
                    orig: None,
                },
                GFP_KERNEL,
            )?,
        };
        let vectors = dev.usable_comp_vectors();
        for i in 0..qps {
            let cq = match setup {
                Setup::Ibext(ctx, mode) | Setup::IbextAgingOff(ctx, mode) => {
                    let p = CqEntries::get(dev, nr_cqe, i as i32, ctx, mode)?;
                    let raw = p.as_raw();
                    c.ibext.push(p, GFP_KERNEL)?;
                    raw
                }
                Setup::PerQp => {
                    // SAFETY: `dev` is registered; the name is a static C string.
                    let cq = kernel::error::from_err_ptr(unsafe {
                        bindings::__ib_alloc_cq(
                            dev.as_raw(),
                            core::ptr::null_mut(),
                            nr_cqe as i32,
                            (i as u32 % vectors) as i32,
                            bindings::ib_poll_context_IB_POLL_SOFTIRQ,
                            c"ibext_bench".as_ptr().cast(),
                        )
                    })?;
                    c.per_qp.push(cq, GFP_KERNEL)?;
                    cq
                }
                Setup::UpstreamPool => {
                    // SAFETY: As above.
                    let cq = kernel::error::from_err_ptr(unsafe {
                        bindings::ib_cq_pool_get(
                            dev.as_raw(),
                            nr_cqe,
                            i as i32,
                            bindings::ib_poll_context_IB_POLL_SOFTIRQ,
                        )
                    })?;
                    c.per_qp.push(cq, GFP_KERNEL)?;
                    cq
                }
            };
            if matches!(setup, Setup::PerQp | Setup::UpstreamPool) && !c.tapped.contains(&cq) {
                // Within the capacity reserved above: no allocation.
                c.tapped.push(cq, GFP_KERNEL)?;
                c.install_tap(cq);
            }
        }
        Ok(c)
    }

    fn install_tap(&mut self, cq: *mut bindings::ib_cq) {
        let tap: *mut Tap = &mut *self.tap;
        // SAFETY: The CQ has no QP yet, so no completion runs its handler concurrently; the
        // tap outlives the swap (restored in `drop`). All ib_core softirq CQs share one handler.
        unsafe {
            (*tap).orig = (*cq).comp_handler;
            (*cq).cq_context = tap.cast();
            (*cq).comp_handler = Some(tap_handler);
        }
    }

    fn cq(&self, i: usize) -> *mut bindings::ib_cq {
        match self.setup.ibext() {
            Some(_) => self.ibext[i].as_raw(),
            None => self.per_qp[i],
        }
    }

    /// Distinct CQs and their entries.
    fn distinct(&self, qps: usize) -> Result<(KVec<*mut bindings::ib_cq>, u64)> {
        let d = crate::tests::fixtures::guest::distinct_cqs((0..qps).map(|i| self.cq(i)))?;
        // SAFETY: The CQs are alive while `self` holds them.
        let cqe = d.iter().map(|&cq| unsafe { (*cq).cqe } as u64).sum();
        Ok((d, cqe))
    }
}

impl Drop for Cqs {
    fn drop(&mut self) {
        for &cq in self.tapped.iter() {
            // SAFETY: Every QP on the CQ is destroyed, so no handler runs; restore ib_core's.
            unsafe {
                (*cq).comp_handler = self.tap.orig;
                (*cq).cq_context = core::ptr::null_mut();
            }
        }
        for &cq in self.per_qp.iter() {
            // SAFETY: Every QP on the CQ is destroyed and ib_core's handler is back.
            unsafe {
                match self.setup {
                    Setup::PerQp => bindings::ib_free_cq(cq),
                    _ => bindings::ib_cq_pool_put(cq, self.nr_cqe),
                }
            }
        }
    }
}

/// Results of one case.
struct Outcome {
    ops_per_s: u64,
    events_per_1k_x10: u64,
    lat_mean_ns: u64,
    lat_p99_ns: u64,
    cqs: usize,
    cqe_allocated: u64,
    /// ibext's CQs: the highest DIM profile at the end, deferred polls, mode switches.
    max_profile: u8,
    deferred_polls: u64,
    mode_switches: u64,
    /// DIM profile changes during the case.
    profile_changes: u64,
    /// Software moderation: tenths of a microsecond the timer was asked for and waited, per
    /// deferred poll.
    defer_asked_us_x10: u64,
    defer_waited_us_x10: u64,
}

fn run_case(dev: &DeviceRef, setup: Setup, qps: usize, depth: usize, ops: u64) -> Result<Outcome> {
    let d = dev.device();
    let state = crate::device::device_state(d).ok_or(ENODEV)?;
    AGING_OFF.store(matches!(setup, Setup::IbextAgingOff(..)), Ordering::Relaxed);
    // Send and receive completions share the QP's CQ: `depth` sends, `2 * depth` receives.
    let nr_cqe = 3 * depth as u32;
    let cqs = Cqs::new(d, setup, qps, nr_cqe)?;
    let (distinct, cqe_allocated) = cqs.distinct(qps)?;
    let mut per_qp = KVec::with_capacity(qps, GFP_KERNEL)?;
    for i in 0..qps {
        per_qp.push(cqs.cq(i), GFP_KERNEL)?;
    }
    // Totals over this case's CQs: events, deferred polls, mode switches, highest profile,
    // profile changes.
    let totals = |cqs: &Cqs| -> (u64, u64, u64, u8, u64, u64, u64) {
        let mut t = (0, 0, 0, 0, 0, 0, 0);
        for info in distinct
            .iter()
            .filter_map(|&cq| cqp(cq).and_then(|c| state.cq_pools().info(c)))
        {
            t.0 += info.get(CqStat::Events);
            t.1 += info.get(CqStat::DeferredPolls);
            t.2 += info.get(CqStat::ModeSwitches);
            t.3 = t.3.max(info.get(CqStat::ProfileMax) as u8);
            t.4 += info.get(CqStat::ProfileChanges);
            t.5 += info.get(CqStat::DeferredAskedUs);
            t.6 += info.get(CqStat::DeferredWaitedUs);
        }
        if setup.ibext().is_none() {
            t.0 = cqs.tap.events.load(Ordering::Acquire);
        }
        t
    };

    let stream = Stream::new(d, &per_qp, depth, Some(ops), ops as usize)?;
    let t0 = totals(&cqs);
    let start = now_ns();
    stream.go()?;
    let done = stream.wait_sends(ops, 120_000);
    // Up to the last send's completion, not to the waiter's wake-up (`msleep`'s tick).
    let elapsed = stream.run().last_done_ns().saturating_sub(start).max(1);
    let t1 = totals(&cqs);
    let ev = t1.0 - t0.0;
    let completions = stream.run().completions();
    // The QPs go before the CQs they use.
    let mut stream = stream.stop()?;
    done?;
    drop(cqs);
    let lat = stream.latencies();
    sort_u64(lat);
    let n = lat.len();
    let mean = if n > 0 {
        lat.iter().sum::<u64>() / n as u64
    } else {
        0
    };
    let p99 = if n > 0 {
        lat[(n * 99 / 100).min(n - 1)]
    } else {
        0
    };
    Ok(Outcome {
        ops_per_s: ops.saturating_mul(1_000_000_000) / elapsed,
        events_per_1k_x10: ev * 10_000 / completions.max(1),
        lat_mean_ns: mean,
        lat_p99_ns: p99,
        cqs: distinct.len(),
        cqe_allocated,
        max_profile: t1.3,
        deferred_polls: t1.1 - t0.1,
        mode_switches: t1.2 - t0.2,
        profile_changes: t1.4 - t0.4,
        defer_asked_us_x10: (t1.5 - t0.5) * 10 / (t1.1 - t0.1).max(1),
        defer_waited_us_x10: (t1.6 - t0.6) * 10 / (t1.1 - t0.1).max(1),
    })
}

/// Sorts with the kernel's `sort()` (core's sort pulls in code objtool cannot follow).
fn sort_u64(v: &mut [u64]) {
    /// # Safety
    ///
    /// `a` and `b` point to `u64`s.
    unsafe extern "C" fn cmp(a: *const core::ffi::c_void, b: *const core::ffi::c_void) -> i32 {
        // SAFETY: `sort` passes pointers to two elements of the `u64` slice.
        let (a, b) = unsafe { (*a.cast::<u64>(), *b.cast::<u64>()) };
        a.cmp(&b) as i32
    }
    // SAFETY: `v` is a valid slice of `u64`; `cmp` matches its element type; no swap function
    // means the generic one.
    unsafe { bindings::sort(v.as_mut_ptr().cast(), v.len(), 8, Some(cmp), None) };
}

/// One point of a benchmark: `qps` QPs at `depth`, until `ops` sends completed.
struct Point<'a> {
    bench: &'a str,
    qps: usize,
    depth: usize,
    ops: u64,
}

/// Prints repetition `rep` of setup `label` at `p`, the `order`th setup of its repetition.
fn emit(p: &Point<'_>, label: &str, rep: usize, order: usize, o: &Outcome) {
    let ev = o.events_per_1k_x10;
    pr_info!(
        "ibext-bench: {{\"bench\":\"{}\",\"setup\":\"{}\",\"qps\":{},\"depth\":{},\"ops\":{},\"rep\":{},\"order\":{},\"ops_per_s\":{},\"events_per_1k_completions\":{}.{},\"lat_mean_ns\":{},\"lat_p99_ns\":{},\"cqs\":{},\"cqe_allocated\":{},\"max_profile\":{},\"deferred_polls\":{},\"mode_switches\":{},\"profile_changes\":{},\"defer_asked_us\":{}.{},\"defer_waited_us\":{}.{}}}\n",
        p.bench,
        label,
        p.qps,
        p.depth,
        p.ops,
        rep,
        order,
        o.ops_per_s,
        ev / 10,
        ev % 10,
        o.lat_mean_ns,
        o.lat_p99_ns,
        o.cqs,
        o.cqe_allocated,
        o.max_profile,
        o.deferred_polls,
        o.mode_switches,
        o.profile_changes,
        o.defer_asked_us_x10 / 10,
        o.defer_asked_us_x10 % 10,
        o.defer_waited_us_x10 / 10,
        o.defer_waited_us_x10 % 10
    );
}

/// Runs `setups` side by side at (`qps`, `depth`), [`REPS`] times with their order rotated,
/// and prints every run as it ends.
fn compare(
    dev: &DeviceRef,
    bench: &str,
    setups: &[(Setup, &str)],
    qps: usize,
    depth: usize,
    ops: u64,
) -> TestResult {
    let n = setups.len();
    let point = Point {
        bench,
        qps,
        depth,
        ops,
    };
    for rep in 0..REPS {
        for j in 0..n {
            let (setup, label) = setups[(rep + j) % n];
            let r = run_case(dev, setup, qps, depth, ops);
            kassert!(
                r.is_ok(),
                "{} qps {} depth {}: {:?}",
                label,
                qps,
                depth,
                r.as_ref().err()
            );
            emit(&point, label, rep, j, &r.map_err(|_| Failed)?);
        }
    }
    Ok(())
}

/// Issues 4 and 17: one CQ per QP, upstream's pool, ibext's pool with the moderation
/// `ibext_cq_pool_get()` gives (upstream's: none on rxe), and ibext's pool with DIM.
fn cq_pool_bench() -> TestResult {
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    // Aging as in the product module (the real clock), whatever ran before.
    AGING_SHIFT_MS.store(0, Ordering::Release);
    let setups = [
        (Setup::PerQp, "per_qp"),
        (Setup::UpstreamPool, "upstream_pool"),
        (
            Setup::Ibext(PollCtx::Softirq, api::default_moderation(dev.device())),
            "ibext_pool",
        ),
        (
            Setup::Ibext(PollCtx::Softirq, Moderation::Dim),
            "ibext_pool_dim",
        ),
    ];
    for qps in [4usize, 16, 64] {
        for depth in [1usize, 8, 32] {
            compare(&dev, "cq_pool", &setups, qps, depth, 12_800)?;
        }
    }
    Ok(())
}

/// The CQs and entries that pooled CQs of `setup` (softirq) occupy on `dev` now: upstream's
/// pool list, or every ibext pool.
fn resident(dev: &crate::ib::Device, setup: Setup) -> Result<(u32, u64)> {
    if setup.ibext().is_some() {
        let state = crate::device::device_state(dev).ok_or(ENODEV)?;
        let (n, e) = state.cq_pools().resident();
        return Ok((n as u32, e));
    }
    let (mut n, mut e) = (0u32, 0u64);
    // SAFETY: `dev` is registered; the helper takes ib_core's pool lock.
    unsafe {
        bindings::ibext_test_upstream_pool_resident(
            dev.as_raw(),
            bindings::ib_poll_context_IB_POLL_SOFTIRQ,
            &mut n,
            &mut e,
        )
    };
    Ok((n, e))
}

/// A burst of `qps` connections on pooled CQs of `setup`: each takes `nr_cqe` entries, runs a
/// little traffic, and goes. Returns what the pool occupied at the burst's peak.
fn burst(dev: &DeviceRef, setup: Setup, qps: usize, nr_cqe: u32) -> Result<(u32, u64)> {
    const DEPTH: usize = 4;
    let d = dev.device();
    let cqs = Cqs::new(d, setup, qps, nr_cqe)?;
    let peak = resident(d, setup)?;
    let mut per_qp = KVec::with_capacity(qps, GFP_KERNEL)?;
    for i in 0..qps {
        per_qp.push(cqs.cq(i), GFP_KERNEL)?;
    }
    let ops = (qps * DEPTH * 4) as u64;
    let stream = Stream::new(d, &per_qp, DEPTH, Some(ops), ops as usize)?;
    stream.go()?;
    let done = stream.wait_sends(ops, 120_000);
    // The QPs go before the CQs they use.
    drop(stream.stop()?);
    done?;
    drop(cqs);
    Ok(peak)
}

/// Aging: the CQs a pool keeps after a burst of 64 connections (1024 entries each, as a
/// queue of 256 commands with its send, receive and spare entries) has come and gone. ibext's
/// pool is measured once its aging work has run, on the guest's real clock, a period after the
/// last put; upstream's pool never gives anything back. The `floor` row is the least ibext may
/// keep: one CQ per vector of the pool the burst used.
///
/// Each repetition waits out a 60 s aging period, and 6.12's KUnit stops a case after 300 s
/// (`kunit_test_timeout`, lib/kunit/try-catch.c): the repetitions are split over two cases.
fn cq_aging_bench() -> TestResult {
    aging_reps(0..3)
}

/// The rest of [`cq_aging_bench`]'s repetitions.
fn cq_aging_more_bench() -> TestResult {
    aging_reps(3..REPS)
}

/// Repetitions `reps` of [`cq_aging_bench`].
fn aging_reps(reps: core::ops::Range<usize>) -> TestResult {
    const QPS: usize = 64;
    const NR_CQE: u32 = 1024;
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    let d = dev.device();
    let state = crate::device::device_state(d).ok_or(Failed)?;
    // The real clock: the aging work runs as in the product module.
    AGING_SHIFT_MS.store(0, Ordering::Release);
    let setups = [
        (Setup::UpstreamPool, "upstream_pool"),
        (
            Setup::Ibext(PollCtx::Softirq, api::default_moderation(d)),
            "ibext_pool",
        ),
    ];
    for rep in reps {
        for j in 0..setups.len() {
            let (setup, label) = setups[(rep + j) % setups.len()];
            let aged = state.cq_pools().aged();
            let peak = burst(&dev, setup, QPS, NR_CQE);
            kassert!(peak.is_ok(), "{}: burst failed: {:?}", label, peak);
            let peak = peak.map_err(|_| Failed)?;
            if setup.ibext().is_some() {
                kassert!(
                    state.cq_pools().aging_pending(),
                    "no aging queued after the burst"
                );
                // The work was queued at the burst's first idle CQ; it runs a period later and
                // again for CQs idle a little later than that one.
                let pools = state.cq_pools();
                let ran = crate::tests::fixtures::guest::wait_for(AGE_MS as u32 + 10_000, || {
                    pools.aged() > aged && !pools.aging_pending()
                });
                kassert!(ran, "the aging work did not run within a period");
            }
            let after = resident(d, setup).map_err(|_| Failed)?;
            emit_aging(label, rep, j, peak, after);
        }
        let v = state.comp_vectors();
        emit_aging("floor", rep, setups.len(), (v, 0), (v, 0));
    }
    Ok(())
}

/// Aging's cost: ops/s of the CQ pool bench with aging as shipped against aging off, at three
/// points.
fn cq_aging_ops_bench() -> TestResult {
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    let d = dev.device();
    AGING_SHIFT_MS.store(0, Ordering::Release);
    let mode = api::default_moderation(d);
    let ops_setups = [
        (Setup::Ibext(PollCtx::Softirq, mode), "ibext_pool"),
        (
            Setup::IbextAgingOff(PollCtx::Softirq, mode),
            "ibext_pool_aging_off",
        ),
    ];
    for (qps, depth) in [(4usize, 1usize), (16, 8), (64, 32)] {
        compare(&dev, "cq_aging_ops", &ops_setups, qps, depth, 12_800)?;
    }
    AGING_OFF.store(false, Ordering::Relaxed);
    Ok(())
}

fn emit_aging(label: &str, rep: usize, order: usize, peak: (u32, u64), after: (u32, u64)) {
    pr_info!(
        "ibext-bench: {{\"bench\":\"cq_aging\",\"setup\":\"{}\",\"qps\":64,\"nr_cqe\":1024,\"rep\":{},\"order\":{},\"peak_cqs\":{},\"peak_cqe\":{},\"resident_cqs\":{},\"resident_cqe\":{}}}\n",
        label, rep, order, peak.0, peak.1, after.0, after.1
    );
}

/// Moderation: the modes of ibext's pool: true depth 1 (one QP, one send in flight), then
/// 16 QPs at depths 1 to 128.
fn dim_bench() -> TestResult {
    let dev = crate::tests::fixtures::guest::required(c_str!("rxe0"))?;
    let setups = [
        (
            Setup::Ibext(PollCtx::Softirq, Moderation::None),
            "none_softirq",
        ),
        (
            Setup::Ibext(PollCtx::Workqueue, Moderation::None),
            "none_workqueue",
        ),
        (Setup::Ibext(PollCtx::Softirq, Moderation::Dim), "dim"),
        (
            Setup::Ibext(PollCtx::Softirq, Moderation::Adaptive),
            "adaptive",
        ),
        // Not one of the fixed modes' setups: the adaptive mode in the context of the fastest fixed
        // mode at low depth on rxe, to tell the context's share from the policy's.
        (
            Setup::Ibext(PollCtx::Workqueue, Moderation::Adaptive),
            "adaptive_workqueue",
        ),
    ];
    compare(&dev, "dim", &setups, 1, 1, 6_400)?;
    for depth in [1usize, 8, 32, 128] {
        compare(&dev, "dim", &setups, 16, depth, 12_800)?;
    }
    Ok(())
}

kunit_suite!(
    ibext_bench,
    [
        cq_aging_bench,
        cq_aging_more_bench,
        cq_aging_ops_bench,
        cq_pool_bench,
        cq_drain_bench,
        dim_bench,
        gid_bench,
        srq_bench
    ],
    slow
);
