// SPDX-License-Identifier: GPL-2.0

//! The SRQ growth policy against a fake SRQ, in virtual time: the maintenance work runs when
//! a limit event queues it and when a run asks to be run again, and at no other time.

use super::Rng;
use crate::policy::{
    cq_pool::AGE_MS,
    srq_growth::{Growth, Pressure, Ran, Steps},
    srq_pool::{limit_for, plan, Caps, Request, MAX_STEPS},
};

/// An SRQ as the policy sees it: its own buffers, its steps (size, retiring), the limits armed
/// and what the owner was told.
#[derive(Default)]
struct FakeSrq {
    own: u32,
    steps: Vec<(u32, bool)>,
    armed: Vec<u32>,
    told: Vec<(Pressure, u32)>,
    declared: u32,
    fail_add: bool,
    fail_arm: bool,
}

impl Steps for FakeSrq {
    fn add_step(&mut self, n: u32) -> bool {
        if self.fail_add || self.steps.len() >= MAX_STEPS as usize {
            return false;
        }
        self.steps.push((n, false));
        true
    }

    fn retire_newest(&mut self) -> u32 {
        match self.steps.iter_mut().rev().find(|(_, r)| !*r) {
            Some((n, r)) => {
                *r = true;
                *n
            }
            None => 0,
        }
    }

    fn arm_limit(&mut self, limit: u32) -> bool {
        assert!(limit > 0, "a limit of 0 is never armed");
        if self.fail_arm {
            return false;
        }
        self.armed.push(limit);
        true
    }

    fn tell(&mut self, what: Pressure, posted: u32) {
        self.told.push((what, posted));
    }

    fn target(&self) -> u32 {
        self.own
            + self
                .steps
                .iter()
                .filter(|(_, r)| !r)
                .map(|(n, _)| n)
                .sum::<u32>()
    }

    fn held(&self) -> u32 {
        self.own + self.steps.iter().map(|(n, _)| n).sum::<u32>()
    }

    fn declared(&self) -> u32 {
        self.declared
    }
}

impl FakeSrq {
    /// The mechanism frees a retired step once its buffers are back: here at once.
    fn free_retired(&mut self) {
        self.steps.retain(|(_, r)| !r);
    }
}

/// A pool's plan for `srq_size` managed buffers of 4 KiB on rxe: the step and the cap.
fn planned(srq_size: u32) -> (u32, u32) {
    let caps = Caps {
        max_srq: 917_503,
        max_srq_wr: 1_048_576,
        max_srq_sge: 27,
        vectors: 4,
    };
    let req = Request {
        nr_srqs: 1,
        srq_size,
        max_sge: 1,
        buf_size: 4096,
        has_recv_done: true,
        max_srq_size: 0,
    };
    let p = plan(&req, &caps).unwrap();
    (p.step, p.max_size)
}

fn managed(srq_size: u32) -> (Growth, FakeSrq) {
    let (step, max) = planned(srq_size);
    let g = Growth::new(step, max, srq_size, limit_for(srq_size), 0);
    let s = FakeSrq {
        own: srq_size,
        ..Default::default()
    };
    (g, s)
}

#[test]
fn a_limit_event_adds_a_step_and_rearms_at_a_quarter() {
    let (mut g, mut s) = managed(256);
    let ran = g.run(&mut s, true, 10, Some(10), AGE_MS);
    assert!(ran.grown && !ran.grow_failed && !ran.arm_failed && !ran.shrunk);
    assert_eq!(s.steps, vec![(256, false)]);
    assert_eq!(s.told, vec![(Pressure::Grown, 512)]);
    assert_eq!(s.armed, vec![128]);
    // Grown: look again when a quiet period could have passed.
    assert_eq!(ran.again_in_ms, Some(AGE_MS));
}

#[test]
fn growth_stops_at_the_cap_and_the_limit_is_still_rearmed() {
    let (mut g, mut s) = managed(256);
    let (_, max) = planned(256);
    for t in 1..=10 {
        g.run(&mut s, true, t, Some(t), AGE_MS);
    }
    assert_eq!(s.held(), max);
    assert_eq!(s.steps.len(), 3);
    assert_eq!(
        s.told.iter().filter(|(p, _)| *p == Pressure::Grown).count(),
        3
    );
    // Every event re-arms, at the cap too.
    assert_eq!(s.armed.len(), 10);
    assert_eq!(*s.armed.last().unwrap(), max / 4);
}

#[test]
fn a_quiet_period_retires_one_step_at_a_time() {
    let (mut g, mut s) = managed(256);
    for t in 0..3 {
        g.run(&mut s, true, t, Some(t), AGE_MS);
    }
    assert_eq!(s.target(), 1024);
    // Not yet a period.
    let ran = g.run(&mut s, false, 2 + AGE_MS - 1, Some(2 + AGE_MS - 1), AGE_MS);
    assert!(!ran.shrunk);
    assert_eq!(ran.again_in_ms, Some(1));
    // A period: one step, and the next period starts now.
    let t = 2 + AGE_MS;
    let ran = g.run(&mut s, false, t, Some(t), AGE_MS);
    assert!(ran.shrunk);
    assert_eq!(s.target(), 768);
    assert_eq!(*s.told.last().unwrap(), (Pressure::Shrunk, 768));
    assert_eq!(*s.armed.last().unwrap(), 192);
    assert_eq!(ran.again_in_ms, Some(AGE_MS));
    // Run again at once: nothing more goes.
    let ran = g.run(&mut s, false, t, Some(t), AGE_MS);
    assert!(!ran.shrunk);
    assert_eq!(s.target(), 768);
}

#[test]
fn held_aging_retires_nothing() {
    let (mut g, mut s) = managed(256);
    g.run(&mut s, true, 0, Some(0), AGE_MS);
    for k in 1..5 {
        let ran = g.run(&mut s, false, k * AGE_MS, None, AGE_MS);
        assert!(!ran.shrunk);
        // Still grown: the work keeps looking.
        assert_eq!(ran.again_in_ms, Some(1));
    }
    assert_eq!(s.target(), 512);
}

fn owner_posted(max_wr: u32, posted: u32) -> (Growth, FakeSrq) {
    let g = Growth::owner_posted(max_wr, posted, 0);
    let s = FakeSrq {
        declared: posted,
        ..Default::default()
    };
    (g, s)
}

#[test]
fn an_owner_posted_srq_is_told_and_rearmed_where_it_was() {
    let (mut g, mut s) = owner_posted(1024, 256);
    let ran = g.run(&mut s, true, 5, Some(5), AGE_MS);
    assert!(!ran.grown && !ran.grow_failed);
    assert_eq!(s.told, vec![(Pressure::Low, 1024)]);
    assert_eq!(s.armed, vec![64]);
    assert_eq!(ran.again_in_ms, None);
    // Quiet periods change nothing for an owner that posts what it posted at creation.
    let ran = g.run(&mut s, false, 5 + 3 * AGE_MS, Some(5 + 3 * AGE_MS), AGE_MS);
    assert_eq!(ran, Ran::default());
    assert_eq!(s.told.len(), 1);
}

#[test]
fn an_owner_posted_srq_without_a_limit_arms_none() {
    let (mut g, mut s) = owner_posted(2, 2);
    let ran = g.run(&mut s, true, 1, Some(1), AGE_MS);
    assert!(!ran.arm_failed);
    assert!(s.armed.is_empty());
}

/// The owner posts a step more when told `Low` (here between runs, as it would inside the
/// callback) and says so: the limit follows at a quarter, on the event's run or, said outside
/// it, on the next.
#[test]
fn the_limit_follows_what_the_owner_says_it_posts() {
    let (mut g, mut s) = owner_posted(1024, 64);
    g.run(&mut s, true, 10, Some(10), AGE_MS);
    assert_eq!(s.armed, vec![16]);
    s.declared = 128;
    // Said outside the callback: the run it kicks re-arms; one more changes nothing.
    let ran = g.run(&mut s, false, 20, Some(20), AGE_MS);
    assert_eq!(s.armed, vec![16, 32]);
    assert!(!ran.shrunk && !ran.arm_failed);
    assert_eq!(ran.again_in_ms, Some(AGE_MS - 10));
    g.run(&mut s, false, 30, Some(30), AGE_MS);
    assert_eq!(s.armed, vec![16, 32]);
    // The next event re-arms at what is said now.
    s.declared = 192;
    g.run(&mut s, true, 40, Some(40), AGE_MS);
    assert_eq!(s.armed, vec![16, 32, 48]);
    assert_eq!(s.told, vec![(Pressure::Low, 1024), (Pressure::Low, 1024)]);
}

/// An owner that posts more than at creation hears `Quiet` once per quiet period, and no more
/// once it is back where it started.
#[test]
fn a_grown_owner_hears_quiet_once_per_period() {
    let (mut g, mut s) = owner_posted(1024, 64);
    s.declared = 192;
    g.run(&mut s, true, 0, Some(0), AGE_MS);
    assert_eq!(s.armed, vec![48]);
    // Not yet quiet for a whole period.
    let ran = g.run(&mut s, false, AGE_MS - 1, Some(AGE_MS - 1), AGE_MS);
    assert!(!ran.shrunk);
    assert_eq!(ran.again_in_ms, Some(1));
    let ran = g.run(&mut s, false, AGE_MS, Some(AGE_MS), AGE_MS);
    assert!(ran.shrunk);
    assert_eq!(s.told.last(), Some(&(Pressure::Quiet, 192)));
    // The owner gives a step back inside the callback: the same run re-arms.
    s.declared = 128;
    g.run(&mut s, false, AGE_MS, Some(AGE_MS), AGE_MS);
    assert_eq!(s.armed, vec![48, 32]);
    // The next notice needs another whole period.
    let ran = g.run(&mut s, false, 2 * AGE_MS - 1, Some(2 * AGE_MS - 1), AGE_MS);
    assert!(!ran.shrunk);
    let ran = g.run(&mut s, false, 2 * AGE_MS, Some(2 * AGE_MS), AGE_MS);
    assert!(ran.shrunk);
    s.declared = 64;
    let ran = g.run(&mut s, false, 2 * AGE_MS, Some(2 * AGE_MS), AGE_MS);
    assert_eq!(s.armed, vec![48, 32, 16]);
    assert_eq!(ran.again_in_ms, None);
    let ran = g.run(&mut s, false, 9 * AGE_MS, Some(9 * AGE_MS), AGE_MS);
    assert_eq!(ran, Ran::default());
    let quiets = s.told.iter().filter(|(w, _)| *w == Pressure::Quiet).count();
    assert_eq!(quiets, 2);
    // Held aging tells nothing.
    s.declared = 128;
    let ran = g.run(&mut s, false, 20 * AGE_MS, None, AGE_MS);
    assert!(!ran.shrunk);
}

/// The period is the caller's (`ibext.age_ms`): with 2 s, the quiet notice comes after 2 s, not
/// before, and the next look is due within 2 s.
#[test]
fn the_quiet_period_is_the_one_given() {
    const AGE: u64 = 2_000;
    let (mut g, mut s) = owner_posted(1024, 64);
    s.declared = 128;
    let ran = g.run(&mut s, true, 0, Some(0), AGE);
    assert_eq!(ran.again_in_ms, Some(AGE));
    let ran = g.run(&mut s, false, AGE - 1, Some(AGE - 1), AGE);
    assert!(!ran.shrunk);
    assert_eq!(ran.again_in_ms, Some(1));
    let ran = g.run(&mut s, false, AGE, Some(AGE), AGE);
    assert!(ran.shrunk);
    assert_eq!(s.told.last(), Some(&(Pressure::Quiet, 128)));
}

#[test]
fn a_failed_step_is_reported_and_the_limit_rearmed() {
    let (mut g, mut s) = managed(256);
    s.fail_add = true;
    let ran = g.run(&mut s, true, 1, Some(1), AGE_MS);
    assert!(ran.grow_failed && !ran.grown);
    assert!(s.told.is_empty());
    assert_eq!(s.armed, vec![64]);
    assert_eq!(ran.again_in_ms, None);
}

#[test]
fn a_refused_arm_keeps_the_old_limit() {
    let (mut g, mut s) = owner_posted(1024, 256);
    s.fail_arm = true;
    let ran = g.run(&mut s, true, 1, Some(1), AGE_MS);
    assert!(ran.arm_failed);
    s.fail_arm = false;
    g.run(&mut s, true, 2, Some(2), AGE_MS);
    assert_eq!(s.armed, vec![64]);
}

/// Bursts of limit events at random times, the work run only when an event queues it or a run
/// asks for it: the SRQ never holds more than its cap, is back to its own buffers within
/// `MAX_STEPS` quiet periods of the last event, and each retirement is a quiet period after
/// the last event or retirement.
#[test]
fn random_bursts_in_virtual_time() {
    let mut rng = Rng::new(28);
    for srq_size in [4, 64, 256, 1000] {
        let (_, max) = planned(srq_size);
        let (mut g, mut s) = managed(srq_size);
        let mut t = 0u64;
        let mut next_run: Option<u64> = None;
        let mut last_change = 0u64;
        for _ in 0..200 {
            // The next event comes within two periods.
            let ev = t + rng.below(2 * AGE_MS);
            // Runs asked for before it.
            while let Some(at) = next_run.filter(|&at| at < ev) {
                let before = s.target();
                s.free_retired();
                let ran = g.run(&mut s, false, at, Some(at), AGE_MS);
                if ran.shrunk {
                    assert!(at - last_change >= AGE_MS);
                    assert!(s.target() < before);
                    last_change = at;
                }
                next_run = ran.again_in_ms.map(|ms| at + ms);
            }
            t = ev;
            s.free_retired();
            let ran = g.run(&mut s, true, t, Some(t), AGE_MS);
            last_change = t;
            assert!(s.held() <= max);
            assert!(s.steps.len() <= MAX_STEPS as usize);
            next_run = ran.again_in_ms.map(|ms| t + ms);
        }
        // Then quiet: back to its own buffers, one step per period.
        let steps = s.steps.len() as u64;
        while let Some(at) = next_run {
            s.free_retired();
            let ran = g.run(&mut s, false, at, Some(at), AGE_MS);
            next_run = ran.again_in_ms.map(|ms| at + ms);
            assert!(at <= t + (steps + 1) * AGE_MS);
        }
        s.free_retired();
        assert_eq!(s.target(), srq_size);
        assert!(s.steps.is_empty());
    }
}
