// SPDX-License-Identifier: GPL-2.0

use crate::policy::{
    moderation::*,
    profiles::*,
    soft_dim::{MIN_RAISED, ON_PROFILE, WINDOW},
};

fn pass(completed: u32, exhausted: bool, profile_ix: u8) -> Pass {
    Pass {
        completed,
        exhausted,
        budget: 256,
        profile_ix,
        hw_moderation: false,
    }
}

#[test]
fn none_always_rearms_under_budget() {
    let mut st = ModState::default();
    for ix in 0..9 {
        assert_eq!(
            end_of_pass(Moderation::None, &mut st, pass(3, false, ix)),
            Some(PassEnd::Rearm)
        );
    }
    assert_eq!(
        end_of_pass(Moderation::None, &mut st, pass(256, true, 0)),
        None
    );
}

#[test]
fn dim_profile_zero_rearms_at_once() {
    // Depth 1: DIM stays at profile 0, and profile 0 must not add latency.
    let mut st = ModState::default();
    for completed in [0, 1, 2] {
        assert_eq!(
            end_of_pass(Moderation::Dim, &mut st, pass(completed, false, 0)),
            Some(PassEnd::Rearm)
        );
    }
}

#[test]
fn dim_software_defers_small_passes() {
    let mut st = ModState::default();
    let dim = Moderation::Dim;
    // Profile 5 = (16 usec, 8 comps).
    assert_eq!(
        end_of_pass(dim, &mut st, pass(3, false, 5)),
        Some(PassEnd::Defer { usec: 16 })
    );
    // The deferred poll found more, still fewer than `comps`: wait again.
    assert_eq!(
        end_of_pass(dim, &mut st, pass(2, false, 5)),
        Some(PassEnd::Defer { usec: 16 })
    );
    // A deferred poll that finds nothing re-arms.
    assert_eq!(
        end_of_pass(dim, &mut st, pass(0, false, 5)),
        Some(PassEnd::Rearm)
    );
    assert!(!st.deferred);
    // `comps` or more: the device would have raised an event at once, so poll at once.
    assert_eq!(
        end_of_pass(dim, &mut st, pass(8, false, 5)),
        Some(PassEnd::Poll)
    );
    // That poll found nothing: it was not deferred, so wait `usec` once before re-arming.
    assert_eq!(
        end_of_pass(dim, &mut st, pass(0, false, 5)),
        Some(PassEnd::Defer { usec: 16 })
    );
    assert_eq!(
        end_of_pass(dim, &mut st, pass(0, false, 5)),
        Some(PassEnd::Rearm)
    );
    // A full pass keeps polling on its own, and the pass after it is not a deferred one.
    assert_eq!(
        end_of_pass(dim, &mut st, pass(3, false, 8)),
        Some(PassEnd::Defer { usec: 32 })
    );
    assert_eq!(end_of_pass(dim, &mut st, pass(256, true, 8)), None);
    assert_eq!(
        end_of_pass(dim, &mut st, pass(0, false, 8)),
        Some(PassEnd::Defer { usec: 32 })
    );
    // Hardware moderation: the device batches, software re-arms.
    for completed in [0, 3, 8, 100] {
        let hw = Pass {
            hw_moderation: true,
            ..pass(completed, false, 5)
        };
        assert_eq!(end_of_pass(dim, &mut st, hw), Some(PassEnd::Rearm));
    }
}

/// A synthetic trace: a burst of completions arriving faster than passes, then silence. The
/// software rule re-arms once per burst, where no moderation re-arms after every pass.
#[test]
fn dim_software_rearms_once_per_burst() {
    let passes = [40u32, 35, 12, 9, 3, 0];
    let count = |mode, ix| {
        let mut st = ModState::default();
        passes
            .iter()
            .filter(|&&c| end_of_pass(mode, &mut st, pass(c, false, ix)) == Some(PassEnd::Rearm))
            .count()
    };
    assert_eq!(count(Moderation::None, 8), passes.len());
    assert_eq!(count(Moderation::Dim, 8), 1);
    assert_eq!(count(Moderation::Dim, 0), passes.len());
}

#[test]
fn dim_profiles_match_ib_core() {
    let want = [
        (1, 1),
        (1, 4),
        (2, 4),
        (2, 8),
        (4, 8),
        (16, 8),
        (16, 16),
        (32, 16),
        (32, 32),
    ];
    for (i, (usec, comps)) in want.into_iter().enumerate() {
        assert_eq!(profile(i as u8), Profile { usec, comps });
        // What `modify_cq` takes: (cq_count, cq_period).
        assert_eq!(comps_usec(i as u8), (comps, usec));
    }
    assert_eq!(
        profile(200),
        Profile {
            usec: 32,
            comps: 32
        },
        "clamped"
    );
}

#[test]
fn adaptive_switches_on_load_and_back_on_empty() {
    let mut st = ModState::default();
    let m = Moderation::Adaptive;
    // Light load: interrupt mode.
    assert_eq!(
        end_of_pass(m, &mut st, pass(2, false, 0)),
        Some(PassEnd::Rearm)
    );
    assert!(!st.polling);
    // A pass that uses its budget: polling from now on.
    assert_eq!(end_of_pass(m, &mut st, pass(256, true, 0)), None);
    assert!(st.polling);
    assert_eq!(
        end_of_pass(m, &mut st, pass(100, false, 0)),
        Some(PassEnd::Poll)
    );
    assert_eq!(
        end_of_pass(m, &mut st, pass(1, false, 0)),
        Some(PassEnd::Poll)
    );
    // Empty: back to interrupt mode, re-armed.
    assert_eq!(
        end_of_pass(m, &mut st, pass(0, false, 0)),
        Some(PassEnd::Rearm)
    );
    assert!(!st.polling);
    assert_eq!(st.switches, 2);
    // DIM's profile can also say load is high.
    assert_eq!(
        end_of_pass(m, &mut st, pass(5, false, ADAPTIVE_POLL_PROFILE)),
        Some(PassEnd::Poll)
    );
    assert_eq!(
        end_of_pass(m, &mut st, pass(5, false, ADAPTIVE_POLL_PROFILE - 1)),
        Some(PassEnd::Poll)
    );
    assert_eq!(st.switches, 3);
    // And a pass that fills an eighth of its budget.
    assert_eq!(
        end_of_pass(m, &mut st, pass(0, false, 0)),
        Some(PassEnd::Rearm)
    );
    assert_eq!(
        end_of_pass(m, &mut st, pass(31, false, 0)),
        Some(PassEnd::Rearm)
    );
    assert_eq!(
        end_of_pass(m, &mut st, pass(32, false, 0)),
        Some(PassEnd::Poll)
    );
    assert_eq!(st.switches, 5);
}

#[test]
fn adaptive_synthetic_load_sequence() {
    // Bursty load: rising, sustained, then idle. Every switch is followed by the mode's action,
    // and the mode always ends in interrupt mode once the load is gone.
    let mut st = ModState::default();
    let m = Moderation::Adaptive;
    let seq: Vec<(u32, bool, u8)> = (0..3u8)
        .map(|i| (i as u32 * 10, false, i))
        .chain((0..50).map(|_| (256, true, 6)))
        .chain((0..20).map(|i| (200 - i * 10, false, 6)))
        .chain(std::iter::once((0, false, 6)))
        .chain((0..10).map(|_| (1, false, 0)))
        .collect();
    for (completed, exhausted, ix) in seq {
        let end = end_of_pass(m, &mut st, pass(completed, exhausted, ix));
        match end {
            None => assert!(exhausted),
            Some(PassEnd::Poll) => assert!(st.polling),
            Some(PassEnd::Rearm) => assert!(!st.polling),
            // In software, only SoftDim's tries defer, after a window of polling passes.
            Some(PassEnd::Defer { .. }) => panic!("no try in the first {WINDOW} passes"),
        }
    }
    assert!(!st.polling);
    assert_eq!(
        st.switches % 2,
        0,
        "every entry into polling has its way out"
    );
}

#[test]
fn modes_from_c_values() {
    assert_eq!(Moderation::from_raw(0), Some(Moderation::None));
    assert_eq!(Moderation::from_raw(1), Some(Moderation::Dim));
    assert_eq!(Moderation::from_raw(2), Some(Moderation::Adaptive));
    assert_eq!(Moderation::from_raw(3), None);
    let names: Vec<_> = Moderation::ALL.iter().map(|m| m.name()).collect();
    assert_eq!(names, ["none", "dim", "adaptive"], "as debugfs shows them");
}

#[test]
fn adaptive_polling_in_software_defers_only_while_the_deferrals_batch() {
    let m = Moderation::Adaptive;
    let top = profile(ON_PROFILE);
    let heavy = 256 / ADAPTIVE_POLL_BUDGET_DIV;
    let mut st = ModState::default();
    // Interrupt mode re-arms, however long it lasts: depth 1 never waits on a timer.
    for _ in 0..4 * u32::from(WINDOW) {
        assert_eq!(
            end_of_pass(m, &mut st, pass(1, false, 0)),
            Some(PassEnd::Rearm)
        );
    }
    // Polling mode polls again at once for its first window of passes...
    assert_eq!(
        end_of_pass(m, &mut st, pass(heavy, false, 0)),
        Some(PassEnd::Poll)
    );
    for _ in 2..WINDOW {
        assert_eq!(
            end_of_pass(m, &mut st, pass(1, false, 0)),
            Some(PassEnd::Poll)
        );
    }
    // ...then tries the longest profile's period.
    assert_eq!(
        end_of_pass(m, &mut st, pass(1, false, 0)),
        Some(PassEnd::Defer { usec: top.usec })
    );
    // Deferred passes that find 3 or more keep it, at that period.
    for _ in 0..2 * u32::from(WINDOW) {
        assert_eq!(
            end_of_pass(m, &mut st, pass(4, false, 0)),
            Some(PassEnd::Defer { usec: top.usec })
        );
    }
    // A batch the device would report at once is polled again at once.
    assert_eq!(
        end_of_pass(m, &mut st, pass(u32::from(top.comps), false, 0)),
        Some(PassEnd::Poll)
    );
    // An empty pass ends polling mode, as ever.
    assert_eq!(
        end_of_pass(m, &mut st, pass(0, false, 0)),
        Some(PassEnd::Rearm)
    );
    assert!(!st.polling);

    // Deferrals that find the CQ empty end the try after MIN_RAISED of them: polling mode polls
    // at once again.
    let mut st = ModState::default();
    end_of_pass(m, &mut st, pass(heavy, false, 0));
    for _ in 2..WINDOW {
        end_of_pass(m, &mut st, pass(1, false, 0));
    }
    assert_eq!(
        end_of_pass(m, &mut st, pass(1, false, 0)),
        Some(PassEnd::Defer { usec: top.usec })
    );
    assert_eq!(
        end_of_pass(m, &mut st, pass(0, false, 0)),
        Some(PassEnd::Rearm)
    );
    let mut deferred = 1;
    let mut last = None;
    for _ in 0..3 * MIN_RAISED {
        assert_eq!(
            end_of_pass(m, &mut st, pass(heavy, false, 0)),
            Some(PassEnd::Poll)
        );
        last = end_of_pass(m, &mut st, pass(1, false, 0));
        if last == Some(PassEnd::Poll) {
            break;
        }
        assert_eq!(last, Some(PassEnd::Defer { usec: top.usec }));
        deferred += 1;
        assert_eq!(
            end_of_pass(m, &mut st, pass(0, false, 0)),
            Some(PassEnd::Rearm)
        );
    }
    assert_eq!(last, Some(PassEnd::Poll));
    assert_eq!(deferred, MIN_RAISED);

    // Where the device moderates, polling mode only polls.
    let mut st = ModState::default();
    let hw = |completed| Pass {
        hw_moderation: true,
        ..pass(completed, false, 0)
    };
    assert_eq!(end_of_pass(m, &mut st, hw(heavy)), Some(PassEnd::Poll));
    for _ in 0..4 * u32::from(WINDOW) {
        assert_eq!(end_of_pass(m, &mut st, hw(2)), Some(PassEnd::Poll));
    }
    assert_eq!(end_of_pass(m, &mut st, hw(0)), Some(PassEnd::Rearm));
}
