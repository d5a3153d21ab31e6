// SPDX-License-Identifier: GPL-2.0

//! SRQs as ibext makes them: [`RecvSrq`], a shared receive queue with receive buffers that
//! ibext maps, posts and posts again itself, re-arms its limit, and grows and shrinks under
//! pressure. The views it works with (`Pd`, `Srq`, `Wc`) are `ib::verbs`'s; when it grows,
//! shrinks and re-arms is `policy::srq_growth`'s, and this file carries it out.
//!
//! It also holds [`UlpRecvDone`] and [`UlpPressure`], a C ULP's callbacks with their context,
//! through which a pool made by `ibext_srq_pool_create` hands receives and pressure to C.
//!
//! About 1100 lines: one pinned object, its three C callbacks (receive, event, maintenance
//! work), its growth steps and its teardown are one lifetime argument, kept in one file.
//!
//! # Growth
//!
//! The SRQ is made with room for its cap (`SrqAttr::max_wr`) and `nr_bufs` buffers posted. A
//! limit event queues the maintenance work, which runs the growth policy
//! (`policy::srq_growth::Growth::run`) with the SRQ as its `Steps`: adding a step of buffers
//! ([`Step`], one allocation, published in `steps`), retiring the newest step once the
//! pressure is gone, arming the limit, calling the owner's `pressure`. A retiring step's
//! buffers are not posted again as they come back from the ULP, and the step is freed when the
//! last is back (`Step::live` reaches zero: the last handler to let go queues the work, which
//! unpublishes the step, waits for an RCU grace period, and frees it). A retiring step's
//! buffers still posted come back only as messages consume them.
//!
//! An SRQ whose owner posts its own receives has no steps: the owner says how many it keeps
//! posted ([`RecvSrq::set_owner_posted`]), and the same policy re-arms the limit for that and
//! tells the owner when it may post more ([`Pressure::Low`]) or give some back
//! ([`Pressure::Quiet`]).
//!
//! `steps` is written only by the work, under `phase`; it is read under RCU (finding a kept
//! buffer, the counts) or by a handler through its own buffer's `step`, which the step
//! outlives while the buffer is live.
//!
//! # Lifetime of a [`RecvSrq`]
//!
//! Everything the SRQ's callbacks reach lives in one pinned allocation, built completely (its
//! buffers mapped, its work item initialized) before the SRQ is made, and never written through
//! `&mut` afterwards (growth steps are separate allocations, see "Growth"). Dropping it, in this
//! order:
//!
//! 1. marks it closing (`closing`, set under `phase`): a handler that starts from now on
//!    neither calls the owner nor posts, and the maintenance work does nothing;
//! 2. waits for every `done` handler that ibext's engine is running in any poll context
//!    ([`wait_for_dispatch`]: an SRCU grace period for workqueue handlers, which may sleep, and
//!    an RCU one for softirq handlers). The QPs are gone by now, but the engine may have taken
//!    their last completions off a shared CQ before `ib_drain_qp` found it empty
//!    (`__ib_drain_srq`), and still be handing them on: such a handler may post on the SRQ
//!    until this wait returns;
//! 3. destroys the SRQ (`ib_destroy_srq_user`, which frees it at once and waits for nothing),
//!    marking it not live under `phase`;
//! 4. disables the maintenance work, and unmaps and frees the buffers, the growth steps' too.
//!
//! An SRQ that cannot be destroyed keeps its buffers: they are leaked, never freed under a live
//! SRQ. A pool of SRQs ([`RecvSrqs`]) takes step 1 for all of them, then one wait, then the
//! rest for each.
//!
//! Completions of the SRQ's receives must not be polled after the pool is closing, other than
//! by ibext's engine: the ULP drains and destroys its QPs first (`ib_drain_qp`, then
//! `ib_destroy_qp`), as it must for any SRQ, and stops polling a receive CQ of its own.
//!
//! Lock order: `RecvSrqState::phase` is a leaf, taken in process context only (the maintenance work,
//! drop).

use crate::{
    backport::{
        bug::warn_on_once,
        percpu::PerCpuCounters,
        sync::{LockClass, RcuGuard},
        workqueue::{impl_has_delayed_work, now_ms, DelayedRun, DelayedWork},
    },
    bindings,
    engine::queues::wait_for_dispatch,
    ib::{Device, DeviceRef},
    policy::{
        srq_growth::{Growth, Pressure, Steps},
        srq_pool::MAX_STEPS,
    },
    seams::{self, fault_point},
    stats::{stat_enum, Values},
    tunables,
};

use crate::ib::verbs::{Pd, Srq, Wc};
use core::{
    ffi::{c_uint, c_void},
    marker::PhantomData,
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering},
};
use kernel::{c_str, error::from_err_ptr, new_mutex, prelude::*, sync::Mutex, types::Opaque};

stat_enum! {
    /// The statistics of a [`RecvSrq`], counted per CPU (the pollers of several CQs, on several
    /// CPUs, complete receives of one SRQ).
    pub(crate) enum SrqStat {
        /// Receives completed successfully and handed to the handler.
        Completions => "completions",
        /// Receives completed in error, events other than the limit, failed limit re-arms,
        /// failed growth steps, and growth buffers whose repost failed (let go).
        Errors => "errors",
        /// Receives flushed by a QP's error, their buffers posted again.
        Flushed => "flushed",
        /// Receives whose repost failed: no longer posted.
        RepostFailures => "repost_failures",
        /// `IB_EVENT_SRQ_LIMIT_REACHED` events.
        LimitEvents => "limit_events",
        /// Limits armed (`ib_modify_srq` with `IB_SRQ_LIMIT`): at creation and after each
        /// event.
        LimitArms => "limit_arms",
        /// Buffers the handler kept ([`RecvAction::Keep`]).
        Kept => "kept",
        /// Kept buffers given back ([`RecvSrq::repost`]).
        Returned => "returned",
        /// Growth steps taken on limit events.
        Grown => "grown",
        /// Growth steps retired once the pressure was gone; for receives the owner posts,
        /// quiet periods it was told of ([`Pressure::Quiet`]).
        Shrunk => "shrunk",
    }
}

/// What [`SrqHandler::recv_done`] does with the buffer (`enum ibext_recv_action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvAction {
    /// Posted again when the handler returns.
    Repost,
    /// Kept by the owner, with its contents, until it gives it back with [`RecvSrq::repost`].
    Keep,
}

/// What a [`RecvSrq`] is made with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SrqAttr {
    /// `max_wr` of the SRQ: with managed buffers, the most it grows to.
    pub(crate) max_wr: u32,
    /// `max_sge` of the SRQ.
    pub(crate) max_sge: u32,
    /// The limit, armed once the buffers are posted and again after each limit event; 0: none.
    pub(crate) limit: u32,
    /// The managed buffers to post (at most `max_wr`); 0 for a ULP that posts its own.
    pub(crate) nr_bufs: u32,
    /// The size of each managed buffer.
    pub(crate) buf_size: u32,
    /// Managed buffers added by one growth step; 0: no growth.
    pub(crate) step: u32,
    /// For an owner that posts its own receives (`nr_bufs` 0): how many it posts at creation;
    /// 0 with managed buffers.
    pub(crate) owner_posted: u32,
}

/// What a [`RecvSrq`]'s owner does with its completed receives.
pub(crate) trait SrqHandler: Send + Sync + Sized {
    /// Handles a receive that completed successfully, in the poll context of the QP's CQ. The
    /// buffer is synced for the CPU; it is posted again when this returns, unless kept.
    fn recv_done(&self, srq: &Srq, wc: &Wc, buf: RecvData<'_>) -> RecvAction;

    /// Told, in process context, that the SRQ's receives changed or must: `posted` is what
    /// ibext now means to keep posted ([`Pressure::Grown`], [`Pressure::Shrunk`]) or the most
    /// the SRQ holds ([`Pressure::Low`]).
    fn pressure(&self, _srq: &Srq, _what: Pressure, _posted: u32) {}
}

/// The received bytes of a managed buffer, lent to [`SrqHandler::recv_done`].
pub(crate) struct RecvData<'a> {
    ptr: *mut u8,
    _buf: PhantomData<&'a mut [u8]>,
}

impl RecvData<'_> {
    /// Returns the buffer's address, for a C callback that reads (or scribbles on) it.
    pub(crate) fn as_mut_ptr(&self) -> *mut c_void {
        self.ptr.cast()
    }
}

/// One managed receive buffer.
///
/// # Invariants
///
/// `cqe.done` is [`recv_buf_done`] for the `H` of the [`RecvSrqState`] that `owner` points to, which
/// holds this buffer; `dma` is 0 or the mapping of `data` (`data.len()` bytes, from the device)
/// on `dev`, undone by drop; `ptr` is `data`'s address. `step` is null for the buffers made
/// with the SRQ, or the growth step that holds this buffer, alive while the buffer is live.
#[repr(C)]
struct RecvBuf {
    cqe: Opaque<bindings::ib_cqe>,
    data: KVec<u8>,
    ptr: *mut u8,
    dma: u64,
    dev: *mut bindings::ib_device,
    owner: *const c_void,
    step: *const Step,
    /// Kept by the owner's handler, not posted.
    kept: AtomicBool,
}

// The pool's size cap counts this much bookkeeping per buffer.
const _: () =
    assert!(core::mem::size_of::<RecvBuf>() as u64 <= crate::policy::srq_pool::BUF_OVERHEAD);

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if self.dma != 0 {
            // SAFETY: Mapped with this length (type invariant). The owner drops a buffer only
            // when no SRQ holds it (never posted, or its SRQ destroyed), and before its own
            // device reference.
            unsafe {
                bindings::ibext_shim_dma_unmap_from_device(self.dev, self.dma, self.data.len())
            };
        }
    }
}

impl RecvBuf {
    /// Returns the growth step holding this buffer, if any.
    fn step(&self) -> Option<&Step> {
        // SAFETY: Null or a step alive while this buffer is live (type invariant).
        unsafe { self.step.as_ref() }
    }
}

/// One growth step: buffers added on a limit event, in one allocation.
///
/// # Invariants
///
/// `live` counts the buffers not yet given back for good (posted, in a handler, or kept);
/// once `retiring` is set it only falls, and the step is freed when it reaches zero.
struct Step {
    bufs: KVVec<RecvBuf>,
    live: AtomicU32,
    retiring: AtomicBool,
}

/// Where a [`RecvSrq`] is in its teardown.
enum Phase {
    /// The SRQ is live, with the state of its growth ([`Growth`], the policy the maintenance
    /// work runs).
    Live(Growth),
    /// The SRQ is destroyed (after `closing` was set and handlers were waited for).
    Destroyed,
    /// The SRQ could not be destroyed: its buffers are leaked.
    Leaked,
}

/// Everything a [`RecvSrq`]'s callbacks reach.
///
/// # Invariants
///
/// - `raw` is a live SRQ made on a PD of `dev` with [`srq_event`]`::<H>` and this value as its
///   event context, until `phase` leaves [`Phase::Live`]; every buffer of `bufs` is mapped.
/// - After the allocation is initialized only `bufs` (in drop) is written through `&mut`.
#[pin_data(PinnedDrop)]
struct RecvSrqState<H: SrqHandler> {
    /// Growth, shrinking, the freeing of retired steps, and the limit's re-arming. Declared
    /// first, and cancelled first by the drop.
    #[pin]
    maint: DelayedWork<RecvSrqState<H>>,
    handler: H,
    stats: PerCpuCounters<{ SrqStat::COUNT }>,
    lkey: u32,
    /// The limit armed now, for readers outside the work (written by [`RecvSrqState::arm_limit`]).
    limit: AtomicU32,
    /// Set by a limit event, taken by the maintenance work.
    limit_hit: AtomicBool,
    /// The receives an owner that posts its own says it keeps posted
    /// ([`RecvSrq::set_owner_posted`]); 0 with managed buffers.
    declared: AtomicU32,
    /// The most `declared` has been (debugfs: growth shows after the owner gave it back).
    declared_peak: AtomicU32,
    /// `SrqAttr::max_wr`.
    max_wr: u32,
    /// `SrqAttr::buf_size`.
    buf_size: u32,
    /// Growth steps, published and unpublished by the maintenance work under `phase`.
    steps: [AtomicPtr<Step>; MAX_STEPS as usize],
    /// Set (under `phase`) when teardown begins: from then on handlers neither call the owner
    /// nor post, and the maintenance work does nothing.
    closing: AtomicBool,
    /// Whether handlers were waited for after `closing` was set.
    waited: AtomicBool,
    /// The task calling the owner's `pressure` now (its address; 0: none), so that a pool's
    /// destruction from inside it is refused ([`RecvSrq::in_own_pressure`]).
    pressure_task: AtomicUsize,
    #[pin]
    phase: Mutex<Phase>,
    /// Declared before `dev`: buffers are unmapped before the device reference is dropped.
    bufs: KVVec<RecvBuf>,
    raw: NonNull<bindings::ib_srq>,
    dev: DeviceRef,
}

// SAFETY: `raw` is an ib_core object usable from any thread; the rest is atomics, per-CPU
// counters, the mutex, and `bufs` and the steps' buffers, which the CPU reads only inside the
// handler of a completed (unposted) buffer.
unsafe impl<H: SrqHandler> Send for RecvSrqState<H> {}
// SAFETY: As for `Send`.
unsafe impl<H: SrqHandler> Sync for RecvSrqState<H> {}

/// An SRQ with receive buffers that ibext posts and reposts, and a limit it re-arms.
///
/// # Invariants
///
/// `self.0`'s receives have all been posted once (or the value was never returned).
pub(crate) struct RecvSrq<H: SrqHandler>(Pin<KBox<RecvSrqState<H>>>);

impl<H: SrqHandler> RecvSrq<H> {
    /// Makes the SRQ on `pd` with `attr`, maps and posts its buffers, arms the limit.
    ///
    /// Fault points (KUnit flavour): one before the buffers, two per buffer, one before the
    /// SRQ, one per post.
    pub(crate) fn new(pd: &Pd, attr: &SrqAttr, handler: H) -> Result<Self> {
        let dev = pd.device();
        fault_point()?;
        let dev_ref = DeviceRef::try_get(dev).ok_or(ENODEV)?;
        let stats = PerCpuCounters::new()?;
        let mut bufs: KVVec<RecvBuf> = KVVec::with_capacity(attr.nr_bufs as usize, GFP_KERNEL)?;
        static MAINT: LockClass = LockClass::new();
        let inner = KBox::try_pin_init(
            try_pin_init!(&this in RecvSrqState {
                maint <- DelayedWork::new(c_str!("ibext_srq_maint"), &MAINT),
                handler,
                stats,
                lkey: pd.local_dma_lkey(),
                limit: AtomicU32::new(attr.limit),
                limit_hit: AtomicBool::new(false),
                declared: AtomicU32::new(attr.owner_posted),
                declared_peak: AtomicU32::new(attr.owner_posted),
                max_wr: attr.max_wr,
                buf_size: attr.buf_size,
                steps: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_STEPS as usize],
                closing: AtomicBool::new(false),
                waited: AtomicBool::new(false),
                pressure_task: AtomicUsize::new(0),
                phase <- new_mutex!(
                    Phase::Live(if attr.nr_bufs > 0 {
                        Growth::new(attr.step, attr.max_wr, attr.nr_bufs, attr.limit, now_ms())
                    } else {
                        Growth::owner_posted(attr.max_wr, attr.owner_posted, now_ms())
                    }),
                    "RecvSrq::phase"
                ),
                bufs: {
                    let owner = this.as_ptr().cast_const().cast();
                    fill_bufs::<H>(&mut bufs, dev, attr.nr_bufs, attr.buf_size, owner, core::ptr::null())?;
                    bufs
                },
                raw: {
                    fault_point()?;
                    // SAFETY: The PD is live (invariant of `Pd`). The event context is this
                    // allocation, whose fields the handler reads are initialized above and
                    // which outlives the SRQ (drop destroys it first).
                    let made = unsafe {
                        bindings::ibext_shim_create_srq(
                            pd.as_raw(),
                            attr.max_wr,
                            attr.max_sge,
                            attr.limit,
                            Some(srq_event::<H>),
                            this.as_ptr().cast(),
                        )
                    };
                    NonNull::new(from_err_ptr(made)?).ok_or(ENOMEM)?
                },
                dev: dev_ref,
            }),
            GFP_KERNEL,
        )?;
        // From here on, an error drops `inner`, which destroys the SRQ first.
        for b in inner.bufs.iter() {
            fault_point()?;
            inner.post(b)?;
        }
        if attr.limit > 0 {
            // Armed again now that receives are posted: mlx4 and mlx5 ignore `srq_limit` at
            // create (mlx5/srq.c, mlx4/srq.c), only `modify_srq` with `IB_SRQ_LIMIT` arms it.
            // A device without `modify_srq` keeps what create armed.
            match inner.arm_limit(attr.limit) {
                Err(e) if e != crate::backport::error::eopnotsupp() => return Err(e),
                _ => {}
            }
        }
        // INVARIANT: every buffer is posted.
        Ok(RecvSrq(inner))
    }

    /// Returns the handler.
    pub(crate) fn handler(&self) -> &H {
        &self.0.handler
    }

    /// Returns the SRQ.
    pub(crate) fn srq(&self) -> &Srq {
        self.0.srq()
    }

    /// Returns statistic `s`, summed over every CPU.
    pub(crate) fn stat(&self, s: SrqStat) -> u64 {
        self.0.stats.sum(s as usize)
    }

    /// Returns every statistic, summed over every CPU.
    pub(crate) fn stats(&self) -> Values<SrqStat, { SrqStat::COUNT }> {
        Values::read(|s| self.stat(s))
    }

    /// Returns the managed buffers posted, or inside the handler on their way back (a flushed
    /// receive is posted again, so it stays counted).
    pub(crate) fn posted(&self) -> u64 {
        let base = (self.0.bufs.len() as u64).saturating_sub(self.stat(SrqStat::RepostFailures));
        let steps = self
            .0
            .with_steps(|c| u64::from(c.live.load(Ordering::Acquire)));
        (base + steps).saturating_sub(self.kept())
    }

    /// Returns the managed buffers ibext means to keep posted (grown and shrunk).
    pub(crate) fn target(&self) -> u32 {
        self.0.target()
    }

    /// Returns the limit armed now.
    pub(crate) fn armed_limit(&self) -> u32 {
        self.0.limit.load(Ordering::Acquire)
    }

    /// Tests only: runs the maintenance work now and waits for it to finish.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_run_maintenance(&self) {
        self.0.maint.kick(0);
        self.0.maint.flush();
    }

    /// Tests only: one maintenance pass with aging's clock a period ahead, run here under
    /// `phase`. The work takes `phase` too, so no run of it reads the shifted clock: a run in
    /// progress when the clock moved would shrink a second step in the same period.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_maintain_a_period_later(&self) {
        let mut phase = self.0.phase.lock();
        if let Phase::Live(growth) = &mut *phase {
            crate::tests::hooks::a_period_later(|| self.0.maintain(growth));
        }
        drop(phase);
    }

    /// Whether the caller is inside this SRQ's call of the owner's `pressure` (which runs under
    /// `phase`, in the maintenance work that teardown waits for: tearing the SRQ down from there
    /// would wait for itself).
    pub(crate) fn in_own_pressure(&self) -> bool {
        self.0.pressure_task.load(Ordering::Acquire) == current_task()
    }

    /// For an SRQ whose owner posts its own receives: records that it now keeps `posted`
    /// posted. The limit follows, at a quarter, armed by the maintenance work (at once, or when
    /// the owner's `pressure` call returns if made from there); while `posted` is above what
    /// the owner posted at creation, quiet periods tell it [`Pressure::Quiet`]. `EINVAL` for an
    /// SRQ with managed buffers, or for `posted` 0 or above the SRQ's `max_wr`.
    pub(crate) fn set_owner_posted(&self, posted: u32) -> Result {
        if !self.0.bufs.is_empty() || posted == 0 || posted > self.0.max_wr {
            return Err(EINVAL);
        }
        self.0.declared.store(posted, Ordering::Release);
        self.0.declared_peak.fetch_max(posted, Ordering::Relaxed);
        if !self.in_own_pressure() {
            self.0.kick();
        }
        Ok(())
    }

    /// Returns the receives the owner says it keeps posted (0 with managed buffers).
    pub(crate) fn owner_posted(&self) -> u32 {
        self.0.declared.load(Ordering::Acquire)
    }

    /// Returns the most the owner has said it keeps posted (0 with managed buffers).
    pub(crate) fn owner_posted_peak(&self) -> u32 {
        self.0.declared_peak.load(Ordering::Relaxed)
    }

    /// Returns the buffers the handler kept and has not given back.
    pub(crate) fn kept(&self) -> u64 {
        self.stat(SrqStat::Kept)
            .saturating_sub(self.stat(SrqStat::Returned))
    }

    /// Gives back the kept buffer whose `ib_cqe` is at `cqe` and posts it (or, for a retiring
    /// step, lets it go): the result of the post, or `None` if `cqe` is not a kept buffer of
    /// this SRQ (never kept, given back twice, or another SRQ's).
    pub(crate) fn repost(&self, cqe: *const c_void) -> Option<Result> {
        let _rcu = RcuGuard::new();
        let b = self.0.find_buf(cqe)?;
        if !b.kept.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.0.stats.inc(SrqStat::Returned as usize);
        if self.0.retire_if_retiring(b) {
            return Some(Ok(()));
        }
        // SAFETY: Mapped for its length (invariant of `RecvBuf`); the owner is done with it.
        unsafe { bindings::ibext_shim_dma_sync_for_device(b.dev, b.dma, b.data.len()) };
        Some(self.0.post_again(b))
    }

    /// Returns the bytes of receive buffer memory held, the growth steps' included.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        let bytes = |bufs: &[RecvBuf]| bufs.iter().map(|b| b.data.capacity() as u64).sum::<u64>();
        bytes(&self.0.bufs) + self.0.with_steps(|c| bytes(&c.bufs))
    }
}

/// The SRQs of a pool: dropped together, with one wait for the handlers of all of them instead
/// of one per SRQ.
pub(crate) struct RecvSrqs<H: SrqHandler>(KVec<RecvSrq<H>>);

impl<H: SrqHandler> RecvSrqs<H> {
    /// Room for `n` SRQs.
    pub(crate) fn with_capacity(n: usize) -> Result<Self> {
        Ok(RecvSrqs(KVec::with_capacity(n, GFP_KERNEL)?))
    }

    /// Adds an SRQ (allocating only beyond the capacity).
    pub(crate) fn push(&mut self, srq: RecvSrq<H>) -> Result {
        self.0.push(srq, GFP_KERNEL)?;
        Ok(())
    }
}

impl<H: SrqHandler> core::ops::Deref for RecvSrqs<H> {
    type Target = [RecvSrq<H>];

    fn deref(&self) -> &[RecvSrq<H>] {
        &self.0
    }
}

impl<H: SrqHandler> Drop for RecvSrqs<H> {
    fn drop(&mut self) {
        let mut any = false;
        for s in self.0.iter() {
            any |= s.0.close();
        }
        if any {
            crate::seams::reached(crate::seams::Point::SrqHandlersWait);
            wait_for_dispatch();
        }
        for s in self.0.iter() {
            s.0.waited.store(true, Ordering::Relaxed);
        }
        // Each SRQ's own drop now destroys its SRQ, cancels its work and frees its buffers.
    }
}

/// The address of the current task, as an identity.
fn current_task() -> usize {
    core::ptr::from_ref(kernel::current!()) as usize
}

impl<H: SrqHandler> RecvSrqState<H> {
    fn srq(&self) -> &Srq {
        // SAFETY: Live while the `RecvSrq` is (type invariant); `Srq` is transparent.
        unsafe { &*self.raw.as_ptr().cast::<Srq>() }
    }

    /// Returns the sum of `f` over the published growth steps, read under RCU.
    fn with_steps(&self, f: impl Fn(&Step) -> u64) -> u64 {
        let _rcu = RcuGuard::new();
        self.steps
            .iter()
            .map(|c| {
                // SAFETY: A published step is freed only after it is unpublished and an RCU
                // grace period has passed (`free_retired`); we are inside a read-side section.
                unsafe { c.load(Ordering::Acquire).as_ref() }.map_or(0, &f)
            })
            .sum()
    }

    /// Returns the buffer whose `ib_cqe` is at `cqe`, among the SRQ's own and its published
    /// steps'. The caller holds an RCU read-side section (`_rcu`), for which the buffer lives.
    fn find_buf<'a>(&'a self, cqe: *const c_void) -> Option<&'a RecvBuf> {
        let find = |bufs: &'a [RecvBuf]| {
            let base = bufs.as_ptr() as usize;
            let size = core::mem::size_of::<RecvBuf>();
            let off = (cqe as usize).checked_sub(base)?;
            let i = off / size;
            (off % size == 0).then_some(())?;
            bufs.get(i)
        };
        find(&self.bufs).or_else(|| {
            self.steps.iter().find_map(|c| {
                // SAFETY: As in `with_steps`; the caller's RCU section outlives `'a`.
                let step = unsafe { c.load(Ordering::Acquire).as_ref() }?;
                find(&step.bufs)
            })
        })
    }

    /// Posts `b`.
    fn post(&self, b: &RecvBuf) -> Result {
        // SAFETY: The SRQ is live and the buffer mapped (type invariant); the buffer stays
        // mapped until the SRQ is destroyed (or, for a step's buffer, until it is retired,
        // which a posted buffer is not).
        let r = unsafe {
            bindings::ibext_shim_post_srq_recv(
                self.raw.as_ptr(),
                b.cqe.get(),
                b.dma,
                b.data.len() as u32,
                self.lkey,
            )
        };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Ok(())
    }

    /// Posts `b` again after its completion. A failure loses the buffer: one of the SRQ's own
    /// is counted in `RepostFailures`; a step's is let go for good (no longer live), counted in
    /// `Errors`.
    fn post_again(&self, b: &RecvBuf) -> Result {
        let r = self.post(b);
        if r.is_err() {
            match b.step() {
                Some(c) => {
                    self.stats.inc(SrqStat::Errors as usize);
                    self.let_go(c);
                }
                None => self.stats.inc(SrqStat::RepostFailures as usize),
            }
        }
        r
    }

    /// If `b` belongs to a retiring step, lets it go instead of posting it again, and returns
    /// `true`. Its last access to the step is the count; the work frees the step after.
    fn retire_if_retiring(&self, b: &RecvBuf) -> bool {
        match b.step() {
            Some(c) if c.retiring.load(Ordering::Acquire) => {
                self.let_go(c);
                true
            }
            _ => false,
        }
    }

    /// Counts one buffer of `c` gone for good; the last one has the step freed.
    fn let_go(&self, c: &Step) {
        if c.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            // `c` is not touched after the count: the work may free it from now on.
            self.kick();
        }
    }

    /// Runs the maintenance work now (any context). Drop cancels it after the SRQ, the source
    /// of the events and completions that kick it, is destroyed.
    fn kick(&self) {
        self.maint.kick(0);
    }

    /// Arms the limit at `limit` (`ib_modify_srq` with `IB_SRQ_LIMIT`; may sleep).
    fn arm_limit(&self, limit: u32) -> Result {
        // SAFETY: The SRQ is live: callers are `new` (before anyone else sees it) and the work
        // under `phase` while `Live`.
        let r = unsafe { bindings::ibext_shim_arm_srq_limit(self.raw.as_ptr(), limit) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        self.stats.inc(SrqStat::LimitArms as usize);
        self.limit.store(limit, Ordering::Release);
        Ok(())
    }

    /// Returns the managed buffers meant to be posted: the SRQ's own and those of the steps not
    /// retiring.
    fn target(&self) -> u32 {
        let steps = self.with_steps(|c| {
            if c.retiring.load(Ordering::Acquire) {
                0
            } else {
                c.bufs.len() as u64
            }
        });
        u32::try_from(self.bufs.len() as u64 + steps).unwrap_or(u32::MAX)
    }

    /// Returns the managed buffers held in all (the SRQ's own and every published step's).
    fn held(&self) -> u32 {
        let steps = self.with_steps(|c| c.bufs.len() as u64);
        u32::try_from(self.bufs.len() as u64 + steps).unwrap_or(u32::MAX)
    }

    /// Adds a step of `n` managed buffers: made, mapped and published, then posted. Called by
    /// the work, under `phase`, with the SRQ live.
    fn grow(&self, n: u32) -> Result {
        let slot = self
            .steps
            .iter()
            .find(|c| c.load(Ordering::Relaxed).is_null())
            .ok_or(ENOSPC)?;
        let mut step = KBox::new(
            Step {
                bufs: KVVec::with_capacity(n as usize, GFP_KERNEL)?,
                live: AtomicU32::new(n),
                retiring: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?;
        let at: *const Step = &*step;
        let owner = core::ptr::from_ref(self).cast();
        // On error `step` is dropped with what was made: nothing was posted.
        fill_bufs::<H>(&mut step.bufs, &self.dev, n, self.buf_size, owner, at)?;
        let step = KBox::into_raw(step);
        slot.store(step, Ordering::Release);
        // SAFETY: Just published; only this work (under `phase`) frees steps.
        for b in unsafe { &*step }.bufs.iter() {
            // A failure lets the buffer go: the step then holds fewer live buffers.
            let _ = self.post_again(b);
        }
        Ok(())
    }

    /// Marks the newest step that is not retiring yet as retiring; returns its size (0: none).
    fn retire_newest(&self) -> u32 {
        for c in self.steps.iter().rev() {
            // SAFETY: Only this work (under `phase`) frees steps.
            let Some(step) = (unsafe { c.load(Ordering::Acquire).as_ref() }) else {
                continue;
            };
            if !step.retiring.swap(true, Ordering::AcqRel) {
                return step.bufs.len() as u32;
            }
        }
        0
    }

    /// Frees the retiring steps whose buffers are all back. Called by the work, under `phase`,
    /// or by drop once the SRQ is destroyed and handlers waited for (`all`: every step).
    fn free_steps(&self, all: bool) {
        let mut gone = [core::ptr::null_mut::<Step>(); MAX_STEPS as usize];
        let mut any = false;
        for (c, g) in self.steps.iter().zip(gone.iter_mut()) {
            // SAFETY: Only this work (under `phase`) or drop frees steps.
            let Some(step) = (unsafe { c.load(Ordering::Acquire).as_ref() }) else {
                continue;
            };
            let idle =
                step.retiring.load(Ordering::Acquire) && step.live.load(Ordering::Acquire) == 0;
            if all || idle {
                *g = c.swap(core::ptr::null_mut(), Ordering::AcqRel);
                any = true;
            }
        }
        if !any {
            return;
        }
        // Readers that found a step under RCU (`find_buf`, the counts) are done with it after
        // this; handlers are done with a step once they counted its last buffer (`let_go`).
        // SAFETY: FFI call in process context.
        unsafe { bindings::synchronize_rcu() };
        for g in gone.iter().filter(|g| !g.is_null()) {
            // SAFETY: Made by `KBox::into_raw` in `grow`, unpublished above, no reader left.
            drop(unsafe { KBox::from_raw(*g) });
        }
    }

    /// The maintenance work's body, under `phase` with the SRQ live: frees the retired steps
    /// whose buffers are all back, then runs the growth policy ([`Growth::run`]) with this SRQ
    /// as its [`Steps`], and queues the next run it asks for.
    fn maintain(&self, growth: &mut Growth) {
        self.free_steps(false);
        let now = now_ms();
        let hit = self.limit_hit.swap(false, Ordering::AcqRel);
        let aging_now = seams::aging_now(now);
        let ran = growth.run(&mut StepsOf(self), hit, now, aging_now, tunables::age_ms());
        let count = |yes: bool, s: SrqStat| {
            if yes {
                self.stats.inc(s as usize);
            }
        };
        count(ran.grown, SrqStat::Grown);
        count(ran.shrunk, SrqStat::Shrunk);
        // Not grown, or not re-armed (no more limit events from this SRQ): visible as errors.
        count(ran.grow_failed, SrqStat::Errors);
        count(ran.arm_failed, SrqStat::Errors);
        if let Some(ms) = ran.again_in_ms {
            // Queues only if not queued already.
            self.maint.queue(u32::try_from(ms).unwrap_or(u32::MAX));
        }
    }

    /// Calls the owner's `pressure`, marked as this task's (see [`RecvSrq::in_own_pressure`]).
    fn tell(&self, what: Pressure, posted: u32) {
        self.pressure_task.store(current_task(), Ordering::Release);
        self.handler.pressure(self.srq(), what, posted);
        self.pressure_task.store(0, Ordering::Release);
    }

    /// Begins teardown: from now on handlers neither call the owner nor post, and the
    /// maintenance work does nothing. Set under `phase`, so a run of the work in progress
    /// finishes first. Returns whether ibext's engine may be running handlers of this SRQ's
    /// buffers (it has managed buffers), which the caller then waits for before destroying it.
    fn close(&self) -> bool {
        let phase = self.phase.lock();
        self.closing.store(true, Ordering::Release);
        drop(phase);
        !self.bufs.is_empty()
    }

    /// Destroys the SRQ if it is still live; returns whether it is destroyed now.
    fn destroy(&self) -> bool {
        let mut phase = self.phase.lock();
        if matches!(*phase, Phase::Live(_)) {
            // SAFETY: A live SRQ (type invariant); no QP uses it (the owner's contract, and the
            // pool checks `in_use`). It is marked not live under the lock the work takes.
            let r =
                unsafe { bindings::ib_destroy_srq_user(self.raw.as_ptr(), core::ptr::null_mut()) };
            *phase = if warn_on_once!(r != 0, "ibext: destroying an SRQ failed") {
                Phase::Leaked
            } else {
                Phase::Destroyed
            };
        }
        matches!(*phase, Phase::Destroyed)
    }
}

#[pinned_drop]
impl<H: SrqHandler> PinnedDrop for RecvSrqState<H> {
    fn drop(self: Pin<&mut Self>) {
        if self.close() && !self.waited.load(Ordering::Relaxed) {
            // Handlers ibext's engine is running (softirq or workqueue, possibly sleeping)
            // return before this does; those that start later see `closing` and leave the SRQ
            // alone. Only then is it destroyed: a handler that read `closing` clear may still
            // post on it until this wait returns.
            crate::seams::reached(crate::seams::Point::SrqHandlersWait);
            wait_for_dispatch();
        }
        self.destroy();
        // The SRQ raises no event and completes no receive any more, and a run finds it
        // closing; disabled, so that nothing queues the work again. Before the steps are freed
        // below, which the work frees too.
        self.maint.disable_sync();
        if matches!(*self.phase.lock(), Phase::Leaked) {
            // SAFETY: Nothing is moved out of the pinned allocation: `bufs` is not structurally
            // pinned, and only its heap storage is given up.
            let this = unsafe { self.get_unchecked_mut() };
            // The device may still write the posted buffers: never unmap or free them.
            core::mem::forget(core::mem::replace(&mut this.bufs, KVVec::new()));
            for c in this.steps.iter() {
                // Leaked with the SRQ, as its own buffers are.
                c.store(core::ptr::null_mut(), Ordering::Relaxed);
            }
            return;
        }
        // The SRQ is destroyed and its handlers done: every step goes.
        self.free_steps(true);
    }
}

/// A [`RecvSrq`]'s growth steps, as the growth policy drives them: the maintenance work's view,
/// under `phase` with the SRQ live.
struct StepsOf<'a, H: SrqHandler>(&'a RecvSrqState<H>);

impl<H: SrqHandler> Steps for StepsOf<'_, H> {
    fn add_step(&mut self, n: u32) -> bool {
        self.0.grow(n).is_ok()
    }

    fn retire_newest(&mut self) -> u32 {
        self.0.retire_newest()
    }

    fn arm_limit(&mut self, limit: u32) -> bool {
        self.0.arm_limit(limit).is_ok()
    }

    fn tell(&mut self, what: Pressure, posted: u32) {
        self.0.tell(what, posted);
    }

    fn target(&self) -> u32 {
        self.0.target()
    }

    fn held(&self) -> u32 {
        self.0.held()
    }

    fn declared(&self) -> u32 {
        self.0.declared.load(Ordering::Acquire)
    }
}

/// Allocates and maps `n` buffers of `buf_size` bytes into `bufs`, whose capacity is reserved;
/// `owner` is the [`RecvSrqState<H>`] they belong to, `step` their growth step (null: none).
fn fill_bufs<H: SrqHandler>(
    bufs: &mut KVVec<RecvBuf>,
    dev: &Device,
    n: u32,
    buf_size: u32,
    owner: *const c_void,
    step: *const Step,
) -> Result {
    for _ in 0..n {
        fault_point()?;
        let mut data = KVec::from_elem(0u8, buf_size as usize, GFP_KERNEL)?;
        let ptr = data.as_mut_ptr();
        // Within the reserved capacity: no allocation, and no buffer moves.
        bufs.push(
            RecvBuf {
                cqe: Opaque::new(bindings::ib_cqe {
                    done: Some(recv_buf_done::<H>),
                }),
                data,
                ptr,
                dma: 0,
                dev: dev.as_raw(),
                owner,
                step,
                kept: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?;
        let last = bufs.len() - 1;
        let b = &mut bufs[last];
        fault_point()?;
        // SAFETY: `dev` is registered; `data` is kmalloc'd, `len()` bytes, and stays mapped
        // until the buffer is dropped.
        b.dma = unsafe {
            bindings::ibext_shim_dma_map_from_device(dev.as_raw(), b.ptr.cast(), b.data.len())
        };
        if b.dma == 0 {
            return Err(ENOMEM);
        }
    }
    Ok(())
}

/// The `done` of every managed receive buffer.
///
/// # Safety
///
/// Called by a CQ poller only, with a completion of a receive posted by [`RecvSrq`], whose
/// SRQ is not destroyed (the owner's contract: QPs drained and destroyed first).
unsafe extern "C" fn recv_buf_done<H: SrqHandler>(
    _cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    // SAFETY: `wc` is valid for the call.
    let wc = unsafe { Wc::from_raw(wc) };
    // SAFETY: The `wr_cqe` is the `cqe` (first field, `repr(C)`) of a live `RecvBuf`, whose
    // owner is the `RecvSrqState<H>` holding it (invariant of `RecvBuf`), alive while its SRQ is.
    let (b, inner) = unsafe {
        let b = &*wc.wr_cqe().cast::<RecvBuf>();
        (b, &*b.owner.cast::<RecvSrqState<H>>())
    };
    crate::seams::park_point(crate::seams::Point::RecvDone, b.owner);
    if inner.closing.load(Ordering::Acquire) {
        // The pool is being torn down (its QPs are gone): the owner has let go of the SRQ, and
        // teardown waits for this handler before it destroys the SRQ. The buffer stays where
        // it is until teardown frees it.
        return;
    }
    let len = b.data.len();
    if wc.is_success() {
        inner.stats.inc(SrqStat::Completions as usize);
        // SAFETY: Mapped for `len` bytes (invariant of `RecvBuf`).
        unsafe { bindings::ibext_shim_dma_sync_for_cpu(b.dev, b.dma, len) };
        let data = RecvData {
            ptr: b.ptr,
            _buf: PhantomData,
        };
        if inner.handler.recv_done(inner.srq(), wc, data) == RecvAction::Keep {
            b.kept.store(true, Ordering::Release);
            inner.stats.inc(SrqStat::Kept as usize);
            return;
        }
        if inner.retire_if_retiring(b) {
            return;
        }
        // SAFETY: As above.
        unsafe { bindings::ibext_shim_dma_sync_for_device(b.dev, b.dma, len) };
    } else {
        inner.stats.inc(SrqStat::Errors as usize);
        if wc.is_flush() {
            // A receive the SRQ gave to a QP that then went to the error state (a hardware
            // device flushes the receives a QP had taken; rxe never flushes an SRQ's). The
            // buffer never reached the ULP: it goes back to the SRQ for the other QPs, rather
            // than being lost to the pool.
            inner.stats.inc(SrqStat::Flushed as usize);
        }
        if inner.retire_if_retiring(b) {
            return;
        }
    }
    let _ = inner.post_again(b);
}

/// The SRQ's event handler.
///
/// # Safety
///
/// Called by the driver only, for an SRQ made by [`RecvSrq::new`], with its `RecvSrqState<H>` as
/// context.
unsafe extern "C" fn srq_event<H: SrqHandler>(ev: *mut bindings::ib_event, ctx: *mut c_void) {
    // SAFETY: `ctx` is the `RecvSrqState<H>`, which outlives its SRQ; the event is valid for the call.
    let (inner, ev) = unsafe { (&*ctx.cast::<RecvSrqState<H>>(), &*ev) };
    if ev.event == bindings::ib_event_type_IB_EVENT_SRQ_LIMIT_REACHED {
        inner.stats.inc(SrqStat::LimitEvents as usize);
        inner.limit_hit.store(true, Ordering::Release);
        // Events may come in atomic context: the work grows and re-arms.
        inner.kick();
    } else {
        inner.stats.inc(SrqStat::Errors as usize);
    }
}

impl<H: SrqHandler> DelayedRun for RecvSrqState<H> {
    /// The maintenance work: frees retired steps, grows on a limit event and re-arms the
    /// limit, shrinks once the pressure is gone; nothing once the SRQ is destroyed.
    fn run(&self) {
        crate::seams::park_point(
            crate::seams::Point::SrqMaintain,
            core::ptr::from_ref(self).cast(),
        );
        let mut phase = self.phase.lock();
        if let Phase::Live(growth) = &mut *phase {
            if !self.closing.load(Ordering::Acquire) {
                self.maintain(growth);
            }
        }
        drop(phase);
    }
}

// `maint` is declared first, and the drop cancels it before anything `run` reads goes.
impl_has_delayed_work!(impl<H: SrqHandler> RecvSrqState<H>, maint);

/// A C ULP's receive callback (`struct ibext_srq_pool_attr::recv_done`) and its context.
///
/// # Invariants
///
/// `f` may be called with a live SRQ, a completion, a buffer and `ctx` for as long as this
/// value lives.
#[derive(Clone)]
pub(crate) struct UlpRecvDone {
    f: UlpRecvFn,
    ctx: *mut c_void,
}

/// The type of `struct ibext_srq_pool_attr::recv_done`.
pub(crate) type UlpRecvFn = unsafe extern "C" fn(
    *mut bindings::ib_srq,
    *mut bindings::ib_wc,
    *mut c_void,
    *mut c_void,
) -> bindings::ibext_recv_action;

// SAFETY: The ULP's contract (`include/rdma/ibext.h`): its callback may run on any CPU, in the
// poll context of any of its CQs, with its context.
unsafe impl Send for UlpRecvDone {}
// SAFETY: As for `Send`.
unsafe impl Sync for UlpRecvDone {}

impl UlpRecvDone {
    /// Wraps a callback and context from C.
    ///
    /// # Safety
    ///
    /// `f` may be called as the type invariant says until the returned value is dropped.
    pub(crate) unsafe fn new(f: UlpRecvFn, ctx: *mut c_void) -> Self {
        // INVARIANT: the caller's guarantee.
        UlpRecvDone { f, ctx }
    }

    /// Calls the callback; an answer other than `IBEXT_RECV_KEEP` reposts.
    pub(crate) fn call(&self, srq: &Srq, wc: &Wc, buf: &RecvData<'_>) -> RecvAction {
        // SAFETY: A live SRQ, a valid completion and a buffer not posted while the callback
        // runs (type invariants of `Srq`, `Wc`, `RecvData`); the callback is valid (invariant).
        let a = unsafe { (self.f)(srq.as_raw(), wc.as_raw(), buf.as_mut_ptr(), self.ctx) };
        if a == bindings::ibext_recv_action_IBEXT_RECV_KEEP {
            RecvAction::Keep
        } else {
            RecvAction::Repost
        }
    }
}

/// A C ULP's pressure callback (`struct ibext_srq_pool_attr::pressure`) and its context.
///
/// # Invariants
///
/// `f` may be called in process context with a live SRQ of the pool, any `enum
/// ibext_srq_pressure` value, a count and `ctx`, for as long as this value lives.
#[derive(Clone)]
pub(crate) struct UlpPressure {
    f: UlpPressureFn,
    ctx: *mut c_void,
}

/// The type of `struct ibext_srq_pool_attr::pressure`.
pub(crate) type UlpPressureFn =
    unsafe extern "C" fn(*mut bindings::ib_srq, bindings::ibext_srq_pressure, c_uint, *mut c_void);

// SAFETY: The ULP's contract (`include/rdma/ibext.h`): its callback may run in any process
// context, with its context.
unsafe impl Send for UlpPressure {}
// SAFETY: As for `Send`.
unsafe impl Sync for UlpPressure {}

impl UlpPressure {
    /// Wraps a callback and context from C.
    ///
    /// # Safety
    ///
    /// `f` may be called as the type invariant says until the returned value is dropped.
    pub(crate) unsafe fn new(f: UlpPressureFn, ctx: *mut c_void) -> Self {
        // INVARIANT: the caller's guarantee.
        UlpPressure { f, ctx }
    }

    /// Calls the callback.
    pub(crate) fn call(&self, srq: &Srq, what: Pressure, posted: u32) {
        let what = match what {
            Pressure::Low => bindings::ibext_srq_pressure_IBEXT_SRQ_LOW,
            Pressure::Quiet => bindings::ibext_srq_pressure_IBEXT_SRQ_QUIET,
            Pressure::Grown => bindings::ibext_srq_pressure_IBEXT_SRQ_GROWN,
            Pressure::Shrunk => bindings::ibext_srq_pressure_IBEXT_SRQ_SHRUNK,
        };
        // SAFETY: A live SRQ (type invariant of `Srq`); the callback is valid (invariant).
        unsafe { (self.f)(srq.as_raw(), what, posted, self.ctx) }
    }
}
