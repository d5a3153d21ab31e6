// SPDX-License-Identifier: GPL-2.0

//! SRQ pools: shared receive queues on a PD, one per completion vector, refcounted by the QPs
//! that use them, with optional managed receive buffers.
//!
//! A pool belongs to the ULP that made it (`ibext_srq_pool_create`) and is destroyed by it
//! (`ibext_srq_pool_destroy`) before its PD and before its client `remove` for the device
//! returns; it holds a reference to ibext's device state so that the state outlives it.
//!
//! # Managed buffers
//!
//! With `buf_size > 0` every SRQ gets `srq_size` buffers, mapped, posted and posted again by
//! [`RecvSrq`] (`ib/srq.rs`): the poller of the receiving QP's CQ (ibext's completion engine
//! for a pooled CQ) hands each completed buffer to the ULP's `recv_done` and posts it again. A
//! buffer is either posted or inside that handler.
//!
//! # Building and teardown
//!
//! A pool is built completely (every SRQ made, its buffers posted) before anything else sees
//! it, and is never written through `&mut` afterwards: what changes is behind `refs`. Its
//! debugfs directory is made last and holds its own reference to the pool's [`Core`].
//!
//! `destroy` refuses (`-EBUSY`, nothing freed) while any SRQ has references or a QP still
//! attached (`usecnt`). Otherwise it marks the pool dead (under `refs`), and dropping the pool
//! removes its debugfs directory (waiting for readers), then destroys the SRQs, waits once for
//! the handlers ibext's engine may be running and frees the buffers ([`RecvSrq::drop_all`]).
//! A ULP that polls the receive CQ itself must have stopped polling it.
//!
//! The pool holds a device reference for its whole life (each [`RecvSrq`] does), so it may be
//! destroyed after ibext's `remove` (an rdma_cm-driven ULP does so on
//! `RDMA_CM_EVENT_DEVICE_REMOVAL`, which comes after).
//!
//! Lock order: `Core::refs` (mutex) is a leaf, taken in process context only.
//! `DeviceState::inner` is taken, alone, only to make the pool's debugfs directory.

use crate::{
    backport::error::{edeadlk, eopnotsupp},
    backport::{
        bug::warn_on_once,
        debugfs::{SeqFile, Show, ShowFile},
    },
    device::DeviceState,
    ib::verbs::{Pd, Srq, Wc},
    ledger::{Kind, Token},
    policy::srq_growth::Pressure,
    policy::srq_pool::{self as policy, Plan},
    recv_srq::{
        RecvAction, RecvData, RecvSrq, RecvSrqs, SrqAttr, SrqHandler, SrqStat, UlpPressure,
        UlpRecvDone,
    },
    seams::fault_point,
};
use core::{
    ffi::c_void,
    fmt::Write,
    sync::atomic::{AtomicPtr, AtomicU32, Ordering},
};
use kernel::{c_str, fmt, new_mutex, prelude::*, str::CString, sync::Arc, sync::Mutex};

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// What each SRQ does with a completed managed receive (hand it to the ULP) and with a change
/// of pressure (tell the ULP), and the ULP's context for the SRQ.
struct Slot {
    recv_done: Option<UlpRecvDone>,
    pressure: Option<UlpPressure>,
    /// Set by the ULP (`ibext_srq_pool_set_srq_ctx`), never dereferenced by ibext.
    ctx: AtomicPtr<c_void>,
}

impl SrqHandler for Slot {
    fn recv_done(&self, srq: &Srq, wc: &Wc, buf: RecvData<'_>) -> RecvAction {
        match &self.recv_done {
            Some(f) => f.call(srq, wc, &buf),
            None => RecvAction::Repost,
        }
    }

    fn pressure(&self, srq: &Srq, what: Pressure, posted: u32) {
        if let Some(f) = &self.pressure {
            f.call(srq, what, posted);
        }
    }
}

/// References of each SRQ, and whether the pool is being destroyed.
struct Refs {
    counts: KVec<u32>,
    dead: bool,
}

/// Counts the pool in its device state's live pools while it lives.
struct Counted(Arc<DeviceState>);

impl Counted {
    fn new(state: Arc<DeviceState>) -> Self {
        state.srq_pool_made();
        Counted(state)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.srq_pool_gone();
    }
}

/// The pool itself, shared with its debugfs file.
///
/// # Invariants
///
/// `srqs` has `plan.nr_srqs` SRQs and `refs.counts` as many entries; neither changes length.
#[pin_data]
pub(crate) struct Core {
    id: u32,
    plan: Plan,
    /// Declared first: dropped (destroyed, waited for) before the device state is uncounted.
    srqs: RecvSrqs<Slot>,
    #[pin]
    refs: Mutex<Refs>,
    counted: Counted,
    _token: Token,
}

/// An SRQ pool: its [`Core`] and the debugfs directory that shows it.
pub(crate) struct SrqPool {
    /// Declared first: removed, waiting for readers, before the core goes (the file keeps its
    /// directory, which keeps the device's).
    _file: Option<ShowFile<Core, Core>>,
    core: Arc<Core>,
}

impl core::ops::Deref for SrqPool {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

/// What `ibext_srq_pool_create` was given, checked for null already.
pub(crate) struct CreateArgs {
    pub(crate) req: policy::Request,
    pub(crate) recv_done: Option<UlpRecvDone>,
    pub(crate) pressure: Option<UlpPressure>,
}

impl SrqPool {
    /// Makes a pool on `pd` (see `ibext_srq_pool_create`); on error everything made is undone.
    pub(crate) fn create(pd: &Pd, args: CreateArgs) -> Result<KBox<Self>> {
        let dev = pd.device();
        // The pool spreads over the vectors the device's CQ pools use: one source for both.
        let state = crate::device::device_state(dev).ok_or(ENODEV)?;
        let state_vectors = state.comp_vectors();
        let a = dev.attrs();
        let caps = policy::Caps {
            max_srq: u32::try_from(a.max_srq).unwrap_or(0),
            max_srq_wr: u32::try_from(a.max_srq_wr).unwrap_or(0),
            max_srq_sge: u32::try_from(a.max_srq_sge).unwrap_or(0),
            vectors: state_vectors,
        };
        let plan = policy::plan(&args.req, &caps).map_err(|r| match r {
            policy::Refusal::Invalid => EINVAL,
            policy::Refusal::NotSupported => eopnotsupp(),
        })?;
        let n = plan.nr_srqs as usize;
        fault_point()?;
        let mut srqs = RecvSrqs::with_capacity(n)?;
        fault_point()?;
        let counts = KVec::from_elem(0u32, n, GFP_KERNEL)?;
        fault_point()?;
        let attr = SrqAttr {
            max_wr: plan.max_size,
            max_sge: plan.max_sge,
            limit: plan.limit,
            nr_bufs: if plan.buf_size > 0 { plan.srq_size } else { 0 },
            buf_size: plan.buf_size,
            step: plan.step,
            owner_posted: if plan.buf_size > 0 { 0 } else { plan.srq_size },
        };
        for _ in 0..n {
            let slot = Slot {
                recv_done: args.recv_done.clone(),
                pressure: args.pressure.clone(),
                ctx: AtomicPtr::new(core::ptr::null_mut()),
            };
            // Within the capacity reserved above: no allocation. On error, `srqs` is dropped
            // with what was made (destroyed, then freed).
            srqs.push(RecvSrq::new(pd, &attr, slot)?)?;
        }
        let counted = Counted::new(state);
        let core = Arc::pin_init(
            pin_init!(Core {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                plan,
                srqs,
                refs <- new_mutex!(Refs { counts, dead: false }, "SrqPool::refs"),
                counted,
                _token: Token::new(Kind::SrqPool),
            }),
            GFP_KERNEL,
        )?;
        let file = core.publish_debugfs();
        Ok(KBox::new(SrqPool { _file: file, core }, GFP_KERNEL)?)
    }
}

impl Core {
    /// Makes `srq_pool.<id>/stats` in the device's debugfs directory.
    fn publish_debugfs(self: &Arc<Self>) -> Option<ShowFile<Core, Core>> {
        let name = CString::try_from_fmt(fmt!("srq_pool.{}", self.id)).ok()?;
        let dir = self.counted.0.new_subdir(&name)?;
        ShowFile::new(&dir, c_str!("stats"), self.clone(), |c| c).ok()
    }

    /// Takes a reference to an SRQ for a QP on completion vector `hint`.
    pub(crate) fn get(&self, hint: i32) -> Result<&Srq> {
        let mut refs = self.refs.lock();
        if refs.dead {
            return Err(ENODEV);
        }
        let vectors = self.counted.0.comp_vectors();
        let i = policy::choose(&refs.counts, vectors, hint).ok_or(EINVAL)?;
        let srq = self.srqs.get(i).ok_or(EINVAL)?;
        refs.counts[i] += 1;
        Ok(srq.srq())
    }

    /// Drops a reference taken by [`Core::get`]; a caller bug warns once and changes nothing.
    pub(crate) fn put(&self, srq: *const Srq) {
        let mut refs = self.refs.lock();
        let Some(i) = self.srqs.iter().position(|s| core::ptr::eq(s.srq(), srq)) else {
            drop(refs);
            warn_on_once!(true, "ibext_srq_pool_put: SRQ not of this pool");
            return;
        };
        let Some(c) = refs.counts.get_mut(i) else {
            return;
        };
        if warn_on_once!(*c == 0, "ibext_srq_pool_put: more puts than gets") {
            return;
        }
        *c -= 1;
    }

    /// Marks the pool dead if no SRQ has references; the caller then drops it.
    pub(crate) fn retire(&self) -> Result {
        // From the ULP's `pressure` callback: it runs in an SRQ's maintenance work, which the
        // pool's teardown disables and waits for, under the SRQ's `phase`, which teardown takes:
        // the destroy would wait for itself. A caller bug; nothing changes.
        if warn_on_once!(
            self.srqs.iter().any(RecvSrq::in_own_pressure),
            "ibext_srq_pool_destroy: called from the pool's own pressure callback"
        ) {
            return Err(edeadlk());
        }
        let mut refs = self.refs.lock();
        if refs.counts.iter().any(|&c| c > 0) {
            return Err(EBUSY);
        }
        // A QP made with an SRQ but whose reference was put back early: destroying the SRQ
        // would fail, and freeing its buffers would free memory the device may still write.
        if self.srqs.iter().any(|s| s.srq().in_use()) {
            return Err(EBUSY);
        }
        // A buffer the ULP kept and has not given back is still the ULP's.
        if self.srqs.iter().any(|s| s.kept() > 0) {
            return Err(EBUSY);
        }
        refs.dead = true;
        Ok(())
    }

    /// Gives back a managed buffer the ULP kept (`ibext_srq_pool_repost`), named by the
    /// `wr_cqe` of its completion, and posts it again. A `cqe` that is not a kept buffer of
    /// this pool is a caller bug: warns once, `EINVAL`.
    pub(crate) fn repost(&self, cqe: *const c_void) -> Result {
        let r = self.srqs.iter().find_map(|s| s.repost(cqe));
        if warn_on_once!(
            r.is_none(),
            "ibext_srq_pool_repost: not a kept buffer of this pool"
        ) {
            return Err(EINVAL);
        }
        r.unwrap_or(Err(EINVAL))
    }

    /// Returns the managed buffers the ULP kept and has not given back, over all SRQs.
    pub(crate) fn kept(&self) -> u64 {
        self.srqs.iter().map(RecvSrq::kept).sum()
    }

    /// Returns the references of every SRQ, in order.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn refs(&self) -> KVec<u32> {
        let refs = self.refs.lock();
        let mut out = KVec::new();
        for &c in refs.counts.iter() {
            if out.push(c, GFP_KERNEL).is_err() {
                break;
            }
        }
        out
    }

    /// Returns the number of SRQs (fixed for the pool's life).
    pub(crate) fn nr_srqs(&self) -> usize {
        self.srqs.len()
    }

    /// Returns SRQ `i`, without taking a reference (for a ULP that posts its own receives).
    pub(crate) fn srq(&self, i: usize) -> Option<&Srq> {
        self.srqs.get(i).map(RecvSrq::srq)
    }

    /// Sets the ULP's context of SRQ `i`; `EINVAL` for an index out of range.
    pub(crate) fn set_srq_ctx(&self, i: usize, ctx: *mut c_void) -> Result {
        let s = self.srqs.get(i).ok_or(EINVAL)?;
        s.handler().ctx.store(ctx, Ordering::Release);
        Ok(())
    }

    /// Returns the pool's SRQ whose view is at `srq`, if it is one of this pool's.
    fn own(&self, srq: *const Srq) -> Option<&RecvSrq<Slot>> {
        self.srqs.iter().find(|s| core::ptr::eq(s.srq(), srq))
    }

    /// Returns the ULP's context of `srq`; a foreign SRQ is a caller bug (warns once, `None`).
    pub(crate) fn srq_ctx(&self, srq: *const Srq) -> Option<*mut c_void> {
        let found = self.own(srq);
        if warn_on_once!(
            found.is_none(),
            "ibext_srq_pool_srq_ctx: SRQ not of this pool"
        ) {
            return None;
        }
        found.map(|s| s.handler().ctx.load(Ordering::Acquire))
    }

    /// For a pool whose ULP posts its own receives: records that it now keeps `posted` posted
    /// on `srq` (see `RecvSrq::set_owner_posted`). `EINVAL` for a pool with managed buffers, a
    /// count of 0 or above the SRQ's size, or an SRQ not of this pool (a caller bug: warned
    /// once).
    pub(crate) fn set_owner_posted(&self, srq: *const Srq, posted: u32) -> Result {
        match self.own(srq) {
            Some(s) => s.set_owner_posted(posted),
            None => {
                warn_on_once!(true, "ibext_srq_pool_set_posted: SRQ not of this pool");
                Err(EINVAL)
            }
        }
    }

    /// Returns the managed buffers posted (or on their way back to the SRQ), over all SRQs.
    pub(crate) fn posted(&self) -> u64 {
        self.srqs.iter().map(RecvSrq::posted).sum()
    }

    /// Returns the bytes of receive buffer memory the pool holds.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.srqs.iter().map(RecvSrq::buffer_bytes).sum()
    }

    /// Returns statistic `s` over all SRQs.
    fn stat(&self, s: SrqStat) -> u64 {
        self.srqs.iter().map(|q| q.stat(s)).sum()
    }

    /// Returns the SRQ limit events seen, over all SRQs.
    pub(crate) fn limit_events(&self) -> u64 {
        self.stat(SrqStat::LimitEvents)
    }

    /// Returns the successful receive completions handled, over all SRQs.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn completions(&self) -> u64 {
        self.stat(SrqStat::Completions)
    }

    /// Returns the managed buffers SRQ `i` is meant to keep posted now (grown and shrunk).
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn target(&self, i: usize) -> Option<u32> {
        self.srqs.get(i).map(RecvSrq::target)
    }

    /// Returns the limit armed on SRQ `i` now.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn armed_limit(&self, i: usize) -> Option<u32> {
        self.srqs.get(i).map(RecvSrq::armed_limit)
    }

    /// Returns the growth steps taken and retired, over all SRQs.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn steps(&self) -> (u64, u64) {
        (self.stat(SrqStat::Grown), self.stat(SrqStat::Shrunk))
    }

    /// Tests only: runs every SRQ's maintenance work now and waits for it.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_run_maintenance(&self) {
        for s in self.srqs.iter() {
            s.test_run_maintenance();
        }
    }

    /// Tests only: one maintenance pass of every SRQ, a quiet period from now (see
    /// `RecvSrq::test_maintain_a_period_later`).
    #[cfg(ibext_kunit)]
    pub(crate) fn test_maintain_a_period_later(&self) {
        for s in self.srqs.iter() {
            s.test_maintain_a_period_later();
        }
    }

    /// Returns the plan the pool was made by.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn plan(&self) -> Plan {
        self.plan
    }
}

/// An SRQ pool owned by Rust code: the safe form of `ibext_srq_pool_create`/`_destroy`.
///
/// References are [`SrqRef`]s, which borrow the pool, so the pool cannot be dropped while one
/// exists and its destruction never meets `-EBUSY`.
///
/// # Invariants
///
/// `self.0` is `Some` until drop.
pub(crate) struct OwnedSrqPool(Option<KBox<SrqPool>>);

#[cfg_attr(
    not(ibext_kunit),
    expect(dead_code, reason = "the crate's tests are its only Rust users so far")
)]
impl OwnedSrqPool {
    /// Makes a pool on `pd` (see `ibext_srq_pool_create`).
    pub(crate) fn new(pd: &Pd, args: CreateArgs) -> Result<Self> {
        // INVARIANT: `Some`.
        SrqPool::create(pd, args).map(|p| OwnedSrqPool(Some(p)))
    }

    /// Returns the pool.
    pub(crate) fn pool(&self) -> Result<&SrqPool> {
        self.0.as_deref().ok_or(ENODEV)
    }

    /// Takes a reference to an SRQ for a QP on completion vector `hint`.
    pub(crate) fn get(&self, hint: i32) -> Result<SrqRef<'_>> {
        let pool = self.pool()?;
        let srq = pool.get(hint)?;
        Ok(SrqRef { pool, srq })
    }
}

impl Drop for OwnedSrqPool {
    fn drop(&mut self) {
        // No `SrqRef` outlives the borrow it holds of `self`, so no SRQ has references; a QP
        // still attached is the owner's bug, and the pool is then left alive (leaked).
        let Some(pool) = self.0.take() else {
            return;
        };
        if warn_on_once!(
            pool.retire().is_err(),
            "ibext: an owned SRQ pool still referenced"
        ) {
            core::mem::forget(pool);
        }
    }
}

/// A reference to one SRQ of a pool, put back when dropped.
pub(crate) struct SrqRef<'a> {
    pool: &'a SrqPool,
    srq: &'a Srq,
}

#[cfg_attr(
    not(ibext_kunit),
    expect(dead_code, reason = "the crate's tests are its only Rust users so far")
)]
impl SrqRef<'_> {
    /// Returns the SRQ, for `ib_qp_init_attr.srq`.
    pub(crate) fn srq(&self) -> &Srq {
        self.srq
    }
}

impl Drop for SrqRef<'_> {
    fn drop(&mut self) {
        self.pool.put(self.srq);
    }
}

impl Show for Core {
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        let p = self.plan;
        writeln!(
            m,
            "srqs {} srq_size {} max_srq_size {} step {} max_sge {} buf_size {} limit {}",
            p.nr_srqs, p.srq_size, p.max_size, p.step, p.max_sge, p.buf_size, p.limit
        )?;
        writeln!(
            m,
            "posted {} kept {} receive_bytes {} limit_events {}",
            self.posted(),
            self.kept(),
            self.buffer_bytes(),
            self.limit_events()
        )?;
        let refs = self.refs.lock();
        for (i, s) in self.srqs.iter().enumerate() {
            write!(
                m,
                "srq {} refs {} bufs {} posted {} limit {} owner_posted {} owner_posted_peak {} ",
                i,
                refs.counts.get(i).copied().unwrap_or(0),
                s.target(),
                s.posted(),
                s.armed_limit(),
                s.owner_posted(),
                s.owner_posted_peak(),
            )?;
            s.stats().write(m)?;
            writeln!(m)?;
        }
        Ok(())
    }
}
