// SPDX-License-Identifier: GPL-2.0

use super::Rng;
use crate::policy::srq_pool::*;

const RXE: Caps = Caps {
    max_srq: 917_503,
    max_srq_wr: 1_048_576,
    max_srq_sge: 27,
    vectors: 4,
};

fn req(nr_srqs: u32, srq_size: u32, buf_size: u32) -> Request {
    Request {
        nr_srqs,
        srq_size,
        max_sge: 1,
        buf_size,
        has_recv_done: buf_size > 0,
        max_srq_size: 0,
    }
}

#[test]
fn one_srq_per_vector_by_default() {
    let p = plan(&req(0, 256, 4096), &RXE).unwrap();
    assert_eq!(
        (p.nr_srqs, p.srq_size, p.buf_size, p.limit),
        (4, 256, 4096, 64)
    );
    let few = Caps { max_srq: 2, ..RXE };
    assert_eq!(
        plan(&req(0, 256, 4096), &few).unwrap().nr_srqs,
        2,
        "capped by max_srq"
    );
    let one = Caps { vectors: 0, ..RXE };
    assert_eq!(plan(&req(0, 256, 0), &one).unwrap().nr_srqs, 1);
}

#[test]
fn size_is_clamped_and_limit_follows() {
    let small = Caps {
        max_srq_wr: 100,
        ..RXE
    };
    let p = plan(&req(3, 256, 0), &small).unwrap();
    assert_eq!((p.nr_srqs, p.srq_size, p.limit), (3, 100, 25));
    assert_eq!(
        plan(&req(1, 3, 0), &RXE).unwrap().limit,
        0,
        "no limit below 4 entries"
    );
}

#[test]
fn refusals() {
    let none = Caps { max_srq: 0, ..RXE };
    assert_eq!(plan(&req(0, 256, 0), &none), Err(Refusal::NotSupported));
    let no_wr = Caps {
        max_srq_wr: 0,
        ..RXE
    };
    assert_eq!(plan(&req(0, 256, 0), &no_wr), Err(Refusal::NotSupported));
    assert_eq!(
        plan(&req(0, 0, 0), &RXE),
        Err(Refusal::Invalid),
        "srq_size 0"
    );
    assert_eq!(
        plan(&req(RXE.max_srq + 1, 1, 0), &RXE),
        Err(Refusal::Invalid)
    );
    assert_eq!(
        plan(&req(0, 8, MAX_BUF_SIZE + 1), &RXE),
        Err(Refusal::Invalid)
    );
    let mut r = req(0, 8, 4096);
    r.has_recv_done = false;
    assert_eq!(
        plan(&r, &RXE),
        Err(Refusal::Invalid),
        "buffers without recv_done"
    );
    let mut r = req(0, 8, 0);
    r.has_recv_done = true;
    assert_eq!(
        plan(&r, &RXE),
        Err(Refusal::Invalid),
        "recv_done without buffers"
    );
    for sge in [0, RXE.max_srq_sge + 1] {
        let r = Request {
            max_sge: sge,
            ..req(0, 8, 0)
        };
        assert_eq!(plan(&r, &RXE), Err(Refusal::Invalid), "max_sge {sge}");
    }
}

#[test]
fn hint_picks_its_vector_when_there_is_one_srq_per_vector() {
    let refs = [5, 0, 9, 2];
    for hint in 0..16 {
        assert_eq!(choose(&refs, 4, hint), Some(hint as usize % 4));
    }
    // More SRQs than vectors (asked for): every SRQ is used, hint modulo the SRQs.
    assert_eq!(choose(&[0, 0, 0, 0, 0, 0], 4, 5), Some(5));
    assert_eq!(choose(&[0, 0, 0, 0], 2, 3), Some(3));
}

#[test]
fn fewer_srqs_than_vectors_takes_the_least_referenced() {
    let mut rng = Rng::new(11);
    for _ in 0..1000 {
        let n = 1 + rng.below(3) as usize;
        let refs: Vec<u32> = (0..n).map(|_| rng.below(5) as u32).collect();
        let hint = rng.below(20) as i32 - 4;
        let got = choose(&refs, 4, hint).unwrap();
        let min = *refs.iter().min().unwrap();
        assert_eq!(refs[got], min);
        assert_eq!(
            refs.iter().position(|&r| r == min),
            Some(got),
            "lowest index on a tie"
        );
    }
    assert_eq!(choose(&[], 4, 0), None);
    assert_eq!(choose(&[3, 1, 1, 7], 4, -1), Some(1), "negative hint");
}

#[test]
fn references_spread_evenly_over_a_short_pool() {
    // 64 QPs on 8 vectors over 3 SRQs: the references stay within one of each other.
    let mut refs = [0u32; 3];
    for qp in 0..64 {
        let i = choose(&refs, 8, qp % 8).unwrap();
        refs[i] += 1;
    }
    let (lo, hi) = (refs.iter().min().unwrap(), refs.iter().max().unwrap());
    assert!(hi - lo <= 1, "{refs:?}");
}

#[test]
fn managed_buffers_are_capped_after_clamping() {
    // The request that made the kernel WARN: 2^30 entries of 64 bytes, clamped to rxe's 2^20,
    // on 4 SRQs: 4 * 2^20 * (64 + overhead) bytes, far over the cap.
    assert_eq!(plan(&req(0, 1 << 30, 64), &RXE), Err(Refusal::Invalid));
    assert_eq!(plan(&req(0, 65536, 65536), &RXE), Err(Refusal::Invalid));
    // Just under and just over the cap, on one SRQ.
    let per_buf = 4096 + BUF_OVERHEAD;
    let fits = (MAX_POOL_BYTES / per_buf) as u32;
    assert!(plan(&req(1, fits, 4096), &RXE).is_ok());
    assert_eq!(plan(&req(1, fits + 1, 4096), &RXE), Err(Refusal::Invalid));
    // Without managed buffers nothing is allocated per entry: no cap.
    assert!(plan(&req(0, 1 << 30, 0), &RXE).is_ok());
}

#[test]
fn managed_pools_grow_to_four_times_in_steps_of_srq_size() {
    let p = plan(&req(2, 256, 4096), &RXE).unwrap();
    assert_eq!((p.max_size, p.step, p.limit), (1024, 256, 64));
    assert_eq!(next_step(p.step, p.max_size, 256), Some(256));
    assert_eq!(next_step(p.step, p.max_size, 900), Some(124));
    assert_eq!(next_step(p.step, p.max_size, 1024), None);
    // Without managed buffers the ULP posts: no room unless asked, no steps.
    let p = plan(&req(2, 256, 0), &RXE).unwrap();
    assert_eq!((p.max_size, p.step), (256, 0));
    assert_eq!(next_step(p.step, p.max_size, 256), None);
}

#[test]
fn max_srq_size_is_checked_clamped_and_bounded_by_bytes() {
    let with = |max: u32, buf: u32| Request {
        max_srq_size: max,
        ..req(1, 64, buf)
    };
    assert_eq!(plan(&with(63, 4096), &RXE), Err(Refusal::Invalid));
    assert_eq!(plan(&with(63, 0), &RXE), Err(Refusal::Invalid));
    assert_eq!(
        plan(&with(64, 4096), &RXE).unwrap().step,
        0,
        "no room: no growth"
    );
    let p = plan(&with(u32::MAX, 0), &RXE).unwrap();
    assert_eq!(p.max_size, RXE.max_srq_wr, "clamped as srq_size is");
    // Managed buffers: an explicit cap over the byte limit is refused, the default is cut.
    assert_eq!(plan(&with(u32::MAX, 65536), &RXE), Err(Refusal::Invalid));
    let big = Request {
        srq_size: 3000,
        ..req(1, 3000, 65536)
    };
    let p = plan(&big, &RXE).unwrap();
    assert!(p.max_size >= 3000 && p.max_size < 4 * 3000);
    let bytes = u64::from(p.max_size) * (65536 + BUF_OVERHEAD);
    assert!(bytes <= MAX_POOL_BYTES);
    // Many steps to a far cap: never more than MAX_STEPS.
    let p = plan(&with(64 * 100, 64), &RXE).unwrap();
    let mut held = 64;
    let mut steps = 0;
    while let Some(n) = next_step(p.step, p.max_size, held) {
        held += n;
        steps += 1;
    }
    assert_eq!(held, 6400);
    assert!(steps <= MAX_STEPS, "{steps} steps");
}

#[test]
fn limit_is_a_quarter_of_what_is_posted() {
    assert_eq!(limit_for(3), 0);
    assert_eq!(limit_for(4), 1);
    assert_eq!(limit_for(1024), 256);
}
