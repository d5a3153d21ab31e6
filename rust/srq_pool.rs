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
//! With `buf_size > 0` every SRQ gets `srq_size` kmalloc'd buffers, DMA-mapped for the device
//! and posted with their own `ib_cqe`. The poller of the receiving QP's CQ (ibext's completion
//! engine for a pooled CQ) calls [`recv_buf_done`], which hands the buffer to the ULP's
//! `recv_done` and posts it again. A buffer is either posted or inside that handler.
//!
//! # Teardown
//!
//! `destroy` refuses (`-EBUSY`, nothing freed) while any SRQ has references or a QP still
//! attached (`usecnt`). Otherwise it marks the pool dead (under `refs`), and dropping the pool
//! removes its debugfs directory, destroys the SRQs (no receive is consumed and no event is
//! raised after that), waits for every handler ibext's completion engine may be running, in any
//! poll context (`cq_engine::wait_for_dispatch`, an SRCU grace period: workqueue handlers may
//! sleep), cancels the limit work, and unmaps and frees the buffers. A ULP that polls the
//! receive CQ itself must have stopped polling it. An SRQ that cannot be destroyed keeps its
//! buffers (leaked, never freed under a live SRQ).
//!
//! The pool holds a device reference for its whole life, so it may be destroyed after ibext's
//! `remove` (an rdma_cm-driven ULP does so on `RDMA_CM_EVENT_DEVICE_REMOVAL`, which comes after).
//!
//! Lock order: `SrqPool::refs` (mutex) is a leaf, taken in process context only; the limit
//! work calls `ib_modify_srq` under it so that it never touches an SRQ being destroyed.
//! `DeviceState::inner` is taken, alone, only to make the pool's debugfs directory.

use crate::{
    bindings,
    debugfs::{Dir, SeqFile, Show, ShowFile},
    device::DeviceState,
    ib::DeviceRef,
    ledger::{Kind, Token},
    policy::srq_pool::{self as policy, Plan},
    warn::warn_on_once,
};
use core::{
    ffi::c_void,
    fmt::Write,
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
};
use kernel::{
    c_str, error::from_err_ptr, fmt, new_mutex, prelude::*, str::CString, sync::Arc, sync::Mutex,
    types::Opaque,
};

/// The ULP's receive callback (`struct ibext_srq_pool_attr::recv_done`).
pub(crate) type RecvDone =
    unsafe extern "C" fn(*mut bindings::ib_srq, *mut bindings::ib_wc, *mut c_void, *mut c_void);

/// Test-only fault injection: the `n`-th fault point of the next pool creations fails with
/// `-ENOMEM` (0: none). Compiled out of the product module.
#[cfg(ibext_kunit)]
pub(crate) static FAIL_AT: AtomicU32 = AtomicU32::new(0);

/// A step of pool creation that can fail; in the KUnit flavour, [`FAIL_AT`] can make it fail.
fn fault_point() -> Result {
    #[cfg(ibext_kunit)]
    {
        let n = FAIL_AT.load(Ordering::Relaxed);
        if n > 0 {
            FAIL_AT.store(n - 1, Ordering::Relaxed);
            if n == 1 {
                return Err(ENOMEM);
            }
        }
    }
    Ok(())
}

/// `-EOPNOTSUPP`, which `kernel::error::code` lacks on 6.12.
pub(crate) fn eopnotsupp() -> Error {
    Error::from_errno(-(kernel::bindings::EOPNOTSUPP as i32))
}

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// One managed receive buffer.
///
/// # Invariants
///
/// `cqe.done` is [`recv_buf_done`]; `srq` points to the [`Srq`] that owns this buffer; `dma` is
/// 0 or the mapping of `data` for the device, `data.len()` bytes, from the device.
#[repr(C)]
struct RecvBuf {
    cqe: Opaque<bindings::ib_cqe>,
    data: KVec<u8>,
    dma: u64,
    srq: *const Srq,
}

/// One SRQ of a pool, with its buffers and counters.
struct Srq {
    /// The SRQ; null until made.
    raw: *mut bindings::ib_srq,
    pool: *const SrqPool,
    /// kvmalloc'd: a pool may have up to 2^20 buffers per SRQ (see `policy::MAX_POOL_BYTES`).
    bufs: KVVec<RecvBuf>,
    /// Buffers no longer posted: flushed, or their repost failed. The others are posted, or
    /// inside the handler on their way back.
    lost: AtomicU64,
    completions: AtomicU64,
    errors: AtomicU64,
    repost_failures: AtomicU64,
    limit_events: AtomicU64,
    limit_hit: AtomicBool,
}

impl Srq {
    /// Returns whether a QP is still attached to the SRQ (`usecnt`).
    fn attached(&self) -> bool {
        // SAFETY: A non-null `raw` is a live SRQ of the pool (invariant of `SrqPool`).
        !self.raw.is_null() && unsafe { bindings::ibext_shim_srq_in_use(self.raw) }
    }

    fn posted(&self) -> u64 {
        (self.bufs.len() as u64).saturating_sub(self.lost.load(Ordering::Relaxed))
    }
}

/// References of each SRQ, and whether the pool is being destroyed.
struct Refs {
    counts: KVec<u32>,
    dead: bool,
}

/// An SRQ pool.
///
/// # Invariants
///
/// - `dev` is the device of `pd`, which outlives the pool (the ULP's contract), and `state` is
///   ibext's state for it.
/// - After creation `srqs` never changes length, so neither it nor the buffers move; every
///   `raw` SRQ is live until the pool is dropped.
#[pin_data(PinnedDrop)]
pub(crate) struct SrqPool {
    state: Arc<DeviceState>,
    /// Keeps the device from finishing unregistration while the pool exists.
    _dev_ref: DeviceRef,
    dev: NonNull<bindings::ib_device>,
    pd: NonNull<bindings::ib_pd>,
    /// The PD's `local_dma_lkey`, for every receive posted.
    lkey: u32,
    id: u32,
    plan: Plan,
    recv_done: Option<RecvDone>,
    ctx: *mut c_void,
    srqs: KVec<Srq>,
    #[pin]
    refs: Mutex<Refs>,
    #[pin]
    rearm: Opaque<bindings::work_struct>,
    dir: Option<Dir>,
    /// Counted in the device state's live pools (set once made).
    counted: bool,
    #[pin]
    file: ShowFile<SrqPool>,
    _token: Token,
}

// SAFETY: The raw pointers are to ib_core objects usable from any thread; the mutable state is
// atomics or behind `refs`.
unsafe impl Send for SrqPool {}
// SAFETY: As for `Send`.
unsafe impl Sync for SrqPool {}

/// What `ibext_srq_pool_create` was given, checked for null already.
pub(crate) struct CreateArgs {
    pub(crate) req: policy::Request,
    pub(crate) recv_done: Option<RecvDone>,
    pub(crate) ctx: *mut c_void,
}

impl SrqPool {
    /// Makes a pool on `pd` (see `ibext_srq_pool_create`); on error everything made is undone.
    ///
    /// # Safety
    ///
    /// `pd` is a live PD of a registered device, and outlives the pool.
    pub(crate) unsafe fn create(
        pd: NonNull<bindings::ib_pd>,
        args: CreateArgs,
    ) -> Result<*mut Self> {
        // SAFETY: `pd` is live (the caller's guarantee).
        let dev_raw = unsafe { (*pd.as_ptr()).device };
        // SAFETY: The device of a live PD is registered.
        let dev = unsafe { crate::ib::Device::from_raw(dev_raw) };
        let a = dev.attrs();
        let caps = policy::Caps {
            max_srq: u32::try_from(a.max_srq).unwrap_or(0),
            max_srq_wr: u32::try_from(a.max_srq_wr).unwrap_or(0),
            max_srq_sge: u32::try_from(a.max_srq_sge).unwrap_or(0),
            vectors: dev.usable_comp_vectors(),
        };
        let plan = policy::plan(&args.req, &caps).map_err(|r| match r {
            policy::Refusal::Invalid => EINVAL,
            policy::Refusal::NotSupported => eopnotsupp(),
        })?;
        let state = crate::client::device_state(dev).ok_or(ENODEV)?;
        let dev_ref = DeviceRef::try_get(dev).ok_or(ENODEV)?;
        // SAFETY: `pd` is live (the caller's guarantee).
        let lkey = unsafe { (*pd.as_ptr()).local_dma_lkey };
        let n = plan.nr_srqs as usize;
        fault_point()?;
        let srqs = KVec::with_capacity(n, GFP_KERNEL)?;
        fault_point()?;
        let counts = KVec::from_elem(0u32, n, GFP_KERNEL)?;
        fault_point()?;
        let pool = KBox::pin_init(
            pin_init!(Self {
                state,
                _dev_ref: dev_ref,
                dev: NonNull::from(dev).cast(),
                pd,
                lkey,
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                plan,
                recv_done: args.recv_done,
                ctx: args.ctx,
                srqs,
                refs <- new_mutex!(Refs { counts, dead: false }, "SrqPool::refs"),
                // SAFETY: Only initializes the memory it is given.
                rearm <- Opaque::ffi_init(|w| unsafe {
                    crate::ib::init_work!(w, rearm_work, "ibext_srq_pool_rearm")
                }),
                dir: None,
                counted: false,
                file <- ShowFile::new(),
                _token: Token::new(Kind::SrqPool),
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: We never move the pool out of its box; only `srqs`, `counted` and `dir`, which
        // are not structurally pinned, are written below, before anything else can see the pool.
        let raw = KBox::into_raw(unsafe { Pin::into_inner_unchecked(pool) });
        // SAFETY: `raw` came from `KBox::into_raw` just above; this is its only user until it is
        // returned or, on error, given back to a box to be dropped.
        let pool = unsafe { &mut *raw };
        if let Err(e) = pool.build() {
            // SAFETY: As above; `pool` is not used after this. Dropping the box undoes whatever
            // `build` made.
            drop(unsafe { KBox::from_raw(raw) });
            return Err(e);
        }
        pool.state.srq_pool_made();
        pool.counted = true;
        pool.publish_debugfs();
        Ok(raw)
    }

    /// Makes the SRQs, their buffers, and posts them.
    fn build(&mut self) -> Result {
        let me: *const SrqPool = self;
        let dev = self.dev.as_ptr();
        let lkey = self.lkey;
        for i in 0..self.plan.nr_srqs as usize {
            fault_point()?;
            let managed = if self.plan.buf_size > 0 {
                self.plan.srq_size as usize
            } else {
                0
            };
            let bufs = KVVec::with_capacity(managed, GFP_KERNEL)?;
            // Within the capacity reserved in `create`: no allocation, nothing moves.
            self.srqs.push(
                Srq {
                    raw: core::ptr::null_mut(),
                    pool: me,
                    bufs,
                    lost: AtomicU64::new(0),
                    completions: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    repost_failures: AtomicU64::new(0),
                    limit_events: AtomicU64::new(0),
                    limit_hit: AtomicBool::new(false),
                },
                GFP_KERNEL,
            )?;
            let srq = &mut self.srqs[i];
            let srq_ptr: *const Srq = srq;
            for _ in 0..managed {
                fault_point()?;
                let data = KVec::from_elem(0u8, self.plan.buf_size as usize, GFP_KERNEL)?;
                srq.bufs.push(
                    RecvBuf {
                        cqe: Opaque::new(bindings::ib_cqe {
                            done: Some(recv_buf_done),
                        }),
                        data,
                        dma: 0,
                        srq: srq_ptr,
                    },
                    GFP_KERNEL,
                )?;
                let last = srq.bufs.len() - 1;
                let b = &mut srq.bufs[last];
                fault_point()?;
                // SAFETY: `dev` is registered; `data` is kmalloc'd, `len()` bytes, and stays
                // mapped until `drop` unmaps it.
                b.dma = unsafe {
                    bindings::ibext_shim_dma_map_from_device(
                        dev,
                        b.data.as_mut_ptr().cast(),
                        b.data.len(),
                    )
                };
                if b.dma == 0 {
                    return Err(ENOMEM);
                }
            }
            fault_point()?;
            // SAFETY: The PD is live; `srq_event` is given the `Srq`, which outlives the SRQ.
            let made = unsafe {
                bindings::ibext_shim_create_srq(
                    self.pd.as_ptr(),
                    self.plan.srq_size,
                    self.plan.max_sge,
                    self.plan.limit,
                    Some(srq_event),
                    srq_ptr.cast_mut().cast(),
                )
            };
            srq.raw = from_err_ptr(made)?;
            for b in srq.bufs.iter() {
                fault_point()?;
                // SAFETY: The SRQ is live; the buffer is mapped and outlives the SRQ.
                let r = unsafe {
                    bindings::ibext_shim_post_srq_recv(
                        srq.raw,
                        b.cqe.get(),
                        b.dma,
                        b.data.len() as u32,
                        lkey,
                    )
                };
                if r != 0 {
                    return Err(Error::from_errno(r));
                }
            }
            if self.plan.limit > 0 {
                // Armed again now that receives are posted: mlx4 and mlx5 ignore `srq_limit` at
                // create (mlx5/srq.c, mlx4/srq.c), only `modify_srq` with `IB_SRQ_LIMIT` arms
                // it. A device without `modify_srq` keeps what create armed.
                // SAFETY: The SRQ is live.
                let r = unsafe { bindings::ibext_shim_arm_srq_limit(srq.raw, self.plan.limit) };
                if r != 0 && r != eopnotsupp().to_errno() {
                    return Err(Error::from_errno(r));
                }
            }
        }
        Ok(())
    }

    /// Makes `srq_pool.<id>/stats` in the device's debugfs directory.
    fn publish_debugfs(&mut self) {
        let Ok(name) = CString::try_from_fmt(fmt!("srq_pool.{}", self.id)) else {
            return;
        };
        let Some(dir) = self.state.new_subdir(&name) else {
            return;
        };
        // SAFETY: The pool is pinned in its box; the file is removed with `dir`, which `drop`
        // drops first.
        unsafe { Pin::new_unchecked(&self.file).create(c_str!("stats"), &dir, &*self) };
        self.dir = Some(dir);
    }

    /// Takes a reference to an SRQ for a QP on completion vector `hint`.
    pub(crate) fn get(&self, hint: i32) -> Result<*mut bindings::ib_srq> {
        let mut refs = self.refs.lock();
        if refs.dead {
            return Err(ENODEV);
        }
        let i = policy::choose(&refs.counts, self.state.comp_vectors(), hint).ok_or(EINVAL)?;
        refs.counts[i] += 1;
        Ok(self.srqs[i].raw)
    }

    /// Drops a reference taken by [`SrqPool::get`]; a caller bug warns once and changes nothing.
    pub(crate) fn put(&self, srq: *mut bindings::ib_srq) {
        let mut refs = self.refs.lock();
        let Some(i) = self.srqs.iter().position(|s| s.raw == srq) else {
            drop(refs);
            warn_on_once!(true, "ibext_srq_pool_put: SRQ not of this pool");
            return;
        };
        if warn_on_once!(
            refs.counts[i] == 0,
            "ibext_srq_pool_put: more puts than gets"
        ) {
            return;
        }
        refs.counts[i] -= 1;
    }

    /// Marks the pool dead if no SRQ has references; the caller then drops it.
    pub(crate) fn retire(&self) -> Result {
        let mut refs = self.refs.lock();
        if refs.counts.iter().any(|&c| c > 0) {
            return Err(EBUSY);
        }
        // A QP made with an SRQ but whose reference was put back early: destroying the SRQ
        // would fail, and freeing its buffers would free memory the device may still write.
        if self.srqs.iter().any(Srq::attached) {
            return Err(EBUSY);
        }
        refs.dead = true;
        Ok(())
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

    /// Returns the SRQs.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn srq(&self, i: usize) -> Option<*mut bindings::ib_srq> {
        self.srqs.get(i).map(|s| s.raw)
    }

    /// Returns the managed buffers posted (or on their way back to the SRQ), over all SRQs.
    pub(crate) fn posted(&self) -> u64 {
        self.srqs.iter().map(Srq::posted).sum()
    }

    /// Returns the bytes of receive buffer memory the pool holds.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.srqs
            .iter()
            .flat_map(|s| s.bufs.iter())
            .map(|b| b.data.capacity() as u64)
            .sum()
    }

    /// Returns the SRQ limit events seen, over all SRQs.
    pub(crate) fn limit_events(&self) -> u64 {
        self.srqs
            .iter()
            .map(|s| s.limit_events.load(Ordering::Relaxed))
            .sum()
    }

    /// Returns the successful receive completions handled, over all SRQs.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn completions(&self) -> u64 {
        self.srqs
            .iter()
            .map(|s| s.completions.load(Ordering::Relaxed))
            .sum()
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
/// `self.0` came from [`SrqPool::create`] and is owned by this value.
pub(crate) struct OwnedSrqPool(NonNull<SrqPool>);

// SAFETY: The pool may be used and destroyed from any thread (`SrqPool` is `Send + Sync`).
unsafe impl Send for OwnedSrqPool {}
// SAFETY: As for `Send`.
unsafe impl Sync for OwnedSrqPool {}

#[cfg_attr(
    not(ibext_kunit),
    expect(dead_code, reason = "the crate's tests are its only Rust users so far")
)]
impl OwnedSrqPool {
    /// Makes a pool on `pd` (see `ibext_srq_pool_create`).
    ///
    /// # Safety
    ///
    /// `pd` is a live PD of a registered device and outlives the returned value.
    pub(crate) unsafe fn new(pd: NonNull<bindings::ib_pd>, args: CreateArgs) -> Result<Self> {
        // SAFETY: The caller's guarantee.
        let p = unsafe { SrqPool::create(pd, args) }?;
        // INVARIANT: made just above, owned by nobody else.
        NonNull::new(p).map(OwnedSrqPool).ok_or(ENOMEM)
    }

    /// Returns the pool.
    pub(crate) fn pool(&self) -> &SrqPool {
        // SAFETY: Owned and alive until drop (type invariant).
        unsafe { self.0.as_ref() }
    }

    /// Takes a reference to an SRQ for a QP on completion vector `hint`.
    pub(crate) fn get(&self, hint: i32) -> Result<SrqRef<'_>> {
        let srq = self.pool().get(hint)?;
        Ok(SrqRef {
            pool: self.pool(),
            srq,
        })
    }
}

impl Drop for OwnedSrqPool {
    fn drop(&mut self) {
        // No `SrqRef` outlives the borrow it holds of `self`, so no SRQ has references.
        if warn_on_once!(
            self.pool().retire().is_err(),
            "ibext: an owned SRQ pool still referenced"
        ) {
            return;
        }
        // SAFETY: The pool came from `KBox::into_raw` in `SrqPool::create` (type invariant) and
        // is dead now.
        drop(unsafe { KBox::from_raw(self.0.as_ptr()) });
    }
}

/// A reference to one SRQ of a pool, put back when dropped.
pub(crate) struct SrqRef<'a> {
    pool: &'a SrqPool,
    srq: *mut bindings::ib_srq,
}

#[cfg_attr(
    not(ibext_kunit),
    expect(dead_code, reason = "the crate's tests are its only Rust users so far")
)]
impl SrqRef<'_> {
    /// Returns the SRQ, for `ib_qp_init_attr.srq`.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_srq {
        self.srq
    }
}

impl Drop for SrqRef<'_> {
    fn drop(&mut self) {
        self.pool.put(self.srq);
    }
}

#[pinned_drop]
impl PinnedDrop for SrqPool {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: Nothing below moves the pool; `srqs` and `dir` are not structurally pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // The file reads the SRQs: it goes first (removal waits for readers).
        drop(this.dir.take());
        this.refs.lock().dead = true;
        let mut any = false;
        for s in this.srqs.iter_mut() {
            if !s.raw.is_null() {
                // SAFETY: A live SRQ of the pool (invariant); no QP uses it any more (the
                // references are 0 and `usecnt` was 0 in `retire`, or it was never handed out).
                let r = unsafe { bindings::ib_destroy_srq_user(s.raw, core::ptr::null_mut()) };
                if warn_on_once!(r != 0, "ibext: destroying a pooled SRQ failed") {
                    // The device may still write the posted buffers: never free them.
                    core::mem::forget(core::mem::replace(&mut s.bufs, KVVec::new()));
                }
                s.raw = core::ptr::null_mut();
                any = true;
            }
        }
        if any && this.plan.buf_size > 0 {
            // Handlers ibext's engine is running (softirq or workqueue, possibly sleeping)
            // return before this does.
            crate::cq_engine::wait_for_dispatch();
        }
        // SAFETY: `rearm` is initialized; `dead` keeps a late run from touching any SRQ.
        unsafe { bindings::cancel_work_sync(this.rearm.get()) };
        let dev = this.dev.as_ptr();
        for s in this.srqs.iter() {
            for b in s.bufs.iter().filter(|b| b.dma != 0) {
                // SAFETY: Mapped in `build` with the same length; the SRQ is gone, so the
                // device no longer writes it.
                unsafe { bindings::ibext_shim_dma_unmap_from_device(dev, b.dma, b.data.len()) };
            }
        }
        if this.counted {
            this.state.srq_pool_gone();
        }
    }
}

/// The `done` of every managed receive buffer.
///
/// # Safety
///
/// Called by a CQ poller only, with a completion of a receive posted by [`SrqPool::build`] or
/// by this function, while its pool is alive.
unsafe extern "C" fn recv_buf_done(_cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `wc` is valid for the call; its `wr_cqe` is the `cqe` (first field, `repr(C)`) of
    // a live `RecvBuf`.
    let (wc_ref, b) = unsafe {
        let wc_ref = &*wc;
        (wc_ref, &*wc_ref.__bindgen_anon_1.wr_cqe.cast::<RecvBuf>())
    };
    // SAFETY: A buffer's `srq` and the `Srq`'s `pool` outlive every posted receive.
    let (srq, pool) = unsafe { (&*b.srq, &*(*b.srq).pool) };
    let dev = pool.dev.as_ptr();
    let len = b.data.len();
    if wc_ref.status == bindings::ib_wc_status_IB_WC_SUCCESS {
        srq.completions.fetch_add(1, Ordering::Relaxed);
        // SAFETY: The buffer is mapped for `len` bytes (invariant of `RecvBuf`).
        unsafe { bindings::ibext_shim_dma_sync_for_cpu(dev, b.dma, len) };
        if let Some(f) = pool.recv_done {
            // SAFETY: The ULP's callback, with the SRQ, the completion, the buffer (not posted
            // while the callback runs) and the ULP's context.
            unsafe { f(srq.raw, wc, b.data.as_ptr().cast_mut().cast(), pool.ctx) };
        }
        // SAFETY: As above.
        unsafe { bindings::ibext_shim_dma_sync_for_device(dev, b.dma, len) };
    } else {
        srq.errors.fetch_add(1, Ordering::Relaxed);
        if wc_ref.status == bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR {
            srq.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    // SAFETY: The SRQ is live while its pool is, and the buffer stays mapped.
    let r = unsafe {
        bindings::ibext_shim_post_srq_recv(srq.raw, b.cqe.get(), b.dma, len as u32, pool.lkey)
    };
    if r != 0 {
        srq.lost.fetch_add(1, Ordering::Relaxed);
        srq.repost_failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// The SRQs' event handler.
///
/// # Safety
///
/// Called by the driver only, for an SRQ made by [`SrqPool::build`], with its `Srq` as context.
unsafe extern "C" fn srq_event(ev: *mut bindings::ib_event, ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Srq`, which outlives its SRQ; the event is valid for the call.
    let (srq, ev) = unsafe { (&*ctx.cast::<Srq>(), &*ev) };
    if ev.event == bindings::ib_event_type_IB_EVENT_SRQ_LIMIT_REACHED {
        srq.limit_events.fetch_add(1, Ordering::Relaxed);
        srq.limit_hit.store(true, Ordering::Release);
        // SAFETY: The pool outlives its SRQs; `rearm` is initialized and cancelled before the
        // pool is freed. Events may come in atomic context: the work re-arms.
        unsafe { bindings::ibext_shim_queue_work_unbound((*srq.pool).rearm.get()) };
    } else {
        srq.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Re-arms the limit of every SRQ whose limit was reached (`ib_modify_srq` may sleep).
///
/// # Safety
///
/// Called by the workqueue only, for the `rearm` of a live pool.
unsafe extern "C" fn rearm_work(w: *mut bindings::work_struct) {
    // SAFETY: `w` is the `rearm` field of a live pool: `drop` cancels it before freeing.
    let pool = unsafe { &*kernel::container_of!(w, SrqPool, rearm) };
    let refs = pool.refs.lock();
    if refs.dead {
        return;
    }
    for s in pool.srqs.iter() {
        if s.limit_hit.swap(false, Ordering::AcqRel) && !s.raw.is_null() {
            // SAFETY: The SRQ is live: the pool is not dead, and `drop` marks it dead under this
            // lock before destroying any SRQ.
            let r = unsafe { bindings::ibext_shim_arm_srq_limit(s.raw, pool.plan.limit) };
            if r != 0 {
                // Not re-armed: no more limit events from this SRQ; visible as an error.
                s.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    drop(refs);
}

impl Show for SrqPool {
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        let p = self.plan;
        writeln!(
            m,
            "srqs {} srq_size {} max_sge {} buf_size {} limit {}",
            p.nr_srqs, p.srq_size, p.max_sge, p.buf_size, p.limit
        )?;
        writeln!(
            m,
            "posted {} receive_bytes {} limit_events {}",
            self.posted(),
            self.buffer_bytes(),
            self.limit_events()
        )?;
        let refs = self.refs.lock();
        for (i, s) in self.srqs.iter().enumerate() {
            writeln!(
                m,
                "srq {} refs {} posted {} completions {} errors {} repost_failures {} limit_events {}",
                i,
                refs.counts.get(i).copied().unwrap_or(0),
                s.posted(),
                s.completions.load(Ordering::Relaxed),
                s.errors.load(Ordering::Relaxed),
                s.repost_failures.load(Ordering::Relaxed),
                s.limit_events.load(Ordering::Relaxed)
            )?;
        }
        Ok(())
    }
}
