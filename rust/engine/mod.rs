// SPDX-License-Identifier: GPL-2.0

//! ibext's completion engine: the budgeted, NAPI-like poll loop behind every pooled CQ.
//!
//! The mechanics of a pooled CQ (the CQ, irq_poll or a work item on ibext's completion
//! workqueues, the software-moderation hrtimer, lib/dim's `struct dim`, and the teardown order)
//! are [`pooled_cq`]'s; the workqueues, budgets and teardown's waits are [`queues`]'s. This
//! file is the engine's side of each callback ([`EngineState`]) and has no `unsafe` code:
//!
//! - a completion event only counts and schedules a pass (the driver may call it in hard-IRQ
//!   context, or, for rxe, with the CQ's spinlock held and interrupts off);
//! - a pass is `policy::engine::poll_pass` then, as its tail, `end_pass`: pure code that the
//!   host tests drive with a fake CQ, and that drives a pooled CQ through
//!   `pooled_cq::PassCtl` (`ib_poll_cq` in batches with every completion handed to its
//!   `wr_cqe->done`, up to the context's budget; a re-arm with `IB_CQ_REPORT_MISSED_EVENTS`,
//!   another pass if completions were missed: the race-free loop from the IB/srp thread;
//!   staying in polling mode without re-arming after a pass that used its whole budget);
//! - moderation (`policy::moderation`): with DIM, every pass feeds `rdma_dim()` one sample; a new
//!   profile goes to the device's `modify_cq` where it has one, and otherwise is applied in
//!   software by deferring the next pass with the hrtimer instead of re-arming. The adaptive
//!   mode switches between interrupt mode and polling mode; in software, its polling mode defers
//!   the next pass with the same hrtimer while the deferrals find batches.

pub(crate) mod pooled_cq;
pub(crate) mod queues;

use crate::{
    engine::pooled_cq::{Handler, PassCtl},
    ib::{dim, Device},
    ledger::{Kind, Token},
    policy::{
        engine::{self, PassStats},
        moderation::{ModState, Moderation, PassEnd},
        profiles,
    },
    seams,
    stats::{stat_enum, Counters, Values},
};
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

/// A CQ of ibext's pools: the polled CQ with the engine as its handler.
pub(crate) type PooledCq = pooled_cq::Cq<EngineState>;
/// An owned pooled CQ; dropping it stops its callbacks and destroys the CQ.
pub(crate) type OwnedPooledCq = pooled_cq::Owned<EngineState>;

/// Stops every callback of the given pooled CQs before they are dropped, with one wait of each
/// kind for all of them (`ib::pooled_cq::quiesce`).
pub(crate) fn quiesce<'a>(cqs: impl Iterator<Item = &'a OwnedPooledCq> + Clone) {
    pooled_cq::quiesce(cqs);
}

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
/// `owner` is the address given to [`PooledCq::new_pooled`]; the engine never dereferences it.
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
    _token: Token,
}

/// The engine's side of each of a pooled CQ's callbacks, called by `pooled_cq.rs` from the one
/// context each runs in (see that file's comment).
impl Handler for EngineState {
    type PollerState = ModState;
    type Tail = Option<PassEnd>;

    fn pass(
        cq: &PooledCq,
        ctl: &mut PassCtl<'_, Self>,
        st: &mut ModState,
        budget: u32,
    ) -> (u32, Option<PassEnd>) {
        let e = cq.handler();
        let mut stats = PassStats::default();
        let report = engine::poll_pass(ctl, e.moderation, st, budget, &mut stats);
        add_pass(&e.stats, &stats);
        (report.completed, report.end)
    }

    fn tail(ctl: &mut PassCtl<'_, Self>, end: Option<PassEnd>) {
        // The tail's own count (missed completions) is kept by `missed_at_rearm`.
        engine::end_pass(ctl, end, &mut PassStats::default());
    }

    fn event(cq: &PooledCq) {
        cq.handler().stats.add(CqStat::Events, 1);
        cq.schedule_pass();
    }

    fn timer(cq: &PooledCq) {
        let e = cq.handler();
        e.stats.add(CqStat::DeferredPolls, 1);
        let now = Ktime::ktime_get().to_ns() as u64;
        let waited = now.saturating_sub(e.timer_started.load(Ordering::Acquire));
        e.stats.add(CqStat::DeferredWaitedUs, waited / 1000);
        cq.schedule_pass();
    }

    fn dim_work(cq: &PooledCq) {
        let e = cq.handler();
        let (ix, applied) = cq.apply_profile(profiles::comps_usec);
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

    fn async_event(cq: &PooledCq, event: u32) {
        pr_warn!(
            "pooled CQ (vector {}, {}) got async event {}\n",
            cq.vector(),
            cq.ctx().name(),
            event
        );
    }

    fn schedule(cq: &PooledCq) {
        cq.schedule_pass();
    }

    fn defer(cq: &PooledCq, usec: u16) {
        cq.defer(usec);
    }

    fn missed_at_rearm(cq: &PooledCq) {
        // In the pass's tail: counted atomically (see `add_pass`).
        cq.handler().stats.add(CqStat::MissedAtRearm, 1);
    }

    fn hw_moderation(cq: &PooledCq) -> bool {
        cq.handler().hw_moderation.load(Ordering::Acquire)
    }
}

impl PooledCq {
    /// Makes a CQ of at least `nr_cqe` entries on `vector`, polled in `ctx` and moderated by
    /// `moderation`, with its engine; `owner` is carried back by [`PooledCq::owner`].
    pub(crate) fn new_pooled(
        dev: &Device,
        nr_cqe: u32,
        vector: u32,
        ctx: PollCtx,
        moderation: Moderation,
        owner: *const c_void,
    ) -> Result<OwnedPooledCq> {
        let state = EngineState {
            moderation,
            hw_moderation: AtomicBool::new(dev.has_modify_cq()),
            owner: owner as usize,
            timer_started: AtomicU64::new(0),
            stats: CqStats::new(),
            _token: Token::new(Kind::PooledCq),
        };
        pooled_cq::Cq::create(dev, nr_cqe, vector, ctx, state)
    }

    /// Returns the owner given to [`PooledCq::new_pooled`].
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

    /// Schedules a pass, unless a test holds this CQ's passes back (`seams::pass_held`).
    fn schedule_pass(&self) {
        if seams::pass_held(self.raw().cast()) {
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
}
