// SPDX-License-Identifier: GPL-2.0

use super::Rng;
use crate::policy::{profiles::RDMA_DIM_PROFILES, soft_dim::*};

/// Feeds one window of runs: `raised` of them started by ibext, finding `found` each; the
/// others find `other`. Returns the profile index after the window.
fn window(s: &mut SoftDim, raised: u8, found: u32, other: u32) -> u8 {
    let mut ix = s.profile_ix();
    for i in 0..WINDOW {
        ix = if i < raised {
            s.sample(found, true)
        } else {
            s.sample(other, false)
        };
    }
    ix
}

#[test]
fn starts_off_and_tries_after_one_window() {
    let mut s = SoftDim::default();
    assert_eq!(s.profile_ix(), 0);
    for _ in 0..WINDOW - 1 {
        assert_eq!(s.sample(1, false), 0);
    }
    assert_eq!(s.sample(1, false), ON_PROFILE);
}

#[test]
fn deferrals_that_batch_keep_it_on() {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    for _ in 0..100 {
        // Under load: nearly every run is a deferred one and finds 2.
        assert_eq!(window(&mut s, 60, 2, 1), ON_PROFILE);
    }
}

/// A selection on at its longest period: one window off, then [`MAX_LEVEL`] windows of
/// deferred runs that found one each.
fn at_max_level() -> SoftDim {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    for _ in 0..MAX_LEVEL {
        window(&mut s, WINDOW, 1, 0);
    }
    assert_eq!(s.profile().usec, 32 << MAX_LEVEL);
    s
}

#[test]
fn keeping_needs_one_and_a_half_per_deferral() {
    let s = at_max_level();
    // 3 completions per 2 deferred runs: kept, at the longest period.
    let mut on = s;
    let mut ix = 0;
    for i in 0..WINDOW {
        ix = on.sample(if i % 2 == 0 { 1 } else { 2 }, true);
    }
    assert_eq!(ix, ON_PROFILE);
    assert_eq!(on.profile().usec, 32 << MAX_LEVEL);
    // One completion fewer in the window, with no longer period left: off.
    let mut slower = s;
    for i in 0..WINDOW {
        ix = slower.sample(
            if i == 0 {
                0
            } else if i % 2 == 0 {
                1
            } else {
                2
            },
            true,
        );
    }
    assert_eq!(ix, 0);
    assert_eq!(slower.profile(), RDMA_DIM_PROFILES[0]);
}

#[test]
fn small_batches_double_the_period_large_ones_keep_it() {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    // Three per deferred run: the period stays.
    for _ in 0..10 {
        assert_eq!(window(&mut s, 40, LONGER_BELOW_FOUND, 1), ON_PROFILE);
        assert_eq!(s.profile().usec, 32);
    }
    // Two each (batched, but small): the period doubles each window, up to the longest, and
    // stays on there.
    for level in 1..=MAX_LEVEL {
        assert_eq!(window(&mut s, 40, LONGER_BELOW_FOUND - 1, 1), ON_PROFILE);
        assert_eq!(s.profile().usec, 32 << level);
    }
    for _ in 0..10 {
        assert_eq!(window(&mut s, 40, LONGER_BELOW_FOUND - 1, 1), ON_PROFILE);
        assert_eq!(s.profile().usec, 32 << MAX_LEVEL);
    }
}

#[test]
fn slow_arrivals_double_the_period_up_to_max_level() {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    let top = RDMA_DIM_PROFILES[usize::from(ON_PROFILE)];
    assert_eq!(s.profile(), top);
    // Each deferred run finds one completion: the period doubles each window...
    for level in 1..=MAX_LEVEL {
        assert_eq!(window(&mut s, WINDOW, 1, 0), ON_PROFILE);
        assert_eq!(s.profile().usec, top.usec << level);
        assert_eq!(s.profile().comps, top.comps);
    }
    // ...and at the longest, one more such window turns moderation off.
    assert_eq!(window(&mut s, WINDOW, 1, 0), 0);
    assert_eq!(s.profile(), RDMA_DIM_PROFILES[0]);
    // It comes on again at the table's period.
    assert_eq!(window(&mut s, 0, 0, 1), ON_PROFILE);
    assert_eq!(s.profile(), top);
}

/// A selection on at 64 µs: one window off, then one of deferred runs that found one each.
fn at_64_us() -> SoftDim {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    window(&mut s, WINDOW, 1, 0);
    assert_eq!(s.profile().usec, 64);
    s
}

#[test]
fn a_longer_period_that_batches_is_kept() {
    let mut s = at_64_us();
    for _ in 0..100 {
        assert_eq!(window(&mut s, 40, LONGER_BELOW_FOUND, 1), ON_PROFILE);
        assert_eq!(s.profile().usec, 64);
    }
}

#[test]
fn nothing_found_at_a_longer_period_turns_it_off_early() {
    let mut s = at_64_us();
    for i in 0..MIN_RAISED {
        assert_eq!(s.profile().usec, 64, "{i}");
        s.sample(1, false);
        s.sample(0, true);
    }
    assert_eq!(s.profile_ix(), 0);
}

#[test]
fn depth_one_backs_off_to_one_window_in_sixty_four() {
    let mut s = SoftDim::default();
    let mut on_windows = 0;
    let mut total = 0;
    for w in 0..2000 {
        let was_on = s.profile_ix() == ON_PROFILE;
        // Depth 1 while on: each run that finds the reply defers; ibext's call finds nothing.
        let ix = if was_on {
            window(&mut s, WINDOW / 2, 0, 1)
        } else {
            window(&mut s, 0, 0, 1)
        };
        if was_on {
            // A failed try lasts one window.
            assert_eq!(ix, 0, "window {w}");
            on_windows += 1;
        }
        if w >= 1000 {
            total += u32::from(was_on);
        }
    }
    assert!(on_windows > 0);
    // From the longest back-off on: one window on in every MAX_BACKOFF_WINDOWS + 1.
    assert!(
        total <= 1000 / u32::from(MAX_BACKOFF_WINDOWS) + 1,
        "{total}"
    );
}

#[test]
fn a_failed_try_costs_min_raised_deferrals() {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    for backoff in [1u16, 2, 4] {
        assert_eq!(s.profile_ix(), ON_PROFILE);
        // Depth 1: the run with the reply defers, and ibext's call finds nothing.
        let mut deferred = 0;
        while s.profile_ix() == ON_PROFILE {
            s.sample(1, false);
            s.sample(0, true);
            deferred += 1;
        }
        assert_eq!(deferred, MIN_RAISED);
        // Off from that run on, for `backoff` whole windows.
        for _ in 0..u32::from(backoff) * u32::from(WINDOW) - 1 {
            assert_eq!(s.sample(1, false), 0);
        }
        assert_eq!(s.sample(1, false), ON_PROFILE);
    }
}

#[test]
fn a_kept_window_resets_the_back_off() {
    let mut s = SoftDim::default();
    // Three failed tries: the waits were 1 and 2 windows, and now 4.
    for _ in 0..3 {
        while s.profile_ix() == 0 {
            window(&mut s, 0, 0, 1);
        }
        assert_eq!(window(&mut s, 32, 0, 1), 0);
    }
    let mut waited = 0;
    while s.profile_ix() == 0 {
        window(&mut s, 0, 0, 1);
        waited += 1;
    }
    assert_eq!(waited, 4);
    // Load comes: kept, and the next failure waits one window only.
    assert_eq!(window(&mut s, 64, 3, 0), ON_PROFILE);
    assert_eq!(window(&mut s, 32, 0, 1), 0);
    assert_eq!(window(&mut s, 0, 0, 1), ON_PROFILE);
}

#[test]
fn too_few_deferred_runs_do_not_judge() {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    // Runs that find the profile's count arm at once; the few deferred ones found nothing.
    for _ in 0..10 {
        assert_eq!(window(&mut s, MIN_RAISED - 1, 0, 40), ON_PROFILE);
    }
    assert_eq!(window(&mut s, MIN_RAISED, 0, 40), 0);
}

#[test]
fn found_saturates() {
    let mut s = SoftDim::default();
    window(&mut s, 0, 0, 1);
    assert_eq!(window(&mut s, WINDOW, u32::MAX, 0), ON_PROFILE);
}

#[test]
fn bits_round_trip() {
    let mut rng = Rng::new(31);
    let mut s = SoftDim::default();
    for _ in 0..100_000 {
        assert_eq!(SoftDim::from_bits(s.to_bits()), s);
        let found = match rng.below(4) {
            0 => 0,
            1 => 1,
            2 => rng.below(5) as u32,
            _ => rng.below(3000) as u32,
        };
        s.sample(found, rng.below(2) == 0);
    }
}

#[test]
fn profile_changed_reads_the_profile_from_the_bits() {
    let mut rng = Rng::new(37);
    let mut s = SoftDim::default();
    let mut changes = 0;
    for _ in 0..100_000 {
        let before = s;
        let found = match rng.below(3) {
            0 => 0,
            1 => 1 + rng.below(2) as u32,
            _ => rng.below(8) as u32,
        };
        s.sample(found, rng.below(4) != 0);
        let changed = s.profile() != before.profile();
        changes += u32::from(changed);
        assert_eq!(
            SoftDim::profile_changed(before.to_bits(), s.to_bits()),
            changed
        );
    }
    assert!(changes > 10, "{changes}");
}
