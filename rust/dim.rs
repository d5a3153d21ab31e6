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

/// Tests only: makes lib/dim's decision `ix`, as `rdma_dim()` does when it picks a profile
/// (`profile_ix`, then `schedule_work(&dim->work)`), and waits until the work has run.
#[cfg(ibext_kunit)]
pub(crate) fn test_force_profile(dim: &Opaque<bindings::dim>, ix: u8) {
    // SAFETY: `dim` is initialized and its work was initialized with it; the owner cancels the
    // work before freeing it, and the caller keeps the owner alive across this call.
    unsafe {
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*dim.get()).profile_ix), ix);
        let work = core::ptr::addr_of_mut!((*dim.get()).work);
        bindings::ibext_shim_queue_work_unbound(work);
        bindings::flush_work(work);
    }
}

/// How a profile was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The device's `modify_cq` took it.
    Hardware,
    /// The device has no `modify_cq`: software moderation applies it.
    Software,
    /// The device's `modify_cq` refused it (the errno): software moderation applies it.
    Refused(i32),
}

impl Applied {
    /// Whether the device moderates events itself now.
    pub(crate) fn in_hardware(self) -> bool {
        self == Applied::Hardware
    }
}

/// Applies the profile lib/dim chose for `cq` (its work function's job, as upstream's
/// `ib_cq_rdma_dim_work`): the device's own `modify_cq` where it has one, then measure afresh.
/// Returns the profile index applied, and how.
///
/// # Safety
///
/// `dim` is initialized and `cq` is alive.
pub(crate) unsafe fn apply_profile(
    dim: &Opaque<bindings::dim>,
    cq: *mut bindings::ib_cq,
) -> (u8, Applied) {
    let ix = profile_ix(dim);
    let p = moderation::profile(ix);
    // SAFETY: `cq` is alive (caller contract).
    let r = unsafe { bindings::ibext_shim_modify_cq(cq, p.comps, p.usec) };
    let applied = if r == 0 {
        Applied::Hardware
    } else if r == -(kernel::bindings::EOPNOTSUPP as i32) {
        Applied::Software
    } else {
        Applied::Refused(r)
    };
    // SAFETY: As in `profile_ix`.
    unsafe {
        core::ptr::write_volatile(
            core::ptr::addr_of_mut!((*dim.get()).state),
            bindings::dim_state_DIM_START_MEASURE as u8,
        )
    };
    (ix, applied)
}
