// SPDX-License-Identifier: GPL-2.0

//! ib_core's GID table as ibext uses it: referenced entries ([`GidAttr`]) and ib_core's own
//! searches.

use crate::{bindings, ib::Device};
use core::ptr::NonNull;
use kernel::prelude::*;

/// A referenced GID table entry, `const struct ib_gid_attr *`; dropping it puts the reference.
///
/// # Invariants
///
/// `self.0` holds one reference from `rdma_get_gid_attr` or `rdma_find_gid*`.
pub(crate) struct GidAttr(NonNull<bindings::ib_gid_attr>);

// SAFETY: A GID attribute reference may be used and put from any context and thread.
unsafe impl Send for GidAttr {}
// SAFETY: `&GidAttr` only reads fields that do not change while the reference is held.
unsafe impl Sync for GidAttr {}

impl GidAttr {
    /// Takes ownership of the reference a ib_core lookup returned, or its error.
    ///
    /// # Safety
    ///
    /// `p` is the return value of `rdma_get_gid_attr` or `rdma_find_gid*`, not yet put.
    pub(crate) unsafe fn from_result(p: *const bindings::ib_gid_attr) -> Result<Self> {
        // `IS_ERR()` inline: 6.12's `from_err_ptr` calls two out-of-line helpers, on every
        // lookup (the GID lookup's hot path).
        const MAX_ERRNO: usize = 4095;
        let v = p as usize;
        if v > usize::MAX - MAX_ERRNO {
            // An error pointer holds `-errno`, in `-MAX_ERRNO..0`.
            return Err(Error::from_errno(v as isize as i32));
        }
        // INVARIANT: not an error, so a referenced attribute (the caller's guarantee).
        NonNull::new(p.cast_mut()).map(GidAttr).ok_or(ENOENT)
    }

    /// Gives the reference to the caller, who must put it with `rdma_put_gid_attr`.
    pub(crate) fn into_raw(self) -> *const bindings::ib_gid_attr {
        let p = self.0.as_ptr();
        core::mem::forget(self);
        p
    }

    /// Returns the attribute.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn as_raw(&self) -> *const bindings::ib_gid_attr {
        self.0.as_ptr()
    }

    fn attr(&self) -> &bindings::ib_gid_attr {
        // SAFETY: The reference we hold keeps the entry alive and its fields fixed (type
        // invariant): ib_core replaces entries, it does not change them.
        unsafe { self.0.as_ref() }
    }

    /// Returns the GID.
    pub(crate) fn gid(&self) -> [u8; 16] {
        // SAFETY: Every bit pattern of the union is a valid `raw` array.
        unsafe { self.attr().gid.raw }
    }

    /// Returns the GID type.
    pub(crate) fn gid_type(&self) -> u32 {
        self.attr().gid_type
    }

    /// Returns the entry's index in its port's table.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn index(&self) -> u32 {
        self.attr().index.into()
    }

    /// Returns the entry's port.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn port(&self) -> u32 {
        self.attr().port_num
    }

    /// Returns the entry's netdev, as an identity only (never dereferenced).
    pub(crate) fn ndev(&self) -> NdevPtr {
        // SAFETY: The field is readable while the reference is held; ib_core reads it the same
        // way (without `rcu_dereference`) when it compares netdevs in `find_gid`.
        NdevPtr(unsafe { core::ptr::read_volatile(&self.attr().ndev) })
    }

    /// Returns whether this entry answers a lookup of `key`, with `ndev` (none: any netdev).
    pub(crate) fn matches(&self, gid: &[u8; 16], gid_type: u32, ndev: NdevPtr) -> bool {
        self.gid() == *gid && self.gid_type() == gid_type && (ndev.is_any() || self.ndev() == ndev)
    }
}

impl Drop for GidAttr {
    fn drop(&mut self) {
        // SAFETY: We hold one reference (type invariant) and give it back once.
        unsafe { bindings::rdma_put_gid_attr(self.0.as_ptr()) };
    }
}

/// A netdev's address, as a lookup compares it (null: any netdev); never dereferenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NdevPtr(*mut bindings::net_device);

// SAFETY: An address that is only compared and passed to ib_core's searches.
unsafe impl Send for NdevPtr {}
// SAFETY: As for `Send`.
unsafe impl Sync for NdevPtr {}

impl NdevPtr {
    /// Any netdev.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) const ANY: Self = NdevPtr(core::ptr::null_mut());

    /// Wraps an address from a caller (nothing is assumed of it).
    pub(crate) fn from_raw(ndev: *mut bindings::net_device) -> Self {
        NdevPtr(ndev)
    }

    /// Returns whether this matches any netdev.
    pub(crate) fn is_any(self) -> bool {
        self.0.is_null()
    }
}

/// `rdma_get_gid_attr(dev, port, index)`.
pub(crate) fn get_gid_attr(dev: &Device, port: u32, index: u32) -> Result<GidAttr> {
    let index = i32::try_from(index).map_err(|_| EINVAL)?;
    // SAFETY: `dev` is registered (`Device` invariant); ib_core checks the port and index.
    unsafe { GidAttr::from_result(bindings::rdma_get_gid_attr(dev.as_raw(), port, index)) }
}

/// ib_core's own search for `gid`: `rdma_find_gid_by_port` on `port`, or `rdma_find_gid` on
/// every port (`None`).
pub(crate) fn upstream_find_gid(
    dev: &Device,
    gid: &[u8; 16],
    gid_type: u32,
    port: Option<u32>,
    ndev: NdevPtr,
) -> Result<GidAttr> {
    let gid = bindings::ib_gid { raw: *gid };
    // SAFETY: `dev` is registered (`Device` invariant) and `gid` outlives the call; `ndev` is
    // only compared.
    unsafe {
        GidAttr::from_result(match port {
            Some(p) => bindings::rdma_find_gid_by_port(dev.as_raw(), &gid, gid_type, p, ndev.0),
            None => bindings::rdma_find_gid(dev.as_raw(), &gid, gid_type, ndev.0),
        })
    }
}
