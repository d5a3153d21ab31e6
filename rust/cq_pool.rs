// SPDX-License-Identifier: GPL-2.0

//! Shared CQ pools: per device, per poll context, CQs spread over the completion vectors.
//!
//! The decisions (vector, least-used CQ, growth size, size checks, put accounting) are in
//! `policy::cq_pool`; this file holds the CQs and the locks.
//!
//! Lock order, for each [`CqPool`]:
//!
//! 1. `grow` (mutex): held by a caller that found no room, across making a new set of CQs, so
//!    that two callers racing for room make one set, not two.
//! 2. `inner` (spinlock): the list of sets and the entries in use. Never held across an
//!    allocation, a CQ creation or destruction, or anything that sleeps.
//!
//! New sets are made with no lock but `grow` held, then published under `inner`.

use crate::{
    bindings,
    cq_engine::{self, CqEngine, CqSnapshot, OwnedCq, PollCtx},
    debugfs::{SeqFile, Show},
    ib::Device,
    ledger::{Kind, Token},
    policy::{
        cq_pool::{self as policy, Slot},
        moderation::Moderation,
    },
    warn::warn_on_once,
};
use core::{
    fmt::Write,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};
use kernel::{
    new_mutex, new_spinlock,
    prelude::*,
    sync::{Mutex, SpinLock},
};

/// One pooled CQ as the pool sees it.
struct PoolSlot {
    cq: OwnedCq,
    vector: u32,
    capacity: u32,
    used: u32,
}

impl Slot for PoolSlot {
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
    fn slots(&self) -> impl Iterator<Item = &PoolSlot> {
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
    fn take_locked(&mut self, vector: u32, nr_cqe: u32) -> Option<*mut bindings::ib_cq> {
        let pos = policy::pick_least_used(self.slots(), vector, nr_cqe)?;
        let slot = self.slot_mut(pos)?;
        slot.used += nr_cqe;
        Some(slot.cq.cq())
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
    fn try_take(&self, vector: u32, nr_cqe: u32) -> Result<Option<*mut bindings::ib_cq>> {
        let mut inner = self.inner.lock();
        if inner.dead {
            return Err(ENODEV);
        }
        Ok(inner.take_locked(vector, nr_cqe))
    }

    /// Makes one CQ per usable vector, each of `cqe` entries; unwinds on failure.
    fn make_set(&self, dev: &Device, vectors: u32, cqe: u32) -> Result<KBox<CqSet>> {
        let mut slots = KVec::with_capacity(vectors as usize, GFP_KERNEL)?;
        for vector in 0..vectors {
            let cq = CqEngine::create(dev, cqe, vector, self.ctx, self.moderation)?;
            // SAFETY: The CQ was just made; drivers round its size up, so read what it has.
            let real = unsafe { (*cq.cq()).cqe };
            let capacity = u32::try_from(real).unwrap_or(0).max(cqe);
            // Within the capacity reserved above: no allocation.
            slots.push(
                PoolSlot {
                    cq,
                    vector,
                    capacity,
                    used: 0,
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

    /// Gives back `nr_cqe` entries of `cq`; `None` if `cq` is not in this pool.
    fn put(&self, cq: *mut bindings::ib_cq, nr_cqe: u32) -> Option<Result<(), policy::OverPut>> {
        let mut inner = self.inner.lock();
        let pos = inner.slots().position(|s| s.cq.cq() == cq)?;
        let slot = inner.slot_mut(pos)?;
        Some(policy::put_back(slot.used, nr_cqe).map(|used| slot.used = used))
    }

    /// Destroys every CQ (device removal). Reports CQs whose entries were never put back.
    fn destroy_all(&self, dev: &Device) {
        let mut head = {
            let mut inner = self.inner.lock();
            inner.dead = true;
            inner.head.take()
        };
        let mut leaked = false;
        let mut set = head.as_deref();
        while let Some(s) = set {
            for slot in s.slots.iter() {
                if slot.used != 0 {
                    leaked = true;
                    pr_err!(
                        "{}: pooled CQ (vector {}, {}) still has {} entries in use at removal\n",
                        dev.name(),
                        slot.vector,
                        self.ctx.name(),
                        slot.used
                    );
                }
                slot.cq.mark_dying();
            }
            set = s.next.as_deref();
        }
        warn_on_once!(
            leaked,
            "pooled CQ entries not put back before device removal"
        );
        if head.is_some() {
            // One wait for every CQ's handlers, instead of one per CQ.
            cq_engine::wait_for_handlers();
        }
        // Drop iteratively: each set drops its CQs (destroying them) outside every lock.
        while let Some(mut s) = head {
            head = s.next.take();
            drop(s);
        }
    }

    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        let inner = self.inner.lock();
        for slot in inner.slots() {
            let Some(e) = slot.cq.engine() else { continue };
            let st = e.snapshot();
            writeln!(
                m,
                "{} vector {} cqe {} used {} events {} passes {} completions {} budget_exhausted {} \
                 moderation {} profile {} profile_max {} profile_changes {} samples {} \
                 deferred_polls {} deferred_asked_us {} deferred_waited_us {} mode_switches {}",
                self.ctx.name(),
                slot.vector,
                slot.capacity,
                slot.used,
                st.events,
                st.passes,
                st.completions,
                st.budget_exhausted,
                e.moderation().name(),
                st.profile_ix,
                st.profile_max,
                st.profile_changes,
                st.samples,
                st.deferred_polls,
                st.deferred_asked_us,
                st.deferred_waited_us,
                st.mode_switches,
            )?;
        }
        Ok(())
    }
}

/// Number of pools per device: one per poll context and moderation mode.
const NR_POOLS: usize = PollCtx::ALL.len() * Moderation::ALL.len();

/// Every CQ pool of one device, one per poll context and moderation mode (CQs of different
/// modes never share), and the device's round-robin counter.
#[pin_data]
pub(crate) struct CqPools {
    rr: AtomicU32,
    #[pin]
    pools: [CqPool; NR_POOLS],
}

impl CqPools {
    /// An initializer for empty pools; they grow on first use.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            rr: AtomicU32::new(0),
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
    fn with_slot<R>(&self, cq: *mut bindings::ib_cq, f: impl Fn(&PoolSlot) -> R) -> Option<R> {
        self.pools.iter().find_map(|pool| {
            let inner = pool.inner.lock();
            let r = inner.slots().find(|s| s.cq.cq() == cq).map(&f);
            r
        })
    }

    /// Takes `nr_cqe` entries on a pooled CQ of `dev` (see `ibext_cq_pool_get`).
    pub(crate) fn get(
        &self,
        dev: &Device,
        vectors: u32,
        nr_cqe: u32,
        hint: i32,
        ctx: PollCtx,
        moderation: Moderation,
    ) -> Result<NonNull<bindings::ib_cq>> {
        let max_cqe = u32::try_from(dev.attrs().max_cqe).unwrap_or(0);
        policy::check_nr_cqe(nr_cqe, max_cqe).map_err(|_| EINVAL)?;
        let vector =
            policy::vector_for_hint(hint, vectors, || self.rr.fetch_add(1, Ordering::Relaxed));
        let pool = self.pool(ctx, moderation);
        if let Some(cq) = pool.try_take(vector, nr_cqe)? {
            return NonNull::new(cq).ok_or(EINVAL);
        }

        let _grow = pool.grow.lock();
        // Another caller may have grown the pool while we waited.
        if let Some(cq) = pool.try_take(vector, nr_cqe)? {
            return NonNull::new(cq).ok_or(EINVAL);
        }
        let set = pool.make_set(dev, vectors, policy::grow_cqe(nr_cqe, max_cqe))?;
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
        cq.and_then(NonNull::new).ok_or(EINVAL)
    }

    /// Gives back `nr_cqe` entries of `cq` (see `ibext_cq_pool_put`).
    pub(crate) fn put(&self, cq: *mut bindings::ib_cq, nr_cqe: u32) {
        for pool in self.pools.iter() {
            match pool.put(cq, nr_cqe) {
                None => continue,
                Some(Ok(())) => return,
                Some(Err(policy::OverPut)) => {
                    warn_on_once!(true, "ibext_cq_pool_put: more entries than are in use");
                    return;
                }
            }
        }
        warn_on_once!(true, "ibext_cq_pool_put: not a CQ from ibext's pool");
    }

    /// Returns the entries in use on `cq`, or `None` if it is not pooled here.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests until a Rust ULP uses it")
    )]
    pub(crate) fn used(&self, cq: *mut bindings::ib_cq) -> Option<u32> {
        self.with_slot(cq, |s| s.used)
    }

    /// Returns what the tests and benchmarks read of `cq`, if it is pooled here.
    #[cfg_attr(
        not(ibext_kunit),
        expect(dead_code, reason = "used by the tests until a Rust ULP uses it")
    )]
    pub(crate) fn info(&self, cq: *mut bindings::ib_cq) -> Option<CqSnapshot> {
        self.with_slot(cq, |s| s.cq.engine().map(CqEngine::snapshot))
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
            .map(|p| p.inner.lock().slots().count())
            .sum()
    }

    /// Destroys every pooled CQ (device removal).
    pub(crate) fn destroy_all(&self, dev: &Device) {
        for pool in self.pools.iter() {
            pool.destroy_all(dev);
        }
    }
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
