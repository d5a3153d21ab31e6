// SPDX-License-Identifier: GPL-2.0

//! CQs as ibext sees them: the poll contexts, a CQ's address as a handle ([`CqPtr`]), and
//! [`UlpCq`], the view of a CQ a ULP made and polls itself, with the [`ArmFlags`] it is armed
//! with. A CQ that ibext polls itself is
//! `engine::pooled_cq::PooledCq`.

use crate::{bindings, ib::Device};
use kernel::{prelude::*, types::Opaque};

/// The contexts a polled CQ can be polled in; `IB_POLL_DIRECT` cannot be pooled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PollCtx {
    /// `IB_POLL_SOFTIRQ`: irq_poll, budget 256.
    Softirq,
    /// `IB_POLL_WORKQUEUE`: ibext's bound workqueue, budget 65536.
    Workqueue,
    /// `IB_POLL_UNBOUND_WORKQUEUE`: ibext's unbound workqueue, budget 65536.
    UnboundWorkqueue,
}

impl PollCtx {
    /// Every pooled context, in the order of `enum ib_poll_context`.
    pub(crate) const ALL: [PollCtx; 3] = [
        PollCtx::Softirq,
        PollCtx::Workqueue,
        PollCtx::UnboundWorkqueue,
    ];

    /// Converts a C `enum ib_poll_context`; `IB_POLL_DIRECT` and unknown values are `EINVAL`.
    pub(crate) fn from_raw(ctx: bindings::ib_poll_context) -> Result<Self> {
        match ctx {
            bindings::ib_poll_context_IB_POLL_SOFTIRQ => Ok(PollCtx::Softirq),
            bindings::ib_poll_context_IB_POLL_WORKQUEUE => Ok(PollCtx::Workqueue),
            bindings::ib_poll_context_IB_POLL_UNBOUND_WORKQUEUE => Ok(PollCtx::UnboundWorkqueue),
            _ => Err(EINVAL),
        }
    }

    /// The C value.
    pub(crate) fn raw(self) -> bindings::ib_poll_context {
        match self {
            PollCtx::Softirq => bindings::ib_poll_context_IB_POLL_SOFTIRQ,
            PollCtx::Workqueue => bindings::ib_poll_context_IB_POLL_WORKQUEUE,
            PollCtx::UnboundWorkqueue => bindings::ib_poll_context_IB_POLL_UNBOUND_WORKQUEUE,
        }
    }

    /// The name shown in debugfs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PollCtx::Softirq => "softirq",
            PollCtx::Workqueue => "workqueue",
            PollCtx::UnboundWorkqueue => "unbound_workqueue",
        }
    }
}

/// The address of a CQ, as a handle: compared, stored and handed to C; dereferenced only by the
/// owner of the CQ it names (`engine::pooled_cq`, `legacy_dim` through [`UlpCq`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct CqPtr(core::ptr::NonNull<bindings::ib_cq>);

// SAFETY: An address; what it points to is reached only under the rules of the object it
// belongs to.
unsafe impl Send for CqPtr {}
// SAFETY: As for `Send`.
unsafe impl Sync for CqPtr {}

impl CqPtr {
    /// Wraps an address (nothing is assumed of it); `None` for null.
    pub(crate) fn from_raw(cq: *mut bindings::ib_cq) -> Option<Self> {
        core::ptr::NonNull::new(cq).map(CqPtr)
    }

    /// Returns the address, for ib_core and C callers.
    pub(crate) fn as_raw(self) -> *mut bindings::ib_cq {
        self.0.as_ptr()
    }
}

/// A valid `enum ib_cq_notify_flags` set: exactly one of `IB_CQ_SOLICITED` and
/// `IB_CQ_NEXT_COMP`, and perhaps `IB_CQ_REPORT_MISSED_EVENTS`.
///
/// # Invariants
///
/// `self.0` is such a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArmFlags(u8);

impl ArmFlags {
    const SOLICITED: u8 = bindings::ib_cq_notify_flags_IB_CQ_SOLICITED as u8;
    const NEXT_COMP: u8 = bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP as u8;
    const MISSED: u8 = bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS as u8;

    /// Validates the C flags; `EINVAL` for anything but a valid set.
    pub(crate) fn from_raw(flags: u32) -> Result<Self> {
        let which = flags & u32::from(Self::SOLICITED | Self::NEXT_COMP);
        let known = u32::from(Self::SOLICITED | Self::NEXT_COMP | Self::MISSED);
        if flags & !known != 0
            || (which != u32::from(Self::SOLICITED) && which != u32::from(Self::NEXT_COMP))
        {
            return Err(EINVAL);
        }
        // INVARIANT: one of the two, and nothing unknown.
        Ok(ArmFlags(flags as u8))
    }

    /// The bits to remember a deferred arm by (never 0).
    pub(crate) fn bits(self) -> u8 {
        self.0
    }

    /// The arm that covers every arm whose bits were or-ed into `bits`: `IB_CQ_NEXT_COMP` if
    /// any asked for it (it reports a superset of solicited completions), and always
    /// `IB_CQ_REPORT_MISSED_EVENTS` (a deferred arm must see what arrived while it waited).
    /// `None` for 0: nothing was asked.
    pub(crate) fn merged(bits: u8) -> Option<Self> {
        if bits == 0 {
            return None;
        }
        let which = if bits & Self::NEXT_COMP != 0 {
            Self::NEXT_COMP
        } else {
            Self::SOLICITED
        };
        // INVARIANT: one of the two, and the missed-events bit.
        Some(ArmFlags(which | Self::MISSED))
    }

    /// The C value.
    pub(crate) fn raw(self) -> bindings::ib_cq_notify_flags {
        self.0.into()
    }
}

/// A CQ that a ULP made itself (`ib_create_cq`) and polls itself, as ibext's DIM for legacy
/// ULPs (`legacy_dim.rs`) sees it.
///
/// # Invariants
///
/// For the lifetime of a `&UlpCq`, the CQ is alive, and the ULP's contract for `ibext_dim_*`
/// holds: it samples from one context at a time, and does not detach ibext's DIM while it
/// samples or reads the profile.
#[repr(transparent)]
pub(crate) struct UlpCq(Opaque<bindings::ib_cq>);

// SAFETY: A `&UlpCq` gives only reads of fields fixed at creation, and the DIM entry points,
// whose concurrency the type invariant describes.
unsafe impl Sync for UlpCq {}

impl UlpCq {
    /// Returns the view of `cq`.
    ///
    /// # Safety
    ///
    /// `cq` is a live CQ for `'a`, and the caller keeps the ULP's contract (type invariants).
    pub(crate) unsafe fn from_raw<'a>(cq: *mut bindings::ib_cq) -> &'a Self {
        // SAFETY: `UlpCq` is a transparent wrapper of `ib_cq`; the caller's guarantee.
        unsafe { &*cq.cast::<Self>() }
    }

    /// Returns the CQ, for ib_core calls.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_cq {
        self.0.get()
    }

    /// Returns the CQ's device.
    pub(crate) fn device(&self) -> &Device {
        // SAFETY: A live CQ's device is registered at least as long as the CQ exists (ib_core
        // destroys a device's CQs, through their owners, before it unregisters it).
        unsafe { Device::from_raw((*self.as_raw()).device) }
    }

    /// Whether the CQ is one of a pool's (ib_core's or ibext's), marked `shared`.
    pub(crate) fn is_pooled(&self) -> bool {
        // SAFETY: The CQ is alive (type invariant).
        unsafe { bindings::ibext_shim_cq_is_pooled(self.as_raw()) }
    }

    /// Whether ib_core polls the CQ itself (made by `ib_alloc_cq`, which gives it a `wc`).
    pub(crate) fn polled_by_core(&self) -> bool {
        // SAFETY: The CQ is alive (type invariant).
        unsafe { bindings::ibext_shim_cq_polled_by_core(self.as_raw()) }
    }

    /// Whether the CQ was made with a completion handler (`ib_create_cq`'s `comp_handler`).
    pub(crate) fn has_comp_handler(&self) -> bool {
        // SAFETY: The CQ is alive (type invariant); the handler is fixed at creation.
        !unsafe { bindings::ibext_shim_cq_comp_handler(self.as_raw()) }.is_null()
    }

    /// `ib_req_notify_cq(cq, flags)`: arms the CQ; returns the driver's result (with
    /// `IB_CQ_REPORT_MISSED_EVENTS`, positive if completions may be waiting).
    pub(crate) fn req_notify(&self, flags: ArmFlags) -> i32 {
        // SAFETY: The CQ is alive (type invariant); `flags` is a valid set (`ArmFlags`).
        unsafe { bindings::ibext_shim_req_notify_cq(self.as_raw(), flags.raw()) }
    }

    /// The CQ's `dim` pointer, as an atomic.
    pub(super) fn dim_slot(&self) -> &core::sync::atomic::AtomicPtr<bindings::dim> {
        // SAFETY: `dim` is a pointer-sized, aligned field of the live CQ; ib_core touches it
        // only for CQs it made with DIM (`ib_alloc_cq` on `use_cq_dim` devices, which ibext
        // refuses to attach to), and ibext changes it only atomically.
        unsafe {
            core::sync::atomic::AtomicPtr::from_ptr(core::ptr::addr_of_mut!((*self.as_raw()).dim))
        }
    }
}
