// SPDX-License-Identifier: GPL-2.0

//! Streaming loopback traffic: QPs that keep sends outstanding until told to stop.
//!
//! Each QP (connected to itself) has `depth` slots; a slot is one outstanding send and two
//! posted receives. A send's completion callback posts the slot's next send (until `ops` sends
//! were posted, or the stream stops), a receive's callback reposts it. Two receives per send
//! keep a reposted receive from racing the next send into an RNR NAK, which would stall the
//! send for rxe's RNR timer.
//!
//! About 460 lines: the stream, its slots' callbacks and the latency samples are one fixture.
//!
//! [`Stream::stop`] stops reposting, moves the QPs to the error state, waits until every posted
//! work request has completed (flushed ones included), and destroys the QPs. What it returns
//! keeps the contexts alive and counts any completion that still arrives for them: a completion
//! delivered after its owner is gone.

use crate::{bindings, ib::Device};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use kernel::prelude::*;

const MSG_LEN: u32 = 64;

/// Returns the monotonic clock in nanoseconds.
pub(crate) fn now_ns() -> u64 {
    // SAFETY: FFI call without preconditions.
    unsafe { bindings::ktime_get() as u64 }
}

/// State every callback of one stream shares.
pub(crate) struct Run {
    /// Sends still to post after the initial ones.
    to_post: AtomicU64,
    stopping: AtomicBool,
    /// Set once the stream's owner has torn it down; a callback after that is `late`.
    gone: AtomicBool,
    sends_posted: AtomicU64,
    /// Send completions of any status.
    sends_seen: AtomicU64,
    /// Successful send completions.
    sends_done: AtomicU64,
    /// When the latest successful send completed (ns, `ktime_get`): the end of a timed run,
    /// exact, where the waiter's `msleep` would round it up to its next tick.
    last_done_ns: AtomicU64,
    completions: AtomicU64,
    errors: AtomicU64,
    late: AtomicU64,
    /// Latency samples: `lat_len` slots of the stream's sample buffer, each written once by the
    /// callback that took its index from `lat_next`.
    lat: *mut u64,
    lat_len: usize,
    lat_next: AtomicUsize,
}

impl Run {
    /// Successful send completions so far.
    pub(crate) fn sends_done(&self) -> u64 {
        self.sends_done.load(Ordering::Acquire)
    }

    /// When the latest successful send completed (ns, `ktime_get`; 0 before the first).
    pub(crate) fn last_done_ns(&self) -> u64 {
        self.last_done_ns.load(Ordering::Acquire)
    }

    /// All completions (sends and receives, flushed ones included).
    pub(crate) fn completions(&self) -> u64 {
        self.completions.load(Ordering::Acquire)
    }

    /// Completions with an unexpected status before the stream stopped.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Acquire)
    }

    /// Completions delivered after the owner tore the stream down.
    pub(crate) fn late(&self) -> u64 {
        self.late.load(Ordering::Acquire)
    }
}

/// One outstanding-send slot: a send and its receives, each with its own `ib_cqe`.
#[repr(C)]
struct Slot {
    send_cqe: bindings::ib_cqe,
    recv_cqe: bindings::ib_cqe,
    qp: *mut bindings::ib_qp,
    addr: u64,
    lkey: u32,
    posted_at: AtomicU64,
    recvs_out: AtomicU32,
    run: *const Run,
}

impl Slot {
    fn run(&self) -> &Run {
        // SAFETY: The run outlives every slot's work requests (see `Stream::stop`).
        unsafe { &*self.run }
    }

    fn post_send(&self) -> bool {
        self.posted_at.store(now_ns(), Ordering::Relaxed);
        self.run().sends_posted.fetch_add(1, Ordering::AcqRel);
        // SAFETY: The QP and this slot outlive the work request.
        let ret = unsafe {
            bindings::ibext_test_post_send(
                self.qp,
                core::ptr::from_ref(&self.send_cqe).cast_mut(),
                self.addr,
                MSG_LEN,
                self.lkey,
                0,
                0,
                0,
            )
        };
        if ret != 0 {
            self.run().sends_posted.fetch_sub(1, Ordering::AcqRel);
        }
        ret == 0
    }

    fn post_recv(&self) -> bool {
        self.recvs_out.fetch_add(1, Ordering::AcqRel);
        // SAFETY: As for `post_send`.
        let ret = unsafe {
            bindings::ibext_test_post_recv(
                self.qp,
                core::ptr::from_ref(&self.recv_cqe).cast_mut(),
                self.addr + u64::from(MSG_LEN),
                MSG_LEN,
                self.lkey,
            )
        };
        if ret != 0 {
            self.recvs_out.fetch_sub(1, Ordering::AcqRel);
        }
        ret == 0
    }
}

/// Counts a completion; returns whether the stream may keep going.
fn account(run: &Run, status: bindings::ib_wc_status) -> bool {
    if run.gone.load(Ordering::Acquire) {
        run.late.fetch_add(1, Ordering::AcqRel);
        return false;
    }
    run.completions.fetch_add(1, Ordering::AcqRel);
    let stopping = run.stopping.load(Ordering::Acquire);
    if status != bindings::ib_wc_status_IB_WC_SUCCESS {
        // Flushes are expected once the stream stops, and nothing else is.
        if !stopping {
            run.errors.fetch_add(1, Ordering::AcqRel);
        }
        return false;
    }
    !stopping
}

/// # Safety
///
/// Called by a CQ poller with a completion whose `wr_cqe` is a [`Slot`]'s `send_cqe`.
unsafe extern "C" fn send_done(_cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `send_cqe` is the first field of a live `Slot`.
    let (slot, status) = unsafe { (&*(*wc).__bindgen_anon_1.wr_cqe.cast::<Slot>(), (*wc).status) };
    let run = slot.run();
    run.sends_seen.fetch_add(1, Ordering::AcqRel);
    let go_on = account(run, status);
    if status != bindings::ib_wc_status_IB_WC_SUCCESS || run.gone.load(Ordering::Acquire) {
        return;
    }
    let now = now_ns();
    let lat = now.saturating_sub(slot.posted_at.load(Ordering::Relaxed));
    let i = run.lat_next.fetch_add(1, Ordering::Relaxed);
    if i < run.lat_len {
        // SAFETY: `i` is in bounds and handed out once; readers wait for `sends_done`
        // (released below) and the buffer outlives the stream.
        unsafe { run.lat.add(i).write(lat) };
    }
    let more = go_on
        && run
            .to_post
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
    if more && !slot.post_send() {
        run.errors.fetch_add(1, Ordering::AcqRel);
    }
    run.last_done_ns.fetch_max(now, Ordering::Relaxed);
    run.sends_done.fetch_add(1, Ordering::Release);
}

/// # Safety
///
/// Called by a CQ poller with a completion whose `wr_cqe` is a [`Slot`]'s `recv_cqe`.
unsafe extern "C" fn recv_done(_cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    let off = core::mem::offset_of!(Slot, recv_cqe);
    // SAFETY: `recv_cqe` is a field of a live `Slot`, at `off`.
    let (slot, status) = unsafe {
        let p = (*wc).__bindgen_anon_1.wr_cqe.cast::<u8>().sub(off);
        (&*p.cast::<Slot>(), (*wc).status)
    };
    let run = slot.run();
    let go_on = account(run, status);
    slot.recvs_out.fetch_sub(1, Ordering::AcqRel);
    if go_on && !slot.post_recv() {
        run.errors.fetch_add(1, Ordering::AcqRel);
    }
}

/// Loopback QPs on one device with traffic running, or, after [`Stream::stop`], what is left
/// of them: the contexts, kept alive so that a late completion is counted rather than a use
/// after free.
///
/// # Invariants
///
/// `run` comes from `KBox::into_raw` and is freed only in `drop`, and only if no work request
/// can still complete (otherwise it is leaked).
pub(crate) struct Stream {
    dev: *mut bindings::ib_device,
    /// Null once the QPs are torn down.
    pd: *mut bindings::ib_pd,
    qps: KVec<*mut bindings::ib_qp>,
    slots: KVec<Slot>,
    mem: KVec<u8>,
    dma: u64,
    run: core::ptr::NonNull<Run>,
    samples: KVec<u64>,
    /// Cleared when work requests may still complete: then nothing they point to is freed.
    drained: bool,
}

// SAFETY: The raw pointers are ib_core objects owned by the stream, usable from any thread.
unsafe impl Send for Stream {}

impl Stream {
    /// [`Stream::new`], then [`Stream::go`].
    pub(crate) fn start(
        dev: &Device,
        cqs: &[*mut bindings::ib_cq],
        depth: usize,
        ops: Option<u64>,
        samples: usize,
    ) -> Result<Self> {
        let s = Self::new(dev, cqs, depth, ops, samples)?;
        s.go()?;
        Ok(s)
    }

    /// Makes `cqs.len()` connected QPs, QP `i` on CQ `cqs[i]` for both sends and receives, with
    /// their receives posted; [`Stream::go`] posts the first `depth` sends of each. `ops` bounds
    /// the sends in all (`None`: until stopped); `samples` latency samples are kept.
    pub(crate) fn new(
        dev: &Device,
        cqs: &[*mut bindings::ib_cq],
        depth: usize,
        ops: Option<u64>,
        samples: usize,
    ) -> Result<Self> {
        let qps = cqs.len();
        let mut samples = KVec::from_elem(0u64, samples, GFP_KERNEL)?;
        let initial = (qps * depth) as u64;
        let run = KBox::new(
            Run {
                to_post: AtomicU64::new(ops.map_or(u64::MAX, |o| o.saturating_sub(initial))),
                stopping: AtomicBool::new(false),
                gone: AtomicBool::new(false),
                sends_posted: AtomicU64::new(0),
                sends_seen: AtomicU64::new(0),
                sends_done: AtomicU64::new(0),
                last_done_ns: AtomicU64::new(0),
                completions: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                late: AtomicU64::new(0),
                lat: samples.as_mut_ptr(),
                lat_len: samples.len(),
                lat_next: AtomicUsize::new(0),
            },
            GFP_KERNEL,
        )?;
        let qp_list = KVec::with_capacity(qps, GFP_KERNEL)?;
        let slots = KVec::with_capacity(qps * depth, GFP_KERNEL)?;
        // SAFETY: `dev` is registered.
        let pd =
            kernel::error::from_err_ptr(unsafe { bindings::ibext_test_alloc_pd(dev.as_raw()) })?;
        // INVARIANT: `run` comes from `KBox::into_raw`.
        let mut s = Stream {
            dev: dev.as_raw(),
            pd,
            qps: qp_list,
            slots,
            mem: KVec::new(),
            dma: 0,
            run: core::ptr::NonNull::from(KBox::leak(run)),
            samples,
            drained: true,
        };
        // From here on, dropping `s` tears everything down.
        s.mem = KVec::from_elem(0u8, qps * depth * 2 * MSG_LEN as usize, GFP_KERNEL)?;
        // SAFETY: `mem` is live and never grown while mapped.
        s.dma =
            unsafe { bindings::ibext_test_dma_map(s.dev, s.mem.as_mut_ptr().cast(), s.mem.len()) };
        if s.dma == 0 {
            return Err(ENOMEM);
        }
        // SAFETY: `pd` is alive.
        let lkey = unsafe { bindings::ibext_test_pd_lkey(pd) };
        for (i, &cq) in cqs.iter().enumerate() {
            // SAFETY: `pd` and `cq` are alive.
            let qp = kernel::error::from_err_ptr(unsafe {
                bindings::ibext_test_create_qp(
                    pd,
                    cq,
                    cq,
                    core::ptr::null_mut(),
                    depth as u32,
                    2 * depth as u32,
                )
            })?;
            // Within the capacity reserved above: no allocation.
            s.qps.push(qp, GFP_KERNEL)?;
            // SAFETY: `qp` is alive.
            kernel::error::to_result(unsafe { bindings::ibext_test_connect_self(qp) })?;
            for k in 0..depth {
                let slot = i * depth + k;
                s.slots.push(
                    Slot {
                        send_cqe: bindings::ib_cqe {
                            done: Some(send_done),
                        },
                        recv_cqe: bindings::ib_cqe {
                            done: Some(recv_done),
                        },
                        qp,
                        addr: s.dma + (slot as u64) * 2 * u64::from(MSG_LEN),
                        lkey,
                        posted_at: AtomicU64::new(0),
                        recvs_out: AtomicU32::new(0),
                        run: s.run.as_ptr(),
                    },
                    GFP_KERNEL,
                )?;
            }
        }
        for slot in s.slots.iter() {
            if !slot.post_recv() || !slot.post_recv() {
                return Err(EIO);
            }
        }
        Ok(s)
    }

    /// Posts the first send of every slot; from then on, completions keep the stream going.
    pub(crate) fn go(&self) -> Result {
        for slot in self.slots.iter() {
            if !slot.post_send() {
                return Err(EIO);
            }
        }
        Ok(())
    }

    /// The stream's counters.
    pub(crate) fn run(&self) -> &Run {
        // SAFETY: `run` is alive until `drop` (type invariant).
        unsafe { self.run.as_ref() }
    }

    /// The latency samples taken, in nanoseconds; complete once the stream has stopped.
    pub(crate) fn latencies(&mut self) -> &mut [u64] {
        let n = self
            .run()
            .lat_next
            .load(Ordering::Acquire)
            .min(self.samples.len());
        &mut self.samples.as_mut_slice()[..n]
    }

    /// Waits until `n` sends completed, an error is seen, or `timeout_ms` passed.
    pub(crate) fn wait_sends(&self, n: u64, timeout_ms: u32) -> Result {
        let mut waited = 0;
        while self.run().sends_done() < n {
            if self.run().errors() != 0 || waited >= timeout_ms {
                return Err(EIO);
            }
            // SAFETY: FFI call in process context.
            unsafe { bindings::msleep(1) };
            waited += 1;
        }
        Ok(())
    }

    /// Stops the traffic and tears the QPs down once every work request has completed; the
    /// stream is kept (its counters, its samples) and counts late completions from now on.
    ///
    /// Fails with `EIO` if work requests are still outstanding after a bounded wait; the
    /// contexts are then leaked rather than freed under a completion that may still come.
    pub(crate) fn stop(mut self) -> Result<Self> {
        self.drained = self.quiesce();
        self.teardown();
        self.run().gone.store(true, Ordering::Release);
        if !self.drained {
            return Err(EIO);
        }
        Ok(self)
    }

    /// Stops reposting, flushes the QPs and waits (bounded) for every posted work request.
    fn quiesce(&self) -> bool {
        self.run().stopping.store(true, Ordering::Release);
        for &qp in self.qps.iter() {
            // SAFETY: The QP is alive.
            unsafe { bindings::ibext_test_qp_to_error(qp) };
        }
        let outstanding = |s: &Self| {
            let run = s.run();
            // Every posted send completes once, successfully or flushed.
            run.sends_seen.load(Ordering::Acquire) < run.sends_posted.load(Ordering::Acquire)
                || s.slots
                    .iter()
                    .any(|x| x.recvs_out.load(Ordering::Acquire) != 0)
        };
        for _ in 0..10_000 {
            if !outstanding(self) {
                return true;
            }
            // SAFETY: FFI call in process context.
            unsafe { bindings::msleep(1) };
        }
        !outstanding(self)
    }

    /// Destroys the QPs and the PD and unmaps the buffers; idempotent.
    fn teardown(&mut self) {
        for &qp in self.qps.iter() {
            // SAFETY: The QP is alive and ours.
            unsafe { bindings::ibext_test_destroy_qp(qp) };
        }
        self.qps = KVec::new();
        if self.dma != 0 {
            // SAFETY: Mapped in `start` with this length.
            unsafe { bindings::ibext_test_dma_unmap(self.dev, self.dma, self.mem.len()) };
            self.dma = 0;
        }
        if !self.pd.is_null() {
            // SAFETY: Its QPs are destroyed.
            unsafe { bindings::ibext_test_dealloc_pd(self.pd) };
            self.pd = core::ptr::null_mut();
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A stream dropped without `stop` (an error path of `start`, or a failed test).
        if !self.pd.is_null() {
            self.drained = self.quiesce();
            self.teardown();
        }
        if !self.drained {
            pr_err!("stream: work requests still outstanding; leaking the contexts\n");
            core::mem::forget(core::mem::replace(&mut self.slots, KVec::new()));
            core::mem::forget(core::mem::replace(&mut self.samples, KVec::new()));
            return;
        }
        // SAFETY: `run` came from `KBox::into_raw` (type invariant) and no work request can
        // complete any more, so nothing else uses it.
        drop(unsafe { KBox::from_raw(self.run.as_ptr()) });
    }
}
