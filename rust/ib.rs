// SPDX-License-Identifier: GPL-2.0

//! Thin views of ib_core objects.
//!
//! Only this file and the other wrapper files (`client.rs`, `debugfs.rs`) touch ib_core through
//! raw pointers; policy code works on these views.

use crate::bindings;
use kernel::{str::CStr, types::Opaque};

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

    /// Returns whether the driver can moderate CQ events itself (`modify_cq`).
    pub(crate) fn has_modify_cq(&self) -> bool {
        // SAFETY: The ops are set before registration and constant while registered.
        unsafe { (*self.as_raw()).ops.modify_cq.is_some() }
    }

    /// Returns the number of completion vectors ibext spreads CQs over:
    /// `min(num_comp_vectors, num_online_cpus())`, at least 1.
    pub(crate) fn usable_comp_vectors(&self) -> u32 {
        // SAFETY: FFI call without preconditions.
        let cpus = unsafe { bindings::ibext_shim_num_online_cpus() };
        self.num_comp_vectors().min(cpus).max(1)
    }

    /// Returns whether `port` is one of the device's ports (`rdma_is_port_valid`).
    pub(crate) fn port_valid(&self, port: u32) -> bool {
        // SAFETY: The device is registered (type invariant).
        unsafe { bindings::ibext_shim_port_valid(self.as_raw(), port) }
    }
}
