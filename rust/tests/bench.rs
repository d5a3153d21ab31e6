// SPDX-License-Identifier: GPL-2.0

//! `ibext_bench`: side-by-side benchmarks in one boot (`make bench`; not part of `make check`).
//!
//! Every case prints one line `ibext-bench: {json}`; the harness collects them into a results
//! file. TCG makes absolute numbers meaningless: compare setups within one run.
//!
//! CQ pool workload: `qps` loopback RC QPs on rxe0, each keeping `depth` sends outstanding
//! (the completion callback of a send posts the next one) until `ops` sends completed in all.
//! Each QP keeps two receives per outstanding send posted (a receive's callback reposts it), so
//! a send never finds its receive queue empty: an RNR NAK would stall it for rxe's RNR timer
//! and measure that timer instead of the completion path.
//! Setups, all polled in softirq context:
//!
//! - `per_qp`: one CQ per QP from `ib_alloc_cq` (send and receive share it);
//! - `upstream_pool`: `ib_cq_pool_get`, one request per QP for its send and receive entries;
//! - `ibext_pool`: `ibext_cq_pool_get` (through [`PooledCq`]), the same requests.
//!
//! Completion events of ib_core's own CQs are counted by a tap: the CQ's `comp_handler` is
//! swapped for one that counts and then calls ib_core's handler, and restored afterwards.
//! ibext's CQs count their events themselves.

use super::guest::DeviceRef;
use crate::{
    api::PooledCq,
    bindings, client,
    cq_engine::PollCtx,
    kunit::{kassert, kunit_suite, Failed, TestResult},
};
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use kernel::{c_str, prelude::*};

const MSG_LEN: u32 = 64;

fn now_ns() -> u64 {
    // SAFETY: FFI call without preconditions.
    unsafe { bindings::ktime_get() as u64 }
}

/// Counts completion events of ib_core CQs, then hands them to ib_core's handler.
struct Tap {
    events: AtomicU64,
    orig: bindings::ib_comp_handler,
}

/// # Safety
///
/// Installed only as `comp_handler` of a CQ whose `cq_context` is a live [`Tap`].
unsafe extern "C" fn tap_handler(cq: *mut bindings::ib_cq, ctx: *mut core::ffi::c_void) {
    // SAFETY: `ctx` is the tap (installation contract), alive until the handler is restored.
    let tap = unsafe { &*ctx.cast::<Tap>() };
    tap.events.fetch_add(1, Ordering::Relaxed);
    if let Some(orig) = tap.orig {
        // SAFETY: ib_core's softirq handler ignores its context argument.
        unsafe { orig(cq, core::ptr::null_mut()) };
    }
}

/// Shared state of one benchmark case.
struct Run {
    /// Sends still to post, over all QPs.
    to_post: AtomicU64,
    sends_done: AtomicU64,
    completions: AtomicU64,
    errors: AtomicU64,
    /// Latency samples: `lat_len` slots of the case's sample buffer, each written once by the
    /// callback that took its index from `lat_next`.
    lat: *mut u64,
    lat_len: usize,
    lat_next: AtomicUsize,
}

/// One outstanding-send slot of a QP: a send and a receive, each with its own `ib_cqe`.
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
        // SAFETY: The run outlives every slot's work requests (see `Case::drop`).
        unsafe { &*self.run }
    }

    fn post_send(&self) -> bool {
        self.posted_at.store(now_ns(), Ordering::Relaxed);
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

/// # Safety
///
/// Called by a CQ poller with a completion whose `wr_cqe` is a [`Slot`]'s `send_cqe`.
unsafe extern "C" fn send_done(_cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `send_cqe` is the first field of a live `Slot`.
    let (slot, status) = unsafe { (&*(*wc).__bindgen_anon_1.wr_cqe.cast::<Slot>(), (*wc).status) };
    let run = slot.run();
    run.completions.fetch_add(1, Ordering::Relaxed);
    if status != bindings::ib_wc_status_IB_WC_SUCCESS {
        run.errors.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let lat = now_ns().saturating_sub(slot.posted_at.load(Ordering::Relaxed));
    let i = run.lat_next.fetch_add(1, Ordering::Relaxed);
    if i < run.lat_len {
        // SAFETY: `i` is in bounds and handed out once; the reader waits for `sends_done`
        // (released below) and the buffer outlives the case.
        unsafe { run.lat.add(i).write(lat) };
    }
    let more = run
        .to_post
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok();
    if more && !slot.post_send() {
        run.errors.fetch_add(1, Ordering::Relaxed);
    }
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
    run.completions.fetch_add(1, Ordering::Relaxed);
    slot.recvs_out.fetch_sub(1, Ordering::AcqRel);
    if status != bindings::ib_wc_status_IB_WC_SUCCESS {
        // Flushed at the end of the case: expected, not reposted.
        return;
    }
    if !slot.post_recv() {
        run.errors.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Setup {
    PerQp,
    UpstreamPool,
    IbextPool,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::PerQp => "per_qp",
            Setup::UpstreamPool => "upstream_pool",
            Setup::IbextPool => "ibext_pool",
        }
    }
}

/// The CQs of one case, whoever made them; gives them back when dropped.
struct Cqs {
    setup: Setup,
    per_qp: KVec<*mut bindings::ib_cq>,
    /// ib_core CQs whose handler is swapped for the tap.
    tapped: KVec<*mut bindings::ib_cq>,
    ibext: KVec<PooledCq>,
    nr_cqe: u32,
    tap: KBox<Tap>,
}

impl Cqs {
    fn new(dev: &crate::ib::Device, setup: Setup, qps: usize, nr_cqe: u32) -> Result<Self> {
        let mut c = Cqs {
            setup,
            per_qp: KVec::with_capacity(qps, GFP_KERNEL)?,
            tapped: KVec::with_capacity(qps, GFP_KERNEL)?,
            ibext: KVec::with_capacity(qps, GFP_KERNEL)?,
            nr_cqe,
            tap: KBox::new(
                Tap {
                    events: AtomicU64::new(0),
                    orig: None,
                },
                GFP_KERNEL,
            )?,
        };
        let vectors = dev.usable_comp_vectors();
        for i in 0..qps {
            let cq = match setup {
                Setup::IbextPool => {
                    let p = PooledCq::get(dev, nr_cqe, i as i32, PollCtx::Softirq)?;
                    let raw = p.as_raw();
                    c.ibext.push(p, GFP_KERNEL)?;
                    raw
                }
                Setup::PerQp => {
                    // SAFETY: `dev` is registered; the name is a static C string.
                    let cq = kernel::error::from_err_ptr(unsafe {
                        bindings::__ib_alloc_cq(
                            dev.as_raw(),
                            core::ptr::null_mut(),
                            nr_cqe as i32,
                            (i as u32 % vectors) as i32,
                            bindings::ib_poll_context_IB_POLL_SOFTIRQ,
                            c"ibext_bench".as_ptr().cast(),
                        )
                    })?;
                    c.per_qp.push(cq, GFP_KERNEL)?;
                    cq
                }
                Setup::UpstreamPool => {
                    // SAFETY: As above.
                    let cq = kernel::error::from_err_ptr(unsafe {
                        bindings::ib_cq_pool_get(
                            dev.as_raw(),
                            nr_cqe,
                            i as i32,
                            bindings::ib_poll_context_IB_POLL_SOFTIRQ,
                        )
                    })?;
                    c.per_qp.push(cq, GFP_KERNEL)?;
                    cq
                }
            };
            if setup != Setup::IbextPool && !c.tapped.contains(&cq) {
                // Within the capacity reserved above: no allocation.
                c.tapped.push(cq, GFP_KERNEL)?;
                c.install_tap(cq);
            }
        }
        Ok(c)
    }

    fn install_tap(&mut self, cq: *mut bindings::ib_cq) {
        let tap: *mut Tap = &mut *self.tap;
        // SAFETY: The CQ has no QP yet, so no completion runs its handler concurrently; the
        // tap outlives the swap (restored in `drop`). All ib_core softirq CQs share one handler.
        unsafe {
            (*tap).orig = (*cq).comp_handler;
            (*cq).cq_context = tap.cast();
            (*cq).comp_handler = Some(tap_handler);
        }
    }

    fn cq(&self, i: usize) -> *mut bindings::ib_cq {
        match self.setup {
            Setup::IbextPool => self.ibext[i].as_raw(),
            _ => self.per_qp[i],
        }
    }

    /// Distinct CQs and their entries.
    fn distinct(&self, qps: usize) -> Result<(KVec<*mut bindings::ib_cq>, u64)> {
        let mut d = KVec::new();
        let mut cqe = 0u64;
        for i in 0..qps {
            let cq = self.cq(i);
            if !d.contains(&cq) {
                d.push(cq, GFP_KERNEL)?;
                // SAFETY: The CQ is alive while `self` holds it.
                cqe += unsafe { (*cq).cqe } as u64;
            }
        }
        Ok((d, cqe))
    }
}

impl Drop for Cqs {
    fn drop(&mut self) {
        for &cq in self.tapped.iter() {
            // SAFETY: Every QP on the CQ is destroyed, so no handler runs; restore ib_core's.
            unsafe {
                (*cq).comp_handler = self.tap.orig;
                (*cq).cq_context = core::ptr::null_mut();
            }
        }
        for &cq in self.per_qp.iter() {
            // SAFETY: Every QP on the CQ is destroyed and ib_core's handler is back.
            unsafe {
                match self.setup {
                    Setup::PerQp => bindings::ib_free_cq(cq),
                    _ => bindings::ib_cq_pool_put(cq, self.nr_cqe),
                }
            }
        }
    }
}

/// Results of one case.
struct Outcome {
    ops_per_s: u64,
    events_per_1k_x10: u64,
    lat_mean_ns: u64,
    lat_p99_ns: u64,
    cqs: usize,
    cqe_allocated: u64,
}

fn run_case(dev: &DeviceRef, setup: Setup, qps: usize, depth: usize, ops: u64) -> Result<Outcome> {
    let d = dev.device();
    let state = client::device_state(d).ok_or(ENODEV)?;
    // Send and receive completions share the QP's CQ: `depth` sends, `2 * depth` receives.
    let nr_cqe = 3 * depth as u32;
    let cqs = Cqs::new(d, setup, qps, nr_cqe)?;
    let (distinct, cqe_allocated) = cqs.distinct(qps)?;
    let ibext_events = |cqs: &KVec<*mut bindings::ib_cq>| -> (u64, u64) {
        cqs.iter()
            .filter_map(|&cq| state.cq_pools().stats_of(cq))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };

    let mut samples = KVec::from_elem(0u64, ops as usize, GFP_KERNEL)?;
    let run = KBox::new(
        Run {
            to_post: AtomicU64::new(ops.saturating_sub((qps * depth) as u64)),
            sends_done: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            lat: samples.as_mut_ptr(),
            lat_len: samples.len(),
            lat_next: AtomicUsize::new(0),
        },
        GFP_KERNEL,
    )?;
    // SAFETY: `d` is registered.
    let pd = kernel::error::from_err_ptr(unsafe { bindings::ibext_test_alloc_pd(d.as_raw()) })?;
    // SAFETY: `pd` was just allocated.
    let lkey = unsafe { bindings::ibext_test_pd_lkey(pd) };
    let mut mem = KVec::from_elem(0u8, qps * depth * 2 * MSG_LEN as usize, GFP_KERNEL)?;
    // SAFETY: `mem` is live and never grown while mapped.
    let dma =
        unsafe { bindings::ibext_test_dma_map(d.as_raw(), mem.as_mut_ptr().cast(), mem.len()) };
    let mut qp_list: KVec<*mut bindings::ib_qp> = KVec::with_capacity(qps, GFP_KERNEL)?;
    let mut slots: KVec<Slot> = KVec::with_capacity(qps * depth, GFP_KERNEL)?;
    let mut result = Err(ENOMEM);
    if dma != 0 {
        result = (|| -> Result<Outcome> {
            for i in 0..qps {
                let cq = cqs.cq(i);
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
                qp_list.push(qp, GFP_KERNEL)?;
                // SAFETY: `qp` is alive.
                kernel::error::to_result(unsafe { bindings::ibext_test_connect_self(qp) })?;
                for s in 0..depth {
                    let k = i * depth + s;
                    slots.push(
                        Slot {
                            send_cqe: bindings::ib_cqe {
                                done: Some(send_done),
                            },
                            recv_cqe: bindings::ib_cqe {
                                done: Some(recv_done),
                            },
                            qp,
                            addr: dma + (k as u64) * 2 * u64::from(MSG_LEN),
                            lkey,
                            posted_at: AtomicU64::new(0),
                            recvs_out: AtomicU32::new(0),
                            run: &*run,
                        },
                        GFP_KERNEL,
                    )?;
                }
            }
            for s in slots.iter() {
                if !s.post_recv() || !s.post_recv() {
                    return Err(EIO);
                }
            }
            let ev0 = (
                cqs.tap.events.load(Ordering::Acquire),
                ibext_events(&distinct),
            );
            let start = now_ns();
            for s in slots.iter() {
                if !s.post_send() {
                    return Err(EIO);
                }
            }
            let mut waited_ms = 0;
            while run.sends_done.load(Ordering::Acquire) < ops {
                if waited_ms > 120_000 || run.errors.load(Ordering::Acquire) != 0 {
                    return Err(EIO);
                }
                // SAFETY: FFI call in process context.
                unsafe { bindings::msleep(1) };
                waited_ms += 1;
            }
            let elapsed = now_ns().saturating_sub(start).max(1);
            let completions = run.completions.load(Ordering::Acquire);
            let events = match setup {
                Setup::IbextPool => ibext_events(&distinct).0 - (ev0.1).0,
                _ => cqs.tap.events.load(Ordering::Acquire) - ev0.0,
            };
            let n = run.lat_next.load(Ordering::Acquire).min(run.lat_len);
            // SAFETY: Every send completed (`sends_done` acquired above), so no callback writes
            // samples any more; `run.lat` points into `samples`, which is alive.
            let lat = unsafe { core::slice::from_raw_parts_mut(run.lat, n) };
            sort_u64(lat);
            let mean = if n > 0 {
                lat.iter().sum::<u64>() / n as u64
            } else {
                0
            };
            let p99 = if n > 0 {
                lat[(n * 99 / 100).min(n - 1)]
            } else {
                0
            };
            Ok(Outcome {
                ops_per_s: ops.saturating_mul(1_000_000_000) / elapsed,
                events_per_1k_x10: events * 10_000 / completions.max(1),
                lat_mean_ns: mean,
                lat_p99_ns: p99,
                cqs: distinct.len(),
                cqe_allocated,
            })
        })();
    }
    // Flush the receives still posted, wait for them, then tear down.
    for &qp in qp_list.iter() {
        // SAFETY: The QP is alive.
        unsafe { bindings::ibext_test_qp_to_error(qp) };
    }
    let mut waited = 0;
    while slots
        .iter()
        .any(|s| s.recvs_out.load(Ordering::Acquire) != 0)
        && waited < 10_000
    {
        // SAFETY: FFI call in process context.
        unsafe { bindings::msleep(1) };
        waited += 1;
    }
    let drained = !slots
        .iter()
        .any(|s| s.recvs_out.load(Ordering::Acquire) != 0);
    for &qp in qp_list.iter() {
        // SAFETY: The QP is alive and ours.
        unsafe { bindings::ibext_test_destroy_qp(qp) };
    }
    if dma != 0 {
        // SAFETY: Mapped above with this length.
        unsafe { bindings::ibext_test_dma_unmap(d.as_raw(), dma, mem.len()) };
    }
    // SAFETY: Its QPs are destroyed.
    unsafe { bindings::ibext_test_dealloc_pd(pd) };
    drop(cqs);
    if !drained {
        pr_err!("bench: receives not flushed; leaking the case's contexts\n");
        core::mem::forget(slots);
        core::mem::forget(run);
        core::mem::forget(samples);
        return Err(EIO);
    }
    result
}

/// Sorts with the kernel's `sort()` (core's sort pulls in code objtool cannot follow).
fn sort_u64(v: &mut [u64]) {
    /// # Safety
    ///
    /// `a` and `b` point to `u64`s.
    unsafe extern "C" fn cmp(a: *const core::ffi::c_void, b: *const core::ffi::c_void) -> i32 {
        // SAFETY: `sort` passes pointers to two elements of the `u64` slice.
        let (a, b) = unsafe { (*a.cast::<u64>(), *b.cast::<u64>()) };
        a.cmp(&b) as i32
    }
    // SAFETY: `v` is a valid slice of `u64`; `cmp` matches its element type; no swap function
    // means the generic one.
    unsafe { bindings::sort(v.as_mut_ptr().cast(), v.len(), 8, Some(cmp), None) };
}

/// Median of `reps` values.
fn median(v: &mut [u64]) -> u64 {
    sort_u64(v);
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn cq_pool_bench() -> TestResult {
    const OPS: u64 = 12_800;
    /// Each case runs this often, the three setups interleaved and their order rotated each
    /// repetition; the median of each metric is reported, since one TCG run is noisy.
    const REPS: usize = 5;
    let dev = DeviceRef::get(c_str!("rxe0"));
    kassert!(dev.is_some(), "rxe0 is not registered");
    let dev = dev.ok_or(Failed)?;
    let setups = [Setup::PerQp, Setup::UpstreamPool, Setup::IbextPool];
    for qps in [4usize, 16, 64] {
        for depth in [1usize, 32] {
            let mut results: [[Option<Outcome>; 3]; REPS] = Default::default();
            for (rep, row) in results.iter_mut().enumerate() {
                for j in 0..setups.len() {
                    let k = (rep + j) % setups.len();
                    let setup = setups[k];
                    let r = run_case(&dev, setup, qps, depth, OPS);
                    kassert!(
                        r.is_ok(),
                        "{} qps {} depth {}: {:?}",
                        setup.name(),
                        qps,
                        depth,
                        r.as_ref().err()
                    );
                    row[k] = Some(r.map_err(|_| Failed)?);
                }
            }
            for (k, setup) in setups.iter().enumerate() {
                let m = |f: fn(&Outcome) -> u64| {
                    let mut v = [0u64; REPS];
                    for (slot, row) in v.iter_mut().zip(results.iter()) {
                        *slot = row[k].as_ref().map_or(0, f);
                    }
                    median(&mut v)
                };
                let ev = m(|o| o.events_per_1k_x10);
                pr_info!(
                    "ibext-bench: {{\"bench\":\"cq_pool\",\"setup\":\"{}\",\"qps\":{},\"depth\":{},\"ops\":{},\"reps\":{},\"ops_per_s\":{},\"events_per_1k_completions\":{}.{},\"lat_mean_ns\":{},\"lat_p99_ns\":{},\"cqs\":{},\"cqe_allocated\":{}}}\n",
                    setup.name(),
                    qps,
                    depth,
                    OPS,
                    REPS,
                    m(|o| o.ops_per_s),
                    ev / 10,
                    ev % 10,
                    m(|o| o.lat_mean_ns),
                    m(|o| o.lat_p99_ns),
                    m(|o| o.cqs as u64),
                    m(|o| o.cqe_allocated)
                );
            }
        }
    }
    Ok(())
}

kunit_suite!(ibext_bench, [cq_pool_bench], slow);
