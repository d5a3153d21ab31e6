// SPDX-License-Identifier: GPL-2.0

//! `ibext_cq_pool`: shared CQ pools on rxe0 with real loopback traffic.

use crate::tests::fixtures::guest::cqp;
use crate::tests::fixtures::{
    guest::{link_add, link_delete, pooled_cqs_on, restore_links, DeviceRef, XorShift},
    traffic::Loopback,
};
use crate::{
    api::CqEntries,
    backport::bug::expect_warnings,
    bindings,
    capi::{ibext_cq_pool_get, ibext_cq_pool_put},
    device::DeviceState,
    engine::PollCtx,
    kunit::{
        bad_input_ok, expect_kernel_warning, kassert, kassert_eq, kunit_suite, Failed, TestResult,
    },
    ledger::{self, Kind},
    policy::moderation::Moderation,
};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::{c_str, prelude::*, sync::Arc, workqueue};

/// rxe0 and ibext's state for it.
fn rxe0() -> core::result::Result<(DeviceRef, Arc<DeviceState>), Failed> {
    let dev = DeviceRef::get(c_str!("rxe0"));
    kassert!(dev.is_some(), "rxe0 is not registered");
    let dev = dev.ok_or(Failed)?;
    let state = crate::device::device_state(dev.device());
    kassert!(state.is_some(), "no ibext state for rxe0");
    Ok((dev, state.ok_or(Failed)?))
}

fn is_err_ptr<T>(p: *mut T, errno: i32) -> bool {
    p as isize == -(errno as isize)
}

/// Every request the pool must refuse is `-EINVAL`, and nothing is made.
fn bad_input_is_einval() -> TestResult {
    let (dev, state) = rxe0()?;
    let d = dev.device().as_raw();
    let max = dev.device().attrs().max_cqe as u32;
    let made = ledger::counts(Kind::PooledCq).made;
    let einval = kernel::error::code::EINVAL.to_errno().abs();
    let softirq = bindings::ib_poll_context_IB_POLL_SOFTIRQ;
    let cases: [(&str, *mut bindings::ib_device, u32, u32); 5] = [
        ("cq_get.null_dev", core::ptr::null_mut(), 16, softirq),
        ("cq_get.zero_cqe", d, 0, softirq),
        ("cq_get.over_max_cqe", d, max + 1, softirq),
        (
            "cq_get.direct",
            d,
            16,
            bindings::ib_poll_context_IB_POLL_DIRECT,
        ),
        ("cq_get.unknown_ctx", d, 16, 99),
    ];
    for (id, dev, nr, ctx) in cases {
        let nr_cqs = state.cq_pools().nr_cqs(PollCtx::Softirq);
        // SAFETY: `dev` is null or rxe0, which the test holds.
        let cq = unsafe { ibext_cq_pool_get(dev, nr, 0, ctx) };
        kassert!(is_err_ptr(cq, einval), "{}: got {:?}", id, cq);
        kassert_eq!(state.cq_pools().nr_cqs(PollCtx::Softirq), nr_cqs, "{}", id);
        bad_input_ok(id);
    }
    kassert_eq!(ledger::counts(Kind::PooledCq).made, made);
    Ok(())
}

/// N QPs share M pooled CQs; SEND and RDMA WRITE WITH IMMEDIATE, every completion checked.
fn traffic_in(ctx: PollCtx) -> TestResult {
    const QPS: usize = 8;
    const DEPTH: usize = 16;
    let (dev, state) = rxe0()?;
    let mut cqs = KVec::new();
    let mut raw = KVec::new();
    for i in 0..QPS {
        let s = CqEntries::get(dev.device(), DEPTH as u32, i as i32, ctx, Moderation::Dim)?;
        let r = CqEntries::get(dev.device(), DEPTH as u32, i as i32, ctx, Moderation::Dim)?;
        raw.push((s.as_raw(), r.as_raw()), GFP_KERNEL)?;
        cqs.push((s, r), GFP_KERNEL)?;
    }
    // 2 x 8 requests of 16 entries fit in one set: one CQ per vector.
    let nr = state.cq_pools().nr_cqs(ctx);
    // `checked_rem`: `%` would carry a divide-by-zero panic (objtool flagged its call).
    kassert_eq!(nr.checked_rem(state.comp_vectors() as usize), Some(0));
    let distinct =
        crate::tests::fixtures::guest::distinct_cqs(raw.iter().flat_map(|&(s, r)| [s, r]))?;
    kassert!(
        distinct.len() <= state.comp_vectors() as usize,
        "{} CQs for 8 QPs",
        distinct.len()
    );

    let mut lb = Loopback::new(dev.device(), DEPTH, &raw)?;
    for round in 0..12u32 {
        let res = lb.round(round, round % 2 == 1, 20_000);
        kassert!(res.is_ok(), "{} round {}: {:?}", ctx.name(), round, res);
    }
    kassert_eq!(lb.completions(), 12 * 2 * (QPS * DEPTH) as u64);
    drop(lb);
    for &(s, r) in raw.iter() {
        kassert!(cqp(s).and_then(|c| state.cq_pools().used(c)).is_some());
        kassert!(cqp(r).and_then(|c| state.cq_pools().used(c)).is_some());
    }
    drop(cqs);
    for &cq in distinct.iter() {
        kassert_eq!(cqp(cq).and_then(|c| state.cq_pools().used(c)), Some(0));
    }
    Ok(())
}

fn traffic_softirq() -> TestResult {
    traffic_in(PollCtx::Softirq)
}

fn traffic_workqueue() -> TestResult {
    traffic_in(PollCtx::Workqueue)
}

fn traffic_unbound_workqueue() -> TestResult {
    traffic_in(PollCtx::UnboundWorkqueue)
}

/// `ibext_cq_pool_get()` moderates as upstream's `ib_cq_pool_get()` does: DIM only where the
/// driver sets `use_cq_dim` (rxe does not; the test sets it on rxe0 for one get).
fn default_moderation_follows_use_cq_dim() -> TestResult {
    let (dev, _state) = rxe0()?;
    let raw = dev.device().as_raw();
    let get_one = || -> core::result::Result<Moderation, Failed> {
        // SAFETY: rxe0 is registered and held by the test.
        let cq = unsafe { ibext_cq_pool_get(raw, 4, 0, bindings::ib_poll_context_IB_POLL_SOFTIRQ) };
        kassert!(
            kernel::error::from_err_ptr(cq).is_ok(),
            "get failed: {:?}",
            cq
        );
        // SAFETY: A live CQ on which the test holds 4 entries until the put below.
        let m = unsafe { crate::engine::PooledCq::of_cq(cq) }.map(|e| e.moderation());
        // SAFETY: The entries taken above.
        unsafe { ibext_cq_pool_put(cq, 4) };
        m.ok_or(Failed)
    };
    kassert!(
        !dev.device().use_cq_dim(),
        "rxe sets use_cq_dim now: the test needs a device without"
    );
    kassert_eq!(get_one()?, Moderation::None);
    // SAFETY: Only ib_core's `ib_alloc_cq` and ibext read the flag; the test restores it.
    unsafe { (*raw).set_use_cq_dim(1) };
    let with = get_one();
    // SAFETY: As above.
    unsafe { (*raw).set_use_cq_dim(0) };
    kassert_eq!(with?, Moderation::Dim);
    Ok(())
}

/// Hints map to `hint % vectors`; negative hints round-robin over the device's vectors.
fn vectors_follow_hints() -> TestResult {
    let (dev, state) = rxe0()?;
    let n = state.comp_vectors();
    kassert!(n >= 1);
    for hint in 0..(2 * n as i32 + 1) {
        let cq = CqEntries::get(dev.device(), 4, hint, PollCtx::Softirq, Moderation::Dim)?;
        // SAFETY: The CQ is alive while `cq` holds entries on it.
        let v = unsafe { (*cq.as_raw()).comp_vector };
        kassert_eq!(v, hint as u32 % n);
        kassert_eq!(cq.nr_cqe(), 4);
    }
    let first = CqEntries::get(dev.device(), 4, -1, PollCtx::Softirq, Moderation::Dim)?;
    // SAFETY: As above.
    let v0 = unsafe { (*first.as_raw()).comp_vector };
    for k in 1..(2 * n) {
        let cq = CqEntries::get(dev.device(), 4, -1, PollCtx::Softirq, Moderation::Dim)?;
        // SAFETY: As above.
        let v = unsafe { (*cq.as_raw()).comp_vector };
        kassert_eq!(v, (v0 + k) % n);
    }
    Ok(())
}

/// With an older, fuller CQ and a newer, emptier one on the same vector, the emptier one wins
/// (first-fit, upstream's choice, would take the older).
fn least_used_not_first_fit() -> TestResult {
    let (dev, state) = rxe0()?;
    let v = state.comp_vectors() as i32 - 1;
    let probe = CqEntries::get(dev.device(), 1, v, PollCtx::Workqueue, Moderation::Dim)?;
    // SAFETY: The CQ is alive while `probe` holds entries on it.
    let cap = unsafe { (*probe.as_raw()).cqe } as u32;
    drop(probe);
    // `a` fills the oldest CQ on `v` to all but 10 entries (pools may hold several sets by now,
    // all empty: the oldest is chosen on the tie).
    let a = CqEntries::get(
        dev.device(),
        cap - 10,
        v,
        PollCtx::Workqueue,
        Moderation::Dim,
    )?;
    // `b` does not fit there: it lands on another CQ on `v`, made if need be.
    let b = CqEntries::get(dev.device(), 100, v, PollCtx::Workqueue, Moderation::Dim)?;
    kassert!(a.as_raw() != b.as_raw());
    let b_cq = b.as_raw();
    drop(b);
    // Now: a's CQ has cap - 10 in use, b's CQ 0. A request of 1 fits both.
    let c = CqEntries::get(dev.device(), 1, v, PollCtx::Workqueue, Moderation::Dim)?;
    kassert!(
        c.as_raw() != a.as_raw(),
        "took the fuller, older CQ (first-fit)"
    );
    kassert_eq!(
        cqp(a.as_raw()).and_then(|c| state.cq_pools().used(c)),
        Some(cap - 10)
    );
    let _ = b_cq;
    Ok(())
}

/// Four workers get and put in random order; every entry comes back.
fn concurrent_get_put() -> TestResult {
    const WORKERS: u32 = 4;
    const ITERS: u32 = 400;
    let (_dev, state) = rxe0()?;
    let done = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let errors = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    for w in 0..WORKERS {
        let (state, done, errors) = (state.clone(), done.clone(), errors.clone());
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            let mut rng = XorShift::new(0x9e37_79b9u32.wrapping_mul(w + 1));
            let mut rnd = move || rng.next();
            let mut held: KVec<CqEntries> = KVec::new();
            for _ in 0..ITERS {
                if held.len() < 8 && rnd() % 3 != 0 {
                    let ctx = PollCtx::ALL[(rnd() % 3) as usize];
                    let hint = (rnd() % 9) as i32 - 1;
                    match CqEntries::get(state.device(), 1 + rnd() % 64, hint, ctx, Moderation::Dim)
                    {
                        Ok(cq) => {
                            if held.push(cq, GFP_KERNEL).is_err() {
                                errors.fetch_add(1, Ordering::AcqRel);
                            }
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                } else if !held.is_empty() {
                    // Drop a random one: swap it to the end and shrink.
                    let k = (rnd() as usize) % held.len();
                    let last = held.len() - 1;
                    held.as_mut_slice().swap(k, last);
                    let old = core::mem::replace(&mut held, KVec::new());
                    let mut keep = KVec::new();
                    for (i, cq) in old.into_iter().enumerate() {
                        if i != last && keep.push(cq, GFP_KERNEL).is_err() {
                            errors.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    held = keep;
                }
            }
            drop(held);
            done.fetch_add(1, Ordering::AcqRel);
        });
        kassert!(res.is_ok(), "cannot start worker {}", w);
    }
    let mut waited = 0;
    while done.load(Ordering::Acquire) < WORKERS && waited < 60_000 {
        // SAFETY: FFI call in process context.
        unsafe { bindings::msleep(5) };
        waited += 5;
    }
    kassert_eq!(done.load(Ordering::Acquire), WORKERS);
    kassert_eq!(errors.load(Ordering::Acquire), 0);
    kassert_eq!(state.cq_pools().total_used(), 0);
    Ok(())
}

/// Putting back what was not taken is a caller bug: one warning, no change.
fn misuse_warns_and_changes_nothing() -> TestResult {
    let (dev, state) = rxe0()?;
    let cq = CqEntries::get(dev.device(), 8, 0, PollCtx::Softirq, Moderation::Dim)?;
    let raw = cq.as_raw();
    let put = |cq: *mut bindings::ib_cq, nr: u32| {
        expect_warnings(|| {
            // SAFETY: `cq` is null or alive (`raw` while `cq` holds entries, `foreign` until
            // it is freed below); the entry point accepts both.
            unsafe { ibext_cq_pool_put(cq, nr) }
        })
    };
    kassert_eq!(put(raw, 9), 1);
    kassert_eq!(cqp(raw).and_then(|c| state.cq_pools().used(c)), Some(8));
    bad_input_ok("cq_put.over");
    kassert_eq!(put(raw, 0), 1);
    kassert_eq!(cqp(raw).and_then(|c| state.cq_pools().used(c)), Some(8));
    bad_input_ok("cq_put.zero");
    kassert_eq!(put(core::ptr::null_mut(), 1), 1);
    bad_input_ok("cq_put.null");
    // A CQ of the right device that the pool does not own.
    // SAFETY: rxe0 is held; the CQ is freed below.
    let foreign = unsafe {
        bindings::__ib_alloc_cq(
            dev.device().as_raw(),
            core::ptr::null_mut(),
            8,
            0,
            bindings::ib_poll_context_IB_POLL_SOFTIRQ,
            c"ibext_test".as_ptr().cast(),
        )
    };
    let foreign = kernel::error::from_err_ptr(foreign)?;
    let warned = put(foreign, 1);
    // SAFETY: `foreign` came from `__ib_alloc_cq` and nothing uses it.
    unsafe { bindings::ib_free_cq(foreign) };
    kassert_eq!(warned, 1);
    kassert_eq!(cqp(raw).and_then(|c| state.cq_pools().used(c)), Some(8));
    bad_input_ok("cq_put.foreign");
    Ok(())
}

/// `ib_free_cq()` on a pooled CQ with entries in use: 6.12's `ib_free_cq` warns and refuses,
/// because the pool keeps `cqe_used` in step with the entries taken, and the CQ still delivers
/// every completion afterwards.
fn ib_free_cq_on_a_pooled_cq_is_refused() -> TestResult {
    let (dev, state) = rxe0()?;
    let cq = CqEntries::get(dev.device(), 16, 0, PollCtx::Softirq, Moderation::None)?;
    let raw = cq.as_raw();
    expect_kernel_warning("ib_free_cq() on a pooled CQ", || {
        // SAFETY: `raw` is live; ib_core refuses to free it (`cqe_used` is 16), which is what
        // this test checks. Had it freed it, the checks below would fail under KASAN.
        unsafe { bindings::ib_free_cq(raw) }
    });
    kassert_eq!(cqp(raw).and_then(|c| state.cq_pools().used(c)), Some(16));
    let mut lb = Loopback::new(dev.device(), 4, &[(raw, raw)])?;
    for round in 0..4u32 {
        let res = lb.round(round, false, 20_000);
        kassert!(res.is_ok(), "round {}: {:?}", round, res);
    }
    kassert_eq!(lb.completions(), 4 * 2 * 4);
    drop(lb);
    drop(cq);
    kassert_eq!(cqp(raw).and_then(|c| state.cq_pools().used(c)), Some(0));
    Ok(())
}

/// After every put, `rdma link delete rxe0` destroys the pooled CQs and returns; the device
/// comes back with empty pools.
fn link_delete_after_puts() -> TestResult {
    let r = link_delete_after_puts_checks();
    restore_links();
    r
}

fn link_delete_after_puts_checks() -> TestResult {
    {
        let (dev, _state) = rxe0()?;
        let a = CqEntries::get(dev.device(), 32, 1, PollCtx::Softirq, Moderation::Dim)?;
        let b = CqEntries::get(
            dev.device(),
            32,
            2,
            PollCtx::UnboundWorkqueue,
            Moderation::Dim,
        )?;
        drop((a, b));
    }
    let on_rxe0 = pooled_cqs_on(c_str!("rxe0"));
    let on_rxe1 = pooled_cqs_on(c_str!("rxe1"));
    kassert!(on_rxe0 > 0);
    kassert_eq!(ledger::counts(Kind::PooledCq).live(), on_rxe0 + on_rxe1);
    kassert_eq!(link_delete(c_str!("rxe0"))?, 0);
    // Every pooled CQ of rxe0 is destroyed with it; rxe1's stay.
    kassert_eq!(ledger::counts(Kind::PooledCq).live(), on_rxe1);
    kassert_eq!(link_add(c_str!("rxe0"))?, 0);
    let (_dev, state) = rxe0()?;
    for ctx in PollCtx::ALL {
        kassert_eq!(state.cq_pools().nr_cqs(ctx), 0);
    }
    Ok(())
}

kunit_suite!(
    ibext_cq_pool,
    [
        bad_input_is_einval,
        default_moderation_follows_use_cq_dim,
        vectors_follow_hints,
        traffic_softirq,
        traffic_workqueue,
        traffic_unbound_workqueue,
        least_used_not_first_fit,
        concurrent_get_put,
        misuse_warns_and_changes_nothing,
        ib_free_cq_on_a_pooled_cq_is_refused,
        link_delete_after_puts,
    ]
);
