// SPDX-License-Identifier: GPL-2.0

//! What a pooled CQ's completion engine costs per completion, without the traffic
//! around it.
//!
//! The CQ pool benchmark times whole operations, and rxe's work per operation (about 19,000
//! instructions under icount) buries the engines' difference. Here one self-connected RC QP on
//! the CQ under test posts `n` receives and `n` sends while the CQ's event is held back, so all
//! `2n` completions wait in the CQ. Then, timed: the held event is delivered and the softirq
//! pass it schedules drains the CQ, handing every completion to a callback that only counts.
//! The event is delivered inside `local_bh_disable()`, so the pass runs in the
//! `local_bh_enable()` that follows, on this CPU, before the clock is read again.
//!
//! What the window holds: the completion handler, irq_poll's scheduling and softirq, the pass
//! (`ib_poll_cq` batches, the callbacks, the re-arm), and two clock reads. The driver's part and
//! the callbacks are the same for both setups; the difference is the engines'. Under the icount
//! clock the window counts instructions.
//!
//! - `upstream_pool`: `ib_cq_pool_get` (softirq);
//! - `ibext_pool`: `ibext_cq_pool_get` with its default moderation (upstream's: none on rxe).
//!
//! Both CQs' events are held the same way: the CQ's `comp_handler` is swapped for a gate that
//! remembers the event, and the release calls the CQ's own handler, so each pool's event path is
//! in the window.

use crate::tests::fixtures::{
    guest::{msleep, required, DeviceRef},
    stream::now_ns,
    REPS,
};
use crate::{
    api::{self, CqEntries},
    bindings,
    engine::PollCtx,
    kunit::{kassert, kassert_eq, Failed, TestResult},
};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
};
use kernel::{c_str, prelude::*};

/// Bytes per message (the callbacks never read them).
const MSG: u32 = 64;

/// A completion callback that only counts.
#[repr(C)]
struct Sink {
    cqe: bindings::ib_cqe,
    done: AtomicU64,
    errors: AtomicU64,
}

/// # Safety
///
/// Called by a CQ's poller with a completion whose `wr_cqe` is the `cqe` of a live [`Sink`].
unsafe extern "C" fn sink_done(_cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `wc` is valid for the call; its `wr_cqe` is a sink's `cqe` (caller contract), the
    // first field of the `repr(C)` sink.
    let (sink, status) = unsafe { (&*(*wc).__bindgen_anon_1.wr_cqe.cast::<Sink>(), (*wc).status) };
    sink.done.fetch_add(1, Ordering::Relaxed);
    if status != bindings::ib_wc_status_IB_WC_SUCCESS {
        sink.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds back a CQ's completion events: the CQ's `comp_handler` and `cq_context` are swapped for
/// [`gate_handler`] and the gate, which only remembers the event while held; the release calls
/// the CQ's own handler with its own context, as the driver would have.
struct Gate {
    cq: *mut bindings::ib_cq,
    orig: bindings::ib_comp_handler,
    orig_ctx: *mut c_void,
    held: AtomicBool,
    pending: AtomicBool,
}

/// # Safety
///
/// Installed only as `comp_handler` of a CQ whose `cq_context` is a live [`Gate`].
unsafe extern "C" fn gate_handler(cq: *mut bindings::ib_cq, ctx: *mut c_void) {
    // SAFETY: `ctx` is the gate (installation contract), alive until the handler is restored.
    let gate = unsafe { &*ctx.cast::<Gate>() };
    if gate.held.load(Ordering::Acquire) {
        gate.pending.store(true, Ordering::Release);
        return;
    }
    if let Some(orig) = gate.orig {
        // SAFETY: The CQ's own handler with its own context.
        unsafe { orig(cq, gate.orig_ctx) };
    }
}

impl Gate {
    /// Installs a gate on `cq`, open.
    ///
    /// # Safety
    ///
    /// No QP uses `cq` yet, and `cq` outlives the gate.
    unsafe fn install(cq: *mut bindings::ib_cq) -> Result<KBox<Gate>> {
        let mut gate = KBox::new(
            Gate {
                cq,
                orig: None,
                orig_ctx: core::ptr::null_mut(),
                held: AtomicBool::new(false),
                pending: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?;
        let g: *mut Gate = &mut *gate;
        // SAFETY: No QP uses the CQ, so no handler runs concurrently (caller contract); the
        // gate outlives the swap (restored in `drop`).
        unsafe {
            (*g).orig = (*cq).comp_handler;
            (*g).orig_ctx = (*cq).cq_context;
            (*cq).cq_context = g.cast();
            (*cq).comp_handler = Some(gate_handler);
        }
        Ok(gate)
    }

    fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Opens the gate and delivers the held event, if any.
    fn release(&self) {
        self.held.store(false, Ordering::Release);
        if self.pending.swap(false, Ordering::AcqRel) {
            if let Some(orig) = self.orig {
                // SAFETY: The CQ is alive (`install`'s contract); its own handler and context.
                unsafe { orig(self.cq, self.orig_ctx) };
            }
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // SAFETY: Every QP on the CQ is destroyed, so no handler runs; the CQ gets its own
        // handler and context back before it goes back to its pool.
        unsafe {
            (*self.cq).comp_handler = self.orig;
            (*self.cq).cq_context = self.orig_ctx;
        }
    }
}

/// The CQ under test, from ibext's pool or upstream's, with a gate on its events.
struct UnderTest {
    /// Declared first: dropped, restoring the CQ's handler, before the CQ goes back.
    gate: KBox<Gate>,
    /// Held for its drop: the CQ goes back to its pool.
    _cq: Cq,
}

enum Cq {
    Upstream(*mut bindings::ib_cq),
    Ibext(CqEntries),
}

impl Drop for Cq {
    fn drop(&mut self) {
        if let Cq::Upstream(cq) = self {
            // SAFETY: Every QP on the CQ is destroyed and its handler is restored.
            unsafe { bindings::ib_cq_pool_put(*cq, NR_CQE) };
        }
    }
}

impl UnderTest {
    fn new(dev: &crate::ib::Device, ibext: bool, nr_cqe: u32) -> Result<Self> {
        let cq = if ibext {
            let mode = api::default_moderation(dev);
            Cq::Ibext(CqEntries::get(dev, nr_cqe, 0, PollCtx::Softirq, mode)?)
        } else {
            // SAFETY: `dev` is registered.
            Cq::Upstream(kernel::error::from_err_ptr(unsafe {
                bindings::ib_cq_pool_get(
                    dev.as_raw(),
                    nr_cqe,
                    0,
                    bindings::ib_poll_context_IB_POLL_SOFTIRQ,
                )
            })?)
        };
        let raw = match &cq {
            Cq::Upstream(c) => *c,
            Cq::Ibext(p) => p.as_raw(),
        };
        // SAFETY: No QP uses the new CQ yet; `cq` is dropped after the gate.
        let gate = unsafe { Gate::install(raw) }?;
        Ok(UnderTest { gate, _cq: cq })
    }

    fn raw(&self) -> *mut bindings::ib_cq {
        self.gate.cq
    }
}

/// Entries asked of either pool: room for the largest drain.
const NR_CQE: u32 = 256;

/// `release` of the [`UnderTest`] at `arg`, for [`bindings::ibext_test_in_bh`].
///
/// # Safety
///
/// `arg` is a live `UnderTest`.
unsafe extern "C" fn release_in_bh(arg: *mut c_void) {
    // SAFETY: Caller contract.
    unsafe { &*arg.cast::<UnderTest>() }.gate.release();
}

/// One QP, its buffer and its sink; torn down in the order ULPs do (QP, then memory).
struct Rig {
    dev: *mut bindings::ib_device,
    pd: *mut bindings::ib_pd,
    qp: *mut bindings::ib_qp,
    buf: KVec<u8>,
    dma: u64,
    sink: KBox<Sink>,
}

impl Rig {
    fn new(dev: &crate::ib::Device, cq: *mut bindings::ib_cq, depth: u32) -> Result<Self> {
        let sink = KBox::new(
            Sink {
                cqe: bindings::ib_cqe {
                    done: Some(sink_done),
                },
                done: AtomicU64::new(0),
                errors: AtomicU64::new(0),
            },
            GFP_KERNEL,
        )?;
        let buf = KVec::from_elem(0u8, MSG as usize, GFP_KERNEL)?;
        let mut rig = Rig {
            dev: dev.as_raw(),
            pd: core::ptr::null_mut(),
            qp: core::ptr::null_mut(),
            buf,
            dma: 0,
            sink,
        };
        // SAFETY: `dev` is registered; each result is checked, and `drop` undoes what was made.
        unsafe {
            rig.pd = kernel::error::from_err_ptr(bindings::ibext_test_alloc_pd(rig.dev))?;
            rig.dma =
                bindings::ibext_test_dma_map(rig.dev, rig.buf.as_mut_ptr().cast(), MSG as usize);
            if rig.dma == 0 {
                return Err(ENOMEM);
            }
            rig.qp = kernel::error::from_err_ptr(bindings::ibext_test_create_qp(
                rig.pd,
                cq,
                cq,
                core::ptr::null_mut(),
                depth,
                depth,
            ))?;
            kernel::error::to_result(bindings::ibext_test_connect_self(rig.qp))?;
        }
        Ok(rig)
    }

    /// Posts `n` receives, then `n` sends to itself.
    fn post(&mut self, n: u32) -> Result {
        // SAFETY: The PD is live.
        let lkey = unsafe { bindings::ibext_test_pd_lkey(self.pd) };
        let cqe: *mut bindings::ib_cqe = &mut self.sink.cqe;
        for _ in 0..n {
            // SAFETY: The QP, the mapped buffer and the sink are live until `drop`.
            kernel::error::to_result(unsafe {
                bindings::ibext_test_post_recv(self.qp, cqe, self.dma, MSG, lkey)
            })?;
        }
        for _ in 0..n {
            // SAFETY: As above.
            kernel::error::to_result(unsafe {
                bindings::ibext_test_post_send(self.qp, cqe, self.dma, MSG, lkey, 0, 0, 0)
            })?;
        }
        Ok(())
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: What `new` made, undone once, QP first; its completions were all handled.
        unsafe {
            if !self.qp.is_null() {
                bindings::ibext_test_destroy_qp(self.qp);
            }
            if self.dma != 0 {
                bindings::ibext_test_dma_unmap(self.dev, self.dma, MSG as usize);
            }
            if !self.pd.is_null() {
                bindings::ibext_test_dealloc_pd(self.pd);
            }
        }
    }
}

/// One timed drain of `2 * n` completions on a fresh CQ and QP of `ibext`'s or upstream's pool;
/// returns the nanoseconds of the timed window.
fn drain(dev: &DeviceRef, ibext: bool, n: u32) -> core::result::Result<u64, Failed> {
    let under = UnderTest::new(dev.device(), ibext, NR_CQE).map_err(|_| Failed)?;
    let cq = under.raw();
    let mut rig = Rig::new(dev.device(), cq, n).map_err(|_| Failed)?;
    let want = u64::from(2 * n);
    under.gate.hold();
    rig.post(n).map_err(|_| Failed)?;
    // Every completion in the CQ before the window opens; the driver reports them without
    // consuming them (rxe has `peek_cq`).
    let mut waited = 0;
    // SAFETY: The CQ is alive.
    while unsafe { bindings::ibext_test_peek_cq(cq, want as i32) } < want as i32 {
        if waited >= 20_000 {
            under.gate.release();
            return Err(Failed);
        }
        msleep(1);
        waited += 1;
    }
    let before = rig.sink.done.load(Ordering::Acquire);
    let arg: *const UnderTest = &under;
    let t0 = now_ns();
    // SAFETY: `under` is alive for the call.
    unsafe { bindings::ibext_test_in_bh(Some(release_in_bh), arg.cast_mut().cast()) };
    let t1 = now_ns();
    let got = rig.sink.done.load(Ordering::Acquire).wrapping_sub(before);
    kassert_eq!(got, want, "{} completions drained in the window", got);
    kassert_eq!(rig.sink.errors.load(Ordering::Relaxed), 0);
    // The QP goes before the CQ.
    drop(rig);
    drop(under);
    Ok(t1.saturating_sub(t0))
}

/// The engines' cost per completion, ibext's pool and upstream's side by side, for
/// drains of 2, 16 and 128 completions.
pub(crate) fn cq_drain_bench() -> TestResult {
    let dev = required(c_str!("rxe0"))?;
    let setups = [(false, "upstream_pool"), (true, "ibext_pool")];
    for n in [1u32, 8, 64] {
        for rep in 0..REPS {
            for j in 0..setups.len() {
                let (ibext, label) = setups[(rep + j) % setups.len()];
                let ns = drain(&dev, ibext, n)?;
                kassert!(ns > 0);
                // `checked_div`: no panic path in a test (objtool flags the call).
                let per = ns.checked_div(u64::from(2 * n)).unwrap_or(0);
                pr_info!(
                    "ibext-bench: {{\"bench\":\"cq_drain\",\"setup\":\"{}\",\"completions\":{},\"rep\":{},\"order\":{},\"drain_ns\":{},\"ns_per_completion\":{}}}\n",
                    label,
                    2 * n,
                    rep,
                    j,
                    ns,
                    per
                );
            }
        }
    }
    Ok(())
}
