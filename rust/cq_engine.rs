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
//! - a pass is `policy::engine::run_pass`, pure code that the host tests drive with a fake CQ;
//!   [`Poller`] is its `Cq` for a pooled CQ: `ib_poll_cq` in batches with every completion
//!   handed to its `wr_cqe->done`, up to the context's budget; a re-arm with
//!   `IB_CQ_REPORT_MISSED_EVENTS` (another pass if completions were missed: the race-free loop
//!   from the IB/srp thread); staying in polling mode without re-arming after a pass that used
//!   its whole budget;
//! - moderation (`policy::moderation`): with DIM, every pass feeds `rdma_dim()` one sample; a new
//!   profile goes to the device's `modify_cq` where it has one, and otherwise is applied in
//!   software by deferring the next pass with the hrtimer instead of re-arming. The adaptive
//!   mode switches between interrupt mode and polling mode.

use crate::{
    ib::{
        dim,
        polled_cq::{Handler, OwnedPolledCq, PassCtl, PolledCq},
        Device,
    },
    ledger::{Kind, Token},
    policy::{
        engine::{self, PassStats},
        moderation::{ModState, Moderation},
    },
};
#[cfg(ibext_kunit)]
use core::sync::atomic::AtomicU8;
use core::{
    ffi::c_void,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
};
use kernel::{prelude::*, time::Ktime};

#[cfg(ibext_kunit)]
pub(crate) use crate::ib::cq::BUDGET_SOFTIRQ;
pub(crate) use crate::ib::cq::{wait_for_handlers, PollCtx};

/// A pooled CQ: the polled CQ with the engine as its handler.
pub(crate) type CqEngine = PolledCq<EngineState>;
/// An owned pooled CQ; dropping it stops the engine and destroys the CQ.
pub(crate) type OwnedCq = OwnedPolledCq<EngineState>;

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
pub(crate) struct Workqueues(Option<crate::ib::cq::CompQueues>);

impl Workqueues {
    /// Allocates and publishes both workqueues.
    pub(crate) fn new() -> Result<Self> {
        Ok(Workqueues(Some(crate::ib::cq::CompQueues::new()?)))
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

/// Counters of one pooled CQ, shown in debugfs.
#[derive(Default)]
pub(crate) struct CqStats {
    /// Completion events: calls of the CQ's completion handler, our "interrupts".
    pub(crate) events: AtomicU64,
    /// Poll passes.
    pub(crate) passes: AtomicU64,
    /// Completions handed to `wr_cqe->done`.
    pub(crate) completions: AtomicU64,
    /// Passes that used their whole budget and stayed in polling mode.
    pub(crate) budget_exhausted: AtomicU64,
    /// DIM samples (`rdma_dim()` calls, one per pass).
    pub(crate) samples: AtomicU64,
    /// DIM profile changes applied.
    pub(crate) profile_changes: AtomicU64,
    /// The highest DIM profile index applied so far.
    pub(crate) profile_max: AtomicU64,
    /// Passes run by the software-moderation timer instead of a completion event.
    pub(crate) deferred_polls: AtomicU64,
    /// Microseconds the software-moderation timer was asked to wait, summed.
    pub(crate) deferred_asked_us: AtomicU64,
    /// Microseconds from starting the timer to its callback, summed: how closely the timer
    /// follows the profile (under TCG, not closely).
    pub(crate) deferred_waited_us: AtomicU64,
    /// Adaptive mode: switches between interrupt and polling mode.
    pub(crate) mode_switches: AtomicU64,
    /// DIM profiles the device's `modify_cq` took.
    pub(crate) hw_applied: AtomicU64,
    /// DIM profiles the device's `modify_cq` refused (software moderation took over).
    pub(crate) hw_refused: AtomicU64,
    /// Re-arms that reported missed completions (another pass followed at once).
    pub(crate) missed_at_rearm: AtomicU64,
}

impl CqStats {
    /// Adds one pass's counters. Only the poller writes these (one pass at a time), so a load
    /// and a store suffice: no read-modify-write on the completion path; readers see whole
    /// values.
    fn add_pass(&self, p: &PassStats) {
        let add = |c: &AtomicU64, n: u64| {
            if n != 0 {
                c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            }
        };
        add(&self.passes, p.passes);
        add(&self.completions, p.completions);
        add(&self.budget_exhausted, p.budget_exhausted);
        add(&self.samples, p.samples);
        add(&self.mode_switches, p.mode_switches);
        add(&self.missed_at_rearm, p.missed_at_rearm);
    }
}

/// A snapshot of a pooled CQ's counters and DIM profile, for debugfs, the tests and the
/// benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CqSnapshot {
    /// See [`CqStats::events`].
    pub(crate) events: u64,
    /// See [`CqStats::passes`].
    pub(crate) passes: u64,
    /// See [`CqStats::completions`].
    pub(crate) completions: u64,
    /// See [`CqStats::budget_exhausted`].
    pub(crate) budget_exhausted: u64,
    /// See [`CqStats::samples`].
    pub(crate) samples: u64,
    /// See [`CqStats::profile_changes`].
    pub(crate) profile_changes: u64,
    /// See [`CqStats::profile_max`].
    pub(crate) profile_max: u64,
    /// See [`CqStats::deferred_polls`].
    pub(crate) deferred_polls: u64,
    /// See [`CqStats::deferred_asked_us`].
    pub(crate) deferred_asked_us: u64,
    /// See [`CqStats::deferred_waited_us`].
    pub(crate) deferred_waited_us: u64,
    /// See [`CqStats::mode_switches`].
    pub(crate) mode_switches: u64,
    /// See [`CqStats::hw_applied`].
    pub(crate) hw_applied: u64,
    /// See [`CqStats::hw_refused`].
    pub(crate) hw_refused: u64,
    /// See [`CqStats::missed_at_rearm`].
    pub(crate) missed_at_rearm: u64,
    /// Whether the device moderates the CQ's events itself now.
    pub(crate) hw_moderation: bool,
    /// The DIM profile index now.
    pub(crate) profile_ix: u8,
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

    fn pass(cq: &CqEngine, ctl: &mut PassCtl<'_, Self>, st: &mut ModState, budget: u32) -> u32 {
        let e = cq.handler();
        let mut poller = Poller { cq, ctl };
        let mut stats = PassStats::default();
        let report = engine::run_pass(&mut poller, e.moderation, st, budget, &mut stats);
        e.stats.add_pass(&stats);
        report.completed
    }

    fn event(cq: &CqEngine) {
        cq.handler().stats.events.fetch_add(1, Ordering::Relaxed);
        cq.schedule_pass();
    }

    fn timer(cq: &CqEngine) {
        let e = cq.handler();
        e.stats.deferred_polls.fetch_add(1, Ordering::Relaxed);
        let now = Ktime::ktime_get().to_ns() as u64;
        let waited = now.saturating_sub(e.timer_started.load(Ordering::Acquire));
        e.stats
            .deferred_waited_us
            .fetch_add(waited / 1000, Ordering::Relaxed);
        cq.schedule_pass();
    }

    fn dim_work(cq: &CqEngine) {
        let e = cq.handler();
        let (ix, applied) = cq.apply_profile();
        // What the device took decides what the poller does: re-arm (the device moderates) or
        // software moderation (no `modify_cq`, or it refused).
        e.hw_moderation
            .store(applied.in_hardware(), Ordering::Release);
        match applied {
            dim::Applied::Hardware => {
                e.stats.hw_applied.fetch_add(1, Ordering::Relaxed);
            }
            dim::Applied::Refused(_) => {
                e.stats.hw_refused.fetch_add(1, Ordering::Relaxed);
            }
            dim::Applied::Software => {}
        }
        e.stats.profile_changes.fetch_add(1, Ordering::Relaxed);
        e.stats
            .profile_max
            .fetch_max(u64::from(ix), Ordering::Relaxed);
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
            stats: CqStats::default(),
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
        let st = &e.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CqSnapshot {
            events: get(&st.events),
            passes: get(&st.passes),
            completions: get(&st.completions),
            budget_exhausted: get(&st.budget_exhausted),
            samples: get(&st.samples),
            profile_changes: get(&st.profile_changes),
            profile_max: get(&st.profile_max),
            deferred_polls: get(&st.deferred_polls),
            deferred_asked_us: get(&st.deferred_asked_us),
            deferred_waited_us: get(&st.deferred_waited_us),
            mode_switches: get(&st.mode_switches),
            hw_applied: get(&st.hw_applied),
            hw_refused: get(&st.hw_refused),
            missed_at_rearm: get(&st.missed_at_rearm),
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
        e.stats
            .deferred_asked_us
            .fetch_add(usec.into(), Ordering::Relaxed);
        // Stored before the timer is started, so before its callback reads it.
        e.timer_started
            .store(Ktime::ktime_get().to_ns() as u64, Ordering::Release);
        self.defer_us(usec.into());
    }

    /// Test gate: returns whether the gate is closed, remembering that a pass was wanted.
    #[cfg(ibext_kunit)]
    fn test_gate_closed(&self) -> bool {
        match self.handler().gate.compare_exchange(
            GATE_HELD,
            GATE_PENDING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
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

/// A pass's view of its pooled CQ, for `policy::engine::run_pass`.
struct Poller<'a, 'b> {
    cq: &'a CqEngine,
    ctl: &'a mut PassCtl<'b, EngineState>,
}

impl engine::Cq for Poller<'_, '_> {
    fn poll(&mut self, max: u32) -> u32 {
        self.ctl.poll(max)
    }

    fn rearm(&mut self) -> bool {
        self.ctl.rearm()
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
        if !self.ctl.in_irq_poll() {
            self.cq.schedule_pass();
        }
    }
}
