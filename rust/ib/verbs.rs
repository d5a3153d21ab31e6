// SPDX-License-Identifier: GPL-2.0

//! Views of the verbs objects ibext is lent by ULPs or handed by pollers: [`Pd`], [`Srq`],
//! [`Wc`]; and [`UlpRecvDone`] and [`UlpPressure`], a C ULP's callbacks with their context.

use crate::{
    bindings,
    ib::{srq::Pressure, srq::RecvAction, srq::RecvData, Device},
};
use core::ffi::{c_uint, c_void};
use kernel::{prelude::*, types::Opaque};

/// `-EOPNOTSUPP`, which `kernel::error::code` lacks on 6.12.
pub(crate) fn eopnotsupp() -> Error {
    Error::from_errno(-(kernel::bindings::EOPNOTSUPP as i32))
}

/// `-EDEADLK`, which `kernel::error::code` lacks on 6.12.
pub(crate) fn edeadlk() -> Error {
    Error::from_errno(-(kernel::bindings::EDEADLK as i32))
}

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
    pub(super) fn wr_cqe(&self) -> *mut bindings::ib_cqe {
        // SAFETY: Valid (type invariant); a completion passed to `wr_cqe->done` has `wr_cqe`
        // set (`__ib_process_cq` in drivers/infiniband/core/cq.c dispatches on it).
        unsafe { (*self.as_raw()).__bindgen_anon_1.wr_cqe }
    }
}

/// A C ULP's receive callback (`struct ibext_srq_pool_attr::recv_done`) and its context.
///
/// # Invariants
///
/// `f` may be called with a live SRQ, a completion, a buffer and `ctx` for as long as this
/// value lives.
#[derive(Clone)]
pub(crate) struct UlpRecvDone {
    f: UlpRecvFn,
    ctx: *mut c_void,
}

/// The type of `struct ibext_srq_pool_attr::recv_done`.
pub(crate) type UlpRecvFn = unsafe extern "C" fn(
    *mut bindings::ib_srq,
    *mut bindings::ib_wc,
    *mut c_void,
    *mut c_void,
) -> bindings::ibext_recv_action;

// SAFETY: The ULP's contract (`include/rdma/ibext.h`): its callback may run on any CPU, in the
// poll context of any of its CQs, with its context.
unsafe impl Send for UlpRecvDone {}
// SAFETY: As for `Send`.
unsafe impl Sync for UlpRecvDone {}

impl UlpRecvDone {
    /// Wraps a callback and context from C.
    ///
    /// # Safety
    ///
    /// `f` may be called as the type invariant says until the returned value is dropped.
    pub(crate) unsafe fn new(f: UlpRecvFn, ctx: *mut c_void) -> Self {
        // INVARIANT: the caller's guarantee.
        UlpRecvDone { f, ctx }
    }

    /// Calls the callback; an answer other than `IBEXT_RECV_KEEP` reposts.
    pub(crate) fn call(&self, srq: &Srq, wc: &Wc, buf: &RecvData<'_>) -> RecvAction {
        // SAFETY: A live SRQ, a valid completion and a buffer not posted while the callback
        // runs (type invariants of `Srq`, `Wc`, `RecvData`); the callback is valid (invariant).
        let a = unsafe { (self.f)(srq.as_raw(), wc.as_raw(), buf.as_mut_ptr(), self.ctx) };
        if a == bindings::ibext_recv_action_IBEXT_RECV_KEEP {
            RecvAction::Keep
        } else {
            RecvAction::Repost
        }
    }
}

/// A C ULP's pressure callback (`struct ibext_srq_pool_attr::pressure`) and its context.
///
/// # Invariants
///
/// `f` may be called in process context with a live SRQ of the pool, any `enum
/// ibext_srq_pressure` value, a count and `ctx`, for as long as this value lives.
#[derive(Clone)]
pub(crate) struct UlpPressure {
    f: UlpPressureFn,
    ctx: *mut c_void,
}

/// The type of `struct ibext_srq_pool_attr::pressure`.
pub(crate) type UlpPressureFn =
    unsafe extern "C" fn(*mut bindings::ib_srq, bindings::ibext_srq_pressure, c_uint, *mut c_void);

// SAFETY: The ULP's contract (`include/rdma/ibext.h`): its callback may run in any process
// context, with its context.
unsafe impl Send for UlpPressure {}
// SAFETY: As for `Send`.
unsafe impl Sync for UlpPressure {}

impl UlpPressure {
    /// Wraps a callback and context from C.
    ///
    /// # Safety
    ///
    /// `f` may be called as the type invariant says until the returned value is dropped.
    pub(crate) unsafe fn new(f: UlpPressureFn, ctx: *mut c_void) -> Self {
        // INVARIANT: the caller's guarantee.
        UlpPressure { f, ctx }
    }

    /// Calls the callback.
    pub(crate) fn call(&self, srq: &Srq, what: Pressure, posted: u32) {
        let what = match what {
            Pressure::Low => bindings::ibext_srq_pressure_IBEXT_SRQ_LOW,
            Pressure::Grown => bindings::ibext_srq_pressure_IBEXT_SRQ_GROWN,
            Pressure::Shrunk => bindings::ibext_srq_pressure_IBEXT_SRQ_SHRUNK,
        };
        // SAFETY: A live SRQ (type invariant of `Srq`); the callback is valid (invariant).
        unsafe { (self.f)(srq.as_raw(), what, posted, self.ctx) }
    }
}
