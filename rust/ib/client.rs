// SPDX-License-Identifier: GPL-2.0

//! An `ib_client`, generic over the per-device data it keeps ([`ClientData`]): ib_core's client
//! calls, the client data as an `Arc`, and the RCU rules of the lookup.
//!
//! ib_core calls `add` for every device present at registration and every device registered
//! later, and `remove` before a device goes away or when the client unregisters. Clients are
//! removed in reverse order of registration, so a ULP with its own client registered after
//! ibext's is removed first; but rdma_cm's client (and with it every rdma_cm-driven ULP: iSER,
//! NFS/RDMA, SMB-Direct) registered before ibext and is removed *after* it. So `remove` only
//! unpublishes the data and drops the client data's reference: what ULPs still hold keeps the
//! data alive until they let go.
//!
//! A [`Client`] is a `static` of the data's own module (ib_core's callbacks get no context but
//! the device, so they find the client through [`ClientData::client`]); what the data is and
//! does is that module's.

use crate::{backport::sync::RcuGuard, bindings, ib::Device};
use core::{
    ffi::{c_void, CStr},
    marker::PhantomData,
    sync::atomic::{AtomicBool, AtomicPtr, Ordering},
};
use kernel::{
    error::{from_result, to_result},
    ffi::c_int,
    prelude::*,
    sync::{Arc, ArcBorrow},
    types::{ForeignOwnable, Opaque},
};

/// What a client keeps per device.
pub(crate) trait ClientData: Send + Sync + Sized + 'static {
    /// The client's name, as ib_core shows it.
    const NAME: &'static CStr;
    /// Returns the client: a `static` of the implementor's module.
    fn client() -> &'static Client<Self>;
    /// Makes the data of a device being registered.
    fn add(dev: &Device) -> Result<Arc<Self>>;
    /// Tears down what the data holds of `dev`; the client data no longer refers to it.
    fn remove(this: Arc<Self>, dev: &Device);
    /// Follows a device rename.
    fn rename(&self, dev: &Device);
}

/// Slots of [`Client`]'s `fast`.
const FAST_SLOTS: usize = 16;

/// A device the client is attached to and its client data, beside ib_core's client-data
/// xarray.
struct FastSlot {
    dev: AtomicPtr<bindings::ib_device>,
    data: AtomicPtr<c_void>,
}

/// An `ib_client` keeping a `T` per device.
///
/// # Invariants
///
/// - `raw` is initialized and registered with ib_core while `registered` is true, and written
///   only while it is false (by [`Client::register`], which sets it);
/// - non-null client data of this client, in ib_core's xarray or in `fast`, came from
///   `Arc::<T>::into_foreign` in [`add_one`], and its reference is dropped only by
///   [`remove_one`], after both were cleared and an RCU grace period passed.
pub(crate) struct Client<T> {
    raw: Opaque<bindings::ib_client>,
    registered: AtomicBool,
    /// A second way from a device to its client data, for the GID lookup's hot path: a scan of
    /// a few slots instead of `xa_load()` under its own RCU section (in an instruction profile,
    /// about a fifth of a 4-entry lookup went there). A device that finds no free slot is found
    /// through the xarray.
    ///
    /// Written only by [`add_one`] (after `ib_set_client_data`) and [`remove_one`] (before its
    /// grace period); a slot is claimed by `cmpxchg` of its device, so devices added at once
    /// take different slots. Readers, inside RCU, match the device, read the data, and match
    /// the device again: a slot freed and claimed by another device between the reads fails
    /// the second match, and no other device can have the address of a device a caller holds.
    /// `remove_one` clears the data, then the device, then waits for a grace period before the
    /// data's reference goes, as it does for the xarray's entry.
    fast: [FastSlot; FAST_SLOTS],
    _data: PhantomData<fn() -> T>,
}

// SAFETY: `raw` is written once by `register` before ib_core can see it, and after that only
// ib_core touches it, under its own locks; the rest is atomics.
unsafe impl<T> Sync for Client<T> {}

/// Tests only: a device address no real device has, for [`Client::test_fill_fast`].
#[cfg(ibext_kunit)]
static NO_DEVICE: u8 = 0;

impl<T: ClientData> Client<T> {
    /// A client not registered yet, for a `static`.
    pub(crate) const fn new() -> Self {
        Client {
            raw: Opaque::uninit(),
            registered: AtomicBool::new(false),
            fast: [const {
                FastSlot {
                    dev: AtomicPtr::new(core::ptr::null_mut()),
                    data: AtomicPtr::new(core::ptr::null_mut()),
                }
            }; FAST_SLOTS],
            _data: PhantomData,
        }
    }

    /// Registers the client; `add` runs for every device already present before this returns.
    /// `EBUSY` if it is registered already.
    pub(crate) fn register(&'static self) -> Result<Registration<T>> {
        if self.registered.swap(true, Ordering::AcqRel) {
            return Err(EBUSY);
        }
        let client = bindings::ib_client {
            name: T::NAME.as_ptr().cast(),
            add: Some(add_one::<T>),
            remove: Some(remove_one::<T>),
            rename: Some(rename_one::<T>),
            ..Default::default()
        };
        // SAFETY: `registered` was false, so the client is not registered and nothing else
        // reads or writes `raw`.
        unsafe { self.raw.get().write(client) };
        // SAFETY: `raw` is initialized above and `self` is a static, so it outlives
        // registration.
        if let Err(e) = to_result(unsafe { bindings::ib_register_client(self.raw.get()) }) {
            self.registered.store(false, Ordering::Release);
            return Err(e);
        }
        // INVARIANT: registered above; `registered` keeps any other `Registration` of this
        // client from existing.
        Ok(Registration(self))
    }

    /// Returns the data of `dev`, borrowed for the read-side critical section `rcu`; `None` if
    /// the client is not attached to `dev` or its `remove` has started. Straight-line code, no
    /// closure: the form of the GID lookup's hot path.
    ///
    /// The client data is read under RCU because it outlives nothing of ib_core's: 6.12's
    /// `ib_get_client_data()` is a plain `xa_load()`, and `remove_client_context()`
    /// (drivers/infiniband/core/device.c) calls `remove` *before* it erases the entry. So
    /// [`remove_one`] clears the entry itself (and its `fast` slot), waits for a grace period,
    /// and only then drops the reference the entry held: a caller that found the data inside
    /// its critical section used it, or took its own reference, before that.
    #[inline(always)]
    pub(crate) fn get_in<'g>(&self, dev: &Device, _rcu: &'g RcuGuard) -> Option<ArcBorrow<'g, T>> {
        if !self.registered.load(Ordering::Acquire) {
            return None;
        }
        let data = match self.fast_get(dev.as_raw()) {
            Some(data) => data,
            // SAFETY: `dev` is a live device (invariant of `Device`); `raw` is initialized and
            // registered (`registered`, type invariant).
            None => unsafe { bindings::ibext_shim_get_client_data(dev.as_raw(), self.raw.get()) },
        };
        if data.is_null() {
            return None;
        }
        // SAFETY: Non-null client data is a reference from `Arc::<T>::into_foreign` that is
        // alive for the rest of the critical section `_rcu` (type invariant); the borrow lives
        // for `'g`, so no longer than the guard, which cannot be dropped while it is borrowed.
        Some(unsafe { <Arc<T> as ForeignOwnable>::borrow(data) })
    }

    /// Returns a reference to the data of `dev`, or `None` if the client is not attached to it
    /// (or is being removed from it).
    pub(crate) fn get(&self, dev: &Device) -> Option<Arc<T>> {
        let rcu = RcuGuard::new();
        self.get_in(dev, &rcu).map(Into::into)
    }

    /// Returns `dev`'s client data from `fast`, if it has a slot there. Called inside RCU.
    #[inline(always)]
    fn fast_get(&self, dev: *mut bindings::ib_device) -> Option<*mut c_void> {
        let s = self
            .fast
            .iter()
            .find(|s| s.dev.load(Ordering::Acquire) == dev)?;
        let data = s.data.load(Ordering::Acquire);
        (!data.is_null() && s.dev.load(Ordering::Acquire) == dev).then_some(data)
    }

    /// Gives `dev` a slot in `fast` with `data`, if one is free.
    fn fast_publish(&self, dev: *mut bindings::ib_device, data: *mut c_void) {
        let null = core::ptr::null_mut();
        if let Some(s) = self.fast.iter().find(|s| {
            s.dev
                .compare_exchange(null, dev, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }) {
            s.data.store(data, Ordering::Release);
        }
    }

    /// Frees `dev`'s slot in `fast`, if it has one; the caller then waits for a grace period.
    fn fast_unpublish(&self, dev: *mut bindings::ib_device, data: *mut c_void) {
        for s in self.fast.iter() {
            if s.dev.load(Ordering::Acquire) == dev && s.data.load(Ordering::Acquire) == data {
                s.data.store(core::ptr::null_mut(), Ordering::Release);
                s.dev.store(core::ptr::null_mut(), Ordering::Release);
            }
        }
    }

    /// Tests only: claims every free slot of `fast` for a device that does not exist, so that a
    /// device added next is found through the xarray; returns how many slots were claimed.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_fill_fast(&self) -> usize {
        let none = core::ptr::addr_of!(NO_DEVICE).cast_mut();
        let mut n = 0;
        while self
            .fast
            .iter()
            .any(|s| s.dev.load(Ordering::Acquire).is_null())
        {
            self.fast_publish(none.cast(), none.cast());
            n += 1;
        }
        n
    }

    /// Tests only: frees the slots [`Client::test_fill_fast`] claimed.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_free_fast(&self) {
        let none = core::ptr::addr_of!(NO_DEVICE).cast_mut();
        self.fast_unpublish(none.cast(), none.cast());
    }

    /// Tests only: returns whether `dev` has a slot in `fast`.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_has_fast_slot(&self, dev: &Device) -> bool {
        self.fast
            .iter()
            .any(|s| s.dev.load(Ordering::Acquire) == dev.as_raw())
    }
}

/// Proof that a client is registered with ib_core; unregisters when dropped.
///
/// # Invariants
///
/// `self.0` is registered, and this is its only `Registration`.
pub(crate) struct Registration<T: ClientData>(&'static Client<T>);

impl<T: ClientData> Drop for Registration<T> {
    fn drop(&mut self) {
        // SAFETY: The client is registered (type invariant). This calls `remove` for every
        // device and waits for callbacks in flight.
        unsafe { bindings::ib_unregister_client(self.0.raw.get()) };
        self.0.registered.store(false, Ordering::Release);
    }
}

/// The client's `add`.
///
/// # Safety
///
/// Called by ib_core only, for `T::client()`, with a device being registered.
unsafe extern "C" fn add_one<T: ClientData>(dev: *mut bindings::ib_device) -> c_int {
    from_result(|| {
        let client = T::client();
        // SAFETY: ib_core calls `add` with a device that stays registered until `remove`.
        let dev = unsafe { Device::from_raw(dev) };
        let data = T::add(dev)?.into_foreign().cast_mut();
        // SAFETY: The client is registered and we are inside its `add` for `dev`.
        unsafe { bindings::ib_set_client_data(dev.as_raw(), client.raw.get(), data) };
        client.fast_publish(dev.as_raw(), data);
        Ok(0)
    })
}

/// The client's `remove`.
///
/// # Safety
///
/// Called by ib_core only, for `T::client()`, once per successful `add`, with that call's
/// client data.
unsafe extern "C" fn remove_one<T: ClientData>(dev: *mut bindings::ib_device, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    let client = T::client();
    // SAFETY: ib_core calls `remove` with the device still registered for its clients: its
    // refcount is held by `disable_device()` until every client is removed.
    let dev = unsafe { Device::from_raw(dev) };
    // Unpublish before tearing down (see `Client::get_in`): new lookups find nothing, and the
    // grace period waits for lookups that found the data.
    // SAFETY: The client is registered and we are inside its `remove` for `dev`; storing NULL
    // does not allocate.
    unsafe { bindings::ib_set_client_data(dev.as_raw(), client.raw.get(), core::ptr::null_mut()) };
    client.fast_unpublish(dev.as_raw(), data);
    // SAFETY: FFI call; `remove` runs in process context.
    unsafe { bindings::synchronize_rcu() };
    // SAFETY: `data` came from `Arc::into_foreign` in `add_one`; ib_core calls `remove` once per
    // successful `add` with that data, and no lookup can reach it any more (above), so we take
    // the reference back exactly once.
    let data = unsafe { <Arc<T> as ForeignOwnable>::from_foreign(data) };
    T::remove(data, dev);
}

/// The client's `rename`.
///
/// # Safety
///
/// Called by ib_core only, for `T::client()`, between `add` and `remove`, with the client data
/// of `add`.
unsafe extern "C" fn rename_one<T: ClientData>(dev: *mut bindings::ib_device, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: `data` is the client data set in `add_one`; ib_core calls `rename` only between
    // `add` and `remove`, so the `Arc` is alive and we only borrow it.
    let data = unsafe { <Arc<T> as ForeignOwnable>::borrow(data) };
    // SAFETY: `rename` runs with the device registered.
    let dev = unsafe { Device::from_raw(dev) };
    data.rename(dev);
}
