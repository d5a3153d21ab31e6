// SPDX-License-Identifier: GPL-2.0

//! The C entry points of `include/rdma/ibext.h`, which the shim exports with
//! `EXPORT_SYMBOL_GPL`.
//!
//! Each converts the raw pointers it is given under a `// SAFETY:` comment naming the C
//! contract, calls the safe function (`api.rs`, the feature files), and turns its `Result` into
//! an errno or `ERR_PTR` in one place.
//!
//! About 470 lines: one short function per C entry point (18), each with its contract.

use crate::{
    api,
    backport::bug::warn_on_once,
    bindings,
    device::DeviceState,
    engine::{PollCtx, PooledCq},
    ib::verbs::Pd,
    ib::{
        cq::{CqPtr, UlpCq},
        gid::NdevPtr,
        Device,
    },
    legacy_dim, policy,
    policy::{gid_index::GidKey, moderation::Moderation},
    recv_srq::{UlpPressure, UlpRecvDone},
    srq_pool::{self, SrqPool},
};
use core::ptr::NonNull;
use kernel::{
    ffi::{c_int, c_uint},
    prelude::*,
};

/// Returns `ERR_PTR(e)`.
fn err_ptr<T>(e: Error) -> *mut T {
    // `ERR_PTR`: the negative errno as an address, never dereferenced.
    e.to_errno() as isize as *mut T
}

/// The checks of `ibext_cq_pool_get*`, then the get; `moderation` is the attribute's mode, or
/// `None` for `ibext_cq_pool_get()`'s default (`api::default_moderation`).
fn cq_pool_get(
    dev: *mut bindings::ib_device,
    nr_cqe: c_uint,
    hint: c_int,
    poll_ctx: bindings::ib_poll_context,
    moderation: Option<bindings::ibext_moderation>,
) -> Result<CqPtr> {
    if dev.is_null() {
        return Err(EINVAL);
    }
    let ctx = PollCtx::from_raw(poll_ctx)?;
    // SAFETY: A non-null `dev` from a ULP is a registered device it may use (the C contract).
    let dev = unsafe { Device::from_raw(dev) };
    let moderation = match moderation {
        Some(m) => Moderation::from_raw(m).ok_or(EINVAL)?,
        None => api::default_moderation(dev),
    };
    api::cq_pool_get(dev, nr_cqe, hint, ctx, moderation)
}

/// C entry point of `ibext_cq_pool_get()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `dev` is null or a registered device the caller may use.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_cq_pool_get(
    dev: *mut bindings::ib_device,
    nr_cqe: c_uint,
    comp_vector_hint: c_int,
    poll_ctx: bindings::ib_poll_context,
) -> *mut bindings::ib_cq {
    match cq_pool_get(dev, nr_cqe, comp_vector_hint, poll_ctx, None) {
        Ok(cq) => cq.as_raw(),
        Err(e) => err_ptr(e),
    }
}

/// C entry point of `ibext_cq_pool_get_attr()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `dev` is null or a registered device the caller may use; `attr` is null or valid for reads.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_cq_pool_get_attr(
    dev: *mut bindings::ib_device,
    attr: *const bindings::ibext_cq_attr,
) -> *mut bindings::ib_cq {
    // SAFETY: `attr` is null or valid for reads (the C contract).
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return err_ptr(EINVAL);
    };
    match cq_pool_get(
        dev,
        a.nr_cqe,
        a.comp_vector_hint,
        a.poll_ctx,
        Some(a.moderation),
    ) {
        Ok(cq) => cq.as_raw(),
        Err(e) => err_ptr(e),
    }
}

/// C entry point of `ibext_cq_pool_put()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a CQ the caller may use.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_cq_pool_put(cq: *mut bindings::ib_cq, nr_cqe: c_uint) {
    if warn_on_once!(cq.is_null(), "ibext_cq_pool_put: NULL CQ") {
        return;
    }
    // The CQ leads back to its state, also after ibext's `remove` (rdma_cm-driven ULPs put
    // their CQs back when rdma_cm, removed after ibext, tells them the device is going).
    // SAFETY: `cq` is a live CQ the caller holds `nr_cqe` entries on (the C contract), until
    // this call returns.
    let Some(engine) = (unsafe { PooledCq::of_cq(cq) }) else {
        warn_on_once!(true, "ibext_cq_pool_put: not a CQ from ibext's pool");
        return;
    };
    // SAFETY: Pooled CQs are made only by `CqPools::get` with the `as_owner()` of the state
    // whose pools hold them, and the state outlives its CQs.
    let Some(state) = (unsafe { engine.owner().cast::<DeviceState>().as_ref() }) else {
        return;
    };
    let Some(cq) = CqPtr::from_raw(cq) else {
        return;
    };
    // The returned reference, if any, is dropped after the state's last use here.
    drop(state.cq_put(cq, nr_cqe));
}

/// The checks of `ibext_find_gid*`, then the lookup; the C return value (a referenced entry or
/// an `ERR_PTR`). Inlined into both entry points: at a few entries the lookup is ib_core's own
/// scan, and every instruction around it shows in the ratio to calling ib_core directly.
#[inline(always)]
fn find_gid(
    dev: *mut bindings::ib_device,
    gid: *const bindings::ib_gid,
    gid_type: bindings::ib_gid_type,
    port: Option<u32>,
    ndev: *mut bindings::net_device,
) -> *const bindings::ib_gid_attr {
    let einval = || err_ptr::<bindings::ib_gid_attr>(EINVAL).cast_const();
    if dev.is_null() || gid.is_null() || gid_type >= bindings::ib_gid_type_IB_GID_TYPE_SIZE {
        return einval();
    }
    // SAFETY: A non-null `dev` from a caller is a registered device it may use (the C contract).
    let dev = unsafe { Device::from_raw(dev) };
    if let Some(p) = port {
        if !dev.port_valid(p) {
            return einval();
        }
    }
    if crate::gid_index::core_scan_cheaper(dev) {
        // A small table: ib_core's own scan, with the caller's arguments as they are
        // (`api::gid_find` makes the same choice for Rust callers); its result is ours.
        // SAFETY: `dev` is registered, `gid` valid for reads (the C contract); `ndev` is only
        // compared.
        return unsafe {
            match port {
                Some(p) => bindings::rdma_find_gid_by_port(dev.as_raw(), gid, gid_type, p, ndev),
                None => bindings::rdma_find_gid(dev.as_raw(), gid, gid_type, ndev),
            }
        };
    }
    // SAFETY: `gid` is valid for reads (the C contract).
    unsafe { find_gid_hashed(dev, gid, gid_type, port, ndev) }
}

/// The hashed lookup of [`find_gid`], out of line so that the entry points' path to ib_core's
/// scan needs no stack frame (it ends in a tail call).
///
/// # Safety
///
/// `gid` is valid for reads.
#[inline(never)]
unsafe fn find_gid_hashed(
    dev: &Device,
    gid: *const bindings::ib_gid,
    gid_type: bindings::ib_gid_type,
    port: Option<u32>,
    ndev: *mut bindings::net_device,
) -> *const bindings::ib_gid_attr {
    let key = GidKey {
        // SAFETY: `gid` is valid for reads (the caller's contract); any bit pattern is a valid
        // array.
        gid: unsafe { (*gid).raw },
        gid_type,
    };
    match api::gid_find_hashed(dev, &key, port, NdevPtr::from_raw(ndev)) {
        Ok(attr) => attr.into_raw(),
        Err(e) => err_ptr::<bindings::ib_gid_attr>(e).cast_const(),
    }
}

/// C entry point of `ibext_find_gid()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `dev` is null or a registered device the caller may use; `gid` is null or valid for reads;
/// `ndev` is only compared.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_find_gid(
    dev: *mut bindings::ib_device,
    gid: *const bindings::ib_gid,
    gid_type: bindings::ib_gid_type,
    ndev: *mut bindings::net_device,
) -> *const bindings::ib_gid_attr {
    find_gid(dev, gid, gid_type, None, ndev)
}

/// C entry point of `ibext_find_gid_by_port()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// As for [`ibext_find_gid`].
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_find_gid_by_port(
    dev: *mut bindings::ib_device,
    gid: *const bindings::ib_gid,
    gid_type: bindings::ib_gid_type,
    port: u32,
    ndev: *mut bindings::net_device,
) -> *const bindings::ib_gid_attr {
    find_gid(dev, gid, gid_type, Some(port), ndev)
}

/// C entry point of `ibext_srq_pool_create()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pd` is null or a live PD of a registered device that outlives the pool; `attr` is null or
/// valid for reads.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_create(
    pd: *mut bindings::ib_pd,
    attr: *const bindings::ibext_srq_pool_attr,
) -> *mut bindings::ibext_srq_pool {
    // SAFETY: `attr` is null or valid for reads (the C contract).
    let (Some(pd), Some(a)) = (NonNull::new(pd), unsafe { attr.as_ref() }) else {
        return err_ptr(EINVAL);
    };
    let args = srq_pool::CreateArgs {
        req: policy::srq_pool::Request {
            nr_srqs: a.nr_srqs,
            srq_size: a.srq_size,
            max_sge: a.max_sge,
            buf_size: a.buf_size,
            has_recv_done: a.recv_done.is_some(),
            max_srq_size: a.max_srq_size,
        },
        // SAFETY: The C contract: the callback may be called with the pool's SRQs, their
        // completions and buffers and `ctx` until the pool is destroyed.
        recv_done: a.recv_done.map(|f| unsafe { UlpRecvDone::new(f, a.ctx) }),
        // SAFETY: The C contract: the callback may be called in process context with the
        // pool's SRQs and `ctx` until the pool is destroyed.
        pressure: a.pressure.map(|f| unsafe { UlpPressure::new(f, a.ctx) }),
    };
    // SAFETY: `pd` is live and outlives the pool (the C contract).
    let pd = unsafe { Pd::from_raw(pd.as_ptr()) };
    match SrqPool::create(pd, args) {
        Ok(p) => KBox::into_raw(p).cast(),
        Err(e) => err_ptr(e),
    }
}

/// Returns the pool behind a C handle.
///
/// # Safety
///
/// `pool` is null or a pool from `ibext_srq_pool_create` not yet destroyed.
unsafe fn srq_pool<'a>(pool: *mut bindings::ibext_srq_pool) -> Option<&'a SrqPool> {
    // SAFETY: The caller's guarantee; the handle is the pool itself.
    unsafe { pool.cast::<SrqPool>().as_ref() }
}

/// C entry point of `ibext_srq_pool_get()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_get(
    pool: *mut bindings::ibext_srq_pool,
    comp_vector_hint: c_int,
) -> *mut bindings::ib_srq {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return err_ptr(EINVAL);
    };
    match pool.get(comp_vector_hint) {
        Ok(srq) => srq.as_raw(),
        Err(e) => err_ptr(e),
    }
}

/// C entry point of `ibext_srq_pool_put()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_put(
    pool: *mut bindings::ibext_srq_pool,
    srq: *mut bindings::ib_srq,
) {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        warn_on_once!(true, "ibext_srq_pool_put: NULL pool");
        return;
    };
    pool.put(srq.cast_const().cast());
}

/// C entry point of `ibext_srq_pool_nr_srqs()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_nr_srqs(
    pool: *mut bindings::ibext_srq_pool,
) -> c_uint {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return 0;
    };
    c_uint::try_from(pool.nr_srqs()).unwrap_or(0)
}

/// C entry point of `ibext_srq_pool_srq()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_srq(
    pool: *mut bindings::ibext_srq_pool,
    index: c_uint,
) -> *mut bindings::ib_srq {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return err_ptr(EINVAL);
    };
    match pool.srq(index as usize) {
        Some(srq) => srq.as_raw(),
        None => err_ptr(EINVAL),
    }
}

/// C entry point of `ibext_srq_pool_set_srq_ctx()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed; `ctx` is never dereferenced.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_set_srq_ctx(
    pool: *mut bindings::ibext_srq_pool,
    index: c_uint,
    ctx: *mut core::ffi::c_void,
) -> c_int {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return EINVAL.to_errno();
    };
    match pool.set_srq_ctx(index as usize, ctx) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// C entry point of `ibext_srq_pool_srq_ctx()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed; `srq` is only compared.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_srq_ctx(
    pool: *mut bindings::ibext_srq_pool,
    srq: *mut bindings::ib_srq,
) -> *mut core::ffi::c_void {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return core::ptr::null_mut();
    };
    pool.srq_ctx(srq.cast_const().cast())
        .unwrap_or(core::ptr::null_mut())
}

/// C entry point of `ibext_srq_pool_set_posted()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed; `srq` is only compared.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_set_posted(
    pool: *mut bindings::ibext_srq_pool,
    srq: *mut bindings::ib_srq,
    posted: c_uint,
) -> c_int {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return EINVAL.to_errno();
    };
    match pool.set_owner_posted(srq.cast_const().cast(), posted) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// C entry point of `ibext_srq_pool_repost()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed; `cqe` is only compared.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_repost(
    pool: *mut bindings::ibext_srq_pool,
    cqe: *mut bindings::ib_cqe,
) -> c_int {
    // SAFETY: The C contract.
    let Some(pool) = (unsafe { srq_pool(pool) }) else {
        return EINVAL.to_errno();
    };
    match pool.repost(cqe.cast_const().cast()) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// C entry point of `ibext_srq_pool_destroy()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `pool` is null or a pool not yet destroyed; after a 0 return it is gone.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_srq_pool_destroy(
    pool: *mut bindings::ibext_srq_pool,
) -> c_int {
    if pool.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The C contract: a live pool.
    let p = unsafe { &*pool.cast::<SrqPool>() };
    if let Err(e) = p.retire() {
        return e.to_errno();
    }
    // SAFETY: The pool came from `KBox::into_raw` in `ibext_srq_pool_create`, is dead now, and the
    // caller gives up its handle with this call.
    drop(unsafe { KBox::from_raw(pool.cast::<SrqPool>()) });
    0
}

/// C entry point of `ibext_dim_attach()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a live CQ the caller owns.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_dim_attach(cq: *mut bindings::ib_cq) -> c_int {
    if cq.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: `cq` is a live CQ the caller owns (the C contract).
    match legacy_dim::attach(unsafe { UlpCq::from_raw(cq) }) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// C entry point of `ibext_dim_sample()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a live CQ; not called concurrently with `ibext_dim_detach` on it.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_dim_sample(cq: *mut bindings::ib_cq, ncompleted: c_uint) {
    if warn_on_once!(cq.is_null(), "ibext_dim_sample: NULL CQ") {
        return;
    }
    // SAFETY: The C contract.
    legacy_dim::sample(unsafe { UlpCq::from_raw(cq) }, ncompleted);
}

/// C entry point of `ibext_dim_detach()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a live CQ whose sampling has stopped.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_dim_detach(cq: *mut bindings::ib_cq) {
    if warn_on_once!(cq.is_null(), "ibext_dim_detach: NULL CQ") {
        return;
    }
    // SAFETY: The C contract.
    legacy_dim::detach(unsafe { UlpCq::from_raw(cq) });
}

/// C entry point of `ibext_dim_arm()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a live CQ; not called concurrently with `ibext_dim_detach` on it.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_dim_arm(cq: *mut bindings::ib_cq, flags: c_uint) -> c_int {
    if cq.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The C contract.
    match legacy_dim::arm(unsafe { UlpCq::from_raw(cq) }, flags) {
        Ok(r) => r,
        Err(e) => e.to_errno(),
    }
}

/// C entry point of `ibext_dim_poll_done()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a live CQ; not called concurrently with `ibext_dim_detach` on it.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_dim_poll_done(
    cq: *mut bindings::ib_cq,
    ncompleted: c_uint,
    flags: c_uint,
) -> c_int {
    if cq.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The C contract.
    match legacy_dim::poll_done(unsafe { UlpCq::from_raw(cq) }, ncompleted, flags) {
        Ok(r) => r,
        Err(e) => e.to_errno(),
    }
}

/// C entry point of `ibext_dim_profile()`; see `include/rdma/ibext.h`.
///
/// # Safety
///
/// `cq` is null or a live CQ; `usec` and `comps` are null or valid for writes.
#[no_mangle]
pub(crate) unsafe extern "C" fn ibext_dim_profile(
    cq: *mut bindings::ib_cq,
    usec: *mut c_uint,
    comps: *mut c_uint,
) -> c_int {
    if cq.is_null() || usec.is_null() || comps.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: `cq` is live (the C contract).
    match legacy_dim::profile(unsafe { UlpCq::from_raw(cq) }) {
        Ok((u, c)) => {
            // SAFETY: Both are valid for writes (the C contract).
            unsafe {
                usec.write(u.into());
                comps.write(c.into());
            }
            0
        }
        Err(e) => e.to_errno(),
    }
}
