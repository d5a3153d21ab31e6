// SPDX-License-Identifier: GPL-2.0

//! ibext's completion engine: the budgeted, NAPI-like poll loop behind every pooled CQ.
//!
//! The mechanics of a CQ that ibext polls itself (the CQ, irq_poll or a work item on ibext's
//! completion workqueues, the software-moderation hrtimer, lib/dim's `struct dim`, and the
//! teardown order) are `ib::cq::PolledCq`; this file is its handler ([`EngineState`]) and has
//! no `unsafe` code:
//!
//! - a completion event only counts and schedules a pass (the driver may call it in hard-IRQ
//!   context, or, for rxe, with the CQ's spinlock held and interrupts off);
//! - a pass is `policy::engine::poll_pass` then, as its tail, `end_pass`: pure code that the
//!   host tests drive with a fake CQ; [`Poller`] is its `Cq` for a pooled CQ: `ib_poll_cq` in batches with every completion
//!   handed to its `wr_cqe->done`, up to the context's budget; a re-arm with
//!   `IB_CQ_REPORT_MISSED_EVENTS` (another pass if completions were missed: the race-free loop
//!   from the IB/srp thread); staying in polling mode without re-arming after a pass that used
//!   its whole budget;
//! - moderation (`policy::moderation`): with DIM, every pass feeds `rdma_dim()` one sample; a new
//!   profile goes to the device's `modify_cq` where it has one, and otherwise is applied in
//!   software by deferring the next pass with the hrtimer instead of re-arming. The adaptive
//!   mode switches between interrupt mode and polling mode.

pub(crate) mod polled_cq;
pub(crate) mod queues;

use crate::{
    engine::polled_cq::{Handler, OwnedPolledCq, PassCtl, PolledCq},
    ib::{dim, Device},
    ledger::{Kind, Token},
    policy::{
        engine::{self, PassStats},
        moderation::{self, ModState, Moderation, PassEnd},
    },
    stats::{stat_enum, Counters, Values},
};
#[cfg(ibext_kunit)]
use core::sync::atomic::AtomicU8;
use core::{
    ffi::c_void,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
};
use kernel::{prelude::*, time::Ktime};

#[cfg(ibext_kunit)]
pub(crate) use crate::engine::queues::wait_for_handlers;
#[cfg(ibext_kunit)]
pub(crate) use crate::engine::queues::BUDGET_SOFTIRQ;
pub(crate) use crate::ib::cq::PollCtx;

/// A pooled CQ: the polled CQ with the engine as its handler.
pub(crate) type CqEngine = PolledCq<EngineState>;
/// An owned pooled CQ; dropping it stops the engine and destroys the CQ.
pub(crate) type OwnedCq = OwnedPolledCq<EngineState>;

/// Stops every callback of the given pooled CQs before they are dropped, with one wait of each
/// kind for all of them (`ib::polled_cq::quiesce`).
pub(crate) fn quiesce<'a>(cqs: impl Iterator<Item = &'a OwnedCq> + Clone) {
    polled_cq::quiesce(cqs);
}

/// The tests' gate on a CQ's passes (see `CqEngine::test_hold`): open, held, held with a pass
/// wanted.
#[cfg(ibext_kunit)]
const GATE_OPEN: u8 = 0;
#[cfg(ibext_kunit)]
const GATE_HELD: u8 = 1;
#[cfg(ibext_kunit)]
const GATE_PENDING: u8 = 2;

/// Owns ibext's completion workqueues; made before the client registers, dropped after it
/// unregisters (so after every pooled CQ is gone).
pub(crate) struct Workqueues(Option<crate::engine::queues::CompQueues>);

impl Workqueues {
    /// Allocates and publishes both workqueues.
    pub(crate) fn new() -> Result<Self> {
        Ok(Workqueues(Some(crate::engine::queues::CompQueues::new()?)))
    }
}

impl Drop for Workqueues {
    fn drop(&mut self) {
        let live = crate::ledger::counts(Kind::PooledCq).live();
        if live != 0 {
            // A ULP leaked pooled CQs (reported at unload): they may still queue work, so the
            // queues are leaked with them rather than destroyed under them.
            pr_err!(
                "{} pooled CQs still live: keeping the completion workqueues\n",
                live
            );
            if let Some(q) = self.0.take() {
                q.leak();
            }
        }
    }
}

stat_enum! {
    /// The statistics of one pooled CQ, in debugfs order.
    pub(crate) enum CqStat {
        /// Completion events: calls of the CQ's completion handler, our "interrupts" (written by
        /// the event handler).
        Events => "events",
        /// Poll passes (this and the next four: written by the poller).
        Passes => "passes",
        /// Completions handed to `wr_cqe->done`.
        Completions => "completions",
        /// Passes that used their whole budget and stayed in polling mode.
        BudgetExhausted => "budget_exhausted",
        /// DIM samples (`rdma_dim()` calls, one per pass).
        Samples => "samples",
        /// Adaptive mode: switches between interrupt and polling mode.
        ModeSwitches => "mode_switches",
        /// DIM profile changes applied (this and the next three: written by the DIM work).
        ProfileChanges => "profile_changes",
        /// The highest DIM profile index applied so far.
        ProfileMax => "profile_max",
        /// DIM profiles the device's `modify_cq` took.
        HwApplied => "hw_applied",
        /// DIM profiles the device's `modify_cq` refused (software moderation took over).
        HwRefused => "hw_refused",
        /// Passes run by the software-moderation timer instead of a completion event (this and the
        /// next: written by the timer).
        DeferredPolls => "deferred_polls",
        /// Microseconds from starting the timer to its callback, summed: how closely the timer
        /// follows the profile (under TCG, not closely).
        DeferredWaitedUs => "deferred_waited_us",
        /// Microseconds the software-moderation timer was asked to wait, summed (a pass's tail).
        DeferredAskedUs => "deferred_asked_us",
        /// Re-arms that reported missed completions (another pass followed at once; a pass's tail).
        MissedAtRearm => "missed_at_rearm",
    }
}

/// The counters of one pooled CQ.
type CqStats = Counters<CqStat, { CqStat::COUNT }>;

/// Adds one pass's counters, before the pass leaves the poll list. Only the poller writes these
/// (one pass at a time), so a load and a store suffice: no read-modify-write on the completion
/// path. Missed completions at re-arm are counted by the pass's tail, atomically.
fn add_pass(st: &CqStats, p: &PassStats) {
    st.add_owned(CqStat::Passes, p.passes);
    st.add_owned(CqStat::Completions, p.completions);
    st.add_owned(CqStat::BudgetExhausted, p.budget_exhausted);
    st.add_owned(CqStat::Samples, p.samples);
    st.add_owned(CqStat::ModeSwitches, p.mode_switches);
}

/// A snapshot of a pooled CQ's counters and DIM profile, for debugfs, the tests and the
/// benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CqSnapshot {
    /// The counters.
    pub(crate) stats: Values<CqStat, { CqStat::COUNT }>,
    /// Whether the device moderates the CQ's events itself now.
    pub(crate) hw_moderation: bool,
    /// The DIM profile index now.
    pub(crate) profile_ix: u8,
}

impl CqSnapshot {
    /// Returns counter `s`.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests and benchmarks only")
    )]
    pub(crate) fn get(&self, s: CqStat) -> u64 {
        self.stats.get(s)
    }
}

/// The engine's part of a pooled CQ: its moderation, counters and owner.
///
/// # Invariants
///
/// `owner` is the address given to [`CqEngine::new_pooled`]; the engine never dereferences it.
pub(crate) struct EngineState {
    moderation: Moderation,
    /// The device applies DIM profiles itself: it has `modify_cq`, and took the last profile.
    hw_moderation: AtomicBool,
    /// What owns the CQ (the device state whose pools hold it), for `ibext_cq_pool_put` to find
    /// its way back from the CQ alone; opaque to the engine.
    owner: usize,
    /// When the moderation timer was started (ns, monotonic clock).
    timer_started: AtomicU64,
    stats: CqStats,
    /// The tests' gate (`GATE_*`); only in the KUnit flavour.
    #[cfg(ibext_kunit)]
    gate: AtomicU8,
    _token: Token,
}

impl Handler for EngineState {
    type PollerState = ModState;
    type Tail = Option<PassEnd>;

    fn pass(
        cq: &CqEngine,
        ctl: &mut PassCtl<'_, Self>,
        st: &mut ModState,
        budget: u32,
    ) -> (u32, Option<PassEnd>) {
        let e = cq.handler();
        let mut poller = Poller { cq, ctl };
        let mut stats = PassStats::default();
        let report = engine::poll_pass(&mut poller, e.moderation, st, budget, &mut stats);
        add_pass(&e.stats, &stats);
        (report.completed, report.end)
    }

    fn tail(cq: &CqEngine, ctl: &mut PassCtl<'_, Self>, end: Option<PassEnd>) {
        let mut poller = Poller { cq, ctl };
        // The tail's own count (missed completions) is kept by `Poller::rearm`.
        engine::end_pass(&mut poller, end, &mut PassStats::default());
    }

    fn event(cq: &CqEngine) {
        cq.handler().stats.add(CqStat::Events, 1);
        cq.schedule_pass();
    }

    fn timer(cq: &CqEngine) {
        let e = cq.handler();
        e.stats.add(CqStat::DeferredPolls, 1);
        let now = Ktime::ktime_get().to_ns() as u64;
        let waited = now.saturating_sub(e.timer_started.load(Ordering::Acquire));
        e.stats.add(CqStat::DeferredWaitedUs, waited / 1000);
        cq.schedule_pass();
    }

    fn dim_work(cq: &CqEngine) {
        let e = cq.handler();
        let (ix, applied) = cq.apply_profile(moderation::comps_usec);
        // What the device took decides what the poller does: re-arm (the device moderates) or
        // software moderation (no `modify_cq`, or it refused).
        e.hw_moderation
            .store(applied.in_hardware(), Ordering::Release);
        match applied {
            dim::Applied::Hardware => e.stats.add(CqStat::HwApplied, 1),
            dim::Applied::Refused(_) => e.stats.add(CqStat::HwRefused, 1),
            dim::Applied::Software => {}
        }
        e.stats.add(CqStat::ProfileChanges, 1);
        e.stats.max(CqStat::ProfileMax, u64::from(ix));
    }

    fn async_event(cq: &CqEngine, event: u32) {
        pr_warn!(
            "pooled CQ (vector {}, {}) got async event {}\n",
            cq.vector(),
            cq.ctx().name(),
            event
        );
    }
}

impl CqEngine {
    /// Makes a CQ of at least `nr_cqe` entries on `vector`, polled in `ctx` and moderated by
    /// `moderation`, with its engine; `owner` is carried back by [`CqEngine::owner`].
    pub(crate) fn new_pooled(
        dev: &Device,
        nr_cqe: u32,
        vector: u32,
        ctx: PollCtx,
        moderation: Moderation,
        owner: *const c_void,
    ) -> Result<OwnedCq> {
        let state = EngineState {
            moderation,
            hw_moderation: AtomicBool::new(dev.has_modify_cq()),
            owner: owner as usize,
            timer_started: AtomicU64::new(0),
            stats: CqStats::new(),
            #[cfg(ibext_kunit)]
            gate: AtomicU8::new(GATE_OPEN),
            _token: Token::new(Kind::PooledCq),
        };
        PolledCq::create(dev, nr_cqe, vector, ctx, state)
    }

    /// Returns the owner given to [`CqEngine::new_pooled`].
    pub(crate) fn owner(&self) -> *const c_void {
        self.handler().owner as *const c_void
    }

    /// Returns the CQ's moderation mode.
    pub(crate) fn moderation(&self) -> Moderation {
        self.handler().moderation
    }

    /// Returns a snapshot of the counters and the DIM profile.
    pub(crate) fn snapshot(&self) -> CqSnapshot {
        let e = self.handler();
        CqSnapshot {
            stats: e.stats.values(),
            hw_moderation: e.hw_moderation.load(Ordering::Relaxed),
            profile_ix: self.profile_ix(),
        }
    }

    /// Schedules a pass, unless the tests' gate holds passes back.
    fn schedule_pass(&self) {
        #[cfg(ibext_kunit)]
        if self.test_gate_closed() {
            return;
        }
        self.schedule();
    }

    /// Starts the software-moderation timer: the next pass in `usec` microseconds.
    fn defer(&self, usec: u16) {
        let e = self.handler();
        // Called by a pass's tail, which the next pass may run beside: atomically.
        e.stats.add(CqStat::DeferredAskedUs, usec.into());
        // Stored before the timer is started, so before its callback reads it.
        e.timer_started
            .store(Ktime::ktime_get().to_ns() as u64, Ordering::Release);
        self.defer_us(usec.into());
    }

    /// Test gate: returns whether the gate is closed, remembering that a pass was wanted.
    #[cfg(ibext_kunit)]
    fn test_gate_closed(&self) -> bool {
        let gate = &self.handler().gate;
        // A load first: the benchmarks run in this flavour, and an open gate must not cost a
        // locked read-modify-write per event.
        if gate.load(Ordering::Acquire) == GATE_OPEN {
            return false;
        }
        match gate.compare_exchange(GATE_HELD, GATE_PENDING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(g) => g == GATE_PENDING,
        }
    }

    /// Tests only: no poll pass starts from now on (events, missed events at re-arm, polling
    /// mode and the moderation timer all go through `schedule`), so completions accumulate in
    /// the CQ until [`CqEngine::test_release`]. A pass already running finishes.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_hold(&self) {
        self.handler().gate.store(GATE_HELD, Ordering::Release);
    }

    /// Tests only: opens the gate, and runs the pass that was wanted while it was closed.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_release(&self) {
        if self.handler().gate.swap(GATE_OPEN, Ordering::AcqRel) == GATE_PENDING {
            self.schedule();
        }
    }
}

/// A pass's view of its pooled CQ, for `policy::engine::poll_pass` and `end_pass`.
struct Poller<'a, 'b> {
    cq: &'a CqEngine,
    ctl: &'a mut PassCtl<'b, EngineState>,
}

impl engine::Cq for Poller<'_, '_> {
    #[inline(always)]
    fn poll(&mut self, max: u32) -> u32 {
        self.ctl.poll(max)
    }

    fn rearm(&mut self) -> bool {
        let missed = self.ctl.rearm();
        if missed {
            // In the pass's tail: counted atomically (see `add_pass`).
            self.cq.handler().stats.add(CqStat::MissedAtRearm, 1);
        }
        missed
    }

    fn schedule(&mut self) {
        self.cq.schedule_pass();
    }

    fn defer(&mut self, usec: u16) {
        self.cq.defer(usec);
    }

    fn dim_sample(&mut self, completed: u32) {
        self.ctl.dim_sample(completed);
    }

    fn profile_ix(&self) -> u8 {
        self.cq.profile_ix()
    }

    fn hw_moderation(&self) -> bool {
        self.cq.handler().hw_moderation.load(Ordering::Acquire)
    }

    fn leave_poll_list(&mut self) {
        self.ctl.leave_poll_list();
    }

    fn keep_polling(&mut self) {
        // irq_poll keeps a poll function that used its budget on its list; a work item
        // requeues itself without re-arming.
        if self.ctl.in_irq_poll() {
            self.ctl.stay_on_poll_list();
        } else {
            self.cq.schedule_pass();
        }
    }

    fn repoll(&mut self) {
        if self.ctl.in_irq_poll() {
            // NAPI's yield: the pass reports its whole budget to irq_poll, which keeps the CQ
            // on its list and ends its run (`irq_poll_softirq`: the budget is spent); the
            // softirq core restarts it a few times, then leaves the rest to `ksoftirqd`, which
            // shares the CPU with the device's completion producers (rxe's `rxe_wq` workers).
            // Leaving the list and scheduling again instead ran the next pass in the same run
            // (139 of 141 repolls in `ibext_yield`), for as long as each pass found a completion
            // and the jiffy lasted.
            self.ctl.stay_on_poll_list();
        } else {
            // A work item requeues itself. It runs at `WQ_HIGHPRI`, but it polls only what the
            // producers (unbound `rxe_wq` workers) post: a producer kept off the CPU posts
            // nothing, the next pass finds the CQ empty and polling mode ends. Deferring these
            // passes on the timer instead made `ibext_yield`'s oversubscribed run slower, not
            // safer (1341 against 617 ms), so they are not deferred.
            self.ctl.leave_poll_list();
            self.cq.schedule_pass();
        }
    }
}
