// SPDX-License-Identifier: GPL-2.0

//! ib_core's GID table as ibext uses it: referenced entries ([`GidAttr`]) and ib_core's own
//! searches; and two helpers of the cached index (`gid_index.rs`): per-CPU counters and
//! [`RcuBox`], a value published through RCU.

use crate::{
    bindings,
    ib::{Device, RcuGuard},
    policy::gid_index::GidKey,
};
use core::{
    ptr::NonNull,
    sync::atomic::{AtomicPtr, Ordering},
};
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
    pub(crate) fn matches(&self, key: &GidKey, ndev: NdevPtr) -> bool {
        self.gid() == key.gid
            && self.gid_type() == key.gid_type
            && (ndev.is_any() || self.ndev() == ndev)
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

/// ib_core's own search of one port: `rdma_find_gid_by_port`.
pub(crate) fn upstream_find_by_port(
    dev: &Device,
    key: &GidKey,
    port: u32,
    ndev: NdevPtr,
) -> Result<GidAttr> {
    let gid = bindings::ib_gid { raw: key.gid };
    // SAFETY: `dev` is registered (`Device` invariant) and `gid` outlives the call; `ndev` is
    // only compared.
    unsafe {
        GidAttr::from_result(bindings::rdma_find_gid_by_port(
            dev.as_raw(),
            &gid,
            key.gid_type,
            port,
            ndev.0,
        ))
    }
}

/// ib_core's own search of every port: `rdma_find_gid`.
pub(crate) fn upstream_find(dev: &Device, key: &GidKey, ndev: NdevPtr) -> Result<GidAttr> {
    let gid = bindings::ib_gid { raw: key.gid };
    // SAFETY: As in `upstream_find_by_port`.
    unsafe {
        GidAttr::from_result(bindings::rdma_find_gid(
            dev.as_raw(),
            &gid,
            key.gid_type,
            ndev.0,
        ))
    }
}

/// `N` per-CPU `u64` counters, for statistics that many CPUs write at once (lookups run on
/// every CPU and must not share a cache line to count).
///
/// # Invariants
///
/// `self.0` points to `N` per-CPU counters from `ibext_shim_counters_alloc`, freed on drop.
pub(crate) struct PerCpuCounters<const N: usize>(NonNull<u64>);

// SAFETY: Each CPU increments its own copy with preemption disabled (`this_cpu_inc`), and the
// sum reads every copy; both are safe from any CPU.
unsafe impl<const N: usize> Send for PerCpuCounters<N> {}
// SAFETY: As for `Send`.
unsafe impl<const N: usize> Sync for PerCpuCounters<N> {}

impl<const N: usize> PerCpuCounters<N> {
    /// Allocates the counters, all zero.
    pub(crate) fn new() -> Result<Self> {
        let n = u32::try_from(N).map_err(|_| EINVAL)?;
        // SAFETY: FFI call; the result is checked.
        let c = unsafe { bindings::ibext_shim_counters_alloc(n) };
        // INVARIANT: non-null results come from `ibext_shim_counters_alloc`.
        NonNull::new(c).map(PerCpuCounters).ok_or(ENOMEM)
    }

    /// Adds one to counter `i` on this CPU; an `i` out of range is ignored.
    pub(crate) fn inc(&self, i: usize) {
        if i < N {
            // SAFETY: `N` per-CPU counters are allocated (type invariant) and `i < N`.
            unsafe { bindings::ibext_shim_counter_inc(self.0.as_ptr(), i as u32) };
        }
    }

    /// Returns counter `i` summed over every CPU (0 for an `i` out of range).
    pub(crate) fn sum(&self, i: usize) -> u64 {
        if i >= N {
            return 0;
        }
        // SAFETY: As in `inc`.
        unsafe { bindings::ibext_shim_counter_sum(self.0.as_ptr(), i as u32) }
    }
}

impl<const N: usize> Drop for PerCpuCounters<N> {
    fn drop(&mut self) {
        // SAFETY: Allocated in `new` (type invariant) and no longer used.
        unsafe { bindings::ibext_shim_counters_free(self.0.as_ptr()) };
    }
}

/// A value published through RCU: readers inside an RCU read-side critical section see the
/// current value or none; a writer replaces it and frees the old one after a grace period.
///
/// # Invariants
///
/// `self.0` is null or came from `KBox::into_raw` and is owned by this box; a value is freed
/// only after it was unpublished and a grace period passed, or when the box itself is dropped.
pub(crate) struct RcuBox<T>(AtomicPtr<T>);

// SAFETY: The box hands out `&T` to readers on any CPU and drops `T` on the writer's: `T` must
// be `Send + Sync`.
unsafe impl<T: Send + Sync> Send for RcuBox<T> {}
// SAFETY: As for `Send`.
unsafe impl<T: Send + Sync> Sync for RcuBox<T> {}

impl<T> RcuBox<T> {
    /// An empty box.
    pub(crate) const fn new() -> Self {
        RcuBox(AtomicPtr::new(core::ptr::null_mut()))
    }

    /// Returns the current value, valid for the read-side critical section `rcu`.
    pub(crate) fn get<'g>(&self, _rcu: &'g RcuGuard) -> Option<&'g T> {
        let p = self.0.load(Ordering::Acquire);
        // SAFETY: A published value is freed only after a grace period that began after it was
        // unpublished (type invariant), and `_rcu` keeps the current grace period from ending.
        unsafe { p.as_ref() }
    }

    /// Publishes `new`, and returns the value it replaced, which is freed when the returned
    /// [`Retired`] is dropped, after `synchronize_rcu()` (so that drop may sleep).
    pub(crate) fn swap(&self, new: KBox<T>) -> Retired<T> {
        // INVARIANT: the old value is unpublished here and handed to `Retired`, which frees it
        // only after a grace period.
        Retired(self.0.swap(KBox::into_raw(new), Ordering::AcqRel))
    }
}

/// A value an [`RcuBox`] no longer publishes; dropping it waits for a grace period (it may
/// sleep: process context only), then frees the value.
///
/// # Invariants
///
/// `self.0` is null or a value that came from `KBox::into_raw` and is no longer published.
pub(crate) struct Retired<T>(*mut T);

impl<T> Drop for Retired<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: FFI call in process context; waits for every reader that may still have
            // the value.
            unsafe { bindings::synchronize_rcu() };
            // SAFETY: The value came from `KBox::into_raw`, is no longer published, and no
            // reader is left (type invariant).
            drop(unsafe { KBox::from_raw(self.0) });
        }
    }
}

impl<T> Drop for RcuBox<T> {
    fn drop(&mut self) {
        let p = *self.0.get_mut();
        if !p.is_null() {
            // SAFETY: The box is dropped, so no reader can reach it any more; `p` came from
            // `KBox::into_raw` (type invariant).
            drop(unsafe { KBox::from_raw(p) });
        }
    }
}
