// SPDX-License-Identifier: GPL-2.0

//! ibext's `ib_client`: per-device state is made when a device registers and torn down when it
//! unregisters.
//!
//! ib_core calls `add` for every device present at registration and every device registered
//! later, and `remove` before a device goes away or when the client unregisters. Clients are
//! removed in reverse order of registration, so a ULP with its own client registered after
//! ibext's is removed first; but rdma_cm's client (and with it every rdma_cm-driven ULP: iSER,
//! NFS/RDMA, SMB-Direct) registered before ibext and is removed *after* it. So `remove` only
//! unpublishes the state and drops the client data's reference: what ULPs still hold (pooled
//! CQ entries, SRQ pools) keeps the state alive until they let go (see `device.rs`).
//!
//! This file owns the FFI (the `ib_client`, its client data as an `Arc`, the RCU rules of the
//! lookup); what a device's state is and does is `device.rs`'s, through [`ClientData`].

use crate::{
    bindings,
    device::DeviceState,
    ib::{Device, RcuGuard},
};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicBool, AtomicPtr, Ordering},
};
use kernel::{
    error::{from_result, to_result},
    ffi::c_int,
    prelude::*,
    sync::{Arc, ArcBorrow},
    types::{ForeignOwnable, Opaque},
};

/// What ibext keeps per device, as its client sees it.
pub(crate) trait ClientData: Send + Sync + Sized {
    /// Makes the state of a device being registered.
    fn add(dev: &Device) -> Result<Arc<Self>>;
    /// Tears down what the state holds of `dev`; the client data no longer refers to it.
    fn remove(this: Arc<Self>, dev: &Device);
    /// Follows a device rename.
    fn rename(&self, dev: &Device);
}

/// The storage of ibext's one `ib_client`.
struct ClientCell(Opaque<bindings::ib_client>);

// SAFETY: The client is written once by `Registration::new` before ib_core can see it, and after
// that only ib_core touches it, under its own locks.
unsafe impl Sync for ClientCell {}

static CLIENT: ClientCell = ClientCell(Opaque::uninit());
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Slots of [`FAST`].
const FAST_SLOTS: usize = 16;

/// A device ibext is attached to and its client data, beside ib_core's client-data xarray.
struct FastSlot {
    dev: AtomicPtr<bindings::ib_device>,
    data: AtomicPtr<c_void>,
}

/// A second way from a device to its client data, for the GID lookup's hot path: a scan of a
/// few slots instead of `xa_load()` under its own RCU section (in an instruction profile, about a fifth of a
/// 4-entry lookup went there). A device that finds no free slot is found through the xarray.
///
/// Written only by [`add_one`] (after `ib_set_client_data`) and [`remove_one`] (before its
/// grace period); a slot is claimed by `cmpxchg` of its device, so devices added at once take
/// different slots. Readers, inside RCU, match the device, read the data, and match the device
/// again: a slot freed and claimed by another device between the reads fails the second match,
/// and no other device can have the address of a device a caller holds. `remove_one` clears the
/// data, then the device, then waits for a grace period before the data's reference goes, as it
/// does for the xarray's entry.
static FAST: [FastSlot; FAST_SLOTS] = [const {
    FastSlot {
        dev: AtomicPtr::new(core::ptr::null_mut()),
        data: AtomicPtr::new(core::ptr::null_mut()),
    }
}; FAST_SLOTS];

/// Returns `dev`'s client data from [`FAST`], if it has a slot there. Called inside RCU.
fn fast_get(dev: *mut bindings::ib_device) -> Option<*mut c_void> {
    let s = FAST.iter().find(|s| s.dev.load(Ordering::Acquire) == dev)?;
    let data = s.data.load(Ordering::Acquire);
    (!data.is_null() && s.dev.load(Ordering::Acquire) == dev).then_some(data)
}

/// Gives `dev` a slot in [`FAST`] with `data`, if one is free.
fn fast_publish(dev: *mut bindings::ib_device, data: *mut c_void) {
    let null = core::ptr::null_mut();
    if let Some(s) = FAST.iter().find(|s| {
        s.dev
            .compare_exchange(null, dev, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) {
        s.data.store(data, Ordering::Release);
    }
}

/// Tests only: a device address no real device has, for [`test_fill_fast`].
#[cfg(ibext_kunit)]
static NO_DEVICE: u8 = 0;

/// Tests only: claims every free slot of [`FAST`] for a device that does not exist, so that a
/// device added next is found through the xarray; returns how many slots were claimed.
#[cfg(ibext_kunit)]
pub(crate) fn test_fill_fast() -> usize {
    let none = core::ptr::addr_of!(NO_DEVICE).cast_mut();
    let mut n = 0;
    while FAST.iter().any(|s| s.dev.load(Ordering::Acquire).is_null()) {
        fast_publish(none.cast(), none.cast());
        n += 1;
    }
    n
}

/// Tests only: frees the slots [`test_fill_fast`] claimed.
#[cfg(ibext_kunit)]
pub(crate) fn test_free_fast() {
    let none = core::ptr::addr_of!(NO_DEVICE).cast_mut();
    fast_unpublish(none.cast(), none.cast());
}

/// Returns whether `dev` has a slot in [`FAST`].
#[cfg(ibext_kunit)]
pub(crate) fn test_has_fast_slot(dev: &Device) -> bool {
    FAST.iter()
        .any(|s| s.dev.load(Ordering::Acquire) == dev.as_raw())
}

/// Frees `dev`'s slot in [`FAST`], if it has one; the caller then waits for a grace period.
fn fast_unpublish(dev: *mut bindings::ib_device, data: *mut c_void) {
    for s in FAST.iter() {
        if s.dev.load(Ordering::Acquire) == dev && s.data.load(Ordering::Acquire) == data {
            s.data.store(core::ptr::null_mut(), Ordering::Release);
            s.dev.store(core::ptr::null_mut(), Ordering::Release);
        }
    }
}

/// Proof that ibext's client is registered with ib_core; unregisters when dropped.
///
/// # Invariants
///
/// While a `Registration` exists, `CLIENT` holds an initialized, registered `ib_client`, and
/// it is the only `Registration`.
pub(crate) struct Registration(());

impl Registration {
    /// Registers the client; `add` runs for every device already present before this returns.
    pub(crate) fn new() -> Result<Self> {
        if REGISTERED.swap(true, Ordering::AcqRel) {
            return Err(EBUSY);
        }
        let client = bindings::ib_client {
            name: c"ibext".as_ptr().cast(),
            add: Some(add_one),
            remove: Some(remove_one),
            rename: Some(rename_one),
            ..Default::default()
        };
        // SAFETY: `REGISTERED` was false, so the client is not registered and nothing else
        // reads or writes `CLIENT`.
        unsafe { CLIENT.0.get().write(client) };
        // SAFETY: `CLIENT` is initialized above and is a static, so it outlives registration.
        if let Err(e) = to_result(unsafe { bindings::ib_register_client(CLIENT.0.get()) }) {
            REGISTERED.store(false, Ordering::Release);
            return Err(e);
        }
        // INVARIANT: registered above; `REGISTERED` keeps any other `Registration` from existing.
        Ok(Registration(()))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: The client is registered (type invariant). This calls `remove` for every
        // device and waits for callbacks in flight.
        unsafe { bindings::ib_unregister_client(CLIENT.0.get()) };
        REGISTERED.store(false, Ordering::Release);
    }
}

/// Runs `f` on ibext's state for `dev` inside an RCU read-side critical section; `None` if ibext
/// is not attached to `dev` or its `remove` has started.
///
/// The client data is read under RCU because it outlives nothing of ib_core's: 6.12's
/// `ib_get_client_data()` is a plain `xa_load()`, and `remove_client_context()`
/// (drivers/infiniband/core/device.c) calls `remove` *before* it erases the entry. So
/// [`remove_one`] clears the entry itself (and its [`FAST`] slot), waits for a grace period, and
/// only then drops the reference the entry held: a caller that found the state inside its
/// critical section used it, or took its own reference, before that.
///
/// `f` also gets the critical section, so that what it reads under RCU needs no section of its
/// own (the GID lookup's hot path).
pub(crate) fn with_device_state<R>(
    dev: &Device,
    f: impl FnOnce(ArcBorrow<'_, DeviceState>, &RcuGuard) -> R,
) -> Option<R> {
    if !REGISTERED.load(Ordering::Acquire) {
        return None;
    }
    let rcu = RcuGuard::new();
    let data = match fast_get(dev.as_raw()) {
        Some(data) => data,
        // SAFETY: `dev` is a live device (invariant of `Device`); `CLIENT` is initialized.
        None => unsafe { bindings::ibext_shim_get_client_data(dev.as_raw(), CLIENT.0.get()) },
    };
    if data.is_null() {
        return None;
    }
    // SAFETY: Non-null client data, in the xarray or in `FAST`, is only ever set by `add_one`,
    // from `Arc::into_foreign`; the reference it stands for is dropped by `remove_one` only
    // after clearing both and waiting for a grace period, so it is alive for the rest of this
    // critical section, which the borrow (passed to `f` only) does not outlive.
    let state = unsafe { <Arc<DeviceState> as ForeignOwnable>::borrow(data) };
    Some(f(state, &rcu))
}

/// Returns a reference to ibext's state for `dev`, or `None` if ibext is not attached to it
/// (or is being removed from it).
pub(crate) fn device_state(dev: &Device) -> Option<Arc<DeviceState>> {
    with_device_state(dev, |s, _| s.into())
}

/// The client's `add`.
///
/// # Safety
///
/// Called by ib_core only, with a device being registered.
unsafe extern "C" fn add_one(dev: *mut bindings::ib_device) -> c_int {
    from_result(|| {
        // SAFETY: ib_core calls `add` with a device that stays registered until `remove`.
        let dev = unsafe { Device::from_raw(dev) };
        let state = <DeviceState as ClientData>::add(dev)?;
        let data = state.into_foreign().cast_mut();
        // SAFETY: `CLIENT` is registered and we are inside its `add` for `dev`.
        unsafe { bindings::ib_set_client_data(dev.as_raw(), CLIENT.0.get(), data) };
        fast_publish(dev.as_raw(), data);
        Ok(0)
    })
}

/// The client's `remove`.
///
/// # Safety
///
/// Called by ib_core only, once per successful `add`, with that call's client data.
unsafe extern "C" fn remove_one(dev: *mut bindings::ib_device, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: ib_core calls `remove` with the device still registered for its clients: its
    // refcount is held by `disable_device()` until every client is removed.
    let dev = unsafe { Device::from_raw(dev) };
    // Unpublish before tearing down (see `with_device_state`): new lookups find nothing, and
    // the grace period waits for lookups that found the state.
    // SAFETY: `CLIENT` is registered and we are inside its `remove` for `dev`; storing NULL
    // does not allocate.
    unsafe { bindings::ib_set_client_data(dev.as_raw(), CLIENT.0.get(), core::ptr::null_mut()) };
    fast_unpublish(dev.as_raw(), data);
    // SAFETY: FFI call; `remove` runs in process context.
    unsafe { bindings::synchronize_rcu() };
    // SAFETY: `data` came from `Arc::into_foreign` in `add_one`; ib_core calls `remove` once per
    // successful `add` with that data, and no lookup can reach it any more (above), so we take
    // the reference back exactly once.
    let state = unsafe { <Arc<DeviceState> as ForeignOwnable>::from_foreign(data) };
    <DeviceState as ClientData>::remove(state, dev);
}

/// The client's `rename`.
///
/// # Safety
///
/// Called by ib_core only, between `add` and `remove`, with the client data of `add`.
unsafe extern "C" fn rename_one(dev: *mut bindings::ib_device, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: `data` is the client data set in `add_one`; ib_core calls `rename` only between
    // `add` and `remove`, so the `Arc` is alive and we only borrow it.
    let state = unsafe { <Arc<DeviceState> as ForeignOwnable>::borrow(data) };
    // SAFETY: `rename` runs with the device registered.
    let dev = unsafe { Device::from_raw(dev) };
    ClientData::rename(&*state, dev);
}
