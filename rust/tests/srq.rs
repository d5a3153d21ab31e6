// SPDX-License-Identifier: GPL-2.0

//! `ibext_srq`: SRQ pools on rxe0, with loopback RC QPs whose receives come from the pool's
//! managed buffers through pooled CQs.
//!
//! The fixtures (a PD, pools made through the C API, a fleet of loopback QPs with every
//! receive setup) are `fixtures::srq`'s.

use crate::tests::fixtures::{
    guest::{
        debugfs_exists, link_add, link_delete, msleep, pass_on_worker, required, restore_links,
        wait_for, PassCpu,
    },
    stream::now_ns,
};
use crate::tests::hooks::HoldPasses;
use crate::{
    api::CqEntries,
    backport::{bug::expect_warnings, error::eopnotsupp},
    bindings,
    capi::{
        ibext_srq_pool_create, ibext_srq_pool_destroy, ibext_srq_pool_get, ibext_srq_pool_nr_srqs,
        ibext_srq_pool_put, ibext_srq_pool_repost, ibext_srq_pool_set_posted,
        ibext_srq_pool_set_srq_ctx, ibext_srq_pool_srq, ibext_srq_pool_srq_ctx,
    },
    engine::PollCtx,
    ib::{verbs::Pd as PdView, Device},
    kunit::{bad_input_ok, kassert, kassert_eq, kunit_suite, Failed, TestResult},
    ledger::{self, Kind},
    policy::moderation::Moderation,
    tests::hooks::{Parking, Point, FAIL_AT},
};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicI32, AtomicU32, Ordering},
};
use kernel::{c_str, prelude::*, sync::Arc, workqueue};

use crate::tests::fixtures::srq::*;

/// Managed buffers that `recv_done` keeps (`IBEXT_RECV_KEEP`) stay the ULP's, with their
/// contents, until `ibext_srq_pool_repost()`: 4 QPs send 2 messages each per round into one SRQ
/// of 16 buffers; every round's 8 buffers are kept (posted drops by 8, destroy is refused) and
/// given back before the next, so 256 messages need the reposts to get through. Every message
/// arrives exactly once. Giving back a buffer twice, an address that is no buffer, or to a NULL
/// pool is refused.
fn kept_buffers_are_given_back() -> TestResult {
    const QPS: usize = 4;
    const PER_QP: u32 = 64;
    const ROUND: u32 = 2;
    let dev = required(c_str!("rxe0"))?;
    let mut f = Fleet::new(
        dev.device(),
        QPS,
        PER_QP,
        Recv::Pool { nr: 1, size: 16 },
        64,
    )
    .map_err(|_| Failed)?;
    f.rx.keep.store(true, Ordering::Release);
    let raw = f.pool.as_ref().map(|p| p.0).ok_or(Failed)?;
    let mut given = 0;
    let mut seq = 0;
    while seq < PER_QP {
        f.post_range(0, seq..seq + ROUND)?;
        seq += ROUND;
        let want = QPS as u64 * u64::from(seq);
        // `recv_done` counts a message before it stashes the buffer, and the pool counts the
        // buffer kept once `recv_done` returned: wait for all three.
        let ok = wait_for(30_000, || {
            let end = f.rx.stash_len.load(Ordering::Acquire);
            f.rx.received.load(Ordering::Acquire) >= want
                && f.pool()
                    .is_ok_and(|p| p.kept() == QPS as u64 * u64::from(ROUND))
                && f.rx.stash[given..end.min(f.rx.stash.len())]
                    .iter()
                    .all(|c| !c.load(Ordering::Acquire).is_null())
        });
        kassert!(
            ok,
            "round to {}: {} of {} received, {} kept",
            seq,
            f.rx.received.load(Ordering::Acquire),
            want,
            f.pool()?.kept()
        );
        let pool = f.pool()?;
        kassert_eq!(pool.kept(), QPS as u64 * u64::from(ROUND));
        kassert_eq!(pool.posted(), 16 - QPS as u64 * u64::from(ROUND));
        if seq == ROUND {
            kassert_eq!(f.pool.as_mut().map_or(0, Pool::destroy), EBUSY.to_errno());
            bad_input_ok("srq_destroy.kept");
        }
        let end = f.rx.stash_len.load(Ordering::Acquire);
        while given < end {
            let cqe = f.rx.stash[given].swap(core::ptr::null_mut(), Ordering::AcqRel);
            kassert!(!cqe.is_null(), "stash {} empty", given);
            // SAFETY: A live pool; `cqe` is a kept buffer's.
            kassert_eq!(unsafe { ibext_srq_pool_repost(raw, cqe.cast()) }, 0);
            given += 1;
            if given == 1 {
                let mut r = 0;
                let again = expect_warnings(|| {
                    // SAFETY: As above; given back already.
                    r = unsafe { ibext_srq_pool_repost(raw, cqe.cast()) };
                });
                kassert_eq!(again, 1);
                kassert_eq!(r, EINVAL.to_errno());
                bad_input_ok("srq_repost.not_kept");
            }
        }
        kassert_eq!(f.pool()?.kept(), 0);
        kassert_eq!(f.pool()?.posted(), 16);
    }
    let total = QPS as u64 * u64::from(PER_QP);
    kassert_eq!(f.rx.received.load(Ordering::Acquire), total);
    kassert_eq!(f.rx.bad.load(Ordering::Acquire), 0);
    kassert_eq!(f.rx.dups.load(Ordering::Acquire), 0);
    let mut x = 0u64;
    let not_a_buffer: *mut bindings::ib_cqe = core::ptr::from_mut(&mut x).cast();
    let mut r = 0;
    let warned = expect_warnings(|| {
        // SAFETY: A live pool; the address is only compared.
        r = unsafe { ibext_srq_pool_repost(raw, not_a_buffer) };
    });
    kassert_eq!(warned, 1);
    kassert_eq!(r, EINVAL.to_errno());
    bad_input_ok("srq_repost.foreign");
    // SAFETY: A NULL pool is refused before anything is used.
    let r = unsafe { ibext_srq_pool_repost(core::ptr::null_mut(), not_a_buffer) };
    kassert_eq!(r, EINVAL.to_errno());
    bad_input_ok("srq_repost.null_pool");
    f.rx.keep.store(false, Ordering::Release);
    drop(f);
    Ok(())
}

/// RNR NAKs rxe0's responder has sent (`send_rnr_err`), over its port.
fn rnr_naks(dev: &Device) -> core::result::Result<u64, Failed> {
    // SAFETY: `dev` is registered; the name is a C string.
    let n = unsafe {
        bindings::ibext_test_hw_counter(dev.as_raw(), 1, c"send_rnr_err".as_ptr().cast())
    };
    kassert!(n >= 0, "no send_rnr_err counter: {}", n);
    u64::try_from(n).map_err(|_| Failed)
}

/// Growth under pressure, and back. One SRQ of 16 managed buffers for 4 QPs, whose ULP keeps
/// every buffer (a load that exhausts the SRQ unless it grows), sent in batches of 16
/// messages. Each batch uses up what is posted and raises a limit event; the test waits for
/// the growth step it must cause (forced, not raced) before the next batch: 16 -> 32 -> 48 ->
/// 64 (the default cap, 4 x 16), then no further step. Every message arrives exactly once, no
/// RNR NAK is sent, the buffers stay under the cap, and the ULP's `pressure` hears each step.
/// The same load on a pool capped at 16 (`max_srq_size`) gets RNR NAKs, until the ULP gives
/// its buffers back. Then, with the pressure gone (aging's clock a period ahead), steps are
/// retired one per period, and once traffic has brought a retired step's buffers back the step
/// is freed.
fn srq_grows_under_pressure_and_shrinks() -> TestResult {
    const QPS: usize = 4;
    const BATCH: u32 = 4;
    const BATCHES: u32 = 4;
    const PER_QP: u32 = 2 * BATCH * BATCHES;
    const BUF: u32 = 64;
    let dev = required(c_str!("rxe0"))?;
    let d = dev.device();

    // Capped at its size: no growth; senders are refused until buffers come back.
    {
        let f = Fleet::new(
            d,
            QPS,
            PER_QP,
            Recv::PoolMax {
                nr: 1,
                size: 16,
                max: 16,
            },
            BUF,
        )
        .map_err(|_| Failed)?;
        f.rx.keep.store(true, Ordering::Release);
        let raw = f.pool.as_ref().map(|p| p.0).ok_or(Failed)?;
        kassert_eq!(f.pool()?.plan().step, 0);
        let rnr = rnr_naks(d)?;
        f.post_range(0, 0..2 * BATCH)?;
        let refused = wait_for(20_000, || rnr_naks(d).is_ok_and(|n| n > rnr));
        kassert!(
            refused,
            "no RNR NAK with 32 messages for 16 buffers held by the ULP"
        );
        // The NAK was sent after the 16th receive was consumed, not after its completion was
        // handled: wait for the handler. None beyond 16 can come while every buffer is kept.
        let all16 = wait_for(20_000, || f.rx.received.load(Ordering::Acquire) >= 16);
        kassert!(all16, "{} received", f.rx.received.load(Ordering::Acquire));
        kassert_eq!(f.rx.received.load(Ordering::Acquire), 16);
        // The ULP gives its buffers back as it gets them, until every message is in.
        let mut given = 0;
        let all = wait_for(30_000, || {
            let end = f.rx.stash_len.load(Ordering::Acquire);
            while given < end {
                let cqe = f.rx.stash[given].swap(core::ptr::null_mut(), Ordering::AcqRel);
                // SAFETY: A live pool; `cqe` is a kept buffer's.
                if !cqe.is_null() && unsafe { ibext_srq_pool_repost(raw, cqe.cast()) } != 0 {
                    return false;
                }
                given += 1;
            }
            f.rx.received.load(Ordering::Acquire) == QPS as u64 * u64::from(2 * BATCH)
        });
        kassert!(all, "{} received", f.rx.received.load(Ordering::Acquire));
        kassert_eq!(f.pool()?.steps().0, 0);
        let capped = rnr_naks(d)? - rnr;
        kernel::kunit::info(format_args!(
            "    # srq growth: {} RNR NAKs capped at 16 buffers
",
            capped
        ));
        f.rx.keep.store(false, Ordering::Release);
    }

    let f = Fleet::new(d, QPS, PER_QP, Recv::Pool { nr: 1, size: 16 }, BUF).map_err(|_| Failed)?;
    f.rx.keep.store(true, Ordering::Release);
    let raw = f.pool.as_ref().map(|p| p.0).ok_or(Failed)?;
    let plan = f.pool()?.plan();
    kassert_eq!((plan.max_size, plan.step), (64, 16));
    let rnr = rnr_naks(d)?;
    for b in 0..BATCHES {
        f.post_range(0, b * BATCH..(b + 1) * BATCH)?;
        let want = QPS as u64 * u64::from((b + 1) * BATCH);
        let all = wait_for(20_000, || f.rx.received.load(Ordering::Acquire) == want);
        kassert!(
            all,
            "batch {}: {} of {} received",
            b,
            f.rx.received.load(Ordering::Acquire),
            want
        );
        // The batch emptied what was posted, so a limit event came; below the cap it grows.
        let steps = u64::from((b + 1).min(3));
        // The work counts a step, then tells the ULP: wait for both.
        let grown = wait_for(20_000, || {
            f.pool().is_ok_and(|p| p.steps().0 == steps)
                && f.rx.pressure[1].load(Ordering::Acquire) == steps as u32
        });
        kassert!(
            grown,
            "batch {}: {:?} steps, {} heard",
            b,
            f.pool()?.steps(),
            f.rx.pressure[1].load(Ordering::Acquire)
        );
        kassert_eq!(f.pool()?.target(0), Some(16 * (1 + steps as u32)));
    }
    let pool = f.pool()?;
    // At the cap the last batch's wait above had nothing to wait for. Its limit event came
    // before its completions (rxe raises it as a receive is taken), but the work it queued and
    // the last buffers' kept counts (after `recv_done` returns) may still be on their way.
    kassert!(
        wait_for(20_000, || pool.kept() == 64),
        "{} kept",
        pool.kept()
    );
    pool.test_run_maintenance();
    kassert_eq!(
        rnr_naks(d)? - rnr,
        0,
        "RNR NAKs although the SRQ grew in time"
    );
    kassert_eq!(pool.buffer_bytes(), 64 * u64::from(BUF));
    kassert_eq!(f.rx.last_posted.load(Ordering::Acquire), 64);
    kassert_eq!(pool.armed_limit(0), Some(16));

    // The ULP gives everything back; the pressure is gone.
    f.rx.keep.store(false, Ordering::Release);
    for i in 0..f.rx.stash_len.load(Ordering::Acquire) {
        let cqe = f.rx.stash[i].swap(core::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: A live pool; `cqe` is a kept buffer's.
        kassert_eq!(unsafe { ibext_srq_pool_repost(raw, cqe.cast()) }, 0);
    }
    kassert_eq!(pool.posted(), 64);
    // A pass at the real time retires nothing: the last event was just now.
    pool.test_run_maintenance();
    kassert_eq!(pool.steps().1, 0);
    pool.test_maintain_a_period_later();
    kassert_eq!(pool.steps().1, 1);
    kassert_eq!(pool.target(0), Some(48));
    kassert_eq!(f.rx.pressure[2].load(Ordering::Acquire), 1);
    kassert_eq!(f.rx.last_posted.load(Ordering::Acquire), 48);
    kassert_eq!(pool.armed_limit(0), Some(12));
    // Traffic brings the retired step's buffers back (each comes back once 64 receives were
    // consumed after its repost, at most): then the step is freed.
    f.post_range(0, BATCH * BATCHES..PER_QP)?;
    let all = QPS as u64 * u64::from(PER_QP);
    kassert!(wait_for(20_000, || f.rx.received.load(Ordering::Acquire) == all));
    let freed = wait_for(20_000, || pool.buffer_bytes() == 48 * u64::from(BUF));
    kassert!(
        freed,
        "{} bytes after the retired step came back",
        pool.buffer_bytes()
    );
    // The run that freed it may still be finishing (its grace period); the passes a period
    // later below run under `phase`, so it cannot see their clock (once, on the debug kernel,
    // a second step retired in one such period, likely that way).
    pool.test_run_maintenance();
    kassert_eq!(pool.posted(), 48);
    kassert_eq!(f.rx.bad.load(Ordering::Acquire), 0);
    kassert_eq!(f.rx.dups.load(Ordering::Acquire), 0);
    // One step per quiet period, down to the size the pool was made with.
    for n in 2..=3 {
        pool.test_maintain_a_period_later();
        kassert_eq!(pool.steps().1, n);
    }
    kassert_eq!(pool.target(0), Some(16));
    pool.test_maintain_a_period_later();
    kassert_eq!(
        pool.steps().1,
        3,
        "shrank below the size the pool was made with"
    );
    Ok(())
}

/// A pool without managed buffers whose SRQ runs short tells the ULP (`IBEXT_SRQ_LOW`, with
/// the most the SRQ holds) and grows nothing itself: the ULP decides. Forced: the pollers are
/// held while more messages arrive than a quarter below what is posted.
fn ulp_posted_pool_hears_low() -> TestResult {
    const QPS: usize = 4;
    const PER_QP: u32 = 16;
    const DEPTH: u32 = 16;
    let dev = required(c_str!("rxe0"))?;
    let f = Fleet::new(
        dev.device(),
        QPS,
        PER_QP,
        Recv::PoolUlp {
            depth: DEPTH,
            max: 0,
        },
        64,
    )
    .map_err(|_| Failed)?;
    for e in f.engines() {
        e.test_hold();
    }
    f.post_range(0, 0..PER_QP)?;
    let low = wait_for(20_000, || f.rx.pressure[0].load(Ordering::Acquire) > 0);
    for e in f.engines() {
        e.test_release();
    }
    kassert!(low, "no IBEXT_SRQ_LOW with every receive of an SRQ used up");
    let all = QPS as u64 * u64::from(PER_QP);
    kassert!(wait_for(30_000, || f.rx.received.load(Ordering::Acquire) == all));
    kassert_eq!(f.rx.last_posted.load(Ordering::Acquire), DEPTH);
    kassert_eq!(f.rx.pressure[1].load(Ordering::Acquire), 0);
    kassert_eq!(f.pool()?.steps(), (0, 0));
    kassert_eq!(f.rx.dups.load(Ordering::Acquire), 0);
    kassert_eq!(f.rx.bad.load(Ordering::Acquire), 0);
    Ok(())
}

/// A pool without managed buffers whose ULP says it keeps more receives posted than it made the
/// pool with (`ibext_srq_pool_set_posted`, as the nvmet port does after a step of commands):
/// the limit follows at a quarter; a quiet period later only that SRQ hears `IBEXT_SRQ_QUIET`,
/// once, and what the ULP says from inside that call re-arms in the same run. Bad input is
/// refused. Forced: the maintenance runs and the quiet periods are the test's.
fn ulp_posted_pool_follows_what_the_ulp_posts() -> TestResult {
    const DEPTH: u32 = 16;
    const MAX: u32 = 64;
    const QUIET: usize = bindings::ibext_srq_pressure_IBEXT_SRQ_QUIET as usize;
    let dev = required(c_str!("rxe0"))?;
    let f = Fleet::new(
        dev.device(),
        1,
        16,
        Recv::PoolUlp {
            depth: DEPTH,
            max: MAX,
        },
        64,
    )
    .map_err(|_| Failed)?;
    let raw = f.pool.as_ref().map(|p| p.0).ok_or(Failed)?;
    let pool = f.pool()?;
    // SAFETY: A live pool; SRQ 0 exists.
    let srq0 = unsafe { ibext_srq_pool_srq(raw, 0) };
    kassert_eq!(pool.armed_limit(0), Some(DEPTH / 4));
    // SAFETY: A live pool and one of its SRQs.
    kassert_eq!(unsafe { ibext_srq_pool_set_posted(raw, srq0, 48) }, 0);
    pool.test_run_maintenance();
    kassert_eq!(pool.armed_limit(0), Some(12));
    f.post_range(0, 0..8)?;
    kassert!(wait_for(30_000, || f.rx.received.load(Ordering::Acquire) == 8));
    // A quiet period later: SRQ 0 alone hears it, with what was said; from inside the call
    // the ULP says 32, which the same run arms.
    f.rx.declare.store(32, Ordering::Release);
    f.rx.declare_pool.store(raw, Ordering::Release);
    pool.test_maintain_a_period_later();
    f.rx.declare_pool
        .store(core::ptr::null_mut(), Ordering::Release);
    kassert_eq!(f.rx.pressure[QUIET].load(Ordering::Acquire), 1);
    kassert_eq!(f.rx.last_posted.load(Ordering::Acquire), 48);
    kassert_eq!(pool.armed_limit(0), Some(8));
    kassert_eq!(f.rx.bad.load(Ordering::Acquire), 0);
    // Back where it started: no more notices, the limit where it was at creation.
    // SAFETY: As above.
    kassert_eq!(unsafe { ibext_srq_pool_set_posted(raw, srq0, DEPTH) }, 0);
    pool.test_run_maintenance();
    kassert_eq!(pool.armed_limit(0), Some(DEPTH / 4));
    pool.test_maintain_a_period_later();
    kassert_eq!(f.rx.pressure[QUIET].load(Ordering::Acquire), 1);
    // Traffic still arrives exactly once.
    f.post_range(0, 8..16)?;
    kassert!(wait_for(30_000, || f.rx.received.load(Ordering::Acquire) == 16));
    kassert_eq!(f.rx.dups.load(Ordering::Acquire), 0);

    let einval = EINVAL.to_errno();
    // SAFETY: Null or live pools; bad counts and foreign SRQs are what is tested.
    unsafe {
        kassert_eq!(
            ibext_srq_pool_set_posted(core::ptr::null_mut(), srq0, 8),
            einval
        );
        bad_input_ok("srq_set_posted.null_pool");
        kassert_eq!(ibext_srq_pool_set_posted(raw, srq0, 0), einval);
        bad_input_ok("srq_set_posted.zero");
        kassert_eq!(ibext_srq_pool_set_posted(raw, srq0, MAX + 1), einval);
        bad_input_ok("srq_set_posted.over_max");
    }
    kassert_eq!(pool.armed_limit(0), Some(DEPTH / 4));
    // A pool with managed buffers posts its own: refused, nothing warned.
    let pd = Pd::new(dev.device()).map_err(|_| Failed)?;
    let rx = Rx::new(1, 1).map_err(|_| Failed)?;
    let managed = Pool::create(&pd, &attr(1, 4, 64, Some(&rx))).map_err(|_| Failed)?;
    // SAFETY: A live pool.
    let msrq = unsafe { ibext_srq_pool_srq(managed.0, 0) };
    // SAFETY: A live pool and one of its SRQs.
    let r = unsafe { ibext_srq_pool_set_posted(managed.0, msrq, 4) };
    kassert_eq!(r, einval);
    bad_input_ok("srq_set_posted.managed");
    // An SRQ of another pool is a caller bug: warned once.
    let mut got = 0;
    let warned = expect_warnings(|| {
        // SAFETY: A live pool; the SRQ is only compared.
        got = unsafe { ibext_srq_pool_set_posted(raw, msrq, 8) };
    });
    kassert_eq!(warned, 1);
    kassert_eq!(got, einval);
    bad_input_ok("srq_set_posted.foreign");
    kassert_eq!(pool.armed_limit(0), Some(DEPTH / 4));
    drop(managed);
    drop(f);
    Ok(())
}

/// A pool without managed buffers, for a ULP that posts its own receives (as nvmet-rdma does):
/// its SRQ count and each SRQ are reachable, each SRQ carries the ULP's context, found again from
/// the SRQ `ibext_srq_pool_get` gave a QP, and traffic arrives exactly once in the ULP's own
/// buffers, on its QP, through its SRQ. Bad input to the four calls is refused.
fn ulp_posted_receives() -> TestResult {
    const QPS: usize = 8;
    const PER_QP: u32 = 64;
    const DEPTH: u32 = 16;
    let dev = required(c_str!("rxe0"))?;
    let vectors = dev.device().usable_comp_vectors();
    let f = Fleet::new(
        dev.device(),
        QPS,
        PER_QP,
        Recv::PoolUlp {
            depth: DEPTH,
            max: 0,
        },
        64,
    )
    .map_err(|_| Failed)?;
    let raw = f.pool.as_ref().map(|p| p.0).ok_or(Failed)?;
    // SAFETY: A live pool.
    let n = unsafe { ibext_srq_pool_nr_srqs(raw) };
    kassert_eq!(n, vectors);
    kassert_eq!(f.pool()?.posted(), 0);
    kassert_eq!(f.pool()?.buffer_bytes(), 0);
    for r in f.refs.iter() {
        // SAFETY: A live pool; `r.1` is one of its SRQs.
        let ctx = unsafe { ibext_srq_pool_srq_ctx(raw, r.1) };
        let k = f
            .ulp_ctx
            .iter()
            .position(|c| core::ptr::eq(c, ctx.cast::<u32>()));
        kassert!(k.is_some(), "QP's SRQ has no context of the test's");
        let k = k.ok_or(Failed)?;
        // SAFETY: As above.
        let srq_k = unsafe { ibext_srq_pool_srq(raw, k as u32) };
        kassert!(srq_k == r.1, "context of another SRQ");
    }
    f.run(8)?;

    let einval = EINVAL.to_errno();
    // SAFETY: Null or live pools; bad indices and foreign SRQs are what is tested.
    unsafe {
        kassert_eq!(ibext_srq_pool_nr_srqs(core::ptr::null_mut()), 0);
        bad_input_ok("srq_nr.null_pool");
        let e = ibext_srq_pool_srq(core::ptr::null_mut(), 0);
        kassert_eq!(kernel::error::from_err_ptr(e).err(), Some(EINVAL));
        bad_input_ok("srq_at.null_pool");
        let e = ibext_srq_pool_srq(raw, n);
        kassert_eq!(kernel::error::from_err_ptr(e).err(), Some(EINVAL));
        bad_input_ok("srq_at.out_of_range");
        let some = core::ptr::NonNull::<u8>::dangling().as_ptr().cast();
        kassert_eq!(
            ibext_srq_pool_set_srq_ctx(core::ptr::null_mut(), 0, some),
            einval
        );
        bad_input_ok("srq_set_ctx.null_pool");
        kassert_eq!(ibext_srq_pool_set_srq_ctx(raw, n, some), einval);
        bad_input_ok("srq_set_ctx.out_of_range");
        let first = ibext_srq_pool_srq(raw, 0);
        kassert!(ibext_srq_pool_srq_ctx(core::ptr::null_mut(), first).is_null());
        bad_input_ok("srq_ctx.null_pool");
    }
    // An SRQ of another pool is a caller bug: warned once, NULL.
    let pd = Pd::new(dev.device()).map_err(|_| Failed)?;
    let other = Pool::create(&pd, &attr(1, 4, 0, None)).map_err(|_| Failed)?;
    // SAFETY: A live pool.
    let foreign = unsafe { ibext_srq_pool_srq(other.0, 0) };
    let mut got = core::ptr::NonNull::<c_void>::dangling().as_ptr();
    let warned = expect_warnings(|| {
        // SAFETY: A live pool; the SRQ is only compared.
        got = unsafe { ibext_srq_pool_srq_ctx(raw, foreign) };
    });
    kassert_eq!(warned, 1);
    kassert!(got.is_null());
    bad_input_ok("srq_ctx.foreign");
    drop(other);
    drop(f);
    Ok(())
}

/// 16 loopback QPs on a pool of one SRQ per vector with 64 managed buffers each (fewer than
/// the messages, so every buffer is reposted many times): every message arrives exactly once,
/// with its payload, on its own QP through its SRQ; the references balance.
fn traffic_exactly_once() -> TestResult {
    const QPS: usize = 16;
    const PER_QP: u32 = 96;
    let dev = required(c_str!("rxe0"))?;
    let made = ledger::counts(Kind::SrqPool).made;
    {
        let mut f = Fleet::new(
            dev.device(),
            QPS,
            PER_QP,
            Recv::Pool { nr: 0, size: 64 },
            64,
        )
        .map_err(|_| Failed)?;
        let pool = f.pool()?;
        let vectors = dev.device().usable_comp_vectors();
        kassert_eq!(pool.plan().nr_srqs, vectors);
        kassert_eq!(pool.posted(), u64::from(vectors) * 64);
        kassert_eq!(pool.buffer_bytes(), u64::from(vectors) * 64 * 64);
        // One SRQ per vector: QP i's SRQ is SRQ i % vectors.
        for (i, r) in f.refs.iter().enumerate() {
            kassert!(
                Some(r.1) == pool.srq(i % vectors as usize).map(|s| s.as_raw()),
                "QP {} SRQ",
                i
            );
        }
        let refs = pool.refs();
        kassert_eq!(refs.iter().sum::<u32>(), QPS as u32);
        f.run(8)?;
        kassert_eq!(f.pool()?.completions(), (QPS as u64) * u64::from(PER_QP));
        kernel::kunit::info(format_args!(
            "    # srq traffic: {} messages over {} SRQs of 64 buffers, {} limit events\n",
            QPS as u32 * PER_QP,
            vectors,
            f.pool()?.limit_events()
        ));
        // QPs, then references: the pool can go.
        drop(core::mem::replace(&mut f.qps, KVec::new()));
        drop(core::mem::replace(&mut f.refs, KVec::new()));
        kassert!(f.pool()?.refs().iter().all(|&r| r == 0));
        kassert_eq!(f.pool.as_mut().map_or(-1, Pool::destroy), 0);
    }
    kassert_eq!(ledger::counts(Kind::SrqPool).made, made + 1);
    kassert_eq!(ledger::counts(Kind::SrqPool).live(), 0);
    Ok(())
}

/// References follow the hints; destroy with references is -EBUSY and changes nothing.
fn references_and_busy() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let pd = Pd::new(dev.device()).map_err(|_| Failed)?;
    let vectors = dev.device().usable_comp_vectors();
    let mut pool = Pool::create(&pd, &attr(0, 16, 0, None)).map_err(|_| Failed)?;
    let mut taken = KVec::new();
    for hint in 0..(4 * vectors as i32) {
        // SAFETY: Live pool.
        let srq = unsafe { ibext_srq_pool_get(pool.0, hint) };
        kassert!(
            Some(srq)
                == pool
                    .get()
                    .srq(hint as usize % vectors as usize)
                    .map(|s| s.as_raw())
        );
        taken.push(srq, GFP_KERNEL).map_err(|_| Failed)?;
    }
    kassert!(pool.get().refs().iter().all(|&r| r == 4));
    // A negative hint takes the least-referenced SRQ: after one such get, SRQ 0 has 5.
    // SAFETY: Live pool.
    let extra = unsafe { ibext_srq_pool_get(pool.0, -1) };
    kassert!(Some(extra) == pool.get().srq(0).map(|s| s.as_raw()));
    taken.push(extra, GFP_KERNEL).map_err(|_| Failed)?;
    kassert_eq!(pool.destroy(), EBUSY.to_errno());
    bad_input_ok("srq_destroy.busy");
    kassert_eq!(pool.get().refs().iter().sum::<u32>(), 4 * vectors + 1);
    for srq in taken.iter() {
        // SAFETY: Live pool; each reference was taken above.
        unsafe { ibext_srq_pool_put(pool.0, *srq) };
    }
    kassert!(pool.get().refs().iter().all(|&r| r == 0));
    kassert_eq!(pool.destroy(), 0);

    // The Rust form: references borrow the pool, so it always goes with none left.
    {
        let args = |nr| crate::srq_pool::CreateArgs {
            req: crate::policy::srq_pool::Request {
                nr_srqs: nr,
                srq_size: 16,
                max_sge: 1,
                buf_size: 0,
                has_recv_done: false,
                max_srq_size: 0,
            },
            recv_done: None,
            pressure: None,
        };
        // SAFETY: `pd` is live and outlives the pool, dropped at the end of this block.
        let pd_view = unsafe { PdView::from_raw(pd.0.as_ptr()) };
        let owned = crate::srq_pool::OwnedSrqPool::new(pd_view, args(0))?;
        let a = owned.get(1)?;
        let b = owned.get(1)?;
        let one = owned.pool()?.srq(1).map(|s| s.as_raw());
        kassert!(a.srq().as_raw() == b.srq().as_raw() && Some(a.srq().as_raw()) == one);
        kassert_eq!(owned.pool()?.refs()[1], 2);
        drop((a, b));
        kassert!(owned.pool()?.refs().iter().all(|&r| r == 0));
        let live = ledger::counts(Kind::SrqPool).live();
        drop(owned);
        kassert_eq!(ledger::counts(Kind::SrqPool).live(), live - 1);
    }

    // Fewer SRQs than vectors: the least-referenced one, so two SRQs share evenly.
    let mut pool = Pool::create(&pd, &attr(2, 16, 0, None)).map_err(|_| Failed)?;
    let mut taken = KVec::new();
    for hint in 0..10 {
        // SAFETY: Live pool.
        let srq = unsafe { ibext_srq_pool_get(pool.0, hint) };
        taken.push(srq, GFP_KERNEL).map_err(|_| Failed)?;
    }
    let refs = pool.get().refs();
    kassert!(
        refs.len() == 2 && refs[0] == 5 && refs[1] == 5,
        "{:?}",
        &refs[..]
    );
    for srq in taken.iter() {
        // SAFETY: As above.
        unsafe { ibext_srq_pool_put(pool.0, *srq) };
    }
    kassert_eq!(pool.destroy(), 0);
    Ok(())
}

/// The SRQ limit is armed (checked with `ib_query_srq()`), raises
/// `IB_EVENT_SRQ_LIMIT_REACHED` when the SRQ runs short, and is armed again after every event.
///
/// The shortage is forced, not hoped for: one SRQ of 16 buffers (limit 4) for 4 QPs, whose
/// CQs' pollers are held (the tests' gate) while 32 messages are sent, so no buffer is reposted
/// until the event has come; then the pollers are released, the senders' RNR retries go
/// through, and every message arrives exactly once. Twice, so the re-arm is checked too.
fn limit_events_are_counted() -> TestResult {
    const QPS: usize = 4;
    const PER_CYCLE: u32 = 8;
    const CYCLES: u32 = 2;
    let dev = required(c_str!("rxe0"))?;
    let f = Fleet::new(
        dev.device(),
        QPS,
        PER_CYCLE * CYCLES,
        // Capped at its size: growth would end the shortage this test forces.
        Recv::PoolMax {
            nr: 1,
            size: 16,
            max: 16,
        },
        64,
    )
    .map_err(|_| Failed)?;
    let pool = f.pool()?;
    kassert_eq!(pool.plan().limit, 4);
    let srq = pool.srq(0).ok_or(Failed)?.as_raw();
    kassert_eq!(f.engines().count(), QPS);
    for cycle in 0..CYCLES {
        // Armed where the pool says (4: the pool is capped at its size).
        let armed = wait_for(20_000, || {
            let want = pool.armed_limit(0).unwrap_or(0);
            // SAFETY: `srq` is live while the pool is.
            let got = unsafe { bindings::ibext_test_srq_limit(srq) };
            want == 4 && i64::from(got) == i64::from(want)
        });
        kassert!(armed, "cycle {}: the limit is not armed", cycle);
        let events = pool.limit_events();
        for e in f.engines() {
            e.test_hold();
        }
        f.post_range(0, cycle * PER_CYCLE..(cycle + 1) * PER_CYCLE)?;
        let hit = wait_for(20_000, || pool.limit_events() > events);
        for e in f.engines() {
            e.test_release();
        }
        kassert!(hit, "cycle {}: no limit event with the pollers held", cycle);
        let want = u64::from((cycle + 1) * PER_CYCLE) * QPS as u64;
        let all = wait_for(30_000, || f.rx.received.load(Ordering::Acquire) >= want);
        kassert!(
            all,
            "cycle {}: {} of {} received",
            cycle,
            f.rx.received.load(Ordering::Acquire),
            want
        );
    }
    let events = pool.limit_events();
    kernel::kunit::info(format_args!(
        "    # srq limit: {} limit events in {} forced shortages\n",
        events, CYCLES
    ));
    kassert!(events >= u64::from(CYCLES));
    kassert_eq!(
        f.rx.received.load(Ordering::Acquire),
        u64::from(PER_CYCLE * CYCLES) * QPS as u64
    );
    kassert_eq!(f.rx.bad.load(Ordering::Acquire), 0);
    kassert_eq!(f.rx.dups.load(Ordering::Acquire), 0);
    let done = wait_for(30_000, || {
        f.sends
            .iter()
            .all(|s| s.done.load(Ordering::Acquire) >= u64::from(PER_CYCLE * CYCLES))
    });
    kassert!(done, "sends did not complete");
    for s in f.sends.iter() {
        kassert_eq!(s.errors.load(Ordering::Acquire), 0);
    }
    kassert_eq!(pool.posted(), 16);
    Ok(())
}

/// Receive CQs polled in workqueue and unbound-workqueue context, with a `recv_done` that sleeps
/// after counting each message. The pool is destroyed as soon as the last message is counted,
/// while its handler may still be asleep inside ibext's receive handler: destroy must wait for
/// every handler the engine is running (an SRCU grace period; RCU would not wait for a kworker),
/// so once it returns no handler is inside, and KASAN sees nothing freed under one.
fn sleeping_handlers_then_destroy() -> TestResult {
    const QPS: usize = 4;
    const PER_QP: u32 = 32;
    let dev = required(c_str!("rxe0"))?;
    for ctx in [PollCtx::Workqueue, PollCtx::UnboundWorkqueue] {
        let mut f = Fleet::with_ctx(
            dev.device(),
            QPS,
            PER_QP,
            Recv::Pool { nr: 0, size: 32 },
            64,
            ctx,
            false,
        )
        .map_err(|_| Failed)?;
        f.rx.sleep_ms.store(5, Ordering::Release);
        f.run(8)?;
        drop(core::mem::replace(&mut f.qps, KVec::new()));
        drop(core::mem::replace(&mut f.refs, KVec::new()));
        kassert_eq!(
            f.pool.as_mut().map_or(-1, Pool::destroy),
            0,
            "{}",
            ctx.name()
        );
        kassert_eq!(
            f.rx.inside.load(Ordering::Acquire),
            0,
            "{}: destroy returned with a handler still running",
            ctx.name()
        );
    }
    kassert_eq!(ledger::counts(Kind::SrqPool).live(), 0);
    Ok(())
}

/// `ib_drain_qp()` on an SRQ QP whose receive CQ is a pooled CQ shared with other QPs, while
/// their messages are in flight. 6.12's `__ib_drain_srq` waits for
/// `IB_EVENT_QP_LAST_WQE_REACHED` and then polls that CQ itself (`ib_process_cq_direct`),
/// beside ibext's engine: the other QPs' completions are then dispatched by two pollers, and
/// every one of them must still arrive exactly once. In every poll context.
fn drain_srq_qp_on_a_shared_cq() -> TestResult {
    const QPS: usize = 4;
    const PER_QP: u32 = 24;
    let dev = required(c_str!("rxe0"))?;
    for ctx in PollCtx::ALL {
        let f = Fleet::with_ctx(
            dev.device(),
            QPS,
            PER_QP,
            Recv::Pool { nr: 1, size: 128 },
            64,
            ctx,
            true,
        )
        .map_err(|_| Failed)?;
        let shared = f.cqs.iter().all(|c| c.as_raw() == f.cqs[0].as_raw());
        kassert!(shared, "{}: the QPs do not share one CQ", ctx.name());
        f.post_all_but_first()?;
        // SAFETY: QP 0 is live; its send and receive CQ is pooled, its SRQ is the pool's.
        unsafe { bindings::ib_drain_qp(f.qps[0].0) };
        let want = (QPS as u64 - 1) * u64::from(PER_QP);
        let mut waited = 0;
        while f.rx.received.load(Ordering::Acquire) < want {
            kassert!(
                waited < 30_000,
                "{}: {} of {} received",
                ctx.name(),
                f.rx.received.load(Ordering::Acquire),
                want
            );
            msleep(2);
            waited += 2;
        }
        kassert_eq!(
            f.rx.received.load(Ordering::Acquire),
            want,
            "{}",
            ctx.name()
        );
        kassert_eq!(f.rx.bad.load(Ordering::Acquire), 0, "{}", ctx.name());
        kassert_eq!(f.rx.dups.load(Ordering::Acquire), 0, "{}", ctx.name());
        for qp in 1..QPS as u32 {
            for seq in 0..PER_QP {
                let id = (qp * PER_QP + seq) as usize;
                let seen = f.rx.seen[id / 64].load(Ordering::Acquire) & (1u64 << (id % 64));
                kassert!(seen != 0, "{}: QP {} message {} lost", ctx.name(), qp, seq);
            }
        }
        for (i, sctx) in f.sends.iter().enumerate().skip(1) {
            let mut waited = 0;
            while sctx.done.load(Ordering::Acquire) < u64::from(PER_QP) && waited < 30_000 {
                msleep(2);
                waited += 2;
            }
            kassert_eq!(
                sctx.done.load(Ordering::Acquire),
                u64::from(PER_QP),
                "QP {}",
                i
            );
            kassert_eq!(sctx.errors.load(Ordering::Acquire), 0, "QP {}", i);
        }
    }
    Ok(())
}

/// A QP still attached to an SRQ whose reference was put back early: destroy refuses with
/// `-EBUSY` and frees nothing (the buffers stay posted), and succeeds once the QP is gone.
fn destroy_refused_while_a_qp_is_attached() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let pd = Pd::new(dev.device()).map_err(|_| Failed)?;
    let rx = Rx::new(0, 1).map_err(|_| Failed)?;
    let cq = CqEntries::get(dev.device(), 64, 0, PollCtx::Workqueue, Moderation::None)
        .map_err(|_| Failed)?;
    let mut pool = Pool::create(&pd, &attr(1, 16, 64, Some(&rx))).map_err(|_| Failed)?;
    // SAFETY: Live pool.
    let srq = kernel::error::from_err_ptr(unsafe { ibext_srq_pool_get(pool.0, 0) })
        .map_err(|_| Failed)?;
    // SAFETY: PD, CQ and SRQ are live; the QP is destroyed before all three.
    let qp = kernel::error::from_err_ptr(unsafe {
        bindings::ibext_test_create_qp(pd.0.as_ptr(), cq.as_raw(), cq.as_raw(), srq, 8, 0)
    })
    .map_err(|_| Failed)?;
    let qp = Qp(qp);
    // SAFETY: Live pool; the reference was taken above (the QP still uses the SRQ).
    unsafe { ibext_srq_pool_put(pool.0, srq) };
    kassert_eq!(pool.destroy(), EBUSY.to_errno());
    bad_input_ok("srq_destroy.attached");
    kassert_eq!(pool.get().posted(), 16);
    drop(qp);
    kassert_eq!(pool.destroy(), 0);
    Ok(())
}

/// Every request the pool must refuse, and every caller bug.
fn bad_input() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let pd = Pd::new(dev.device()).map_err(|_| Failed)?;
    let einval = EINVAL.to_errno() as isize;
    let made = ledger::counts(Kind::SrqPool).made;
    let rx = Rx::new(0, 1).map_err(|_| Failed)?;
    let max_srq = dev.device().attrs().max_srq as u32;
    let max_sge = dev.device().attrs().max_srq_sge as u32;
    let bad_sge = |sge| bindings::ibext_srq_pool_attr {
        max_sge: sge,
        ..attr(0, 16, 0, None)
    };
    // The too_big row is over the cap on this device, whatever its vector count.
    {
        use crate::policy::srq_pool::{BUF_OVERHEAD, MAX_POOL_BYTES};
        let wr = u64::from((dev.device().attrs().max_srq_wr as u32).min(1 << 30));
        kassert!(
            4 * wr * (64 + BUF_OVERHEAD) > MAX_POOL_BYTES,
            "max_srq_wr {}",
            wr
        );
    }
    let mut no_cb = attr(0, 16, 64, Some(&rx));
    no_cb.recv_done = None;
    let with_max = |size, max, buf| bindings::ibext_srq_pool_attr {
        max_srq_size: max,
        ..attr(1, size, buf, if buf > 0 { Some(&rx) } else { None })
    };
    let cases: [(&str, bindings::ibext_srq_pool_attr); 12] = [
        ("srq_create.zero_size", attr(0, 0, 0, None)),
        ("srq_create.zero_sge", bad_sge(0)),
        ("srq_create.over_max_sge", bad_sge(max_sge + 1)),
        ("srq_create.over_max_srq", attr(max_srq + 1, 16, 0, None)),
        ("srq_create.big_buf", attr(0, 16, 64 * 1024 + 1, Some(&rx))),
        ("srq_create.buf_without_recv_done", no_cb),
        // Clamped to max_srq_wr (2^20 on rxe), still 4 * 2^20 managed buffers: over the cap,
        // refused before anything is allocated (it used to make the page allocator WARN). Four
        // SRQs, not one per vector: with two vCPUs (the debug guest) the default of one per
        // vector is exactly at the cap, and a legal 256 MiB pool takes minutes under KASAN.
        ("srq_create.too_big", attr(4, 1 << 30, 64, Some(&rx))),
        ("srq_create.too_big_total", attr(0, 65536, 65536, Some(&rx))),
        (
            "srq_create.recv_done_without_buf",
            attr(0, 16, 0, Some(&rx)),
        ),
        ("srq_create.max_below_size", with_max(16, 15, 0)),
        ("srq_create.max_below_size", with_max(16, 15, 64)),
        ("srq_create.max_too_big", with_max(16, u32::MAX, 65536)),
    ];
    for (id, a) in cases {
        // SAFETY: Live PD; `a` is valid.
        let p = unsafe { ibext_srq_pool_create(pd.0.as_ptr(), &a) };
        kassert!(p as isize == einval, "{}: {:?}", id, p);
        bad_input_ok(id);
    }
    let ok = attr(0, 16, 0, None);
    // SAFETY: Null arguments are refused before use.
    let p = unsafe { ibext_srq_pool_create(core::ptr::null_mut(), &ok) };
    kassert!(p as isize == einval);
    bad_input_ok("srq_create.null_pd");
    // SAFETY: As above.
    let p = unsafe { ibext_srq_pool_create(pd.0.as_ptr(), core::ptr::null()) };
    kassert!(p as isize == einval);
    bad_input_ok("srq_create.null_attr");

    // A device without SRQs: rxe0's attributes say so for the length of one call.
    {
        // SAFETY: The attributes are plain data in the registered device; nothing else reads
        // `max_srq` while this test runs, and it is restored at once.
        let attrs = unsafe { &mut (*dev.device().as_raw()).attrs };
        let saved = attrs.max_srq;
        attrs.max_srq = 0;
        // SAFETY: Live PD.
        let p = unsafe { ibext_srq_pool_create(pd.0.as_ptr(), &ok) };
        attrs.max_srq = saved;
        kassert!(p as isize == eopnotsupp().to_errno() as isize, "{:?}", p);
        bad_input_ok("srq_create.no_srq");
    }
    kassert_eq!(ledger::counts(Kind::SrqPool).made, made);

    // SAFETY: Null is refused.
    let s = unsafe { ibext_srq_pool_get(core::ptr::null_mut(), 0) };
    kassert!(s as isize == einval);
    bad_input_ok("srq_get.null_pool");
    // SAFETY: Null is refused.
    let r = unsafe { ibext_srq_pool_destroy(core::ptr::null_mut()) };
    kassert_eq!(r, EINVAL.to_errno());
    bad_input_ok("srq_destroy.null");

    let a = Pool::create(&pd, &ok).map_err(|_| Failed)?;
    let b = Pool::create(&pd, &ok).map_err(|_| Failed)?;
    // SAFETY: Live pools.
    let (sa, sb) = unsafe { (ibext_srq_pool_get(a.0, 0), ibext_srq_pool_get(b.0, 0)) };
    let warned = expect_warnings(|| {
        // SAFETY: Null is refused with a warning.
        unsafe { ibext_srq_pool_put(core::ptr::null_mut(), sa) };
    });
    kassert_eq!(warned, 1);
    bad_input_ok("srq_put.null_pool");
    let warned = expect_warnings(|| {
        // SAFETY: Live pool; `sb` is of the other pool.
        unsafe { ibext_srq_pool_put(a.0, sb) };
    });
    kassert_eq!(warned, 1);
    bad_input_ok("srq_put.foreign");
    // SAFETY: Live pools; each puts back its own reference.
    unsafe {
        ibext_srq_pool_put(a.0, sa);
        ibext_srq_pool_put(b.0, sb);
    }
    let warned = expect_warnings(|| {
        // SAFETY: Live pool; the reference was already put back.
        unsafe { ibext_srq_pool_put(a.0, sa) };
    });
    kassert_eq!(warned, 1);
    bad_input_ok("srq_put.over");
    kassert!(a.get().refs().iter().all(|&r| r == 0));
    kassert!(b.get().refs().iter().all(|&r| r == 0));
    drop((a, b));
    Ok(())
}

/// A forced allocation failure at every step of making a pool with managed buffers unwinds it
/// all: -ENOMEM, no pool, no SRQ, no mapping left (the PD is deallocated cleanly at the end).
fn allocation_failure_unwinds() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let pd = Pd::new(dev.device()).map_err(|_| Failed)?;
    let rx = Rx::new(0, 1).map_err(|_| Failed)?;
    let a = attr(2, 8, 64, Some(&rx));
    let mut faults = 0;
    let mut n = 1;
    loop {
        let live = ledger::counts(Kind::SrqPool).live();
        FAIL_AT.store(n, Ordering::Relaxed);
        let res = Pool::create(&pd, &a);
        let left = FAIL_AT.swap(0, Ordering::Relaxed);
        match res {
            Err(e) => {
                kassert_eq!(e, ENOMEM, "fault {}", n);
                kassert_eq!(left, 0);
                kassert_eq!(ledger::counts(Kind::SrqPool).live(), live, "fault {}", n);
                faults += 1;
            }
            Ok(mut p) => {
                kassert!(left > 0, "fault {} was reached but the pool was made", n);
                kassert_eq!(p.get().posted(), 16);
                kassert_eq!(p.destroy(), 0);
                break;
            }
        }
        n += 1;
        kassert!(n < 1000);
    }
    // 3 before the pool, then per SRQ: 1 + 2 per buffer + 1 + 1 per post.
    kassert_eq!(faults, 3 + 2 * (1 + 2 * 8 + 1 + 8));
    kernel::kunit::info(format_args!(
        "    # srq create: {} fault points unwound\n",
        faults
    ));
    Ok(())
}

/// After every QP and pool is gone, `rdma link delete rxe0` is prompt (nothing of ibext's holds
/// the device), and the re-added device takes a pool again.
fn link_delete_after_cleanup() -> TestResult {
    let res = link_delete_after_cleanup_checks();
    restore_links();
    res
}

fn link_delete_after_cleanup_checks() -> TestResult {
    {
        let dev = required(c_str!("rxe0"))?;
        let f = Fleet::new(dev.device(), 4, 16, Recv::Pool { nr: 0, size: 32 }, 64)
            .map_err(|_| Failed)?;
        kassert!(debugfs_exists(&[c_str!("rxe0")]));
        f.run(4)?;
        drop(f);
    }
    let t = now_ns();
    kassert_eq!(link_delete(c_str!("rxe0"))?, 0);
    let ms = (now_ns() - t) / 1_000_000;
    kernel::kunit::info(format_args!("    # rdma link delete rxe0: {} ms\n", ms));
    kassert_eq!(link_add(c_str!("rxe0"))?, 0);
    let dev = required(c_str!("rxe0"))?;
    let f =
        Fleet::new(dev.device(), 2, 8, Recv::Pool { nr: 0, size: 16 }, 64).map_err(|_| Failed)?;
    f.run(4)?;
    Ok(())
}

/// A managed receive's handler that ibext's engine is running when the pool is destroyed: the
/// handler is held on entry (`Point::RecvDone`) with a real message in it, the QP is destroyed,
/// and the pool's teardown runs on a worker until it waits for the handlers in flight
/// (`Point::SrqHandlersWait`). Then the handler goes on. It must neither call the ULP nor post
/// its buffer again: the SRQ is closing. Before the fix the SRQ was already destroyed there, and
/// the handler called the ULP and reposted on the freed SRQ. In every poll context.
fn handler_in_flight_at_destroy() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    for ctx in PollCtx::ALL {
        let f = Fleet::with_ctx(
            dev.device(),
            1,
            1,
            Recv::Pool { nr: 1, size: 16 },
            64,
            ctx,
            false,
        )
        .map_err(|_| Failed)?;
        handler_in_flight_checks(f, ctx)?;
    }
    kassert_eq!(ledger::counts(Kind::SrqPool).live(), 0);
    Ok(())
}

fn handler_in_flight_checks(mut f: Fleet, ctx: PollCtx) -> TestResult {
    let cq = f.cqs.first().map(CqEntries::as_raw).ok_or(Failed)?;
    let at = f.engines().next().map(|e| core::ptr::from_ref(e) as usize);
    let at = at.ok_or(Failed)?;
    // SAFETY: The fleet holds the CQ until it is dropped, after this function.
    let engine = unsafe { &*(at as *const crate::engine::PooledCq) };
    let parking = Parking::arm(Point::RecvDone, core::ptr::null());
    // The message's completions wait in the CQ; then a worker runs the pass that holds the
    // receive's handler (see `pass_on_worker`).
    engine.test_hold();
    f.post_range(0, 0..1)?;
    // SAFETY: The CQ is live (held by the fleet).
    let queued = wait_for(
        60_000,
        || unsafe { bindings::ibext_test_peek_cq(cq, 2) } >= 2,
    );
    let passed = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
    let started = queued && pass_on_worker(engine, &passed, PassCpu::Other).is_ok();
    let parked = started && parking.wait_parked(60_000);
    engine.test_release();
    kassert!(
        queued,
        "{}: the message's completions never came",
        ctx.name()
    );
    kassert!(parked, "{}: no handler parked", ctx.name());
    drop(core::mem::replace(&mut f.qps, KVec::new()));
    drop(core::mem::replace(&mut f.refs, KVec::new()));
    let pool = f.pool.as_ref().map_or(core::ptr::null_mut(), |p| p.0) as usize;
    let result = Arc::new(AtomicI32::new(NOT_YET), GFP_KERNEL)?;
    let r = result.clone();
    let spawned = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
        // SAFETY: A live pool; the test gives up its handle if this succeeds.
        let ret = unsafe { ibext_srq_pool_destroy(pool as *mut bindings::ibext_srq_pool) };
        r.store(ret, Ordering::Release);
    });
    kassert!(spawned.is_ok(), "cannot start the destroyer");
    let waiting = wait_for(60_000, || {
        Parking::was_reached(Point::SrqHandlersWait) || result.load(Ordering::Acquire) != NOT_YET
    });
    kassert!(
        waiting,
        "{}: teardown never waited for handlers",
        ctx.name()
    );
    kassert_eq!(f.rx.received.load(Ordering::Acquire), 0, "{}", ctx.name());
    kassert!(
        parking.release(),
        "{}: the handler was held too long",
        ctx.name()
    );
    let done = wait_for(60_000, || result.load(Ordering::Acquire) != NOT_YET);
    kassert!(done, "{}: destroy did not return", ctx.name());
    kassert_eq!(result.load(Ordering::Acquire), 0, "{}", ctx.name());
    if let Some(p) = f.pool.as_mut() {
        p.0 = core::ptr::null_mut();
    }
    kassert_eq!(
        f.rx.received.load(Ordering::Acquire),
        0,
        "{}: a handler released after its pool began closing called the ULP",
        ctx.name()
    );
    kassert!(wait_for(60_000, || passed.load(Ordering::Acquire) == 1));
    Ok(())
}

/// A ULP whose `pressure` callback destroys its own pool, its QP gone. The callback runs in the
/// SRQ's maintenance work, which holds the SRQ's `phase` mutex and which teardown cancels and
/// waits for: the destroy would wait for itself. It is refused with `-EDEADLK`, and nothing
/// changes: the pool is destroyed normally afterwards. The work is held on entry
/// (`Point::SrqMaintain`) after a real limit event, while the QP goes. Before the fix the
/// callback's destroy hung the work for good.
fn pressure_callback_destroying_its_pool() -> TestResult {
    const DEPTH: u32 = 16;
    let dev = required(c_str!("rxe0"))?;
    let mut f = Fleet::new(
        dev.device(),
        1,
        DEPTH,
        Recv::PoolUlp {
            depth: DEPTH,
            max: 0,
        },
        64,
    )
    .map_err(|_| Failed)?;
    let parking = Parking::arm(Point::SrqMaintain, core::ptr::null());
    for e in f.engines() {
        e.test_hold();
    }
    // Every receive of the QP's SRQ is used up: the limit event queues the maintenance work.
    f.post_range(0, 0..DEPTH)?;
    let parked = parking.wait_parked(60_000);
    for e in f.engines() {
        e.test_release();
    }
    kassert!(parked, "no maintenance work after a limit event");
    kassert!(wait_for(30_000, || f.rx.received.load(Ordering::Acquire)
        == u64::from(DEPTH)));
    drop(core::mem::replace(&mut f.qps, KVec::new()));
    drop(core::mem::replace(&mut f.refs, KVec::new()));
    let pool = f.pool.as_ref().map_or(core::ptr::null_mut(), |p| p.0);
    f.rx.destroy_pool.store(pool, Ordering::Release);
    let mut released = false;
    let mut tried = false;
    let warned = expect_warnings(|| {
        released = parking.release();
        tried = wait_for(60_000, || {
            f.rx.destroy_result.load(Ordering::Acquire) != NOT_YET
        });
    });
    kassert!(released, "the work was held too long");
    if !tried {
        // The work is stuck inside the pool's teardown: leave everything to it.
        core::mem::forget(f);
        kassert!(tried, "the pressure callback's destroy never returned");
        // Not reached: the assertion above fails.
        return Ok(());
    }
    kassert_eq!(
        f.rx.destroy_result.load(Ordering::Acquire),
        crate::backport::error::edeadlk().to_errno()
    );
    kassert_eq!(warned, 1);
    bad_input_ok("srq_destroy.from_pressure");
    kassert!(f.rx.pressure[0].load(Ordering::Acquire) > 0);
    kassert_eq!(f.pool.as_mut().map_or(-1, Pool::destroy), 0);
    Ok(())
}

kunit_suite!(
    ibext_srq,
    [
        bad_input,
        references_and_busy,
        destroy_refused_while_a_qp_is_attached,
        sleeping_handlers_then_destroy,
        handler_in_flight_at_destroy,
        pressure_callback_destroying_its_pool,
        drain_srq_qp_on_a_shared_cq,
        traffic_exactly_once,
        ulp_posted_receives,
        kept_buffers_are_given_back,
        limit_events_are_counted,
        srq_grows_under_pressure_and_shrinks,
        ulp_posted_pool_hears_low,
        ulp_posted_pool_follows_what_the_ulp_posts,
        allocation_failure_unwinds,
        link_delete_after_cleanup,
    ]
);
