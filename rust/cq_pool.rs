// SPDX-License-Identifier: GPL-2.0

//! Shared CQ pools: per device, per poll context, CQs spread over the completion vectors.
//!
//! The decisions (vector, least-used CQ, growth size, size checks, put accounting) are in
//! `policy::cq_pool`; this file holds the CQs and the locks.
//!
//! About 520 lines: the pools' locking (grow, inner, the retirement count) is one argument
//! whose parts (get, put, grow, retire, release) are kept together.
//!
//! Lock order, for each [`CqPool`]:
//!
//! 1. `grow` (mutex): held by a caller that found no room, across making a new set of CQs, so
//!    that two callers racing for room make one set, not two.
//! 2. `inner` (spinlock): the list of sets and the entries in use. Never held across an
//!    allocation, a CQ creation or destruction, or anything that sleeps.
//!
//! New sets are made with no lock but `grow` held, then published under `inner`.
//!
//! # Lifetime
//!
//! A pooled CQ lives as long as ULPs hold entries on it, not as long as ibext's client: rdma_cm
//! (and every rdma_cm-driven ULP) is removed from a device *after* ibext. When the device is
//! removed from ibext, [`CqPools::retire_begin`] marks every pool dead (`get` fails with
//! `ENODEV`) and destroys the CQs nobody uses; CQs with entries in use stay fully live
//! (completions dispatched, `ib_drain_qp` works) and are counted in `orphans`. The put that
//! brings the last of them to zero tells its caller to [`CqPools::release`] them (the device
//! state holds a device reference until then, see `device.rs`).
//!
//! `orphans` carries a bias of one while `retire_begin`..`retire_end` runs, so that it reaches
//! zero exactly once, after retirement has finished counting. A pool's busy CQs are added under
//! its `inner` lock, in the same section that marks it dead, so every put that later sees the
//! pool dead finds its CQ already counted.

use crate::{
    backport::{
        bug::warn_on_once,
        debugfs::{SeqFile, Show},
        sync::LockClass,
        workqueue::{impl_has_delayed_work, DelayedRun, DelayedWork},
    },
    engine::{self, CqSnapshot, OwnedPooledCq, PollCtx, PooledCq},
    ib::{cq::CqPtr, Device},
    ledger::{Kind, Token},
    policy::{
        cq_pool::{self as policy, AgingSlot, Slot},
        moderation::Moderation,
    },
    seams, tunables,
};
use core::{
    ffi::c_void,
    fmt::Write,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};
use kernel::{
    c_str, new_mutex, new_spinlock,
    prelude::*,
    sync::{Mutex, SpinLock},
};

/// One pooled CQ as the pool sees it.
struct PoolSlot {
    /// `None` once destroyed idle, by aging or at retirement (the slot stays until its whole
    /// set is empty, see [`CqPoolInner::unlink_empty_locked`]).
    cq: Option<OwnedPooledCq>,
    vector: u32,
    capacity: u32,
    used: u32,
    /// When `used` last dropped to 0, or the CQ was made ([`now_ms`]).
    idle_since_ms: u64,
}

impl Slot for PoolSlot {
    fn vector(&self) -> u32 {
        self.vector
    }
    fn capacity(&self) -> u32 {
        if self.cq.is_some() {
            self.capacity
        } else {
            0
        }
    }
    fn used(&self) -> u32 {
        self.used
    }
}

impl AgingSlot for PoolSlot {
    fn idle_since_ms(&self) -> u64 {
        self.idle_since_ms
    }
}

impl PoolSlot {
    /// Returns the CQ, or `None` once destroyed.
    fn ptr(&self) -> Option<CqPtr> {
        self.cq.as_ref().and_then(OwnedPooledCq::ptr)
    }

    /// Sets `used`, and the CQ's `cqe_used` to match (see `ibext_shim_cq_set_used`).
    fn set_used(&mut self, used: u32) {
        if used == 0 && self.used != 0 {
            self.idle_since_ms = now_ms();
        }
        self.used = used;
        if let Some(cq) = self.cq.as_ref().and_then(OwnedPooledCq::get) {
            cq.set_used(used);
        }
    }
}

/// One CQ per usable vector, made together when the pool grows; sets form a list, oldest first.
struct CqSet {
    slots: KVec<PoolSlot>,
    next: Option<KBox<CqSet>>,
    _token: Token,
}

/// The fields of a [`CqPool`] that `inner` protects.
struct CqPoolInner {
    head: Option<KBox<CqSet>>,
    /// Set once the device is going away; `get` then fails with `ENODEV`.
    dead: bool,
}

impl CqPoolInner {
    /// Iterates over every pooled CQ, oldest set first.
    fn slots(&self) -> impl Iterator<Item = &PoolSlot> + Clone {
        core::iter::successors(self.head.as_deref(), |s| s.next.as_deref())
            .flat_map(|s| s.slots.iter())
    }

    /// Returns the `pos`-th CQ in [`CqPoolInner::slots`] order.
    fn slot_mut(&mut self, mut pos: usize) -> Option<&mut PoolSlot> {
        let mut set = self.head.as_deref_mut();
        while let Some(s) = set {
            if pos < s.slots.len() {
                return s.slots.as_mut_slice().get_mut(pos);
            }
            pos -= s.slots.len();
            set = s.next.as_deref_mut();
        }
        None
    }

    /// Takes `nr_cqe` entries on `vector` from the least-used CQ with room.
    fn take_locked(&mut self, vector: u32, nr_cqe: u32) -> Option<CqPtr> {
        let pos = policy::pick_least_used(self.slots(), vector, nr_cqe)?;
        let slot = self.slot_mut(pos)?;
        slot.set_used(slot.used + nr_cqe);
        slot.ptr()
    }

    /// Unlinks the sets whose CQs are all destroyed and returns them as a list, for the caller
    /// to drop outside the lock.
    fn unlink_empty_locked(&mut self) -> Option<KBox<CqSet>> {
        let mut gone: Option<KBox<CqSet>> = None;
        let mut rest = self.head.take();
        let mut tail = &mut self.head;
        while let Some(mut set) = rest {
            rest = set.next.take();
            if set.slots.iter().all(|s| s.cq.is_none()) {
                set.next = gone.take();
                gone = Some(set);
            } else {
                tail = &mut tail.insert(set).next;
            }
        }
        gone
    }

    /// Appends a set at the tail, keeping the list oldest first.
    fn append_locked(&mut self, set: KBox<CqSet>) {
        let mut tail = &mut self.head;
        while let Some(s) = tail {
            tail = &mut s.next;
        }
        *tail = Some(set);
    }
}

/// The pool of one poll context and one moderation mode on one device.
#[pin_data]
struct CqPool {
    ctx: PollCtx,
    moderation: Moderation,
    #[pin]
    grow: Mutex<()>,
    #[pin]
    inner: SpinLock<CqPoolInner>,
}

impl CqPool {
    fn new(ctx: PollCtx, moderation: Moderation) -> impl PinInit<Self> {
        pin_init!(Self {
            ctx,
            moderation,
            grow <- new_mutex!((), "CqPool::grow"),
            inner <- new_spinlock!(CqPoolInner { head: None, dead: false }, "CqPool::inner"),
        })
    }

    /// Takes entries if a CQ has room; `Err(ENODEV)` once the device is going away.
    fn try_take(&self, vector: u32, nr_cqe: u32) -> Result<Option<CqPtr>> {
        let mut inner = self.inner.lock();
        if inner.dead {
            return Err(ENODEV);
        }
        Ok(inner.take_locked(vector, nr_cqe))
    }

    /// Makes one CQ per usable vector, each of `cqe` entries; unwinds on failure.
    fn make_set(
        &self,
        dev: &Device,
        vectors: u32,
        cqe: u32,
        owner: *const c_void,
    ) -> Result<KBox<CqSet>> {
        let mut slots = KVec::with_capacity(vectors as usize, GFP_KERNEL)?;
        for vector in 0..vectors {
            let cq = PooledCq::new_pooled(dev, cqe, vector, self.ctx, self.moderation, owner)?;
            // Drivers round the size up, so use what the CQ has.
            let capacity = cq.get().map_or(0, PooledCq::cqe).max(cqe);
            // Within the capacity reserved above: no allocation.
            slots.push(
                PoolSlot {
                    cq: Some(cq),
                    vector,
                    capacity,
                    used: 0,
                    idle_since_ms: now_ms(),
                },
                GFP_KERNEL,
            )?;
        }
        Ok(KBox::new(
            CqSet {
                slots,
                next: None,
                _token: Token::new(Kind::CqSet),
            },
            GFP_KERNEL,
        )?)
    }

    /// Gives back `nr_cqe` entries of `cq`; `None` if `cq` is not in this pool. Otherwise
    /// whether `cq` has just become idle, and whether the pool is dead. `idled` runs under the
    /// pool's lock when `cq` has just become idle in a live pool: retirement marks the pool dead
    /// under the same lock, so whatever `idled` does happens before retirement starts, never
    /// after the state has gone.
    fn put(
        &self,
        cq: CqPtr,
        nr_cqe: u32,
        idled: impl FnOnce(),
    ) -> Option<Result<Idle, policy::OverPut>> {
        let mut inner = self.inner.lock();
        let pos = inner.slots().position(|s| s.ptr() == Some(cq))?;
        let dead = inner.dead;
        let slot = inner.slot_mut(pos)?;
        Some(policy::put_back(slot.used, nr_cqe).map(|used| {
            slot.set_used(used);
            match (used == 0, dead) {
                (false, _) => Idle::No,
                (true, false) => {
                    idled();
                    Idle::Yes
                }
                (true, true) => Idle::Orphan,
            }
        }))
    }

    /// One aging pass at `now_ms` (see [`policy::age_pass`]): takes the CQs that aged out out of
    /// the pool under `inner`, so that no get can pick them, then destroys them. Returns the
    /// number destroyed and the milliseconds until the next pass is due.
    fn age(&self, now_ms: u64) -> (usize, Option<u64>) {
        let age_ms = tunables::age_ms();
        // Serializes with growth and retirement: the slots neither come nor go meanwhile, and a
        // dead pool stays dead.
        let _grow = self.grow.lock();
        let total = {
            let inner = self.inner.lock();
            if inner.dead {
                return (0, None);
            }
            inner.slots().count()
        };
        let (Ok(mut at), Ok(mut aged)) = (
            KVec::<usize>::with_capacity(total, GFP_KERNEL),
            KVec::<OwnedPooledCq>::with_capacity(total, GFP_KERNEL),
        ) else {
            // No memory for the bookkeeping: try again after another period.
            return (0, Some(age_ms));
        };
        let (next, empty) = {
            let mut inner = self.inner.lock();
            // Within the capacity reserved above (`total` slots, unchanged under `grow`): no
            // allocation, so no failure, under the lock.
            let next = policy::age_pass(inner.slots(), now_ms, age_ms, |pos| {
                let _ = at.push(pos, GFP_ATOMIC);
            });
            for &pos in at.iter() {
                if let Some(cq) = inner.slot_mut(pos).and_then(|s| s.cq.take()) {
                    let _ = aged.push(cq, GFP_ATOMIC);
                }
            }
            (next, inner.unlink_empty_locked())
        };
        // No get can reach these any more: wait out their handlers, then destroy them.
        destroy_cqs(aged.iter());
        let n = aged.len();
        // Dropped outside every lock: destroying CQs sleeps.
        drop(aged);
        drop_sets(empty);
        (n, next)
    }

    /// Marks the pool dead and destroys its idle CQs; adds its busy ones to `orphans`.
    fn retire(&self, dev: &Device, orphans: &AtomicU32) {
        // No set is being made while we hold `grow`, and none is made once `dead` is set.
        let _grow = self.grow.lock();
        let total = {
            let mut inner = self.inner.lock();
            inner.dead = true;
            let busy = inner.slots().filter(|s| s.used != 0).count();
            for slot in inner.slots().filter(|s| s.used != 0) {
                pr_info!(
                    "{}: pooled CQ (vector {}, {}) has {} entries in use at removal: kept until \
                     they are put back\n",
                    dev.name(),
                    slot.vector,
                    self.ctx.name(),
                    slot.used
                );
            }
            orphans.fetch_add(busy as u32, Ordering::AcqRel);
            inner.slots().filter(|s| s.cq.is_some()).count()
        };
        // Idle CQs are taken out under the lock into room allocated outside it. Without the
        // room they are simply destroyed later, with the busy ones.
        let Ok(mut idle) = KVec::<OwnedPooledCq>::with_capacity(total, GFP_KERNEL) else {
            return;
        };
        {
            let mut inner = self.inner.lock();
            let mut pos = 0;
            while let Some(slot) = inner.slot_mut(pos) {
                pos += 1;
                if slot.used != 0 || idle.len() == idle.capacity() {
                    continue;
                }
                if let Some(cq) = slot.cq.take() {
                    // Within the capacity reserved above (checked just before): no allocation,
                    // so no failure, under the lock.
                    let _ = idle.push(cq, GFP_ATOMIC);
                }
            }
        }
        destroy_cqs(idle.iter());
        // Dropped outside every lock: destroying CQs sleeps.
        drop(idle);
    }

    /// Destroys every CQ left (the last put after retirement, or retirement with none busy).
    fn release(&self) {
        let head = self.inner.lock().head.take();
        let cqs = core::iter::successors(head.as_deref(), |s| s.next.as_deref())
            .flat_map(|s| s.slots.iter())
            .filter_map(|s| s.cq.as_ref());
        destroy_cqs(cqs);
        drop_sets(head);
    }

    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        let inner = self.inner.lock();
        for slot in inner.slots() {
            let Some(e) = slot.cq.as_ref().and_then(OwnedPooledCq::get) else {
                continue;
            };
            let st = e.snapshot();
            write!(
                m,
                "{} vector {} cqe {} used {} moderation {} profile {} moderated_by {} ",
                self.ctx.name(),
                slot.vector,
                slot.capacity,
                slot.used,
                e.moderation().name(),
                st.profile_ix,
                if st.hw_moderation { "device" } else { "ibext" },
            )?;
            st.stats.write(m)?;
            writeln!(m)?;
        }
        Ok(())
    }
}

/// Where the pools live: their device, the vectors they spread CQs over, and the owner their
/// CQs carry back (`PooledCq::owner`).
#[derive(Clone, Copy)]
pub(crate) struct Home<'a> {
    pub(crate) dev: &'a Device,
    pub(crate) vectors: u32,
    pub(crate) owner: *const c_void,
}

/// Number of pools per device: one per poll context and moderation mode.
const NR_POOLS: usize = PollCtx::ALL.len() * Moderation::ALL.len();

/// Every CQ pool of one device, one per poll context and moderation mode (CQs of different
/// modes never share), the device's round-robin counter, and the aging of idle CQs.
///
/// # Aging
///
/// A put that leaves a CQ idle queues `aging` (`ibext.age_ms` later, unless it is pending
/// already); each run destroys the CQs idle for that long beyond each vector's floor and queues
/// itself again for the next CQ due, if any. Puts queue it under the pool's lock while the pool
/// is live; retirement (`retire_begin`) disables it once every pool is dead, and it never
/// touches a dead pool.
#[pin_data]
pub(crate) struct CqPools {
    /// Declared first: dropped, cancelled and waited for, before `pools`, which it reads.
    #[pin]
    aging: DelayedWork<CqPools>,
    /// CQs destroyed by aging, over the device's life.
    aged: AtomicU64,
    rr: AtomicU32,
    /// Busy CQs of dead pools, plus one while retirement runs (see the file's "Lifetime").
    orphans: AtomicU32,
    #[pin]
    pools: [CqPool; NR_POOLS],
}

impl CqPools {
    /// An initializer for empty pools; they grow on first use.
    pub(crate) fn new() -> impl PinInit<Self> {
        static AGING: LockClass = LockClass::new();
        pin_init!(Self {
            aging <- DelayedWork::new(c_str!("ibext_cq_aging"), &AGING),
            aged: AtomicU64::new(0),
            rr: AtomicU32::new(0),
            orphans: AtomicU32::new(0),
            pools <- kernel::init::pin_init_array_from_fn(|i| {
                let ctx = PollCtx::ALL[i / Moderation::ALL.len()];
                CqPool::new(ctx, Moderation::ALL[i % Moderation::ALL.len()])
            }),
        })
    }

    fn pool(&self, ctx: PollCtx, moderation: Moderation) -> &CqPool {
        let c = PollCtx::ALL.iter().position(|&x| x == ctx).unwrap_or(0);
        let m = Moderation::ALL
            .iter()
            .position(|&x| x == moderation)
            .unwrap_or(0);
        &self.pools[c * Moderation::ALL.len() + m]
    }

    /// Finds `cq` in any pool and reads it with `f` under that pool's lock.
    fn with_slot<R>(&self, cq: CqPtr, f: impl Fn(&PoolSlot) -> R) -> Option<R> {
        self.pools.iter().find_map(|pool| {
            let inner = pool.inner.lock();
            let r = inner.slots().find(|s| s.ptr() == Some(cq)).map(&f);
            r
        })
    }

    /// Takes `nr_cqe` entries on a pooled CQ of `home`'s device (see `ibext_cq_pool_get`).
    pub(crate) fn get(
        &self,
        home: &Home<'_>,
        nr_cqe: u32,
        hint: i32,
        ctx: PollCtx,
        moderation: Moderation,
    ) -> Result<CqPtr> {
        let Home {
            dev,
            vectors,
            owner,
        } = *home;
        let max_cqe = u32::try_from(dev.attrs().max_cqe).unwrap_or(0);
        policy::check_nr_cqe(nr_cqe, max_cqe).map_err(|_| EINVAL)?;
        let vector =
            policy::vector_for_hint(hint, vectors, || self.rr.fetch_add(1, Ordering::Relaxed));
        let pool = self.pool(ctx, moderation);
        if let Some(cq) = pool.try_take(vector, nr_cqe)? {
            return Ok(cq);
        }

        let _grow = pool.grow.lock();
        // Another caller may have grown the pool while we waited.
        if let Some(cq) = pool.try_take(vector, nr_cqe)? {
            return Ok(cq);
        }
        let set = pool.make_set(dev, vectors, policy::grow_cqe(nr_cqe, max_cqe), owner)?;
        let mut inner = pool.inner.lock();
        if inner.dead {
            drop(inner);
            // Dropped outside the lock: destroying CQs sleeps.
            drop(set);
            return Err(ENODEV);
        }
        inner.append_locked(set);
        let cq = inner.take_locked(vector, nr_cqe);
        drop(inner);
        // A new set has a CQ on every usable vector with room for a valid request.
        cq.ok_or(EINVAL)
    }

    /// Gives back `nr_cqe` entries of `cq` (see `ibext_cq_pool_put`). Returns `true` if this
    /// was the last put of the last busy CQ after retirement: the caller must [`release`].
    ///
    /// [`release`]: CqPools::release
    ///
    /// The caller's entries keep the state alive until they are given back, under the pool's
    /// lock: from then on, device removal may retire the pools and free the state, so nothing
    /// here touches `self` after the pool's `put` returns but the orphan count, which a busy CQ
    /// of a dead pool keeps alive until this put has counted it.
    pub(crate) fn put(&self, cq: CqPtr, nr_cqe: u32) -> bool {
        // A no-op while pending: the first idle CQ sets the time of the pass.
        let queue_aging = || {
            if seams::aging_off() {
                return;
            }
            self.aging.queue(tunables::age_ms() as u32);
        };
        for pool in self.pools.iter() {
            match pool.put(cq, nr_cqe, queue_aging) {
                None => continue,
                Some(Ok(Idle::No)) => return false,
                Some(Ok(Idle::Yes)) => {
                    seams::park_point(seams::Point::CqPutIdle, cq.as_raw().cast());
                    return false;
                }
                Some(Ok(Idle::Orphan)) => return self.orphans.fetch_sub(1, Ordering::AcqRel) == 1,
                Some(Err(policy::OverPut)) => {
                    warn_on_once!(true, "ibext_cq_pool_put: more entries than are in use");
                    return false;
                }
            }
        }
        warn_on_once!(true, "ibext_cq_pool_put: not a CQ from ibext's pool");
        false
    }

    /// Returns the entries in use on `cq`, or `None` if it is not pooled here.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests until a Rust ULP uses it")
    )]
    pub(crate) fn used(&self, cq: CqPtr) -> Option<u32> {
        self.with_slot(cq, |s| s.used)
    }

    /// Returns what the tests and benchmarks read of `cq`, if it is pooled here.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests until a Rust ULP uses it")
    )]
    pub(crate) fn info(&self, cq: CqPtr) -> Option<CqSnapshot> {
        self.with_slot(cq, |s| {
            s.cq.as_ref()
                .and_then(OwnedPooledCq::get)
                .map(PooledCq::snapshot)
        })
        .flatten()
    }

    /// Returns the entries in use on every pooled CQ together.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests until a Rust ULP uses it")
    )]
    pub(crate) fn total_used(&self) -> u64 {
        self.pools
            .iter()
            .map(|pool| {
                let inner = pool.inner.lock();
                let used: u64 = inner.slots().map(|s| u64::from(s.used)).sum();
                used
            })
            .sum()
    }

    /// Returns the number of pooled CQs in `ctx`, over every moderation mode.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests until a Rust ULP uses it")
    )]
    pub(crate) fn nr_cqs(&self, ctx: PollCtx) -> usize {
        self.pools
            .iter()
            .filter(|p| p.ctx == ctx)
            .map(|p| p.inner.lock().slots().filter(|s| s.cq.is_some()).count())
            .sum()
    }

    /// Starts retirement (device removal): every pool is dead from now on, idle CQs are
    /// destroyed, busy ones are counted. Returns the number of busy CQs left.
    pub(crate) fn retire_begin(&self, dev: &Device) -> u32 {
        // The bias: nothing reaches zero before `retire_end`.
        self.orphans.fetch_add(1, Ordering::AcqRel);
        for pool in self.pools.iter() {
            pool.retire(dev, &self.orphans);
        }
        // Every pool is dead: no put queues the work any more (puts queue it under a pool's
        // lock, only while the pool is live), and a run from now on does nothing. Disabled,
        // not only cancelled: a run in progress cannot queue itself again either.
        self.aging.disable_sync();
        self.orphans.load(Ordering::Acquire).saturating_sub(1)
    }

    /// Ends retirement. Returns `true` if no CQ is busy any more: the caller must
    /// [`release`](CqPools::release) (otherwise the last put will say so).
    pub(crate) fn retire_end(&self) -> bool {
        self.orphans.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Destroys every CQ left after retirement, once none is busy.
    pub(crate) fn release(&self) {
        for pool in self.pools.iter() {
            pool.release();
        }
    }

    /// Runs one aging pass over every pool as if the time were `now_ms`; returns the number of
    /// CQs destroyed and when the next pass is due. The aging work's body; the tests call it
    /// with a time one period ahead, to age what is idle now without waiting.
    pub(crate) fn age(&self, now_ms: u64) -> (usize, Option<u64>) {
        let mut destroyed = 0;
        let mut next: Option<u64> = None;
        for pool in self.pools.iter() {
            let (n, due) = pool.age(now_ms);
            destroyed += n;
            next = match (next, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        self.aged.fetch_add(destroyed as u64, Ordering::Relaxed);
        (destroyed, next)
    }

    /// Returns the number of CQs aging has destroyed.
    pub(crate) fn aged(&self) -> u64 {
        self.aged.load(Ordering::Relaxed)
    }

    /// Tests only: queues the aging work to run now (or moves it to now if pending), and
    /// waits for it to finish.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_run_aging(&self) {
        self.aging.kick(0);
        self.aging.flush();
    }

    /// Returns whether an aging pass is queued.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn aging_pending(&self) -> bool {
        self.aging.pending()
    }

    /// Returns the number of live pooled CQs of one pool on `vector`.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn live_on(&self, ctx: PollCtx, moderation: Moderation, vector: u32) -> usize {
        let inner = self.pool(ctx, moderation).inner.lock();
        let n = inner
            .slots()
            .filter(|s| s.cq.is_some() && s.vector == vector)
            .count();
        n
    }

    /// Returns the live pooled CQs over every pool, and their entries together.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn resident(&self) -> (usize, u64) {
        self.pools.iter().fold((0, 0), |(n, e), pool| {
            let inner = pool.inner.lock();
            let live = inner.slots().filter(|s| s.cq.is_some());
            let (dn, de) = live.fold((0, 0u64), |(n, e), s| (n + 1, e + u64::from(s.capacity)));
            (n + dn, e + de)
        })
    }
}

impl DelayedRun for CqPools {
    /// The aging pass, then the next one queued if a CQ is due later.
    fn run(&self) {
        let Some(now) = seams::aging_now(now_ms()) else {
            return;
        };
        if let (_, Some(due)) = self.age(now) {
            self.aging.queue(u32::try_from(due).unwrap_or(u32::MAX));
        }
    }
}

// `aging` is declared before `pools`, the only field `run` reads besides the atomics.
impl_has_delayed_work!(CqPools, aging);

/// Drops a list of sets iteratively (not recursively), outside every lock: each set drops its
/// CQs, destroying them.
fn drop_sets(mut head: Option<KBox<CqSet>>) {
    while let Some(mut s) = head {
        head = s.next.take();
        drop(s);
    }
}

/// What a put did to its CQ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Idle {
    /// Entries are still in use.
    No,
    /// Idle now: aging may destroy it later.
    Yes,
    /// Idle now, in a dead pool: one orphan fewer.
    Orphan,
}

/// Milliseconds of a monotonic clock, for aging.
fn now_ms() -> u64 {
    crate::backport::workqueue::now_ms()
}

/// Destroys the given CQs: stops every callback of them together, with one wait of each kind
/// for all (`quiesce`), then lets the caller drop them (each drop destroys its CQ).
fn destroy_cqs<'a>(cqs: impl Iterator<Item = &'a OwnedPooledCq> + Clone) {
    engine::quiesce(cqs);
}

impl Show for CqPools {
    /// One line per pooled CQ.
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        for pool in self.pools.iter() {
            pool.show(m)?;
        }
        Ok(())
    }
}
