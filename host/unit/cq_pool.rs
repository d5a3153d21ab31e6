// SPDX-License-Identifier: GPL-2.0

use super::Rng;
use crate::policy::cq_pool::*;

#[derive(Clone, Debug, Default)]
struct FakeCq {
    vector: u32,
    capacity: u32,
    used: u32,
    idle_since: u64,
}

impl AgingSlot for FakeCq {
    fn idle_since_ms(&self) -> u64 {
        self.idle_since
    }
}

impl Slot for FakeCq {
    fn vector(&self) -> u32 {
        self.vector
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn used(&self) -> u32 {
        self.used
    }
}

/// A pool driven only by the policy functions, as the kernel side drives them.
struct Pool {
    cqs: Vec<FakeCq>,
    usable: u32,
    max_cqe: u32,
    rr: u32,
    /// Drivers round sizes up; rxe makes 2^k - 1 >= n.
    round: fn(u32) -> u32,
}

impl Pool {
    fn new(usable: u32, max_cqe: u32) -> Self {
        Pool {
            cqs: Vec::new(),
            usable,
            max_cqe,
            rr: 0,
            round: |n| n,
        }
    }

    fn get(&mut self, nr: u32, hint: i32) -> Result<usize, Invalid> {
        check_nr_cqe(nr, self.max_cqe)?;
        let rr = &mut self.rr;
        let v = vector_for_hint(hint, self.usable, || {
            let r = *rr;
            *rr = rr.wrapping_add(1);
            r
        });
        let i = match pick_least_used(&self.cqs, v, nr) {
            Some(i) => i,
            None => {
                let size = (self.round)(grow_cqe(nr, self.max_cqe));
                for vector in 0..self.usable.max(1) {
                    self.cqs.push(FakeCq {
                        vector,
                        capacity: size,
                        ..Default::default()
                    });
                }
                pick_least_used(&self.cqs, v, nr).expect("a fresh set always fits a valid request")
            }
        };
        self.cqs[i].used += nr;
        Ok(i)
    }

    fn put(&mut self, i: usize, nr: u32) -> Result<(), OverPut> {
        self.cqs[i].used = put_back(self.cqs[i].used, nr)?;
        Ok(())
    }
}

/// The reference model: sort the candidates and take the first.
fn model_pick(cqs: &[FakeCq], vector: u32, nr: u32) -> Option<usize> {
    let mut cand: Vec<(u32, usize)> = cqs
        .iter()
        .enumerate()
        .filter(|(_, c)| c.vector == vector && c.capacity - c.used >= nr)
        .map(|(i, c)| (c.used, i))
        .collect();
    cand.sort();
    cand.first().map(|&(_, i)| i)
}

#[test]
fn bad_sizes_are_invalid() {
    assert_eq!(check_nr_cqe(0, 32767), Err(Invalid));
    assert_eq!(check_nr_cqe(32768, 32767), Err(Invalid));
    assert_eq!(check_nr_cqe(1, 32767), Ok(()));
    assert_eq!(check_nr_cqe(32767, 32767), Ok(()));
    let mut p = Pool::new(4, 100);
    assert!(p.get(0, 0).is_err());
    assert!(p.get(101, 0).is_err());
    assert!(p.cqs.is_empty(), "a refused request changes nothing");
}

#[test]
fn hint_maps_modulo_usable_vectors() {
    let never = || -> u32 { panic!("a non-negative hint must not use round-robin") };
    assert_eq!(vector_for_hint(0, 4, never), 0);
    assert_eq!(vector_for_hint(5, 4, never), 1);
    assert_eq!(vector_for_hint(i32::MAX, 4, never), (i32::MAX as u32) % 4);
    assert_eq!(vector_for_hint(3, 0, never), 0, "no vectors behaves as one");
}

#[test]
fn negative_hint_round_robins_per_device() {
    // Two devices, each with its own counter: one device's traffic does not skew the other's.
    let (mut a, mut b) = (Pool::new(4, 32767), Pool::new(4, 32767));
    let take = |p: &mut Pool| {
        let i = p.get(1, -1).unwrap();
        p.cqs[i].vector
    };
    let va: Vec<u32> = (0..8).map(|_| take(&mut a)).collect();
    let vb: Vec<u32> = (0..3).map(|_| take(&mut b)).collect();
    assert_eq!(va, [0, 1, 2, 3, 0, 1, 2, 3]);
    assert_eq!(vb, [0, 1, 2]);
}

#[test]
fn grows_one_set_of_min_4096_capped_by_max_cqe() {
    assert_eq!(grow_cqe(1, 32767), 4096);
    assert_eq!(grow_cqe(5000, 32767), 5000);
    assert_eq!(grow_cqe(100, 1000), 1000);
    let mut p = Pool::new(4, 32767);
    p.get(16, 2).unwrap();
    assert_eq!(p.cqs.len(), 4, "one CQ per vector");
    assert!(p
        .cqs
        .iter()
        .enumerate()
        .all(|(i, c)| c.vector == i as u32 && c.capacity == 4096));
}

#[test]
fn least_used_not_first_fit() {
    let mut p = Pool::new(1, 32767);
    // Two sets on the one vector: fill the first, grow, then free part of the first.
    let a = p.get(4000, 0).unwrap();
    let b = p.get(4000, 0).unwrap();
    assert_ne!(a, b);
    p.put(a, 3990).unwrap(); // a: 10 used, b: 4000 used
                             // First-fit would take b (if it came first) or a; least-used must take a.
    assert_eq!(p.get(50, 0).unwrap(), a);
    p.put(a, 60).unwrap();
    p.put(b, 1000).unwrap(); // a: 0, b: 3000
    assert_eq!(p.get(1, 0).unwrap(), a);
}

#[test]
fn ties_go_to_the_oldest_cq() {
    let cqs = vec![
        FakeCq {
            vector: 0,
            capacity: 10,
            used: 3,
            ..Default::default()
        },
        FakeCq {
            vector: 1,
            capacity: 10,
            used: 0,
            ..Default::default()
        },
        FakeCq {
            vector: 0,
            capacity: 10,
            used: 3,
            ..Default::default()
        },
    ];
    assert_eq!(pick_least_used(&cqs, 0, 1), Some(0));
    assert_eq!(pick_least_used(&cqs, 0, 8), None);
    assert_eq!(pick_least_used(&cqs, 1, 10), Some(1));
}

#[test]
fn over_put_is_refused_and_never_underflows() {
    assert_eq!(put_back(5, 6), Err(OverPut));
    assert_eq!(put_back(5, 0), Err(OverPut));
    assert_eq!(put_back(5, 5), Ok(0));
    let mut p = Pool::new(2, 32767);
    let i = p.get(10, 0).unwrap();
    assert!(p.put(i, 11).is_err());
    assert_eq!(p.cqs[i].used, 10, "a refused put changes nothing");
}

#[test]
fn rounded_up_capacity_is_used() {
    // rxe rounds 4096 up to 8191; the pool must count what the CQ really has.
    let mut p = Pool::new(1, 32767);
    p.round = |n| (n + 1).next_power_of_two() - 1;
    let a = p.get(4096, 0).unwrap();
    let b = p.get(4095, 0).unwrap();
    assert_eq!(a, b, "8191 entries hold both requests");
    assert_eq!(p.cqs.len(), 1);
}

#[test]
fn randomized_against_reference_model() {
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed);
        let usable = 1 + rng.below(6) as u32;
        let max_cqe = [64u32, 4096, 32767][rng.below(3) as usize];
        let mut p = Pool::new(usable, max_cqe);
        let mut held: Vec<(usize, u32)> = Vec::new();
        let mut total = 0u64;
        for _ in 0..2000 {
            if held.is_empty() || rng.below(3) != 0 {
                let nr = 1 + rng.below(u64::from(max_cqe.min(600))) as u32;
                let hint = rng.below(2 * u64::from(usable) + 2) as i32 - 1;
                let v = if hint >= 0 {
                    hint as u32 % usable
                } else {
                    p.rr % usable
                };
                let expect = model_pick(&p.cqs, v, nr);
                let before = p.cqs.len();
                let i = p.get(nr, hint).unwrap();
                match expect {
                    Some(e) => assert_eq!(i, e, "seed {seed}: least-used choice"),
                    None => assert_eq!(p.cqs.len(), before + usable as usize, "seed {seed}"),
                }
                assert_eq!(p.cqs[i].vector, v);
                assert!(p.cqs[i].used <= p.cqs[i].capacity);
                held.push((i, nr));
                total += u64::from(nr);
            } else {
                let k = rng.below(held.len() as u64) as usize;
                let (i, nr) = held.swap_remove(k);
                p.put(i, nr).unwrap();
                total -= u64::from(nr);
            }
            let used: u64 = p.cqs.iter().map(|c| u64::from(c.used)).sum();
            assert_eq!(used, total, "seed {seed}: entries in use balance");
        }
        for (i, nr) in held.drain(..) {
            p.put(i, nr).unwrap();
        }
        assert!(p.cqs.iter().all(|c| c.used == 0), "seed {seed}: all back");
        // Growth only when nothing fitted: never more than one set per request that missed.
        assert_eq!(p.cqs.len() % usable as usize, 0);
    }
}

fn cq(vector: u32, used: u32, idle_since: u64) -> FakeCq {
    FakeCq {
        vector,
        capacity: 100,
        used,
        idle_since,
    }
}

fn aged(cqs: &[FakeCq], now: u64) -> (Vec<usize>, Option<u64>) {
    let mut out = Vec::new();
    let next = age_pass(cqs.iter(), now, AGE_MS, |i| out.push(i));
    (out, next)
}

#[test]
fn aging_keeps_the_oldest_cq_of_each_vector() {
    let t = AGE_MS;
    let cqs = [
        cq(0, 0, 0),
        cq(1, 0, 0),
        cq(0, 0, 0),
        cq(1, 0, 0),
        cq(0, 0, 0),
    ];
    // All idle for a whole period: everything but the first of each vector goes.
    assert_eq!(aged(&cqs, t), (vec![2, 3, 4], None));
    // Not yet a period: nothing goes, the next pass is due when the first would.
    assert_eq!(aged(&cqs, t - 10), (vec![], Some(10)));
}

/// The period is the caller's (`ibext.age_ms`).
#[test]
fn aging_uses_the_period_given() {
    let cqs = [cq(0, 0, 0), cq(0, 0, 0)];
    let mut out = Vec::new();
    assert_eq!(age_pass(cqs.iter(), 1_999, 2_000, |i| out.push(i)), Some(1));
    assert!(out.is_empty());
    assert_eq!(age_pass(cqs.iter(), 2_000, 2_000, |i| out.push(i)), None);
    assert_eq!(out, vec![1]);
}

#[test]
fn aging_never_takes_a_busy_cq_and_a_busy_floor_counts() {
    let t = 10 * AGE_MS;
    // The floor of vector 0 is busy: the idle one after it may go; the busy one after never.
    let cqs = [cq(0, 5, 0), cq(0, 0, 0), cq(0, 1, 0)];
    assert_eq!(aged(&cqs, t).0, vec![1]);
}

#[test]
fn aging_skips_destroyed_slots_and_waits_for_the_youngest() {
    let t = AGE_MS;
    // A destroyed slot (capacity 0) is no floor: the next live CQ of its vector is.
    let mut dead = cq(0, 0, 0);
    dead.capacity = 0;
    let cqs = [dead, cq(0, 0, 0), cq(0, 0, 500), cq(0, 0, 200)];
    assert_eq!(aged(&cqs, t), (vec![], Some(200)));
    assert_eq!(aged(&cqs, t + 200), (vec![3], Some(300)));
    assert_eq!(aged(&cqs, t + 500).0, vec![2, 3]);
}

#[test]
fn aging_randomized_keeps_a_floor_per_vector() {
    for seed in 0..300u64 {
        let mut rng = Rng::new(seed);
        let n = rng.below(20) as usize;
        let cqs: Vec<FakeCq> = (0..n)
            .map(|_| {
                let mut c = cq(
                    rng.below(4) as u32,
                    if rng.below(3) == 0 { 1 } else { 0 },
                    rng.below(2 * AGE_MS),
                );
                if rng.below(6) == 0 {
                    c.capacity = 0;
                }
                c
            })
            .collect();
        // The clock is monotonic: every CQ became idle before now.
        let now = 2 * AGE_MS + rng.below(AGE_MS);
        let (out, next) = aged(&cqs, now);
        let mut left = cqs.clone();
        for &i in &out {
            let c = &cqs[i];
            assert!(c.capacity > 0 && c.used == 0, "seed {seed}: took {c:?}");
            assert!(
                now.saturating_sub(c.idle_since) >= AGE_MS,
                "seed {seed}: too young"
            );
            left[i].capacity = 0;
        }
        for v in 0..4 {
            let before = cqs
                .iter()
                .filter(|c| c.capacity > 0 && c.vector == v)
                .count();
            let after = left
                .iter()
                .filter(|c| c.capacity > 0 && c.vector == v)
                .count();
            assert_eq!(
                after == 0,
                before == 0,
                "seed {seed}: vector {v} lost its floor"
            );
        }
        // Whatever is due later is reported, and nothing due now is left behind.
        let (again, _) = aged(&left, now);
        assert!(again.is_empty(), "seed {seed}: a second pass found more");
        if let Some(d) = next {
            assert!(d > 0 && d <= AGE_MS);
            assert!(
                !aged(&left, now + d).0.is_empty(),
                "seed {seed}: nothing due at +{d}"
            );
        }
    }
}
