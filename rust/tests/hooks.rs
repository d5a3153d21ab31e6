// SPDX-License-Identifier: GPL-2.0

//! Test-only hooks that product code calls through `ib::fault_point` and `ib::park_point`,
//! compiled into the KUnit flavour only.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use kernel::{prelude::*, time::Ktime};

/// Fault injection: the `n`-th fault point reached after this is set fails with `-ENOMEM`
/// (0: none).
pub(crate) static FAIL_AT: AtomicU32 = AtomicU32::new(0);

/// A step of making an object that can fail: counts down [`FAIL_AT`], failing at 1.
pub(crate) fn fault_point() -> Result {
    let n = FAIL_AT.load(Ordering::Relaxed);
    if n > 0 {
        FAIL_AT.store(n - 1, Ordering::Relaxed);
        if n == 1 {
            return Err(ENOMEM);
        }
    }
    Ok(())
}

/// Aging's clock, in the KUnit flavour: the real time plus this many milliseconds.
///
/// While it is `u64::MAX` (the default) the aging work does nothing when it runs: the other
/// suites count pooled CQs, and a pass 60 s after some put must not change the count under
/// them. `ibext_elastic` sets a shift to run the real work as if a period had passed, and
/// calls the pass itself for the rest; the benchmarks set 0.
pub(crate) static AGING_SHIFT_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Returns the time aging's work runs at, or `None` while the tests hold it (see
/// [`AGING_SHIFT_MS`]).
pub(crate) fn aging_now(now_ms: u64) -> Option<u64> {
    match AGING_SHIFT_MS.load(Ordering::Acquire) {
        u64::MAX => None,
        shift => Some(now_ms + shift),
    }
}

/// The deferral of legacy re-arms that are deferred at all (`seams::legacy_defer_us`), in
/// microseconds; 0 (the default) keeps the profile's. `ibext_dim_arm` sets an hour, so that a
/// deferred pass waits for the test to run it.
pub(crate) static LEGACY_DEFER_US: AtomicU32 = AtomicU32::new(0);

/// Returns the deferral of a legacy re-arm the profile defers by `usec` (see
/// [`LEGACY_DEFER_US`]).
pub(crate) fn legacy_defer_us(usec: u32) -> u32 {
    match LEGACY_DEFER_US.load(Ordering::Acquire) {
        0 => usec,
        _ if usec == 0 => 0,
        held => held,
    }
}

/// Aging switched off, as before it existed: puts queue no pass (the benchmarks' baseline).
pub(crate) static AGING_OFF: AtomicBool = AtomicBool::new(false);

/// Runs `f` with aging's clock one period ahead ([`AGING_SHIFT_MS`]), then holds aging again.
pub(crate) fn a_period_later(f: impl FnOnce()) {
    AGING_SHIFT_MS.store(crate::policy::cq_pool::AGE_MS, Ordering::Release);
    f();
    AGING_SHIFT_MS.store(u64::MAX, Ordering::Release);
}

/// The places where a test can hold one side of a race ([`park_point`]), and where teardown says
/// how far it got ([`reached`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Point {
    /// `CqPools::put`: a put has left a CQ idle and let go of the pool's lock.
    CqPutIdle = 1,
    /// A polled CQ's pass has left irq_poll's list (`irq_poll_complete`) and not yet re-armed,
    /// scheduled or deferred the next one.
    PassTail = 2,
    /// A managed receive buffer's completion handler, on entry.
    RecvDone = 3,
    /// Mark: a polled CQ's teardown has stopped its poller and is about to wait for the tail of
    /// a pass that was running.
    PollerStopped = 4,
    /// Mark: an SRQ pool's teardown is about to wait for the receive handlers in flight.
    SrqHandlersWait = 5,
    /// An SRQ's maintenance work, on entry (before it takes `phase`).
    SrqMaintain = 6,
}

/// The point armed to park (0: none), and the object it parks for (0: any).
static ARMED: AtomicU32 = AtomicU32::new(0);
static ARMED_OBJ: AtomicUsize = AtomicUsize::new(0);
/// The point a caller is parked at now (0: none).
static PARKED: AtomicU32 = AtomicU32::new(0);
static RELEASE: AtomicBool = AtomicBool::new(false);
/// A parked caller gave up waiting for its release (a test bug; the test fails).
static TIMED_OUT: AtomicBool = AtomicBool::new(false);
/// One bit per [`Point`] reached since the last [`Parking::arm`].
static REACHED: AtomicU32 = AtomicU32::new(0);

/// How long a parked caller waits for its release before it goes on by itself, so that a test
/// that failed before releasing cannot hang the guest: the test then fails on `TIMED_OUT`.
const PARK_LIMIT_NS: u64 = 30_000_000_000;

/// Product code at point `p`, on object `obj`: returns at once unless a test armed `p` (one
/// load); otherwise the first caller to arrive waits there until the test releases it.
#[inline(always)]
pub(crate) fn park_point(p: Point, obj: *const core::ffi::c_void) {
    if ARMED.load(Ordering::Relaxed) == p as u32 {
        park(p, obj as usize);
    }
}

#[cold]
#[inline(never)]
fn park(p: Point, obj: usize) {
    let want = ARMED_OBJ.load(Ordering::Acquire);
    if want != 0 && want != obj {
        return;
    }
    // One caller parks; the point is disarmed for every later one.
    if ARMED
        .compare_exchange(p as u32, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    REACHED.fetch_or(1 << p as u32, Ordering::AcqRel);
    PARKED.store(p as u32, Ordering::Release);
    let start = Ktime::ktime_get().to_ns();
    // SAFETY: FFI call without preconditions.
    let may_sleep = unsafe { crate::bindings::ibext_test_may_sleep() };
    while !RELEASE.load(Ordering::Acquire) {
        if (Ktime::ktime_get().to_ns() - start) as u64 > PARK_LIMIT_NS {
            TIMED_OUT.store(true, Ordering::Release);
            break;
        }
        if may_sleep {
            crate::tests::fixtures::guest::msleep(1);
        } else {
            // Softirq or atomic context: spin, on a CPU the test does not need.
            core::hint::spin_loop();
        }
    }
    PARKED.store(0, Ordering::Release);
}

/// Product code says it reached point `p` (teardown's marks; not on any hot path).
pub(crate) fn reached(p: Point) {
    REACHED.fetch_or(1 << p as u32, Ordering::AcqRel);
}

/// A test's hold on one park point: armed by [`Parking::arm`], released by
/// [`Parking::release`] or, whatever happened, by its drop.
pub(crate) struct Parking(());

impl Parking {
    /// Arms `p`: the next caller that reaches it for `obj` (null: any object) parks there.
    pub(crate) fn arm(p: Point, obj: *const core::ffi::c_void) -> Parking {
        RELEASE.store(false, Ordering::Release);
        TIMED_OUT.store(false, Ordering::Release);
        REACHED.store(0, Ordering::Release);
        ARMED_OBJ.store(obj as usize, Ordering::Release);
        ARMED.store(p as u32, Ordering::Release);
        Parking(())
    }

    /// Waits up to `ms` milliseconds for a caller to park; returns whether one did.
    pub(crate) fn wait_parked(&self, ms: u32) -> bool {
        crate::tests::fixtures::guest::wait_for(ms, || PARKED.load(Ordering::Acquire) != 0)
    }

    /// Whether `p` was reached since the point was armed.
    pub(crate) fn was_reached(p: Point) -> bool {
        REACHED.load(Ordering::Acquire) & (1 << p as u32) != 0
    }

    /// Whether a caller is parked now.
    pub(crate) fn parked(&self) -> bool {
        PARKED.load(Ordering::Acquire) != 0
    }

    /// Lets the parked caller go on, disarms the point, and waits (bounded) until the caller
    /// has left it; returns whether it had been parked for less than the limit.
    pub(crate) fn release(&self) -> bool {
        ARMED.store(0, Ordering::Release);
        RELEASE.store(true, Ordering::Release);
        crate::tests::fixtures::guest::wait_for(PARK_LIMIT_NS as u32 / 1_000_000, || {
            PARKED.load(Ordering::Acquire) == 0
        });
        !TIMED_OUT.load(Ordering::Acquire)
    }
}

impl Drop for Parking {
    fn drop(&mut self) {
        self.release();
    }
}

/// The polled CQ whose softirq passes are watched for a repoll in the same run of
/// `IRQ_POLL_SOFTIRQ` (0: none); see [`RepollWatch`].
static WATCHED: AtomicUsize = AtomicUsize::new(0);
/// The run (`ibext_test_softirq_run`) in which the watched CQ's last pass asked, in its tail, to
/// be polled again without re-arming; 0 once the next pass began.
static REPOLL_RUN: AtomicU64 = AtomicU64::new(0);
/// Repolls the watched CQ asked for.
static REPOLLS: AtomicU64 = AtomicU64::new(0);
/// Passes of the watched CQ that began in the very run of `IRQ_POLL_SOFTIRQ` whose pass asked
/// for them: the softirq did not yield between the two.
static SAME_RUN: AtomicU64 = AtomicU64::new(0);

/// Product code: a softirq pass of `obj` asks to be polled again without re-arming. One load
/// unless `obj` is watched.
#[inline(always)]
pub(crate) fn softirq_repoll_asked(obj: *const core::ffi::c_void) {
    if WATCHED.load(Ordering::Relaxed) == obj as usize && !obj.is_null() {
        // SAFETY: FFI call; we are in the softirq that runs the pass.
        let run = unsafe { crate::bindings::ibext_test_softirq_run() };
        REPOLLS.fetch_add(1, Ordering::Relaxed);
        REPOLL_RUN.store(run, Ordering::Release);
    }
}

/// Product code: a softirq pass of `obj` begins. One load unless `obj` is watched.
#[inline(always)]
pub(crate) fn softirq_pass_begins(obj: *const core::ffi::c_void) {
    if WATCHED.load(Ordering::Relaxed) == obj as usize && !obj.is_null() {
        // SAFETY: As above.
        let run = unsafe { crate::bindings::ibext_test_softirq_run() };
        if REPOLL_RUN.swap(0, Ordering::AcqRel) == run {
            SAME_RUN.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A test's watch on one polled CQ's softirq passes: does a pass that asks to be polled again
/// at once (polling mode) let the softirq end its run before the next pass? Unwatched on drop.
pub(crate) struct RepollWatch(());

impl RepollWatch {
    /// Watches the CQ `obj` (its `ib_cq`), from zero.
    pub(crate) fn arm(obj: *const core::ffi::c_void) -> RepollWatch {
        REPOLL_RUN.store(0, Ordering::Release);
        REPOLLS.store(0, Ordering::Release);
        SAME_RUN.store(0, Ordering::Release);
        WATCHED.store(obj as usize, Ordering::Release);
        RepollWatch(())
    }

    /// (repolls asked for, passes that ran in the same softirq run as the pass that asked).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            REPOLLS.load(Ordering::Acquire),
            SAME_RUN.load(Ordering::Acquire),
        )
    }
}

impl Drop for RepollWatch {
    fn drop(&mut self) {
        WATCHED.store(0, Ordering::Release);
    }
}

/// The tests' holds on pooled CQs' passes: a CQ's address (0: a free slot) and its gate.
struct Hold {
    cq: AtomicUsize,
    gate: AtomicU32,
}

/// The gate of a held CQ: held, or held with a pass wanted.
const GATE_OPEN: u32 = 0;
const GATE_HELD: u32 = 1;
const GATE_PENDING: u32 = 2;

static HOLDS: [Hold; 32] = [const {
    Hold {
        cq: AtomicUsize::new(0),
        gate: AtomicU32::new(GATE_OPEN),
    }
}; 32];
/// Slots in use: a load of it is all a pass costs while no test holds a CQ (the benchmarks run
/// in this flavour).
static HOLDING: AtomicU32 = AtomicU32::new(0);

/// `seams::pass_held`: whether the CQ at `obj` is held, remembering that a pass was wanted.
pub(crate) fn pass_held(obj: *const core::ffi::c_void) -> bool {
    if HOLDING.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Some(h) = HOLDS
        .iter()
        .find(|h| h.cq.load(Ordering::Acquire) == obj as usize)
    else {
        return false;
    };
    match h
        .gate
        .compare_exchange(GATE_HELD, GATE_PENDING, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => true,
        Err(g) => g == GATE_PENDING,
    }
}

/// Holding a pooled CQ's passes back, for the tests that need completions to pile up in it.
pub(crate) trait HoldPasses {
    /// No poll pass starts from now on (events, missed events at re-arm, a workqueue pass's
    /// next one and the moderation timer all go through `schedule_pass`; a softirq pass that
    /// would stay on irq_poll's list leaves it instead), so completions accumulate in the CQ
    /// until [`HoldPasses::test_release`]. A pass already running finishes.
    fn test_hold(&self);
    /// Lets go, and runs the pass that was wanted while the CQ was held.
    fn test_release(&self);
}

impl HoldPasses for crate::engine::PooledCq {
    fn test_hold(&self) {
        let me = self.raw() as usize;
        let free = HOLDS.iter().find(|h| {
            h.cq.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        let Some(h) = free else {
            crate::backport::bug::warn_on_once!(true, "ibext tests: more than 32 held CQs");
            return;
        };
        h.gate.store(GATE_HELD, Ordering::Release);
        HOLDING.fetch_add(1, Ordering::AcqRel);
    }

    fn test_release(&self) {
        let me = self.raw() as usize;
        let Some(h) = HOLDS.iter().find(|h| h.cq.load(Ordering::Acquire) == me) else {
            return;
        };
        let was = h.gate.swap(GATE_OPEN, Ordering::AcqRel);
        h.cq.store(0, Ordering::Release);
        HOLDING.fetch_sub(1, Ordering::AcqRel);
        if was == GATE_PENDING {
            self.schedule();
        }
    }
}
