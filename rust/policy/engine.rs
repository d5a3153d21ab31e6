// SPDX-License-Identifier: GPL-2.0

//! The completion engine's poll pass, as pure code over [`PassOps`].
//!
//! `rust/engine/pooled_cq.rs` implements [`PassOps`] for a pooled CQ's pass (ib_core's `ib_poll_cq`, the CQ's
//! `wr_cqe->done` callbacks, `ib_req_notify_cq`, irq_poll or ibext's workqueues, an hrtimer and
//! lib/dim); the host tests implement it for a fake CQ. What a pass does, and in which order, is
//! decided here only:
//!
//! 1. poll in batches of [`POLL_BATCH`] up to the budget, handing every completion on, until a
//!    poll finds fewer than it asked for and fewer than [`POLL_AGAIN_AT`];
//! 2. with moderation, feed DIM one sample for the pass (as upstream's `ib_poll_handler`);
//! 3. let [`end_of_pass`] decide what follows: nothing (the budget was used: stay in polling
//!    mode, without re-arming); another pass without re-arming, after the poller has yielded
//!    ([`PassOps::repoll`]); or, after leaving the poll list, a re-arm with
//!    `IB_CQ_REPORT_MISSED_EVENTS` that schedules another pass if completions were missed (the
//!    race-free loop from the IB/srp thread), or a deferred pass.
//!
//! The counters [`poll_pass`] keeps are the poller's own (one poller per CQ at a time), so the
//! kernel side may store them without read-modify-write atomics; [`end_pass`] runs after the
//! pass left the poll list, and what it counts (missed completions at re-arm) is counted
//! atomically.

use super::moderation::{end_of_pass, ModState, Moderation, Pass, PassEnd};

/// Completions polled per `ib_poll_cq` call: 64, NAPI's default weight, where upstream's
/// `IB_POLL_BATCH` is 16.
///
/// Each call takes the driver's CQ lock (rxe, mlx5). A pass of `n` completions makes
/// `n / 64 + 1` calls, one more if the last `n % 64` are 16 or more ([`POLL_AGAIN_AT`]), where
/// upstream makes `n / 16 + 1`: 2 against 2 for 16, 3 against 9 for 128. The array is the
/// CQ's own (4.5 KiB of `ib_wc`), and a pooled CQ serves many QPs. The drain benchmark
/// measures the difference.
pub(crate) const POLL_BATCH: u32 = 64;

/// A poll that found at least this many completions is followed by another, even if it found
/// fewer than it asked for: upstream's `IB_POLL_BATCH`, whose full batch means "poll again".
///
/// Completions that arrive while a pass runs its callbacks are then picked up by the pass, as
/// upstream's would pick them up, instead of by a re-arm and a new event. With a batch of 64
/// and no such rule, NVMe over RDMA at queue depth 32 (`make bench`, one job) took 1.16 and
/// 1.25 times upstream's events per I/O in two runs; with a batch of 16, 0.94.
pub(crate) const POLL_AGAIN_AT: u32 = 16;

/// What a pass asks of its CQ and the CQ's poll context.
///
/// Every method is called by the CQ's poller only: those [`poll_pass`] calls one pass at a
/// time, those [`end_pass`] calls (`leave_poll_list`, `rearm`, `schedule`, `defer`,
/// `keep_polling`, `repoll`) possibly beside the next pass.
pub(crate) trait PassOps {
    /// Polls at most `max` (at most [`POLL_BATCH`]) completions and hands each to its
    /// consumer; returns how many.
    fn poll(&mut self, max: u32) -> u32;
    /// Arms the CQ for the next completion; returns whether completions may have arrived
    /// unreported since the last poll (`IB_CQ_REPORT_MISSED_EVENTS`).
    fn rearm(&mut self) -> bool;
    /// Schedules another pass in the CQ's context.
    fn schedule(&mut self);
    /// Schedules another pass after `usec` microseconds (software moderation).
    fn defer(&mut self, usec: u16);
    /// Feeds DIM one sample: a pass that handled `completed` completions.
    fn dim_sample(&mut self, completed: u32);
    /// The DIM profile index now.
    fn profile_ix(&self) -> u8;
    /// Whether the device applies DIM profiles itself (`modify_cq`).
    fn hw_moderation(&self) -> bool;
    /// The pass leaves the context's poll list (irq_poll's `irq_poll_complete`); called before
    /// the CQ is re-armed or another pass is scheduled.
    fn leave_poll_list(&mut self);
    /// The pass used its budget: the context keeps polling (irq_poll keeps the CQ on its list;
    /// a work item requeues itself).
    fn keep_polling(&mut self);
    /// The pass stayed under budget but the CQ is to be polled again without re-arming (polling
    /// mode, [`PassEnd::Poll`]): poll again once the CPU has been offered to others, as NAPI
    /// does for an instance that is not done. irq_poll keeps the CQ on its list as a pass that
    /// used its whole budget, so the softirq ends its run first (and, after its restarts, hands
    /// over to `ksoftirqd`); a work item requeues itself (its worker yields between items).
    /// Called instead of `leave_poll_list`.
    fn repoll(&mut self);
}

/// The poller's counters, in the order of [`PassStats::ALL`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PassStats {
    /// Poll passes.
    pub(crate) passes: u64,
    /// Completions handed on.
    pub(crate) completions: u64,
    /// Passes that used their whole budget and stayed in polling mode.
    pub(crate) budget_exhausted: u64,
    /// DIM samples (one per pass with moderation).
    pub(crate) samples: u64,
    /// Adaptive mode: switches between interrupt and polling mode.
    pub(crate) mode_switches: u64,
    /// Re-arms that reported missed completions, so another pass was scheduled at once.
    pub(crate) missed_at_rearm: u64,
}

/// What one pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PassReport {
    /// Completions handed on.
    pub(crate) completed: u32,
    /// What followed: `None` when the budget was used and the context keeps polling.
    pub(crate) end: Option<PassEnd>,
}

/// The part of a pass that only the CQ's poller may run (steps 1 and 2, and the decision of
/// step 3): it polls, feeds DIM and moves the moderation state. Everything it writes is written
/// when it returns, before [`end_pass`] leaves the poll list: from then on, an event on another
/// CPU may start the next pass there (irq_poll) while this one is still ending.
pub(crate) fn poll_pass<C: PassOps>(
    cq: &mut C,
    mode: Moderation,
    st: &mut ModState,
    budget: u32,
    stats: &mut PassStats,
) -> PassReport {
    let mut completed = 0u32;
    while completed < budget {
        let want = (budget - completed).min(POLL_BATCH);
        // A CQ that reports more than it was asked for is a driver bug: never count past
        // `want`, so the budget holds.
        let n = cq.poll(want).min(want);
        completed += n;
        if n < want && n < POLL_AGAIN_AT {
            break;
        }
    }
    stats.passes += 1;
    stats.completions += u64::from(completed);
    let exhausted = completed >= budget;
    if exhausted {
        stats.budget_exhausted += 1;
    }
    let end = if mode == Moderation::None {
        (!exhausted).then_some(PassEnd::Rearm)
    } else {
        cq.dim_sample(completed);
        stats.samples += 1;
        let before = st.switches;
        let end = end_of_pass(
            mode,
            st,
            Pass {
                completed,
                exhausted,
                budget,
                profile_ix: cq.profile_ix(),
                hw_moderation: cq.hw_moderation(),
            },
        );
        stats.mode_switches += st.switches - before;
        end
    };
    PassReport { completed, end }
}

/// What follows a pass (step 3), given what [`poll_pass`] decided: nothing (the budget was
/// used: stay in polling mode), another pass after yielding, or leave the poll list and then
/// re-arm (scheduling a pass for missed completions) or defer. After leaving the list it
/// touches no state of the poller's: another pass may already be running.
pub(crate) fn end_pass<C: PassOps>(cq: &mut C, end: Option<PassEnd>, stats: &mut PassStats) {
    match end {
        None => cq.keep_polling(),
        Some(PassEnd::Poll) => cq.repoll(),
        Some(PassEnd::Rearm) => {
            cq.leave_poll_list();
            if cq.rearm() {
                stats.missed_at_rearm += 1;
                cq.schedule();
            }
        }
        Some(PassEnd::Defer { usec }) => {
            cq.leave_poll_list();
            cq.defer(usec);
        }
    }
}
