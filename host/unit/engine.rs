// SPDX-License-Identifier: GPL-2.0

//! The engine's pass driven by a fake CQ in virtual time: completions arrive at given
//! microseconds, an armed CQ raises one event for the next arrival, a scheduled pass runs at once
//! (irq_poll and workqueues coalesce: scheduling a pass that is already pending does nothing),
//! and a deferred pass runs `usec` later.

use super::Rng;
use crate::policy::engine::*;
use crate::policy::moderation::{ModState, Moderation, PassEnd};
use std::collections::VecDeque;

/// One whole pass, as the kernel runs it: [`poll_pass`], then [`end_pass`].
fn run_pass<C: PassOps>(
    cq: &mut C,
    mode: Moderation,
    st: &mut ModState,
    budget: u32,
    stats: &mut PassStats,
) -> PassReport {
    let report = poll_pass(cq, mode, st, budget, stats);
    end_pass(cq, report.end, stats);
    report
}

/// A CQ, its device and its poll context.
#[derive(Default)]
struct FakeCq {
    /// Completions in the CQ, by id.
    queue: VecDeque<u64>,
    /// Completions handed on, in order.
    delivered: Vec<u64>,
    armed: bool,
    /// A pass is scheduled.
    pending: bool,
    /// A deferred pass is due at this time.
    timer: Option<u64>,
    /// The pass runs on the context's poll list (irq_poll), from scheduling until it leaves.
    on_list: bool,
    now: u64,
    next_id: u64,
    events: u64,
    rearms: u64,
    keep_polling: u64,
    /// Passes under budget that asked for another pass without re-arming (polling mode).
    repolls: u64,
    /// Sizes of the `poll` calls.
    polls: Vec<u32>,
    /// Completions that arrive in the window between a pass's last poll and its re-arm, one
    /// batch per re-arm.
    race_window: VecDeque<u32>,
    /// The device also raises an event when it is armed with completions already queued (some
    /// do, besides reporting them as missed).
    event_when_armed_nonempty: bool,
    /// The device's `poll` returns this many more than asked (a driver bug the pass must
    /// survive).
    over_report: u32,
    profile_ix: u8,
    hw_moderation: bool,
    samples: Vec<u32>,
    defers: Vec<u16>,
    /// Deferrals made while one was pending (the timer moved).
    timer_restarts: u64,
    /// Teardown has stopped the poll context: nothing is scheduled any more.
    disabled: bool,
}

impl FakeCq {
    fn arrive(&mut self, n: u32) {
        for _ in 0..n {
            self.queue.push_back(self.next_id);
            self.next_id += 1;
        }
        if n > 0 && self.armed {
            self.armed = false;
            self.events += 1;
            self.sched();
        }
    }

    fn sched(&mut self) {
        if !self.disabled {
            self.pending = true;
        }
    }
}

impl PassOps for FakeCq {
    fn poll(&mut self, max: u32) -> u32 {
        assert!(max <= POLL_BATCH && max > 0, "poll of {max}");
        self.polls.push(max);
        let mut n = 0;
        while n < max {
            let Some(id) = self.queue.pop_front() else {
                break;
            };
            self.delivered.push(id);
            n += 1;
        }
        n + self.over_report
    }

    fn rearm(&mut self) -> bool {
        let late = self.race_window.pop_front().unwrap_or(0);
        // Arrivals before the CQ is armed raise no event.
        let armed = core::mem::replace(&mut self.armed, false);
        self.arrive(late);
        self.armed = armed;
        assert!(!self.on_list, "re-armed before leaving the poll list");
        self.rearms += 1;
        self.armed = true;
        if !self.queue.is_empty() && self.event_when_armed_nonempty {
            self.armed = false;
            self.events += 1;
            self.sched();
        }
        !self.queue.is_empty()
    }

    fn schedule(&mut self) {
        assert!(!self.on_list, "scheduled from the poll list");
        self.sched();
    }

    fn defer(&mut self, usec: u16) {
        // A pass can run while a deferral is pending: one scheduled by the event of a CQ that
        // a re-arm armed and reported missed completions on, whose pass then deferred. The
        // kernel's `hrtimer_start` then moves the pending timer; so does this.
        if self.timer.is_some() {
            self.timer_restarts += 1;
        }
        self.defers.push(usec);
        if !self.disabled {
            self.timer = Some(self.now + u64::from(usec));
        }
    }

    fn dim_sample(&mut self, completed: u32) {
        self.samples.push(completed);
    }

    fn profile_ix(&self) -> u8 {
        self.profile_ix
    }

    fn hw_moderation(&self) -> bool {
        self.hw_moderation
    }

    fn leave_poll_list(&mut self) {
        self.on_list = false;
    }

    fn keep_polling(&mut self) {
        self.keep_polling += 1;
        // irq_poll keeps the CQ listed; a work item requeues itself. Either way another pass.
        self.sched();
    }

    fn repoll(&mut self) {
        self.repolls += 1;
        // As a pass that used its budget: still listed (irq_poll), another pass follows. The
        // yield before it (the softirq's run ending, or a work item's timer) takes no virtual
        // time here.
        self.sched();
    }
}

/// The engine of one CQ: its fake, its moderation state and counters.
struct Sim {
    cq: FakeCq,
    mode: Moderation,
    st: ModState,
    stats: PassStats,
    budget: u32,
    reports: Vec<PassReport>,
}

impl Sim {
    fn new(mode: Moderation, budget: u32) -> Self {
        let mut cq = FakeCq::default();
        // Created armed, as `CqEngine::create` arms with `IB_CQ_NEXT_COMP`.
        cq.armed = true;
        Sim {
            cq,
            mode,
            st: ModState::default(),
            stats: PassStats::default(),
            budget,
            reports: Vec::new(),
        }
    }

    /// Runs every pass that is due now.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            if self.cq.timer.is_some_and(|t| t <= self.cq.now) {
                self.cq.timer = None;
                self.cq.sched();
            }
            if !self.cq.pending {
                return;
            }
            self.run_one();
        }
        panic!("the engine never went idle");
    }

    /// Runs the pass that is scheduled, as irq_poll or the work item would.
    fn run_one(&mut self) {
        assert!(self.cq.pending, "no pass scheduled");
        self.cq.pending = false;
        self.cq.on_list = true;
        let r = run_pass(
            &mut self.cq,
            self.mode,
            &mut self.st,
            self.budget,
            &mut self.stats,
        );
        self.reports.push(r);
    }

    /// Advances virtual time to `t`, running deferred passes as they come due.
    fn advance(&mut self, t: u64) {
        while let Some(due) = self.cq.timer.filter(|&d| d <= t) {
            self.cq.now = due.max(self.cq.now);
            self.settle();
        }
        self.cq.now = self.cq.now.max(t);
        self.settle();
    }

    /// Lets every timer run out.
    fn drain(&mut self) {
        self.settle();
        while let Some(due) = self.cq.timer {
            self.advance(due);
        }
    }

    /// Every completion that arrived was handed on exactly once, in order, and the CQ is armed
    /// and empty: nothing is stranded.
    fn check_quiescent(&self) {
        let want: Vec<u64> = (0..self.cq.next_id).collect();
        assert_eq!(
            self.cq.delivered, want,
            "lost, duplicated or reordered completions"
        );
        assert!(self.cq.queue.is_empty());
        assert!(!self.cq.pending && self.cq.timer.is_none());
        assert!(
            self.cq.armed,
            "idle but not armed: the next completion raises no event"
        );
        assert_eq!(
            self.stats.completions, self.cq.next_id,
            "completions counted"
        );
        assert_eq!(self.stats.passes as usize, self.reports.len());
    }
}

#[test]
fn missed_completions_at_rearm_are_polled() {
    let mut sim = Sim::new(Moderation::None, 256);
    // Every re-arm races one late completion, except the last few.
    sim.cq.race_window = [1, 1, 2, 1, 0].into_iter().collect();
    sim.cq.arrive(3);
    sim.settle();
    sim.check_quiescent();
    assert_eq!(sim.cq.next_id, 3 + 5);
    // Four re-arms reported missed completions, each followed by a pass; the fifth found none.
    assert_eq!(sim.stats.missed_at_rearm, 4);
    assert_eq!(sim.cq.rearms, 5);
    assert_eq!(sim.stats.passes, 5);
    // Only the first arrival raised an event: the late ones came while the CQ was not armed.
    assert_eq!(sim.cq.events, 1);
}

#[test]
fn a_device_that_also_raises_an_event_gives_one_pass() {
    let mut sim = Sim::new(Moderation::None, 256);
    sim.cq.event_when_armed_nonempty = true;
    sim.cq.race_window = [2].into_iter().collect();
    sim.cq.arrive(1);
    sim.settle();
    sim.check_quiescent();
    // The event and the missed report schedule the same pass: two passes in all, not three.
    assert_eq!(sim.stats.passes, 2);
}

#[test]
fn budget_exhaustion_keeps_polling_without_rearm() {
    let mut sim = Sim::new(Moderation::None, 256);
    sim.cq.arrive(1000);
    sim.settle();
    sim.check_quiescent();
    let done: Vec<u32> = sim.reports.iter().map(|r| r.completed).collect();
    assert_eq!(done, [256, 256, 256, 232]);
    assert_eq!(sim.stats.budget_exhausted, 3);
    assert_eq!(sim.cq.keep_polling, 3);
    // Re-armed once, by the pass that stayed under budget.
    assert_eq!(sim.cq.rearms, 1);
    assert_eq!(sim.reports[3].end, Some(PassEnd::Rearm));
    assert!(sim.reports[..3].iter().all(|r| r.end.is_none()));
}

#[test]
fn an_exactly_full_pass_polls_once_more_before_rearming() {
    let mut sim = Sim::new(Moderation::None, 64);
    sim.cq.arrive(64);
    sim.settle();
    sim.check_quiescent();
    let done: Vec<u32> = sim.reports.iter().map(|r| r.completed).collect();
    assert_eq!(done, [64, 0]);
}

#[test]
fn polls_in_batches_within_the_budget() {
    for budget in [1, 15, 16, 17, 63, 64, 65, 100, 256] {
        let mut sim = Sim::new(Moderation::None, budget);
        sim.cq.arrive(300);
        sim.settle();
        sim.check_quiescent();
        assert!(sim.cq.polls.iter().all(|&n| n <= POLL_BATCH));
        assert!(sim.reports.iter().all(|r| r.completed <= budget));
    }
}

#[test]
fn a_cq_that_reports_too_many_cannot_break_the_budget() {
    let mut cq = FakeCq::default();
    cq.over_report = 100;
    cq.arrive(5);
    let mut stats = PassStats::default();
    let budget = 2 * POLL_BATCH + POLL_BATCH / 2;
    let r = run_pass(
        &mut cq,
        Moderation::None,
        &mut ModState::default(),
        budget,
        &mut stats,
    );
    assert!(
        r.completed <= budget,
        "{} of a budget of {budget}",
        r.completed
    );
    assert_eq!(cq.polls, [POLL_BATCH, POLL_BATCH, POLL_BATCH / 2]);
}

#[test]
fn a_poll_that_finds_an_upstream_batch_polls_again() {
    for (waiting, polls) in [
        (POLL_AGAIN_AT - 1, 1),
        (POLL_AGAIN_AT, 2),
        (POLL_AGAIN_AT + 4, 2),
        (POLL_BATCH + 1, 2),
        (POLL_BATCH + POLL_AGAIN_AT, 3),
    ] {
        let mut cq = FakeCq::default();
        cq.arrive(waiting);
        let mut stats = PassStats::default();
        let r = run_pass(
            &mut cq,
            Moderation::None,
            &mut ModState::default(),
            256,
            &mut stats,
        );
        assert_eq!(r.completed, waiting);
        assert_eq!(cq.polls.len(), polls, "{waiting} waiting: {:?}", cq.polls);
    }
}

#[test]
fn no_moderation_feeds_no_dim() {
    let mut sim = Sim::new(Moderation::None, 256);
    sim.cq.arrive(50);
    sim.settle();
    assert!(sim.cq.samples.is_empty());
    assert_eq!(sim.stats.samples, 0);
}

#[test]
fn dim_samples_once_per_pass() {
    let mut sim = Sim::new(Moderation::Dim, 256);
    sim.cq.arrive(600);
    sim.settle();
    sim.check_quiescent();
    assert_eq!(sim.cq.samples, [256, 256, 88]);
    assert_eq!(sim.stats.samples, 3);
}

/// One completion every `gap` microseconds, `n` of them; returns the sim once idle.
fn stream(mode: Moderation, profile_ix: u8, hw: bool, gap: u64, n: u64) -> Sim {
    let mut sim = Sim::new(mode, 256);
    sim.cq.profile_ix = profile_ix;
    sim.cq.hw_moderation = hw;
    for i in 0..n {
        sim.advance(i * gap);
        sim.cq.arrive(1);
        sim.settle();
    }
    sim.drain();
    sim.check_quiescent();
    sim
}

#[test]
fn software_dim_raises_fewer_events_than_none() {
    let none = stream(Moderation::None, 0, false, 2, 400);
    // Profile 5: (16 usec, 8 comps).
    let dim = stream(Moderation::Dim, 5, false, 2, 400);
    assert_eq!(none.cq.events, 400);
    assert!(
        dim.cq.events * 4 < none.cq.events,
        "{} events with DIM, {} without",
        dim.cq.events,
        none.cq.events
    );
    assert!(dim.cq.defers.iter().all(|&u| u == 16));
}

#[test]
fn dim_profile_zero_and_hardware_moderation_only_rearm() {
    for (ix, hw) in [(0, false), (5, true), (8, true)] {
        let sim = stream(Moderation::Dim, ix, hw, 3, 100);
        assert!(sim.cq.defers.is_empty(), "profile {ix} hw {hw} deferred");
        assert_eq!(sim.cq.events, 100);
    }
}

#[test]
fn adaptive_switches_to_polling_and_back() {
    let mut sim = Sim::new(Moderation::Adaptive, 256);
    sim.cq.arrive(2);
    sim.settle();
    assert_eq!(
        sim.stats.mode_switches, 0,
        "a light pass stays in interrupt mode"
    );
    // 1/8 of the budget in one pass: polling mode, no re-arm until a pass finds nothing.
    let rearms = sim.cq.rearms;
    sim.cq.arrive(40);
    sim.settle();
    sim.check_quiescent();
    let ends: Vec<_> = sim.reports[1..].iter().map(|r| r.end).collect();
    assert_eq!(ends, [Some(PassEnd::Poll), Some(PassEnd::Rearm)]);
    assert_eq!(sim.stats.mode_switches, 2);
    assert_eq!(sim.cq.rearms, rearms + 1);
    // Polling mode polls again through the yielding path, never by leaving the list and
    // scheduling itself at once (which, in softirq, ran the next pass in the same run).
    assert_eq!(sim.cq.repolls, 1);
}

#[test]
fn adaptive_enters_polling_from_the_dim_profile() {
    let mut sim = Sim::new(Moderation::Adaptive, 256);
    sim.cq.profile_ix = 3;
    sim.cq.arrive(1);
    sim.settle();
    sim.check_quiescent();
    assert_eq!(sim.reports[0].end, Some(PassEnd::Poll));
    assert_eq!(sim.stats.mode_switches, 2);
}

/// Random arrivals, race-window arrivals, profiles, budgets and modes: whatever the
/// interleaving, every completion is handed on exactly once and in order, and an idle engine
/// leaves the CQ armed and empty.
#[test]
fn random_interleavings_lose_nothing() {
    let mut rng = Rng::new(0x1b_e7);
    // (missed at re-arm, budget used, deferrals, timer moved, mode switches), over all rounds:
    // the seed must reach every one of the engine's paths, or the test proves little.
    let mut reached = [0u64; 5];
    for round in 0..400 {
        let mode = Moderation::ALL[round % 3];
        let budget = [1u32, 8, 16, 33, 256][rng.below(5) as usize];
        let mut sim = Sim::new(mode, budget);
        sim.cq.event_when_armed_nonempty = rng.below(2) == 0;
        sim.cq.hw_moderation = rng.below(4) == 0;
        let mut t = 0;
        for _ in 0..rng.below(60) + 1 {
            sim.cq.race_window.push_back(rng.below(3) as u32);
            sim.cq.profile_ix = rng.below(9) as u8;
            t += rng.below(40);
            sim.advance(t);
            sim.cq.arrive(rng.below(50) as u32);
            if rng.below(3) == 0 {
                sim.settle();
            }
        }
        sim.drain();
        sim.check_quiescent();
        for (r, n) in reached.iter_mut().zip([
            sim.stats.missed_at_rearm,
            sim.stats.budget_exhausted,
            sim.cq.defers.len() as u64,
            sim.cq.timer_restarts,
            sim.stats.mode_switches,
        ]) {
            *r += n;
        }
    }
    assert!(
        reached.iter().all(|&n| n > 0),
        "paths not reached: {reached:?}"
    );
}

/// Teardown stops the context while the CQ is in polling mode, with completions still queued
/// and a pass scheduled: the pass running finishes, no pass starts after the context is
/// disabled, and nothing was handed on twice.
#[test]
fn teardown_while_polling() {
    for mode in Moderation::ALL {
        let mut sim = Sim::new(mode, 16);
        sim.cq.profile_ix = 5;
        sim.cq.arrive(100);
        // Two passes, then teardown disables the context (irq_poll_disable, cancel_work_sync,
        // hrtimer_cancel): what is pending is dropped, and nothing schedules again.
        for _ in 0..2 {
            sim.run_one();
        }
        sim.cq.disabled = true;
        sim.cq.pending = false;
        sim.cq.timer = None;
        let passes = sim.stats.passes;
        sim.cq.arrive(5);
        sim.advance(1_000);
        assert_eq!(
            sim.stats.passes, passes,
            "{mode:?}: a pass ran after teardown"
        );
        let mut seen = sim.cq.delivered.clone();
        seen.dedup();
        assert_eq!(seen.len(), sim.cq.delivered.len());
        assert_eq!(sim.cq.delivered, (0..32).collect::<Vec<u64>>());
    }
}

/// `poll_pass` is the poller's exclusive part: in every mode, whatever it finds, it leaves the
/// poll list, re-arms, schedules and defers nothing (the tail, `end_pass`, does all of that
/// after the pass's last write), and it has counted its pass when it returns.
#[test]
fn poll_pass_leaves_the_list_to_its_tail() {
    for mode in Moderation::ALL {
        for (arrivals, profile_ix) in [(0, 0), (3, 0), (40, 5), (300, 8)] {
            let mut cq = FakeCq {
                profile_ix,
                ..FakeCq::default()
            };
            cq.arrive(arrivals);
            cq.on_list = true;
            let mut st = ModState::default();
            let mut stats = PassStats::default();
            let r = poll_pass(&mut cq, mode, &mut st, 256, &mut stats);
            assert!(cq.on_list, "{mode:?}: left the poll list inside the pass");
            assert_eq!((cq.rearms, cq.pending, cq.timer), (0, false, None));
            assert!(cq.defers.is_empty() && cq.keep_polling == 0);
            assert_eq!(stats.passes, 1);
            assert_eq!(stats.completions, u64::from(r.completed));
            end_pass(&mut cq, r.end, &mut stats);
            // Only a re-arm or a deferral leaves the list: a pass that used its budget, and one
            // that polls again (polling mode), stay on it as irq_poll's NAPI-like owner.
            let stays = matches!(r.end, None | Some(PassEnd::Poll));
            assert_eq!(cq.on_list, stays, "{mode:?}");
            assert_eq!(
                cq.repolls,
                u64::from(r.end == Some(PassEnd::Poll)),
                "{mode:?}"
            );
        }
    }
}
