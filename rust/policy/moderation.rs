// SPDX-License-Identifier: GPL-2.0

//! Interrupt moderation policy: what the completion engine does at the end of a poll pass.
//!
//! The DIM *decision* (which profile) is the kernel's own `lib/dim` (`rdma_dim()`); this file
//! only decides how a profile is applied where the device cannot apply it itself (rxe has no
//! `modify_cq`), and when the adaptive mode switches between interrupt and polling mode.

use super::{profiles::profile, soft_dim::SoftDim};

/// How a pooled CQ is moderated. CQs of different modes never share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moderation {
    /// Re-arm after every pass that ends under budget.
    None,
    /// DIM: `rdma_dim()` picks a profile; hardware applies it, or software defers re-arming.
    Dim,
    /// NAPI-like: interrupt mode until load is high, then polling without re-arming.
    Adaptive,
}

impl Moderation {
    /// Every mode, in the order of `enum ibext_moderation`.
    pub(crate) const ALL: [Moderation; 3] =
        [Moderation::None, Moderation::Dim, Moderation::Adaptive];

    /// The mode for a C `enum ibext_moderation` value.
    pub(crate) fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// The name shown in debugfs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Moderation::None => "none",
            Moderation::Dim => "dim",
            Moderation::Adaptive => "adaptive",
        }
    }
}

/// The adaptive mode enters polling mode from this DIM profile up: from (2 usec, 8 comps),
/// DIM has seen completions arrive in batches of 8 and more per event.
pub(crate) const ADAPTIVE_POLL_PROFILE: u8 = 3;

/// The adaptive mode also enters polling mode after a pass that filled this fraction of its
/// budget (1/8: 32 completions in softirq context): completions then arrive faster than
/// wakeups can follow, and each re-arm only buys an event that is due at once.
pub(crate) const ADAPTIVE_POLL_BUDGET_DIV: u32 = 8;

/// What the engine does once a pass that stayed under budget is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassEnd {
    /// Re-arm the CQ (and poll again if completions were missed).
    Rearm,
    /// Do not re-arm; poll again after `usec` microseconds (software moderation).
    Defer {
        /// Microseconds.
        usec: u16,
    },
    /// Do not re-arm; poll again at once (polling mode).
    Poll,
}

/// The moderation state the engine keeps between passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ModState {
    /// Adaptive mode: in polling mode.
    pub(crate) polling: bool,
    /// Mode switches (adaptive), for debugfs and the tests.
    pub(crate) switches: u64,
    /// The last pass ended in [`PassEnd::Defer`]: the next pass is the deferred poll (the CQ is
    /// not armed meanwhile, so nothing else schedules one).
    pub(crate) deferred: bool,
    /// Adaptive mode in software: whether its polling mode defers, judged by what the
    /// deferrals find ([`SoftDim`], as for legacy CQs).
    pub(crate) soft: SoftDim,
}

/// What one finished pass looked like.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pass {
    /// Completions the pass handled.
    pub(crate) completed: u32,
    /// Whether it used its whole budget (the engine then polls again without re-arming,
    /// whatever the mode).
    pub(crate) exhausted: bool,
    /// The pass's budget.
    pub(crate) budget: u32,
    /// The DIM profile index now.
    pub(crate) profile_ix: u8,
    /// Whether the device applies profiles itself (`modify_cq`).
    pub(crate) hw_moderation: bool,
}

/// Decides what follows a pass; `None` if the pass used its whole budget (the engine stays in
/// polling mode on its own). Updates the adaptive state.
///
/// - `None` mode re-arms.
/// - `Dim` with hardware moderation re-arms (the device batches). In software, profile 0
///   re-arms at once (depth-1 latency stays as without moderation). Otherwise the software
///   stands in for the device's (`usec`, `comps`) rule, under which an event is raised once
///   `comps` completions are queued or `usec` after the first:
///   - a pass that found `comps` or more polls again at once (the device would have raised
///     the next event at once; re-arming only buys that event);
///   - a pass that found fewer defers the next poll by `usec` instead of re-arming;
///   - a deferred poll that finds nothing re-arms. A pass that was not deferred and found
///     nothing (it followed a full pass) still waits `usec` once.
/// - `Adaptive` starts in interrupt mode (re-arm) and enters polling mode when a pass fills
///   1/[`ADAPTIVE_POLL_BUDGET_DIV`] of its budget (or all of it) or DIM reaches
///   [`ADAPTIVE_POLL_PROFILE`]; in polling mode it does not re-arm, and it falls back to
///   interrupt mode when a pass finds the CQ empty. Polling mode polls again at once where the
///   device moderates itself. In software it asks [`SoftDim`], fed by the polling passes only:
///   on a device that makes completions at the CPU's pace (rxe) a pass that polls again at once
///   finds the CQ empty, so while the deferred passes find completions in batches (1.5 each or
///   more) the next pass is deferred by SoftDim's period instead, and a pass that found the
///   profile's `comps` polls again at once. Interrupt mode never waits on a timer: a light load
///   (depth 1) keeps its latency.
pub(crate) fn end_of_pass(mode: Moderation, st: &mut ModState, pass: Pass) -> Option<PassEnd> {
    let deferred = core::mem::replace(&mut st.deferred, false);
    let heavy = pass.exhausted
        || pass.completed >= pass.budget / ADAPTIVE_POLL_BUDGET_DIV
        || pass.profile_ix >= ADAPTIVE_POLL_PROFILE;
    if mode == Moderation::Adaptive && !st.polling && heavy {
        st.polling = true;
        st.switches += 1;
    }
    if pass.exhausted {
        return None;
    }
    let end = match mode {
        Moderation::None => PassEnd::Rearm,
        Moderation::Dim => {
            let p = profile(pass.profile_ix);
            if pass.hw_moderation || pass.profile_ix == 0 {
                PassEnd::Rearm
            } else if pass.completed >= u32::from(p.comps) {
                PassEnd::Poll
            } else if pass.completed == 0 && deferred {
                PassEnd::Rearm
            } else {
                PassEnd::Defer { usec: p.usec }
            }
        }
        Moderation::Adaptive => {
            if st.polling && !pass.hw_moderation {
                st.soft.sample(pass.completed, deferred);
            }
            if st.polling && pass.completed == 0 {
                st.polling = false;
                st.switches += 1;
            }
            if !st.polling {
                PassEnd::Rearm
            } else if pass.hw_moderation {
                PassEnd::Poll
            } else {
                soft_poll(&st.soft, pass)
            }
        }
    };
    st.deferred = matches!(end, PassEnd::Defer { .. });
    Some(end)
}

/// Adaptive mode's polling mode in software: polls again at once, or after [`SoftDim`]'s
/// period while its deferrals find completions in batches.
fn soft_poll(soft: &SoftDim, pass: Pass) -> PassEnd {
    let p = soft.profile();
    if soft.profile_ix() == 0 || pass.completed >= u32::from(p.comps) {
        PassEnd::Poll
    } else {
        PassEnd::Defer { usec: p.usec }
    }
}
