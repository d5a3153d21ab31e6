// SPDX-License-Identifier: GPL-2.0

//! ibext's `ib_client`: per-device state is made when a device registers and torn down when it
//! unregisters.
//!
//! ib_core calls `add` for every device present at registration and every device registered
//! later, and `remove` before a device goes away or when the client unregisters. Clients are
//! removed in reverse order of registration, so a ULP that registered after ibext is removed
//! from a device before ibext is, and ibext's state outlives every ULP use of it.

use crate::{bindings, device::DeviceState, ib::Device};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{
    error::{from_result, to_result},
    ffi::c_int,
    prelude::*,
    sync::{Arc, ArcBorrow},
    types::{ForeignOwnable, Opaque},
};

/// The storage of ibext's one `ib_client`.
struct ClientCell(Opaque<bindings::ib_client>);

// SAFETY: The client is written once by `Registration::new` before ib_core can see it, and after
// that only ib_core touches it, under its own locks.
unsafe impl Sync for ClientCell {}

static CLIENT: ClientCell = ClientCell(Opaque::uninit());
static REGISTERED: AtomicBool = AtomicBool::new(false);

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

/// Returns ibext's state for `dev`, or `None` if ibext is not attached to it.
///
/// Valid for as long as the caller may use `dev`: a ULP's own client callbacks and every call it
/// makes between its `add` and `remove` lie inside ibext's `add`..`remove` of the same device.
pub(crate) fn device_state(dev: &Device) -> Option<Arc<DeviceState>> {
    if !REGISTERED.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: `dev` is registered (invariant of `Device`) and `CLIENT` is registered.
    let data = unsafe { bindings::ibext_shim_get_client_data(dev.as_raw(), CLIENT.0.get()) };
    if data.is_null() {
        return None;
    }
    // SAFETY: Non-null client data is only ever set by `add_one`, from `Arc::into_foreign`, and
    // stays valid until `remove_one`, which the caller's use of `dev` precedes.
    let borrowed = unsafe { <Arc<DeviceState> as ForeignOwnable>::borrow(data) };
    Some(borrowed.into())
}

/// Returns ibext's state for `dev` without taking a reference, for hot paths that may run in
/// atomic context (GID lookups): no shared counter is touched, and the caller can never drop the
/// last reference.
///
/// Valid for as long as `dev` is, as for [`device_state`].
pub(crate) fn device_state_borrow(dev: &Device) -> Option<ArcBorrow<'_, DeviceState>> {
    if !REGISTERED.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: `dev` is registered (invariant of `Device`) and `CLIENT` is registered.
    let data = unsafe { bindings::ibext_shim_get_client_data(dev.as_raw(), CLIENT.0.get()) };
    if data.is_null() {
        return None;
    }
    // SAFETY: As in `device_state`: the client data stays valid while the caller may use `dev`,
    // which the returned borrow's lifetime is tied to.
    Some(unsafe { <Arc<DeviceState> as ForeignOwnable>::borrow(data) })
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
        let state = DeviceState::add(dev)?;
        // SAFETY: `CLIENT` is registered and we are inside its `add` for `dev`.
        unsafe {
            bindings::ib_set_client_data(
                dev.as_raw(),
                CLIENT.0.get(),
                state.into_foreign().cast_mut(),
            )
        };
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
    // SAFETY: `data` came from `Arc::into_foreign` in `add_one`, and ib_core calls `remove`
    // once per successful `add`, after clearing the client data, so we take it back exactly once.
    let state = unsafe { <Arc<DeviceState> as ForeignOwnable>::from_foreign(data) };
    // SAFETY: The device is still registered while its clients are removed.
    let dev = unsafe { Device::from_raw(dev) };
    state.remove(dev);
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
    state.rename(dev);
}
