// SPDX-License-Identifier: GPL-2.0

//! Glue to the kernel's `lib/dim`, shared by pooled CQs (`cq_engine`) and legacy ULPs' CQs
//! (`legacy_dim`): the `struct dim` they keep, and applying the profile it picks.

use crate::{bindings, ib::LockClass, policy::moderation};
use kernel::{prelude::*, types::Opaque};

/// The work function lib/dim schedules when it picks a new profile.
pub(crate) type WorkFn = unsafe extern "C" fn(*mut bindings::work_struct);

/// An initializer for a `struct dim` as upstream's `rdma_dim_init` makes one, whose work runs
/// `work_fn` and belongs to the lockdep class `key` named `name` (one per owner kind).
/// `priv` is left null for the owner to use.
pub(crate) fn new_dim(
    work_fn: WorkFn,
    name: &'static core::ffi::CStr,
    key: &'static LockClass,
) -> impl PinInit<Opaque<bindings::dim>> {
    Opaque::ffi_init(move |p: *mut bindings::dim| {
        // SAFETY: `p` is valid for writes (guaranteed by `ffi_init`).
        unsafe {
            p.write(bindings::dim {
                state: bindings::dim_state_DIM_START_MEASURE as u8,
                tune_state: bindings::dim_tune_state_DIM_GOING_RIGHT as u8,
                profile_ix: 0,
                ..Default::default()
            });
            bindings::ibext_shim_init_work(
                core::ptr::addr_of_mut!((*p).work),
                Some(work_fn),
                name.as_ptr().cast(),
                key.as_ptr(),
            );
        }
    })
}

/// Returns the `struct dim` whose `work` this is.
///
/// # Safety
///
/// `work` is the `work` field of a `struct dim`.
pub(crate) unsafe fn dim_of_work(work: *mut bindings::work_struct) -> *mut bindings::dim {
    let off = core::mem::offset_of!(bindings::dim, work);
    // SAFETY: Caller contract: `work` lies `off` bytes into a `struct dim`.
    unsafe { work.cast::<u8>().sub(off).cast() }
}

/// Returns the profile index lib/dim chose last.
pub(crate) fn profile_ix(dim: &Opaque<bindings::dim>) -> u8 {
    // SAFETY: `dim` is initialized; lib/dim reads and writes its `u8`s racily by design, and a
    // stale index is only a stale profile.
    unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*dim.get()).profile_ix)) }
}

/// Applies the profile lib/dim chose for `cq` (its work function's job, as upstream's
/// `ib_cq_rdma_dim_work`): `modify_cq` if the device has it (`hw`), then measure afresh.
/// Returns the profile index applied.
///
/// # Safety
///
/// `dim` is initialized and `cq` is alive.
pub(crate) unsafe fn apply_profile(
    dim: &Opaque<bindings::dim>,
    cq: *mut bindings::ib_cq,
    hw: bool,
) -> u8 {
    let ix = profile_ix(dim);
    if hw {
        let p = moderation::profile(ix);
        // SAFETY: `cq` is alive (caller contract).
        unsafe { bindings::rdma_set_cq_moderation(cq, p.comps, p.usec) };
    }
    // SAFETY: As in `profile_ix`.
    unsafe {
        core::ptr::write_volatile(
            core::ptr::addr_of_mut!((*dim.get()).state),
            bindings::dim_state_DIM_START_MEASURE as u8,
        )
    };
    ix
}
