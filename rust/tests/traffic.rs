// SPDX-License-Identifier: GPL-2.0

//! Loopback RC traffic on rxe: QPs connected to themselves, every completion checked.
//!
//! Each round posts `depth` receives and `depth` sends (or RDMA WRITEs with immediate) on every
//! QP and waits for all of them. Every work request has its own context, whose `ib_cqe` the
//! completion engine calls back; the callback checks the status, the opcode, the QP, the CQ, the
//! payload (or the written data and the immediate) and counts the call, so a round proves every
//! completion reached the right `wr_cqe` exactly once.

use crate::{bindings, ib::Device};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use kernel::prelude::*;

/// Bytes per message.
pub(crate) const MSG_LEN: usize = 64;
const WORDS: usize = MSG_LEN / 4;

const KIND_SEND: u32 = 0;
const KIND_WRITE_IMM: u32 = 1;
const KIND_RECV: u32 = 2;

/// Counters every callback of one [`Loopback`] updates.
#[derive(Default)]
struct Shared {
    completions: AtomicU64,
    errors: AtomicU64,
}

/// One work request: the `ib_cqe` the engine calls, and what must come back.
#[repr(C)]
struct WrCtx {
    cqe: bindings::ib_cqe,
    qp: *mut bindings::ib_qp,
    cq: *mut bindings::ib_cq,
    /// For receives: the message buffer and the write-target slot.
    buf: *const u32,
    target: *const u32,
    kind: AtomicU32,
    expected: AtomicU32,
    hits: AtomicU32,
    shared: *const Shared,
}

fn pattern(qp: usize, round: u32, slot: usize) -> u32 {
    ((qp as u32) << 20) ^ (round << 8) ^ (slot as u32) ^ 0x5a00_0000
}

/// Checks one message of `WORDS` words against `tag`.
///
/// # Safety
///
/// `p` points to `WORDS` readable words.
unsafe fn words_match(p: *const u32, tag: u32) -> bool {
    // SAFETY: Caller contract.
    (0..WORDS).all(|w| unsafe { p.add(w).read_volatile() } == tag.wrapping_add(w as u32))
}

/// The completion callback of every test work request.
///
/// # Safety
///
/// Called by the completion engine only, with a completion whose `wr_cqe` is a [`WrCtx`].
unsafe extern "C" fn wr_done(cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `wc` is valid for the call; its `wr_cqe` is the first field of a live `WrCtx`.
    let (wc, ctx) = unsafe {
        let wc = &*wc;
        (wc, &*wc.__bindgen_anon_1.wr_cqe.cast::<WrCtx>())
    };
    // SAFETY: `shared` outlives every context (see `Loopback`).
    let shared = unsafe { &*ctx.shared };
    ctx.hits.fetch_add(1, Ordering::AcqRel);
    let expected = ctx.expected.load(Ordering::Acquire);
    let mut ok =
        wc.status == bindings::ib_wc_status_IB_WC_SUCCESS && wc.qp == ctx.qp && cq == ctx.cq;
    ok &= match ctx.kind.load(Ordering::Acquire) {
        KIND_SEND => wc.opcode == bindings::ib_wc_opcode_IB_WC_SEND,
        KIND_WRITE_IMM => wc.opcode == bindings::ib_wc_opcode_IB_WC_RDMA_WRITE,
        _ if wc.opcode == bindings::ib_wc_opcode_IB_WC_RECV => {
            // SAFETY: `buf` is this receive's `MSG_LEN`-byte buffer, now filled.
            wc.byte_len as usize == MSG_LEN && unsafe { words_match(ctx.buf, expected) }
        }
        _ if wc.opcode == bindings::ib_wc_opcode_IB_WC_RECV_RDMA_WITH_IMM => {
            // SAFETY: `wc` is valid; `target` is the slot the matching write filled.
            unsafe {
                bindings::ibext_test_wc_imm(wc) == expected && words_match(ctx.target, expected)
            }
        }
        _ => false,
    };
    if !ok {
        shared.errors.fetch_add(1, Ordering::AcqRel);
    }
    shared.completions.fetch_add(1, Ordering::AcqRel);
}

/// One loopback QP with its buffers and work-request contexts; destroyed when dropped.
struct LoopQp {
    dev: *mut bindings::ib_device,
    qp: *mut bindings::ib_qp,
    /// Send buffers, receive buffers and write targets, `depth` messages each.
    mem: KVec<u32>,
    dma: u64,
    sends: KVec<WrCtx>,
    recvs: KVec<WrCtx>,
}

impl Drop for LoopQp {
    fn drop(&mut self) {
        // SAFETY: The QP is ours and alive; its owner flushed it first (see `Loopback::drop`).
        unsafe { bindings::ibext_test_destroy_qp(self.qp) };
        if self.dma != 0 {
            // SAFETY: Mapped in `add_qp` with this length.
            unsafe { bindings::ibext_test_dma_unmap(self.dev, self.dma, self.mem.len() * 4) };
        }
    }
}

/// QPs on `dev`, each connected to itself, with its CQs given by the caller.
///
/// The caller keeps the CQs alive longer than the `Loopback`.
pub(crate) struct Loopback {
    dev: *mut bindings::ib_device,
    pd: *mut bindings::ib_pd,
    lkey: u32,
    rkey: u32,
    depth: usize,
    qps: KVec<LoopQp>,
    shared: core::mem::ManuallyDrop<KBox<Shared>>,
    posted: u64,
}

impl Loopback {
    /// Makes `cqs.len()` QPs of `depth` outstanding sends and receives, QP `i` on
    /// `cqs[i] = (send CQ, receive CQ)`, and connects each to itself.
    pub(crate) fn new(
        dev: &Device,
        depth: usize,
        cqs: &[(*mut bindings::ib_cq, *mut bindings::ib_cq)],
    ) -> Result<Self> {
        // SAFETY: `dev` is registered.
        let pd =
            kernel::error::from_err_ptr(unsafe { bindings::ibext_test_alloc_pd(dev.as_raw()) })?;
        let mut lb = Loopback {
            dev: dev.as_raw(),
            pd,
            // SAFETY: `pd` was just allocated.
            lkey: unsafe { bindings::ibext_test_pd_lkey(pd) },
            // SAFETY: As above.
            rkey: unsafe { bindings::ibext_test_pd_rkey(pd) },
            depth,
            qps: KVec::with_capacity(cqs.len(), GFP_KERNEL)?,
            shared: core::mem::ManuallyDrop::new(KBox::new(Shared::default(), GFP_KERNEL)?),
            posted: 0,
        };
        for &(scq, rcq) in cqs {
            lb.add_qp(scq, rcq)?;
        }
        Ok(lb)
    }

    fn add_qp(&mut self, scq: *mut bindings::ib_cq, rcq: *mut bindings::ib_cq) -> Result {
        let depth = self.depth;
        // SAFETY: `pd` and the CQs are alive; depth fits a u32.
        let qp = kernel::error::from_err_ptr(unsafe {
            bindings::ibext_test_create_qp(
                self.pd,
                scq,
                rcq,
                core::ptr::null_mut(),
                depth as u32,
                depth as u32,
            )
        })?;
        // From here on, dropping `lq` destroys the QP.
        let mut lq = LoopQp {
            dev: self.dev,
            qp,
            mem: KVec::new(),
            dma: 0,
            sends: KVec::with_capacity(depth, GFP_KERNEL)?,
            recvs: KVec::with_capacity(depth, GFP_KERNEL)?,
        };
        lq.mem = KVec::from_elem(0u32, 3 * depth * WORDS, GFP_KERNEL)?;
        let bytes = lq.mem.len() * 4;
        // SAFETY: `mem` is a live buffer of `bytes` bytes that stays put (it is never grown).
        lq.dma =
            unsafe { bindings::ibext_test_dma_map(self.dev, lq.mem.as_mut_ptr().cast(), bytes) };
        if lq.dma == 0 {
            return Err(ENOMEM);
        }
        let base = lq.mem.as_ptr();
        let shared: *const Shared = &**self.shared;
        for i in 0..depth {
            let mk = |kind, cq, buf, target| WrCtx {
                cqe: bindings::ib_cqe {
                    done: Some(wr_done),
                },
                qp,
                cq,
                buf,
                target,
                kind: AtomicU32::new(kind),
                expected: AtomicU32::new(0),
                hits: AtomicU32::new(0),
                shared,
            };
            // SAFETY: Both offsets lie inside `mem` (3 * depth messages).
            let (rbuf, tgt) = unsafe {
                (
                    base.add((depth + i) * WORDS),
                    base.add((2 * depth + i) * WORDS),
                )
            };
            lq.sends.push(
                mk(KIND_SEND, scq, core::ptr::null(), core::ptr::null()),
                GFP_KERNEL,
            )?;
            lq.recvs.push(mk(KIND_RECV, rcq, rbuf, tgt), GFP_KERNEL)?;
        }
        // SAFETY: `qp` is alive.
        kernel::error::to_result(unsafe { bindings::ibext_test_connect_self(qp) })?;
        self.qps.push(lq, GFP_KERNEL)?;
        Ok(())
    }

    /// Runs one round: `depth` receives and `depth` sends (RDMA WRITEs with immediate if
    /// `write_imm`) on every QP, and waits up to `timeout_ms` for all completions.
    ///
    /// Returns `Err` with a description if a completion is missing, duplicated or wrong.
    pub(crate) fn round(
        &mut self,
        round: u32,
        write_imm: bool,
        timeout_ms: u32,
    ) -> core::result::Result<(), &'static str> {
        self.round_polled(round, write_imm, timeout_ms, &mut || {
            // SAFETY: FFI call; tests run in process context.
            unsafe { bindings::msleep(1) }
        })
    }

    /// [`Loopback::round`], calling `wait` while completions are outstanding: a test of a
    /// legacy ULP polls its own CQ there; `wait` should take about a millisecond.
    pub(crate) fn round_polled(
        &mut self,
        round: u32,
        write_imm: bool,
        timeout_ms: u32,
        wait: &mut dyn FnMut(),
    ) -> core::result::Result<(), &'static str> {
        let before = self.shared.completions.load(Ordering::Acquire);
        let errors = self.shared.errors.load(Ordering::Acquire);
        let depth = self.depth;
        let msg = MSG_LEN as u64;
        for (q, lq) in self.qps.iter_mut().enumerate() {
            for i in 0..depth {
                let tag = pattern(q, round, i);
                let r = &lq.recvs[i];
                r.expected.store(tag, Ordering::Release);
                let raddr = lq.dma + ((depth + i) * MSG_LEN) as u64;
                // SAFETY: The QP is alive; the context and buffer outlive the work request.
                let ret = unsafe {
                    bindings::ibext_test_post_recv(
                        lq.qp,
                        &r.cqe as *const _ as *mut _,
                        raddr,
                        msg as u32,
                        self.lkey,
                    )
                };
                if ret != 0 {
                    return Err("ib_post_recv failed");
                }
                self.posted += 1;
            }
        }
        for (q, lq) in self.qps.iter_mut().enumerate() {
            for i in 0..depth {
                let tag = pattern(q, round, i);
                for w in 0..WORDS {
                    lq.mem[i * WORDS + w] = tag.wrapping_add(w as u32);
                }
                let s = &lq.sends[i];
                s.kind.store(
                    if write_imm { KIND_WRITE_IMM } else { KIND_SEND },
                    Ordering::Release,
                );
                let saddr = lq.dma + (i * MSG_LEN) as u64;
                let remote = if write_imm {
                    lq.dma + ((2 * depth + i) * MSG_LEN) as u64
                } else {
                    0
                };
                // SAFETY: As for the receives.
                let ret = unsafe {
                    bindings::ibext_test_post_send(
                        lq.qp,
                        &s.cqe as *const _ as *mut _,
                        saddr,
                        msg as u32,
                        self.lkey,
                        remote,
                        self.rkey,
                        tag,
                    )
                };
                if ret != 0 {
                    return Err("ib_post_send failed");
                }
                self.posted += 1;
            }
        }
        let want = before + 2 * (self.qps.len() * depth) as u64;
        let mut waited = 0;
        while self.shared.completions.load(Ordering::Acquire) < want {
            if waited >= timeout_ms {
                return Err("completions missing after the timeout");
            }
            wait();
            waited += 1;
        }
        if self.shared.completions.load(Ordering::Acquire) != want {
            return Err("more completions than work requests");
        }
        if self.shared.errors.load(Ordering::Acquire) != errors {
            return Err("a completion had the wrong status, opcode, QP, CQ or payload");
        }
        for lq in self.qps.iter() {
            for c in Iterator::chain(lq.sends.iter(), lq.recvs.iter()) {
                if c.hits.swap(0, Ordering::AcqRel) != 1 {
                    return Err("a work request completed other than exactly once");
                }
            }
        }
        Ok(())
    }

    /// Completions seen so far.
    pub(crate) fn completions(&self) -> u64 {
        self.shared.completions.load(Ordering::Acquire)
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        let outstanding = |lb: &Self| lb.posted > lb.shared.completions.load(Ordering::Acquire);
        // Flush what a failed round left outstanding, and wait for it, before the contexts go.
        if outstanding(self) {
            for lq in self.qps.iter() {
                // SAFETY: The QP is alive.
                unsafe { bindings::ibext_test_qp_to_error(lq.qp) };
            }
            for _ in 0..5000 {
                if !outstanding(self) {
                    break;
                }
                // SAFETY: FFI call in process context.
                unsafe { bindings::msleep(1) };
            }
        }
        let qps = core::mem::replace(&mut self.qps, KVec::new());
        let leak = outstanding(self);
        if leak {
            // A completion may still arrive for a context: keep the memory rather than free it.
            pr_err!("loopback: completions still outstanding; leaking the test contexts\n");
            for lq in qps.iter() {
                // SAFETY: The QP is alive; destroying it stops new completions.
                unsafe { bindings::ibext_test_destroy_qp(lq.qp) };
            }
            core::mem::forget(qps);
        } else {
            drop(qps);
        }
        // SAFETY: Every QP of the PD is destroyed.
        unsafe { bindings::ibext_test_dealloc_pd(self.pd) };
        if !leak {
            // SAFETY: Dropped once, here, after every context that points to it.
            unsafe { core::mem::ManuallyDrop::drop(&mut self.shared) };
        }
    }
}
