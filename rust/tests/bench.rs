// SPDX-License-Identifier: GPL-2.0

//! `ibext_bench`: side-by-side benchmarks in one boot (`make bench`; not part of `make check`).
//!
//! Every case prints one line `ibext-bench: {json}`; the harness collects them into a results
//! file. TCG makes absolute numbers meaningless: compare setups within one run.
//!
//! CQ pool workload: `qps` loopback RC QPs on rxe0, each keeping `depth` sends outstanding
//! until `ops` sends completed in all ([`Stream`]).
//! Setups, all polled in softirq context:
//!
//! - `per_qp`: one CQ per QP from `ib_alloc_cq` (send and receive share it);
//! - `upstream_pool`: `ib_cq_pool_get`, one request per QP for its send and receive entries;
//! - `ibext_pool`: `ibext_cq_pool_get` (through [`PooledCq`]), the same requests.
//!
//! Completion events of ib_core's own CQs are counted by a tap: the CQ's `comp_handler` is
//! swapped for one that counts and then calls ib_core's handler, and restored afterwards.
//! ibext's CQs count their events themselves.

use super::{
    guest::DeviceRef,
    stream::{now_ns, Stream},
};
use crate::{
    api::PooledCq,
    bindings, client,
    cq_engine::PollCtx,
    kunit::{kassert, kunit_suite, Failed, TestResult},
};
use core::sync::atomic::{AtomicU64, Ordering};
use kernel::{c_str, prelude::*};

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
    let mut per_qp = KVec::with_capacity(qps, GFP_KERNEL)?;
    for i in 0..qps {
        per_qp.push(cqs.cq(i), GFP_KERNEL)?;
    }
    let events = |cqs: &Cqs| -> u64 {
        match setup {
            Setup::IbextPool => distinct
                .iter()
                .filter_map(|&cq| state.cq_pools().stats_of(cq))
                .map(|(events, _)| events)
                .sum(),
            _ => cqs.tap.events.load(Ordering::Acquire),
        }
    };

    let stream = Stream::new(d, &per_qp, depth, Some(ops), ops as usize)?;
    let ev0 = events(&cqs);
    let start = now_ns();
    stream.go()?;
    let done = stream.wait_sends(ops, 120_000);
    let elapsed = now_ns().saturating_sub(start).max(1);
    let ev = events(&cqs) - ev0;
    let completions = stream.run().completions();
    // The QPs go before the CQs they use.
    let mut stream = stream.stop()?;
    done?;
    drop(cqs);
    let lat = stream.latencies();
    sort_u64(lat);
    let n = lat.len();
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
        events_per_1k_x10: ev * 10_000 / completions.max(1),
        lat_mean_ns: mean,
        lat_p99_ns: p99,
        cqs: distinct.len(),
        cqe_allocated,
    })
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
