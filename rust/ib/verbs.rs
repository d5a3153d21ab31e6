// SPDX-License-Identifier: GPL-2.0

//! Views of the verbs objects ibext is lent by ULPs or handed by pollers: [`Pd`], [`Srq`],
//! [`Wc`].

use crate::{bindings, ib::Device};
use kernel::types::Opaque;

/// A protection domain, `struct ib_pd`, lent by the ULP that allocated it.
///
/// # Invariants
///
/// A `&Pd` refers to a PD that is not deallocated for the lifetime of the reference; its device
/// stays registered while the PD exists (a ULP deallocates its PDs in its client `remove` or on
/// `RDMA_CM_EVENT_DEVICE_REMOVAL`, both before `ib_unregister_device` returns).
#[repr(transparent)]
pub(crate) struct Pd(Opaque<bindings::ib_pd>);

impl Pd {
    /// Returns the view of `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` points to a PD that is not deallocated for `'a`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_pd) -> &'a Self {
        // SAFETY: `Pd` is a transparent wrapper of `ib_pd`; the caller guarantees the lifetime.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// Returns the raw pointer, for calls into ib_core.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_pd {
        self.0.get()
    }

    /// Returns the PD's device.
    pub(crate) fn device(&self) -> &Device {
        // SAFETY: `device` is set by `__ib_alloc_pd` and constant; the device stays registered
        // while the PD exists (type invariant).
        unsafe { Device::from_raw((*self.as_raw()).device) }
    }

    /// Returns the PD's `local_dma_lkey`, the key of every receive ibext posts.
    pub(crate) fn local_dma_lkey(&self) -> u32 {
        // SAFETY: Set by `__ib_alloc_pd` and constant while the PD exists (type invariant).
        unsafe { (*self.as_raw()).local_dma_lkey }
    }
}

/// A shared receive queue, `struct ib_srq`, as a view.
///
/// # Invariants
///
/// A `&Srq` refers to an SRQ that is not destroyed for the lifetime of the reference.
#[repr(transparent)]
pub(crate) struct Srq(Opaque<bindings::ib_srq>);

impl Srq {
    /// Returns the raw pointer, for `ib_qp_init_attr.srq` and the C API.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_srq {
        self.0.get()
    }

    /// Returns whether a QP still uses the SRQ (`srq->usecnt`, which `ib_qp_usecnt_inc` raises
    /// when a QP is made and `ib_qp_usecnt_dec` lowers when it is destroyed; drivers/infiniband/
    /// core/verbs.c, where `ib_destroy_srq_user` refuses while it is not 0).
    pub(crate) fn in_use(&self) -> bool {
        // SAFETY: The SRQ is live (type invariant).
        unsafe { bindings::ibext_shim_srq_in_use(self.as_raw()) }
    }
}

/// A work completion, `struct ib_wc`, as a poller hands it to a `done` callback.
///
/// # Invariants
///
/// A `&Wc` refers to a completion that is valid and not written for the reference's lifetime.
#[repr(transparent)]
pub(crate) struct Wc(Opaque<bindings::ib_wc>);

impl Wc {
    /// Returns the view of `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` is a completion passed to a `done` callback, used only during that call.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_wc) -> &'a Self {
        // SAFETY: A transparent wrapper; the caller guarantees validity.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// Returns the raw pointer, for a C callback.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_wc {
        self.0.get()
    }

    fn status(&self) -> bindings::ib_wc_status {
        // SAFETY: Valid for the reference's lifetime (type invariant).
        unsafe { (*self.as_raw()).status }
    }

    /// Returns whether the work request completed successfully.
    pub(crate) fn is_success(&self) -> bool {
        self.status() == bindings::ib_wc_status_IB_WC_SUCCESS
    }

    /// Returns whether the work request was flushed (its QP moved to the error state).
    pub(crate) fn is_flush(&self) -> bool {
        self.status() == bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR
    }

    /// Returns the `ib_cqe` the work request was posted with.
    pub(crate) fn wr_cqe(&self) -> *mut bindings::ib_cqe {
        // SAFETY: Valid (type invariant); a completion passed to `wr_cqe->done` has `wr_cqe`
        // set (`__ib_process_cq` in drivers/infiniband/core/cq.c dispatches on it).
        unsafe { (*self.as_raw()).__bindgen_anon_1.wr_cqe }
    }
}
