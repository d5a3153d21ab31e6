// SPDX-License-Identifier: GPL-2.0

//! SRQ growth and retirement: when an SRQ with managed buffers adds a step of buffers, when it
//! gives the newest step back, where its limit is armed, and what the owner is told.
//!
//! [`Growth`] is the decision, over [`Steps`], the mechanism that carries it out
//! (`recv_srq.rs`: allocating, mapping and posting a step, marking one retiring, arming the
//! limit with `ib_modify_srq`, calling the owner). [`Growth::run`] is one run of the SRQ's
//! maintenance work; the host tests drive it with a fake SRQ in virtual time, as they drive the
//! engine's passes.
//!
//! - A limit event (fewer receives posted than the limit) adds a step, up to the SRQ's cap,
//!   and arms the limit again at a quarter of what is now meant to be posted.
//! - Once no limit event has come for an aging period (`age_ms`, by default
//!   [`AGE_MS`](super::cq_pool::AGE_MS)), the newest step retires, one step per quiet period,
//!   and the limit follows what is meant to be posted.
//! - While grown, the work looks again when a quiet period could have passed.
//!
//! An SRQ whose receives the owner posts grows nothing itself. The owner says how many it keeps
//! posted ([`Steps::declared`]; at first what it posted at creation), and the limit follows
//! that, at a quarter. A limit event tells it [`Pressure::Low`] (it may post more); once no
//! limit event has come for an aging period while it keeps more posted than at creation, it is
//! told [`Pressure::Quiet`] (it may give some back), one quiet period at a time.

use super::srq_pool::{limit_for, next_step};

/// What changed about an SRQ's receives, for the owner's `pressure` callback
/// (`enum ibext_srq_pressure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pressure {
    /// The limit was reached on an SRQ whose receives the owner posts: it may post more.
    Low,
    /// ibext posted a step of managed buffers more.
    Grown,
    /// The pressure is gone: ibext gives a step of managed buffers back as they return.
    Shrunk,
    /// The pressure is gone on an SRQ whose receives the owner posts, and which holds more than
    /// the owner posted at creation: it may give some back.
    Quiet,
}

/// What [`Growth`] does to an SRQ: the mechanism's side. Called from the maintenance work only,
/// one run at a time.
pub(crate) trait Steps {
    /// Adds a step of `n` managed buffers, posted; false if it could not be made.
    fn add_step(&mut self, n: u32) -> bool;
    /// Marks the newest step that is not retiring yet as retiring; returns its size (0: none).
    fn retire_newest(&mut self) -> u32;
    /// Arms the SRQ's limit at `limit` (at least 1); false if the device refused.
    fn arm_limit(&mut self, limit: u32) -> bool;
    /// Tells the owner `what`, with the receives now meant to be posted.
    fn tell(&mut self, what: Pressure, posted: u32);
    /// The managed buffers meant to be posted: the SRQ's own and those of the steps not
    /// retiring.
    fn target(&self) -> u32;
    /// The managed buffers held in all: the SRQ's own and every step's, retiring or not.
    fn held(&self) -> u32;
    /// The receives the owner says it keeps posted, on an SRQ whose receives it posts (0 for
    /// managed buffers).
    fn declared(&self) -> u32;
}

/// What one [`Growth::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ran {
    /// A step was added.
    pub(crate) grown: bool,
    /// A step was wanted and could not be made.
    pub(crate) grow_failed: bool,
    /// A step was marked retiring, or the owner that posts the receives was told it may give
    /// some back.
    pub(crate) shrunk: bool,
    /// The limit was to be armed again and the device refused.
    pub(crate) arm_failed: bool,
    /// Run again in this many milliseconds (at least 1); `None`: only on the next event.
    pub(crate) again_in_ms: Option<u64>,
}

/// The growth state of one SRQ.
///
/// # Invariants
///
/// `limit` is the limit armed last (0: none armed); `last_pressure_ms` is not after the `now`
/// of any later run; `own` and `base` are not both non-zero.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Growth {
    /// Managed buffers a step adds (0: the SRQ does not grow).
    step: u32,
    /// The most receives the SRQ holds.
    max_wr: u32,
    /// The SRQ's own managed buffers (0: the owner posts the receives).
    own: u32,
    /// The receives the owner posted at creation, if it posts them (0: managed buffers).
    base: u32,
    /// The limit armed last.
    limit: u32,
    /// When the last limit event (or retirement) was acted on, in milliseconds.
    last_pressure_ms: u64,
}

impl Growth {
    /// The state of an SRQ made at `now_ms` with `own` managed buffers, `step` more per step up
    /// to `max_wr`, and `limit` armed at creation.
    pub(crate) fn new(step: u32, max_wr: u32, own: u32, limit: u32, now_ms: u64) -> Self {
        Growth {
            step,
            max_wr,
            own,
            base: 0,
            limit,
            last_pressure_ms: now_ms,
        }
    }

    /// The state of an SRQ made at `now_ms` with room for `max_wr` receives, of which its owner
    /// posted `posted` itself, with the limit armed at [`limit_for`]`(posted)`.
    pub(crate) fn owner_posted(max_wr: u32, posted: u32, now_ms: u64) -> Self {
        Growth {
            step: 0,
            max_wr,
            own: 0,
            base: posted,
            limit: limit_for(posted),
            last_pressure_ms: now_ms,
        }
    }

    /// One run of the maintenance work at `now` (milliseconds), after `limit_hit` limit events
    /// (any number since the last run count as one). `aging_now` is the clock aging is measured
    /// on: `now`, or in the KUnit flavour a shifted one; `None` holds aging (nothing retires).
    /// `age_ms` is the aging period.
    pub(crate) fn run<S: Steps>(
        &mut self,
        s: &mut S,
        limit_hit: bool,
        now: u64,
        aging_now: Option<u64>,
        age_ms: u64,
    ) -> Ran {
        let mut ran = Ran::default();
        if limit_hit {
            self.last_pressure_ms = now;
            if self.own == 0 {
                // The owner posts the receives: it decides.
                s.tell(Pressure::Low, self.max_wr);
            } else if let Some(n) = next_step(self.step, self.max_wr, s.held()) {
                if s.add_step(n) {
                    ran.grown = true;
                    s.tell(Pressure::Grown, s.target());
                } else {
                    ran.grow_failed = true;
                }
            }
            ran.arm_failed = !self.rearm(s);
        } else if self.own == 0 {
            if s.declared() > self.base && self.quiet_at(aging_now) >= age_ms {
                // One notice per quiet period, as one step retires per period.
                self.last_pressure_ms = now;
                ran.shrunk = true;
                s.tell(Pressure::Quiet, s.declared());
            }
            // The owner said it posts more, or fewer, receives than the limit was armed for.
            if self.limit != self.wanted_limit(s) {
                ran.arm_failed = !self.rearm(s);
            }
        } else if self.quiet_at(aging_now) >= age_ms && s.retire_newest() > 0 {
            // One step per quiet period: the next goes only if the quiet lasts another.
            self.last_pressure_ms = now;
            ran.shrunk = true;
            s.tell(Pressure::Shrunk, s.target());
            ran.arm_failed = !self.rearm(s);
        }
        // While grown, look again once a quiet period could have passed, on the real clock.
        let grown = if self.own == 0 {
            s.declared() > self.base
        } else {
            s.target() > self.own
        };
        if grown {
            let quiet = now.saturating_sub(self.last_pressure_ms);
            ran.again_in_ms = Some(age_ms.saturating_sub(quiet).max(1));
        }
        ran
    }

    /// Milliseconds since the last limit event on aging's clock; 0 while aging is held.
    fn quiet_at(&self, aging_now: Option<u64>) -> u64 {
        aging_now.map_or(0, |t| t.saturating_sub(self.last_pressure_ms))
    }

    /// The limit for what is meant to be posted now: a quarter of the managed buffers, or of the
    /// receives the owner says it posts.
    fn wanted_limit<S: Steps>(&self, s: &S) -> u32 {
        if self.own == 0 {
            limit_for(s.declared())
        } else {
            limit_for(s.target())
        }
    }

    /// Arms the limit again, at [`Growth::wanted_limit`]. Returns false if the device refused.
    fn rearm<S: Steps>(&mut self, s: &mut S) -> bool {
        let limit = self.wanted_limit(s);
        if limit == 0 {
            return true;
        }
        if !s.arm_limit(limit) {
            return false;
        }
        self.limit = limit;
        true
    }
}
