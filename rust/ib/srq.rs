// SPDX-License-Identifier: GPL-2.0

//! SRQs as ibext makes them: [`RecvSrq`], a shared receive queue with receive buffers that
//! ibext maps, posts and posts again itself, and re-arms its limit. The views it works with
//! ([`Pd`], [`Srq`], [`Wc`], [`UlpRecvDone`]) are in `verbs.rs`.
//!
//! About 600 lines: one pinned object, its three C callbacks (receive, event, limit work) and
//! its teardown are one lifetime argument, kept in one file.
//!
//! # Lifetime of a [`RecvSrq`]
//!
//! Everything the SRQ's callbacks reach lives in one pinned allocation, built completely (its
//! buffers mapped, its work item initialized) before the SRQ is made, and never written through
//! `&mut` afterwards. Dropping it, in this order: marks it dead under `phase` (the limit work
//! then leaves the SRQ alone), destroys the SRQ (`ib_destroy_srq_user`: no receive is consumed
//! and no event raised after it returns), waits for every `done` handler that ibext's engine is
//! running in any poll context ([`wait_for_dispatch`]: an SRCU grace period for workqueue
//! handlers, which may sleep, and an RCU one for softirq handlers), cancels the limit work,
//! and unmaps and frees the buffers. An SRQ that cannot be destroyed keeps its buffers: they
//! are leaked, never freed under a live SRQ.
//!
//! Completions of the SRQ's receives must not be polled after the SRQ is gone: the ULP drains
//! and destroys its QPs first (`ib_drain_qp`, then `ib_destroy_qp`), as it must for any SRQ.
//!
//! Lock order: `Inner::phase` is a leaf, taken in process context only (the limit work, drop).

use crate::{
    bindings,
    ib::{cq::wait_for_dispatch, fault_point, gid::PerCpuCounters, init_work, Device, DeviceRef},
    stats::{stat_enum, Values},
    warn::warn_on_once,
};

pub(crate) use crate::ib::verbs::{eopnotsupp, Pd, Srq, UlpRecvDone, Wc};
use core::{
    ffi::c_void,
    marker::PhantomData,
    ptr::NonNull,
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{error::from_err_ptr, new_mutex, prelude::*, sync::Mutex, types::Opaque};

stat_enum! {
    /// The statistics of a [`RecvSrq`], counted per CPU (the pollers of several CQs, on several
    /// CPUs, complete receives of one SRQ).
    pub(crate) enum SrqStat {
        /// Receives completed successfully and handed to the handler.
        Completions => "completions",
        /// Receives completed in error, events other than the limit, and failed limit re-arms.
        Errors => "errors",
        /// Receives flushed by a QP's error, their buffers posted again.
        Flushed => "flushed",
        /// Receives whose repost failed: no longer posted.
        RepostFailures => "repost_failures",
        /// `IB_EVENT_SRQ_LIMIT_REACHED` events.
        LimitEvents => "limit_events",
        /// Buffers the handler kept ([`RecvAction::Keep`]).
        Kept => "kept",
        /// Kept buffers given back ([`RecvSrq::repost`]).
        Returned => "returned",
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
    /// `max_wr` of the SRQ.
    pub(crate) max_wr: u32,
    /// `max_sge` of the SRQ.
    pub(crate) max_sge: u32,
    /// The limit, armed once the buffers are posted and again after each limit event; 0: none.
    pub(crate) limit: u32,
    /// The managed buffers to post (at most `max_wr`); 0 for a ULP that posts its own.
    pub(crate) nr_bufs: u32,
    /// The size of each managed buffer.
    pub(crate) buf_size: u32,
}

/// What a [`RecvSrq`]'s owner does with its completed receives.
pub(crate) trait SrqHandler: Send + Sync + Sized {
    /// Handles a receive that completed successfully, in the poll context of the QP's CQ. The
    /// buffer is synced for the CPU; it is posted again when this returns, unless kept.
    fn recv_done(&self, srq: &Srq, wc: &Wc, buf: RecvData<'_>) -> RecvAction;
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
/// `cqe.done` is [`recv_buf_done`] for the `H` of the [`Inner`] that `owner` points to, which
/// holds this buffer; `dma` is 0 or the mapping of `data` (`data.len()` bytes, from the device)
/// on `dev`, undone by drop; `ptr` is `data`'s address.
#[repr(C)]
struct RecvBuf {
    cqe: Opaque<bindings::ib_cqe>,
    data: KVec<u8>,
    ptr: *mut u8,
    dma: u64,
    dev: *mut bindings::ib_device,
    owner: *const c_void,
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

/// Where a [`RecvSrq`] is in its teardown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    /// The SRQ is destroyed; `waited` says whether handlers were waited for.
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
struct Inner<H: SrqHandler> {
    handler: H,
    stats: PerCpuCounters<{ SrqStat::COUNT }>,
    lkey: u32,
    limit: u32,
    limit_hit: AtomicBool,
    /// Whether handlers were waited for after the SRQ was destroyed.
    waited: AtomicBool,
    #[pin]
    phase: Mutex<Phase>,
    #[pin]
    rearm: Opaque<bindings::work_struct>,
    /// Declared before `_dev`: buffers are unmapped before the device reference is dropped.
    bufs: KVVec<RecvBuf>,
    raw: NonNull<bindings::ib_srq>,
    _dev: DeviceRef,
}

// SAFETY: `raw` is an ib_core object usable from any thread; the rest is atomics, per-CPU
// counters, the mutex, and `bufs`, which the CPU reads only inside the handler of a completed
// (unposted) buffer.
unsafe impl<H: SrqHandler> Send for Inner<H> {}
// SAFETY: As for `Send`.
unsafe impl<H: SrqHandler> Sync for Inner<H> {}

/// An SRQ with receive buffers that ibext posts and reposts, and a limit it re-arms.
///
/// # Invariants
///
/// `self.0`'s receives have all been posted once (or the value was never returned).
pub(crate) struct RecvSrq<H: SrqHandler>(Pin<KBox<Inner<H>>>);

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
        let inner = KBox::try_pin_init(
            try_pin_init!(&this in Inner {
                handler,
                stats,
                lkey: pd.local_dma_lkey(),
                limit: attr.limit,
                limit_hit: AtomicBool::new(false),
                waited: AtomicBool::new(false),
                phase <- new_mutex!(Phase::Live, "RecvSrq::phase"),
                // SAFETY: Only initializes the memory it is given.
                rearm <- Opaque::ffi_init(|w| unsafe {
                    init_work!(w, rearm_work::<H>, "ibext_srq_rearm")
                }),
                bufs: {
                    fill_bufs::<H>(&mut bufs, dev, attr, this.as_ptr().cast_const().cast())?;
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
                _dev: dev_ref,
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
            match inner.arm_limit() {
                Err(e) if e != eopnotsupp() => return Err(e),
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

    /// Returns the managed buffers posted, or inside the handler on their way back.
    pub(crate) fn posted(&self) -> u64 {
        let lost = self.stat(SrqStat::Flushed) + self.stat(SrqStat::RepostFailures);
        (self.0.bufs.len() as u64).saturating_sub(lost + self.kept())
    }

    /// Returns the buffers the handler kept and has not given back.
    pub(crate) fn kept(&self) -> u64 {
        self.stat(SrqStat::Kept)
            .saturating_sub(self.stat(SrqStat::Returned))
    }

    /// Returns the index of the buffer whose `ib_cqe` is at `cqe`, if it is one of this SRQ's
    /// (found by address only: `cqe` is never read).
    pub(crate) fn buf_index(&self, cqe: *const c_void) -> Option<usize> {
        let base = self.0.bufs.as_ptr() as usize;
        let size = core::mem::size_of::<RecvBuf>();
        let off = (cqe as usize).checked_sub(base)?;
        let i = off / size;
        (off % size == 0 && i < self.0.bufs.len()).then_some(i)
    }

    /// Gives back kept buffer `i` (see [`RecvSrq::buf_index`]) and posts it: the result of the
    /// post, or `None` if the buffer is not kept (never kept, or given back twice).
    pub(crate) fn repost(&self, i: usize) -> Option<Result> {
        let b = self.0.bufs.get(i)?;
        if !b.kept.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.0.stats.inc(SrqStat::Returned as usize);
        // SAFETY: Mapped for its length (invariant of `RecvBuf`); the owner is done with it.
        unsafe { bindings::ibext_shim_dma_sync_for_device(b.dev, b.dma, b.data.len()) };
        let r = self.0.post(b);
        if r.is_err() {
            self.0.stats.inc(SrqStat::RepostFailures as usize);
        }
        Some(r)
    }

    /// Returns the bytes of receive buffer memory held.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.0.bufs.iter().map(|b| b.data.capacity() as u64).sum()
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
            any |= s.0.destroy() && !s.0.bufs.is_empty();
        }
        if any {
            wait_for_dispatch();
        }
        for s in self.0.iter() {
            s.0.waited.store(true, Ordering::Relaxed);
        }
        // Each SRQ's own drop now only cancels its work and frees its buffers.
    }
}

impl<H: SrqHandler> Inner<H> {
    fn srq(&self) -> &Srq {
        // SAFETY: Live while the `RecvSrq` is (type invariant); `Srq` is transparent.
        unsafe { &*self.raw.as_ptr().cast::<Srq>() }
    }

    /// Posts `b`.
    fn post(&self, b: &RecvBuf) -> Result {
        // SAFETY: The SRQ is live and the buffer mapped (type invariant); the buffer stays
        // mapped until the SRQ is destroyed.
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

    /// Arms the limit (`ib_modify_srq` with `IB_SRQ_LIMIT`; may sleep).
    fn arm_limit(&self) -> Result {
        // SAFETY: The SRQ is live: callers are `new` (before anyone else sees it) and the limit
        // work under `phase` while `Live`.
        let r = unsafe { bindings::ibext_shim_arm_srq_limit(self.raw.as_ptr(), self.limit) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Ok(())
    }

    /// Destroys the SRQ if it is still live; returns whether it is destroyed now.
    fn destroy(&self) -> bool {
        let mut phase = self.phase.lock();
        if *phase == Phase::Live {
            // SAFETY: A live SRQ (type invariant); no QP uses it (the owner's contract, and the
            // pool checks `in_use`). It is marked not live under the lock the limit work takes.
            let r =
                unsafe { bindings::ib_destroy_srq_user(self.raw.as_ptr(), core::ptr::null_mut()) };
            *phase = if warn_on_once!(r != 0, "ibext: destroying an SRQ failed") {
                Phase::Leaked
            } else {
                Phase::Destroyed
            };
        }
        *phase == Phase::Destroyed
    }
}

#[pinned_drop]
impl<H: SrqHandler> PinnedDrop for Inner<H> {
    fn drop(self: Pin<&mut Self>) {
        if self.destroy() && !self.bufs.is_empty() && !self.waited.load(Ordering::Relaxed) {
            // Handlers ibext's engine is running (softirq or workqueue, possibly sleeping)
            // return before this does.
            wait_for_dispatch();
        }
        // SAFETY: `rearm` is initialized; the SRQ raises no event any more, so nothing queues
        // it again, and a run that is late finds the SRQ not live.
        unsafe { bindings::cancel_work_sync(self.rearm.get()) };
        if *self.phase.lock() == Phase::Leaked {
            // SAFETY: Nothing is moved out of the pinned allocation: `bufs` is not structurally
            // pinned, and only its heap storage is given up.
            let this = unsafe { self.get_unchecked_mut() };
            // The device may still write the posted buffers: never unmap or free them.
            core::mem::forget(core::mem::replace(&mut this.bufs, KVVec::new()));
        }
    }
}

/// Allocates and maps `attr.nr_bufs` buffers into `bufs`, whose capacity is reserved.
fn fill_bufs<H: SrqHandler>(
    bufs: &mut KVVec<RecvBuf>,
    dev: &Device,
    attr: &SrqAttr,
    owner: *const c_void,
) -> Result {
    for _ in 0..attr.nr_bufs {
        fault_point()?;
        let mut data = KVec::from_elem(0u8, attr.buf_size as usize, GFP_KERNEL)?;
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
    // owner is the `Inner<H>` holding it (invariant of `RecvBuf`), alive while its SRQ is.
    let (b, inner) = unsafe {
        let b = &*wc.wr_cqe().cast::<RecvBuf>();
        (b, &*b.owner.cast::<Inner<H>>())
    };
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
    }
    if inner.post(b).is_err() {
        inner.stats.inc(SrqStat::RepostFailures as usize);
    }
}

/// The SRQ's event handler.
///
/// # Safety
///
/// Called by the driver only, for an SRQ made by [`RecvSrq::new`], with its `Inner<H>` as
/// context.
unsafe extern "C" fn srq_event<H: SrqHandler>(ev: *mut bindings::ib_event, ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Inner<H>`, which outlives its SRQ; the event is valid for the call.
    let (inner, ev) = unsafe { (&*ctx.cast::<Inner<H>>(), &*ev) };
    if ev.event == bindings::ib_event_type_IB_EVENT_SRQ_LIMIT_REACHED {
        inner.stats.inc(SrqStat::LimitEvents as usize);
        inner.limit_hit.store(true, Ordering::Release);
        // SAFETY: `rearm` is initialized, and cancelled in drop after the SRQ (the only source
        // of events) is destroyed. Events may come in atomic context: the work re-arms.
        unsafe { bindings::ibext_shim_queue_work_unbound(inner.rearm.get()) };
    } else {
        inner.stats.inc(SrqStat::Errors as usize);
    }
}

/// Re-arms the limit after a limit event (`ib_modify_srq` may sleep).
///
/// # Safety
///
/// Called by the workqueue only, for the `rearm` of a live `Inner<H>`.
unsafe extern "C" fn rearm_work<H: SrqHandler>(w: *mut bindings::work_struct) {
    // SAFETY: `w` is the `rearm` field of a live `Inner<H>`: drop cancels it before freeing.
    let inner = unsafe { &*kernel::container_of!(w, Inner<H>, rearm) };
    let phase = inner.phase.lock();
    if *phase == Phase::Live
        && inner.limit_hit.swap(false, Ordering::AcqRel)
        && inner.arm_limit().is_err()
    {
        // Not re-armed: no more limit events from this SRQ; visible as an error.
        inner.stats.inc(SrqStat::Errors as usize);
    }
    drop(phase);
}
