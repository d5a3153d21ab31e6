// SPDX-License-Identifier: GPL-2.0

//! DIM for legacy ULPs: CQs a ULP made itself with `ib_create_cq` and polls itself.
//!
//! The ULP attaches ibext's DIM to its CQ, calls [`sample`] after each of its poll loops (as the
//! RDS patch called `rdma_dim()`), and detaches before it destroys the CQ. ibext runs the
//! kernel's `rdma_dim()` on the samples; a new profile goes to the device's `modify_cq` where it
//! has one, and otherwise is kept for the ULP to read with `ibext_dim_profile()`, so that it can
//! defer its own re-arm.
//!
//! The DIM state hangs off the CQ's own `dim` pointer, which ib_core uses only for the CQs it
//! allocates itself (`ib_alloc_cq` on devices with `use_cq_dim`). ibext's state is recognised
//! by its `priv`, which points back to the state itself.

use crate::{
    bindings, dim,
    ib::Device,
    ledger::{Kind, Token},
    policy::moderation,
    warn::warn_on_once,
};
use core::{
    marker::PhantomPinned,
    pin::Pin,
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering},
};
use kernel::prelude::*;
use kernel::types::Opaque;

/// The lockdep class of legacy CQs' DIM work.
static LEGACY_DIM_CLASS: crate::ib::LockClass = crate::ib::LockClass::new();

/// ibext's DIM state for one legacy CQ.
///
/// # Invariants
///
/// While attached, `dim.priv` points to this `LegacyDim`, the CQ's `dim` points to `dim`, and
/// the CQ is alive (the ULP detaches before destroying it).
#[pin_data]
struct LegacyDim {
    #[pin]
    dim: Opaque<bindings::dim>,
    cq: *mut bindings::ib_cq,
    /// The device applies profiles itself: it has `modify_cq`, and took the last profile.
    hw_moderation: AtomicBool,
    samples: AtomicU64,
    profile_changes: AtomicU64,
    _token: Token,
    #[pin]
    _pin: PhantomPinned,
}

impl LegacyDim {
    /// lib/dim's work: a new profile was chosen; apply it.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, with the `work` of a `LegacyDim`'s `dim`.
    unsafe extern "C" fn work_fn(work: *mut bindings::work_struct) {
        // SAFETY: `work` is the `work` field of the `dim` field of a live `LegacyDim`: the
        // work is cancelled before the state is freed.
        let this = unsafe { &*kernel::container_of!(dim::dim_of_work(work), Self, dim) };
        // SAFETY: The CQ is alive while attached (type invariant).
        let (_, applied) = unsafe { dim::apply_profile(&this.dim, this.cq) };
        this.hw_moderation
            .store(applied.in_hardware(), Ordering::Release);
        this.profile_changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// The CQ's `dim` pointer, as an atomic.
///
/// # Safety
///
/// `cq` is a live CQ.
unsafe fn dim_slot<'a>(cq: *mut bindings::ib_cq) -> &'a AtomicPtr<bindings::dim> {
    // SAFETY: `dim` is a pointer-sized, aligned field of the live CQ; ib_core does not touch it
    // for CQs it did not allocate with DIM, and ibext only changes it atomically.
    unsafe { AtomicPtr::from_ptr(core::ptr::addr_of_mut!((*cq).dim)) }
}

/// Returns ibext's state behind `cq`, or `None` if the CQ has none (or has ib_core's).
///
/// # Safety
///
/// `cq` is a live CQ.
unsafe fn state_of<'a>(cq: *mut bindings::ib_cq) -> Option<&'a LegacyDim> {
    // SAFETY: Caller contract.
    let dim = unsafe { dim_slot(cq) }.load(Ordering::Acquire);
    let dim = NonNull::new(dim)?;
    // SAFETY: A non-null `dim` is a live `struct dim`, ibext's or ib_core's; `priv` is a plain
    // pointer field of both.
    let owner = unsafe { (*dim.as_ptr()).priv_ };
    // ib_core's `rdma_dim_init` (drivers/infiniband/core/cq.c) sets `priv` to the CQ; ibext sets
    // it to its `LegacyDim`. Only ibext's is followed, so `container_of` is never applied to a
    // `struct dim` that is not inside a `LegacyDim`.
    if owner.is_null() || owner == cq.cast() {
        return None;
    }
    let this = owner.cast::<LegacyDim>().cast_const();
    // SAFETY: Not ib_core's, so ibext's: a live `LegacyDim` until detached (type invariant).
    let this = unsafe { &*this };
    (this.dim.get() == dim.as_ptr()).then_some(this)
}

/// Attaches ibext's DIM to `cq` (see `ibext_dim_attach`).
///
/// # Safety
///
/// `cq` is a live CQ the caller owns.
pub(crate) unsafe fn attach(cq: *mut bindings::ib_cq) -> Result {
    // SAFETY: Caller contract.
    let (dev, pooled) = unsafe {
        (
            Device::from_raw((*cq).device),
            bindings::ibext_shim_cq_is_pooled(cq),
        )
    };
    // SAFETY: Caller contract.
    let polled_by_core = unsafe { bindings::ibext_shim_cq_polled_by_core(cq) };
    if pooled || polled_by_core {
        // ibext's own CQs are moderated by their pool's mode; ib_core polls the CQs of
        // `ib_alloc_cq` itself, and would feed its own DIM (or none) concurrently with ours.
        return Err(EINVAL);
    }
    // SAFETY: Caller contract.
    if !unsafe { dim_slot(cq) }.load(Ordering::Acquire).is_null() {
        return Err(EBUSY);
    }
    let state = KBox::pin_init(
        pin_init!(LegacyDim {
            dim <- dim::new_dim(LegacyDim::work_fn, c"ibext_legacy_dim", &LEGACY_DIM_CLASS),
            cq,
            hw_moderation: AtomicBool::new(dev.has_modify_cq()),
            samples: AtomicU64::new(0),
            profile_changes: AtomicU64::new(0),
            _token: Token::new(Kind::LegacyDim),
            _pin: PhantomPinned,
        }),
        GFP_KERNEL,
    )?;
    // SAFETY: The state is never moved: from here on it is reached through `raw` only, and
    // freed in place by `detach` (or below).
    let raw = KBox::into_raw(unsafe { Pin::into_inner_unchecked(state) });
    // SAFETY: `raw` is the live state; its `dim` is initialized.
    let dim = unsafe {
        let dim = (*raw).dim.get();
        (*dim).priv_ = raw.cast();
        dim
    };
    // SAFETY: Caller contract.
    let slot = unsafe { dim_slot(cq) };
    if slot
        .compare_exchange(
            core::ptr::null_mut(),
            dim,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another attach won the race.
        // SAFETY: `raw` came from `KBox::into_raw` above and was never published.
        drop(unsafe { KBox::from_raw(raw) });
        return Err(EBUSY);
    }
    // INVARIANT: published: the CQ's `dim` points to the state, whose `priv` points back.
    Ok(())
}

/// Feeds one sample (see `ibext_dim_sample`).
///
/// # Safety
///
/// `cq` is a live CQ; the caller does not detach concurrently.
pub(crate) unsafe fn sample(cq: *mut bindings::ib_cq, ncompleted: u32) {
    // SAFETY: Caller contract.
    let Some(state) = (unsafe { state_of(cq) }) else {
        warn_on_once!(true, "ibext_dim_sample: no ibext DIM attached to the CQ");
        return;
    };
    // SAFETY: The ULP samples from its own poll loop, one at a time (its contract).
    unsafe { bindings::rdma_dim(state.dim.get(), u64::from(ncompleted)) };
    state.samples.fetch_add(1, Ordering::Relaxed);
}

/// Detaches and frees ibext's DIM (see `ibext_dim_detach`).
///
/// # Safety
///
/// `cq` is a live CQ; the caller has stopped sampling it.
pub(crate) unsafe fn detach(cq: *mut bindings::ib_cq) {
    // SAFETY: Caller contract.
    let Some(state) = (unsafe { state_of(cq) }) else {
        warn_on_once!(true, "ibext_dim_detach: no ibext DIM attached to the CQ");
        return;
    };
    let raw = core::ptr::from_ref(state).cast_mut();
    // SAFETY: Caller contract.
    unsafe { dim_slot(cq) }.store(core::ptr::null_mut(), Ordering::Release);
    // SAFETY: The work belongs to the state, which is still alive; nothing queues it any more
    // (only `rdma_dim()` does, from `sample`, which the caller has stopped).
    unsafe { bindings::cancel_work_sync(core::ptr::addr_of_mut!((*state.dim.get()).work)) };
    // SAFETY: `raw` came from `KBox::into_raw` in `attach` and is no longer reachable.
    drop(unsafe { KBox::from_raw(raw) });
}

/// Returns the current profile as (usec, comps) (see `ibext_dim_profile`).
///
/// # Safety
///
/// `cq` is a live CQ.
pub(crate) unsafe fn profile(cq: *mut bindings::ib_cq) -> Result<(u16, u16)> {
    // SAFETY: Caller contract.
    let state = unsafe { state_of(cq) }.ok_or(EINVAL)?;
    let p = moderation::profile(dim::profile_ix(&state.dim));
    Ok((p.usec, p.comps))
}

/// Returns the samples and profile changes of `cq`'s attached DIM.
///
/// # Safety
///
/// `cq` is a live CQ.
#[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
pub(crate) unsafe fn counters(cq: *mut bindings::ib_cq) -> Option<(u64, u64)> {
    // SAFETY: Caller contract.
    let state = unsafe { state_of(cq) }?;
    Some((
        state.samples.load(Ordering::Relaxed),
        state.profile_changes.load(Ordering::Relaxed),
    ))
}

/// Tests only: forces lib/dim's decision `ix` on `cq`'s attached DIM (see
/// `dim::test_force_profile`) and returns whether the device moderates the CQ itself afterwards.
///
/// # Safety
///
/// `cq` is a live CQ with ibext's DIM attached, not detached during the call.
#[cfg(ibext_kunit)]
pub(crate) unsafe fn test_force_profile(cq: *mut bindings::ib_cq, ix: u8) -> Option<bool> {
    // SAFETY: Caller contract.
    let state = unsafe { state_of(cq) }?;
    dim::test_force_profile(&state.dim, ix);
    Some(state.hw_moderation.load(Ordering::Acquire))
}
