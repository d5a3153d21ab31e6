// SPDX-License-Identifier: GPL-2.0

//! Thin views of ib_core objects, and the kernel services ibext builds on.
//!
//! `rust/ib/` holds the typed wrappers through which the feature files reach ib_core and the
//! kernel, and is (with the C shim and the tests) the only place that names `bindings::` or
//! contains `unsafe`: this file (devices, device references, RCU, lockdep classes, work item
//! initialization, fault points) and the modules below, listed in Documentation/ibext.rst.

pub(crate) mod client;
pub(crate) mod cq;
pub(crate) mod dim;
pub(crate) mod event;
pub(crate) mod gid;
pub(crate) mod verbs;

use crate::bindings;
use kernel::{str::CStr, types::Opaque};

/// The size of an RDMA device name buffer, `IB_DEVICE_NAME_MAX`.
pub(crate) const DEVICE_NAME_MAX: usize = bindings::IB_DEVICE_NAME_MAX as usize;

/// A driver's CQ verbs, read once from its `ib_device_ops` ([`Device::cq_ops`]), so that a
/// pass calls the driver as `ib_poll_cq` does, without a C call around each call.
#[derive(Clone, Copy)]
pub(crate) struct CqOps {
    /// `ops.poll_cq`.
    pub(crate) poll: unsafe extern "C" fn(
        *mut bindings::ib_cq,
        core::ffi::c_int,
        *mut bindings::ib_wc,
    ) -> core::ffi::c_int,
    /// `ops.req_notify_cq`.
    pub(crate) notify: unsafe extern "C" fn(
        *mut bindings::ib_cq,
        bindings::ib_cq_notify_flags,
    ) -> core::ffi::c_int,
}

/// A registered RDMA device, `struct ib_device`.
///
/// # Invariants
///
/// A `&Device` refers to an `ib_device` that stays registered with ib_core for the lifetime of
/// the reference: ib_core calls a client's `remove` before it frees the device, and ibext never
/// keeps a `&Device` past its `remove`.
#[repr(transparent)]
pub(crate) struct Device(Opaque<bindings::ib_device>);

// SAFETY: An `ib_device` is shared by every ULP on every CPU; the fields `Device` reads are set
// before registration and never change while the device is registered.
unsafe impl Sync for Device {}
// SAFETY: As above; nothing in `Device` is tied to the thread that made the reference.
unsafe impl Send for Device {}

impl Device {
    /// Returns the view of `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must point to an `ib_device` that stays registered for `'a`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_device) -> &'a Self {
        // SAFETY: `Device` is a transparent wrapper of `ib_device`, and the caller guarantees the
        // device stays registered for `'a`.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// Returns the raw `ib_device` pointer, for calls into ib_core.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_device {
        self.0.get()
    }

    /// Returns the device's current name.
    ///
    /// ib_core changes the name only with `devices_rwsem` held for write, and tells clients so
    /// through the `rename` callback; callers that keep the name copy it.
    pub(crate) fn name(&self) -> &CStr {
        // SAFETY: `name` is a NUL-terminated array inside the registered device (type invariant).
        unsafe { CStr::from_char_ptr((*self.as_raw()).name.as_ptr()) }
    }

    /// Returns ib_core's index of the device (`ib_device.index`), unique among registered
    /// devices.
    pub(crate) fn index(&self) -> u32 {
        // SAFETY: Set before registration and constant while registered (type invariant).
        unsafe { (*self.as_raw()).index }
    }

    /// Returns the number of completion vectors the driver exposes.
    pub(crate) fn num_comp_vectors(&self) -> u32 {
        // SAFETY: Set before registration and constant while registered (type invariant).
        let n = unsafe { (*self.as_raw()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    /// Returns the number of physical ports (port numbers run from 1 to this).
    pub(crate) fn phys_port_cnt(&self) -> u32 {
        // SAFETY: Set before registration and constant while registered (type invariant).
        unsafe { (*self.as_raw()).phys_port_cnt }
    }

    /// Returns the device attributes queried at registration.
    pub(crate) fn attrs(&self) -> &bindings::ib_device_attr {
        // SAFETY: Filled in before registration and constant while registered (type invariant).
        unsafe { &(*self.as_raw()).attrs }
    }

    /// Returns whether the driver asks for DIM on the CQs ib_core allocates for it
    /// (`use_cq_dim`; `ib_alloc_cq` and so `ib_cq_pool_get` use DIM only then).
    pub(crate) fn use_cq_dim(&self) -> bool {
        // SAFETY: Set by the driver before registration and constant while registered.
        unsafe { (*self.as_raw()).use_cq_dim() != 0 }
    }

    /// Returns whether the driver can moderate CQ events itself (`modify_cq`).
    pub(crate) fn has_modify_cq(&self) -> bool {
        // SAFETY: The ops are set before registration and constant while registered.
        unsafe { (*self.as_raw()).ops.modify_cq.is_some() }
    }

    /// Returns the driver's `poll_cq` and `req_notify_cq`: what 6.12's `ib_poll_cq` and
    /// `ib_req_notify_cq` (static inlines in `include/rdma/ib_verbs.h`) call through
    /// `cq->device->ops`. Both are mandatory (`ib_device_check_mandatory()`, device.c), so `None`
    /// only for a device that skipped registration's checks.
    pub(crate) fn cq_ops(&self) -> Option<CqOps> {
        // SAFETY: The ops are set before registration and constant while registered.
        let ops = unsafe { &(*self.as_raw()).ops };
        Some(CqOps {
            poll: ops.poll_cq?,
            notify: ops.req_notify_cq?,
        })
    }

    /// Returns the number of completion vectors ibext spreads CQs over:
    /// `min(num_comp_vectors, num_online_cpus())`, at least 1.
    pub(crate) fn usable_comp_vectors(&self) -> u32 {
        // SAFETY: FFI call without preconditions.
        let cpus = unsafe { bindings::ibext_shim_num_online_cpus() };
        self.num_comp_vectors().min(cpus).max(1)
    }

    /// Returns the device's first and last port numbers (`rdma_start_port`, `rdma_end_port`).
    pub(crate) fn port_range(&self) -> core::ops::RangeInclusive<u32> {
        // SAFETY: The device is registered (type invariant).
        unsafe {
            bindings::ibext_shim_start_port(self.as_raw())
                ..=bindings::ibext_shim_end_port(self.as_raw())
        }
    }

    /// Returns the length of `port`'s GID table, 0 for a port the device does not have.
    pub(crate) fn gid_tbl_len(&self, port: u32) -> u32 {
        if !self.port_valid(port) {
            return 0;
        }
        // SAFETY: The device is registered (type invariant) and `port` is one of its ports.
        unsafe { bindings::ibext_shim_gid_tbl_len(self.as_raw(), port) }
    }

    /// Returns whether `port` is a RoCE port (`rdma_protocol_roce`); false for a port the device
    /// does not have.
    pub(crate) fn port_is_roce(&self, port: u32) -> bool {
        // SAFETY: The device is registered (type invariant) and `port` is one of its ports.
        self.port_valid(port) && unsafe { bindings::ibext_shim_port_is_roce(self.as_raw(), port) }
    }

    /// Returns whether `port` is one of the device's ports (`rdma_is_port_valid`).
    pub(crate) fn port_valid(&self, port: u32) -> bool {
        // SAFETY: The device is registered (type invariant).
        unsafe { bindings::ibext_shim_port_valid(self.as_raw(), port) }
    }
}

/// A counted reference to an `ib_device` (`ib_device_try_get`/`ib_device_put`).
///
/// While one exists, ib_core's unregistration of the device (`disable_device` in
/// drivers/infiniband/core/device.c, which drops the registration's own reference and then waits
/// for `unreg_completion`) cannot finish, so the device, its ops and everything made on it stay
/// usable. Clients' `remove` runs before that wait, so taking one there still succeeds.
///
/// # Invariants
///
/// `self.0` is a device on which this value holds one reference from `ib_device_try_get`.
pub(crate) struct DeviceRef(core::ptr::NonNull<bindings::ib_device>);

// SAFETY: The reference may be dropped from any thread; `ib_device_put` is atomic.
unsafe impl Send for DeviceRef {}
// SAFETY: `&DeviceRef` only gives a `&Device`, which is `Sync`.
unsafe impl Sync for DeviceRef {}

impl DeviceRef {
    /// Takes a reference to `dev`; `None` once its unregistration has dropped the last one.
    pub(crate) fn try_get(dev: &Device) -> Option<Self> {
        // SAFETY: `dev` is a live device (invariant of `Device`).
        if unsafe { bindings::ibext_shim_device_try_get(dev.as_raw()) } {
            // INVARIANT: the reference was just taken.
            Some(DeviceRef(core::ptr::NonNull::from(dev).cast()))
        } else {
            None
        }
    }
}

impl core::ops::Deref for DeviceRef {
    type Target = Device;

    fn deref(&self) -> &Device {
        // SAFETY: The reference keeps the device from finishing unregistration (type invariant),
        // so it is live while `self` is.
        unsafe { Device::from_raw(self.0.as_ptr()) }
    }
}

impl Drop for DeviceRef {
    fn drop(&mut self) {
        // SAFETY: We hold one reference (type invariant) and give it back once.
        unsafe { bindings::ib_device_put(self.0.as_ptr()) };
    }
}
