// SPDX-License-Identifier: GPL-2.0

//! Which profile software moderation applies to a legacy CQ on a device without `modify_cq`, and
//! whether a pooled CQ's adaptive polling mode polls again at once or after a period
//! (`policy::moderation::end_of_pass`).
//!
//! On such a device ibext applies a profile by leaving the CQ unarmed for the profile's time and
//! then calling the ULP's handler once (`legacy_dim::arm`, `policy::moderation::end_of_pass`).
//! That deferral has its own price: a timer, and a handler call that is an event of its own. It
//! pays only when the run that call starts finds more than one completion, and how many it finds
//! is something the software can count directly, which a device's `rdma_dim()` cannot: lib/dim
//! climbs while completions per event grow, and a deferral of the low profiles' 1 to 4 µs finds
//! nothing more on a device that makes completions at the CPU's pace (rxe: about one per
//! 15–40 µs under load in the benchmark guest), so it never reaches a profile that would batch.
//!
//! So the software choice is between profile 0 (arm at once) and the table's highest profile
//! ([`ON_PROFILE`], 32 µs or 32 completions), whose period software may double up to
//! [`MAX_LEVEL`] times (128 µs), judged by what the deferrals find:
//!
//! - Every [`WINDOW`] runs of the ULP, the runs that ibext's handler calls started are counted
//!   with what their first poll found.
//! - While on, a window with at least [`MIN_RAISED`] such runs is judged by what they found on
//!   average: [`LONGER_BELOW_FOUND`] (3) or more keeps the period; [`KEEP_FOUND_X2`]/2 (1.5) or
//!   more but fewer than 3 keeps moderation on and doubles the period (up to [`MAX_LEVEL`]
//!   times), since a longer wait batches more for the same one event; at least one but fewer
//!   than 1.5 means completions keep coming, slower than the period, and the period doubles
//!   (up to [`MAX_LEVEL`] times; beyond, moderation goes off); fewer than one turns moderation
//!   off: the deferrals did not batch (at depth 1 the peer waits for the reply, and the deferred
//!   run finds nothing). That last case is judged as soon as the window's [`MIN_RAISED`]th
//!   deferred run is seen, so that a try that fails costs that many deferrals, not a window's
//!   worth (half of its runs at depth 1). Off, the period starts again at 32 µs.
//! - While off, moderation comes on again after a back-off of 1, 2, 4 … [`MAX_BACKOFF_WINDOWS`]
//!   windows, doubling after every failed try and starting again at 1 after a window that kept
//!   it. At depth 1 that is one window of deferrals in 64 once the back-off is at its longest.
//!
//! The state fits in a `u64` ([`SoftDim::to_bits`]) so that the kernel side keeps it in one
//! atomic, written only by the CQ's one sampler.

use super::profiles::{Profile, RDMA_DIM_PROFILES};

/// The runs in one window.
pub(crate) const WINDOW: u8 = 64;

/// The profile applied while software moderation is on: the table's highest.
pub(crate) const ON_PROFILE: u8 = (RDMA_DIM_PROFILES.len() - 1) as u8;

/// A window judges the deferrals only if at least this many runs were started by ibext.
pub(crate) const MIN_RAISED: u8 = 8;

/// Twice the average completions a deferred run must find for moderation to stay on: 1.5.
pub(crate) const KEEP_FOUND_X2: u32 = 3;

/// A window whose deferred runs batched ([`KEEP_FOUND_X2`]) but found fewer completions each
/// than this doubles the period, up to [`MAX_LEVEL`] times.
pub(crate) const LONGER_BELOW_FOUND: u32 = 3;

/// The longest back-off, in windows.
pub(crate) const MAX_BACKOFF_WINDOWS: u16 = 64;

/// The longest software period while on: [`ON_PROFILE`]'s 32 µs doubled this many times.
pub(crate) const MAX_LEVEL: u8 = 2;

/// Software moderation's state for one CQ.
///
/// # Invariants
///
/// `samples < WINDOW`, `raised <= samples`, `backoff <= MAX_BACKOFF_WINDOWS` and is a power of
/// two, `wait <= backoff`; `wait` is 0 while `on`; `level <= MAX_LEVEL`, and 0 while off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SoftDim {
    /// Runs seen in this window.
    samples: u8,
    /// Of those, the runs that ibext's handler call started.
    raised: u8,
    /// Completions the raised runs found (saturating).
    found: u16,
    /// While off: windows left before moderation comes on again.
    wait: u16,
    /// The back-off after the next failed try, in windows.
    backoff: u16,
    /// Whether moderation is on.
    on: bool,
    /// While on: the period is [`ON_PROFILE`]'s doubled this many times.
    level: u8,
}

impl Default for SoftDim {
    /// Off, trying after one window: a new CQ starts without moderation, as under lib/dim.
    fn default() -> Self {
        SoftDim {
            samples: 0,
            raised: 0,
            found: 0,
            wait: 1,
            backoff: 1,
            on: false,
            level: 0,
        }
    }
}

impl SoftDim {
    /// The profile index to apply: 0, or [`ON_PROFILE`].
    pub(crate) fn profile_ix(&self) -> u8 {
        if self.on {
            ON_PROFILE
        } else {
            0
        }
    }

    /// Feeds one run of the ULP that found `found` completions; `raised` if ibext's handler call
    /// started it. Returns the profile index to apply from now on.
    pub(crate) fn sample(&mut self, found: u32, raised: bool) -> u8 {
        self.samples += 1;
        if raised {
            self.raised += 1;
            self.found = self
                .found
                .saturating_add(found.min(u32::from(u16::MAX)) as u16);
        }
        if self.on && raised && self.raised == MIN_RAISED && self.found < u16::from(MIN_RAISED) {
            // The first deferrals of the window found less than one completion each: every
            // further one would cost its wait for nothing (at depth 1, the reply's).
            self.turn_off();
        } else if self.samples == WINDOW {
            self.end_window();
        }
        self.profile_ix()
    }

    /// The profile to apply: profile 0 while off; while on, [`ON_PROFILE`] with its period
    /// doubled `level` times.
    pub(crate) fn profile(&self) -> Profile {
        let mut p = RDMA_DIM_PROFILES[usize::from(self.profile_ix())];
        if self.on {
            p.usec <<= self.level;
        }
        p
    }

    /// Whether the window's deferred runs found [`KEEP_FOUND_X2`]/2 completions each.
    fn batched(&self) -> bool {
        2 * u32::from(self.found) >= KEEP_FOUND_X2 * u32::from(self.raised)
    }

    fn turn_off(&mut self) {
        self.on = false;
        self.level = 0;
        self.wait = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF_WINDOWS);
        self.new_window();
    }

    fn new_window(&mut self) {
        self.samples = 0;
        self.raised = 0;
        self.found = 0;
    }

    fn end_window(&mut self) {
        if self.on {
            // With fewer deferred runs, the runs found the profile's count or the CQ went
            // quiet, and nothing says the deferrals failed.
            if self.raised >= MIN_RAISED {
                let (found, raised) = (u32::from(self.found), u32::from(self.raised));
                if self.batched() {
                    self.backoff = 1;
                    if found < LONGER_BELOW_FOUND * raised && self.level < MAX_LEVEL {
                        // Small batches: a longer period batches more, for one event each.
                        self.level += 1;
                    }
                } else if found >= raised && self.level < MAX_LEVEL {
                    // Completions keep coming, slower than the period: a longer one.
                    self.level += 1;
                } else {
                    return self.turn_off();
                }
            }
        } else {
            self.wait = self.wait.saturating_sub(1);
            if self.wait == 0 {
                self.on = true;
            }
        }
        self.new_window();
    }

    /// The state as one word, for an atomic.
    pub(crate) fn to_bits(self) -> u64 {
        u64::from(self.samples)
            | u64::from(self.raised) << 8
            | u64::from(self.found) << 16
            | u64::from(self.wait) << 32
            | u64::from(self.backoff) << 48
            | u64::from(self.level) << 56
            | u64::from(self.on) << 63
    }

    /// Whether two states ([`SoftDim::to_bits`]) apply different profiles: the profile depends
    /// on `on` and `level` only, the word's top byte.
    pub(crate) fn profile_changed(before: u64, after: u64) -> bool {
        (before ^ after) >> 56 != 0
    }

    /// The state [`SoftDim::to_bits`] made.
    pub(crate) fn from_bits(b: u64) -> Self {
        SoftDim {
            samples: b as u8,
            raised: (b >> 8) as u8,
            found: (b >> 16) as u16,
            wait: (b >> 32) as u16,
            backoff: ((b >> 48) as u16) & 0xff,
            level: ((b >> 56) as u8) & 3,
            on: b >> 63 != 0,
        }
    }
}
