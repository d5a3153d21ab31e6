// SPDX-License-Identifier: GPL-2.0

//! SRQ pool policy: what a pool is made of, and which of its SRQs a QP gets.
//!
//! nvmet-rdma (6.12, `drivers/nvme/target/rdma.c`) keeps `min(num_comp_vectors, max_srq)` SRQs
//! per device and gives a queue `srqs[comp_vector % srq_count]`, with no count of the queues
//! using each one. Here each SRQ counts its references, and when a device has fewer SRQs than
//! vectors the least-referenced SRQ is taken.

/// The largest managed receive buffer: a kmalloc'd buffer the device DMAs into.
pub(crate) const MAX_BUF_SIZE: u32 = 64 * 1024;

/// The most memory one pool's managed receive buffers may take, with ibext's bookkeeping of
/// [`BUF_OVERHEAD`] bytes per buffer: 256 MiB. Beyond it `ibext_srq_pool_create` gives
/// `-EINVAL` rather than let a legal-looking request (`srq_size` is clamped to `max_srq_wr`,
/// 2^20 on rxe) ask the allocator for gigabytes.
pub(crate) const MAX_POOL_BYTES: u64 = 256 << 20;

/// ibext's bookkeeping per managed buffer, counted against [`MAX_POOL_BYTES`] (an upper bound
/// of the size of its `RecvBuf`).
pub(crate) const BUF_OVERHEAD: u64 = 80;

/// How far a pool with managed buffers grows by default: to this many times `srq_size`.
pub(crate) const GROWTH_FACTOR: u32 = 4;

/// The most growth steps an SRQ takes from `srq_size` to its cap (each step's buffers are one
/// allocation, kept until the step is given back).
pub(crate) const MAX_STEPS: u32 = 8;

/// Why a pool cannot be made as asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Nonsense attributes (`-EINVAL`).
    Invalid,
    /// The device has no SRQs (`-EOPNOTSUPP`).
    NotSupported,
}

/// What the device offers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub(crate) max_srq: u32,
    pub(crate) max_srq_wr: u32,
    pub(crate) max_srq_sge: u32,
    /// Completion vectors in use (`min(num_comp_vectors, num_online_cpus())`, at least 1).
    pub(crate) vectors: u32,
}

/// What the ULP asks for (`struct ibext_srq_pool_attr`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub(crate) nr_srqs: u32,
    pub(crate) srq_size: u32,
    pub(crate) max_sge: u32,
    pub(crate) buf_size: u32,
    pub(crate) has_recv_done: bool,
    /// The most receives an SRQ may grow to; 0: the default (see [`plan`]).
    pub(crate) max_srq_size: u32,
}

/// What the pool is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) nr_srqs: u32,
    /// Receive WRs per SRQ, clamped to `max_srq_wr`.
    pub(crate) srq_size: u32,
    pub(crate) max_sge: u32,
    /// Bytes per managed buffer; 0: the ULP posts its own receives.
    pub(crate) buf_size: u32,
    /// The SRQ limit armed on each SRQ: an event when fewer receives than this are posted.
    /// 0 (no limit) for SRQs of fewer than 4 entries.
    pub(crate) limit: u32,
    /// The most receives each SRQ holds (its `max_wr`): with managed buffers, what it may grow
    /// to; without, what the ULP may post. At least `srq_size`.
    pub(crate) max_size: u32,
    /// Managed buffers added by one growth step (0: no growth).
    pub(crate) step: u32,
}

/// Returns the limit to arm on an SRQ meant to hold `posted` receives: a quarter, none below
/// 4 entries.
pub(crate) fn limit_for(posted: u32) -> u32 {
    if posted >= 4 {
        posted / 4
    } else {
        0
    }
}

/// Returns the buffers of the next growth step (`step`, at most up to `max_size`) of an SRQ
/// whose managed buffers are `held` (posted, with the ULP, or given back and not yet freed), or
/// `None` at the cap.
pub(crate) fn next_step(step: u32, max_size: u32, held: u32) -> Option<u32> {
    let room = max_size.saturating_sub(held);
    (step > 0 && room > 0).then(|| step.min(room))
}

/// Checks a request against the device and plans the pool.
///
/// - no SRQ support (`max_srq` or `max_srq_wr` 0): [`Refusal::NotSupported`];
/// - `srq_size` 0, `max_sge` 0 or above `max_srq_sge`, more SRQs than `max_srq`, a buffer size
///   above [`MAX_BUF_SIZE`], or managed buffers without `recv_done` (or `recv_done` without
///   managed buffers): [`Refusal::Invalid`];
/// - `nr_srqs` 0 means one per vector, capped by `max_srq`; `srq_size` is clamped to
///   `max_srq_wr`;
/// - managed buffers over [`MAX_POOL_BYTES`] after clamping: [`Refusal::Invalid`];
/// - `max_srq_size` below `srq_size` (but not 0): [`Refusal::Invalid`]; above `max_srq_wr`:
///   clamped, as `srq_size` is; with managed buffers, over [`MAX_POOL_BYTES`] at that size:
///   [`Refusal::Invalid`];
/// - `max_srq_size` 0: with managed buffers, [`GROWTH_FACTOR`] times `srq_size`, clamped to
///   `max_srq_wr` and to what fits [`MAX_POOL_BYTES`]; without, `srq_size` (the ULP posts its
///   own receives and did not ask for room to grow);
/// - a growth step is `srq_size` buffers, or more if the cap is over [`MAX_STEPS`] such steps
///   away.
pub(crate) fn plan(req: &Request, caps: &Caps) -> Result<Plan, Refusal> {
    if caps.max_srq == 0 || caps.max_srq_wr == 0 || caps.max_srq_sge == 0 {
        return Err(Refusal::NotSupported);
    }
    if req.srq_size == 0
        || req.max_sge == 0
        || req.max_sge > caps.max_srq_sge
        || req.nr_srqs > caps.max_srq
        || req.buf_size > MAX_BUF_SIZE
        || (req.buf_size > 0) != req.has_recv_done
        || (req.max_srq_size != 0 && req.max_srq_size < req.srq_size)
    {
        return Err(Refusal::Invalid);
    }
    let nr_srqs = if req.nr_srqs == 0 {
        caps.vectors.max(1).min(caps.max_srq)
    } else {
        req.nr_srqs
    };
    let srq_size = req.srq_size.min(caps.max_srq_wr);
    // The most buffers per SRQ that fit the pool's byte cap.
    let fit = if req.buf_size > 0 {
        let per_buf = (u64::from(req.buf_size) + BUF_OVERHEAD) * u64::from(nr_srqs);
        u32::try_from(MAX_POOL_BYTES / per_buf).unwrap_or(u32::MAX)
    } else {
        u32::MAX
    };
    if srq_size > fit {
        return Err(Refusal::Invalid);
    }
    let max_size = match req.max_srq_size {
        0 if req.buf_size > 0 => srq_size
            .saturating_mul(GROWTH_FACTOR)
            .min(caps.max_srq_wr)
            .min(fit),
        0 => srq_size,
        m => {
            let m = m.min(caps.max_srq_wr);
            if m > fit {
                return Err(Refusal::Invalid);
            }
            m
        }
    };
    let step = if req.buf_size > 0 && max_size > srq_size {
        srq_size.max((max_size - srq_size).div_ceil(MAX_STEPS))
    } else {
        0
    };
    Ok(Plan {
        nr_srqs,
        srq_size,
        max_sge: req.max_sge,
        buf_size: req.buf_size,
        limit: limit_for(srq_size),
        max_size,
        step,
    })
}

/// Returns the SRQ a QP with completion vector `hint` gets, from the references each SRQ has.
///
/// With at least one SRQ per vector, SRQ `hint % nr_srqs` (nvmet's `comp_vector % srq_count`):
/// with the default one SRQ per vector, the SRQ of the hint's vector. With fewer SRQs than
/// vectors, or a negative hint, the least-referenced SRQ, the lowest index on a tie. `None` only
/// for a pool without SRQs.
pub(crate) fn choose(refs: &[u32], vectors: u32, hint: i32) -> Option<usize> {
    if refs.is_empty() {
        return None;
    }
    if let Ok(h) = usize::try_from(hint) {
        if refs.len() >= vectors.max(1) as usize {
            return Some(h % refs.len());
        }
    }
    refs.iter()
        .enumerate()
        .min_by_key(|&(i, r)| (*r, i))
        .map(|(i, _)| i)
}
