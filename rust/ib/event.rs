// SPDX-License-Identifier: GPL-2.0

//! [`EventWork`]: a device's asynchronous event handler (`ib_register_event_handler`) and a work
//! item, together with the data both of them use.
//!
//! ib_core calls an event handler with `device->event_handler_rwsem` held for reading
//! (`ib_dispatch_event_clients` in drivers/infiniband/core/device.c) and
//! `ib_unregister_event_handler` takes it for writing, so unregistering waits for a running
//! handler. The work item is cancelled with `cancel_work_sync`. Dropping an `EventWork`
//! unregisters the handler, then cancels the work, and only then drops the data, so neither
//! callback ever sees freed data.
//!
//! An `EventWork` is made only through its `PinInit`, so it always lives in pinned memory (like
//! `kernel::sync::Mutex`), and its methods take `&self`.

use crate::{
    backport::sync::LockClass,
    bindings,
    ib::{Device, DeviceRef},
};
use core::{
    marker::PhantomPinned,
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{prelude::*, str::CStr, types::Opaque};

/// An asynchronous event of a device, `struct ib_event`, as a handler sees it.
///
/// # Invariants
///
/// A `&Event` refers to an event that is valid for the reference's lifetime.
#[repr(transparent)]
pub(crate) struct Event(Opaque<bindings::ib_event>);

impl Event {
    /// Returns the port whose GID table changed, for `IB_EVENT_GID_CHANGE`; `None` for other
    /// events.
    pub(crate) fn gid_change_port(&self) -> Option<u32> {
        let ev = self.0.get();
        // SAFETY: The event is valid (type invariant); a GID change names a port in
        // `element.port_num` (`dispatch_gid_change_event` in drivers/infiniband/core/cache.c).
        unsafe {
            ((*ev).event == bindings::ib_event_type_IB_EVENT_GID_CHANGE)
                .then(|| (*ev).element.port_num)
        }
    }
}

/// What an [`EventWork`]'s callbacks do with its data.
pub(crate) trait EventWorker: Send + Sync + Sized {
    /// An event of the device, called by `ib_dispatch_event_clients` with the device's
    /// `event_handler_rwsem` held for reading (and, for a GID change, the port's GID table
    /// mutex, `dispatch_gid_change_event` in drivers/infiniband/core/cache.c): it must not wait
    /// for anything that waits on those.
    fn event(this: &EventWork<Self>, ev: &Event);
    /// The work item runs (process context; it may sleep).
    fn work(this: &EventWork<Self>);
}

/// A device's event handler and a work item, with their data `T`.
///
/// # Invariants
///
/// `handler` is initialized for `dev` with [`EventWork::handler_fn`] and registered exactly
/// while `registered` is true; `work` is initialized with [`EventWork::work_fn`].
#[pin_data(PinnedDrop)]
pub(crate) struct EventWork<T: EventWorker> {
    #[pin]
    handler: Opaque<bindings::ib_event_handler>,
    #[pin]
    work: Opaque<bindings::work_struct>,
    registered: AtomicBool,
    dev: DeviceRef,
    #[pin]
    data: T,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: The C objects are used by ib_core and the workqueue under their own locks; `data` is
// `Send + Sync` (bound of `EventWorker`).
unsafe impl<T: EventWorker> Send for EventWork<T> {}
// SAFETY: As for `Send`.
unsafe impl<T: EventWorker> Sync for EventWork<T> {}

impl<T: EventWorker> EventWork<T> {
    /// An initializer for `dev`'s handler (not yet registered) and a work item named `name`, of
    /// lockdep class `key`, with `data`.
    pub(crate) fn new_with<E>(
        dev: &Device,
        name: &'static CStr,
        key: &'static LockClass,
        data: impl PinInit<T, E>,
    ) -> Result<impl PinInit<Self, Error>>
    where
        Error: From<E>,
    {
        let dev_ref = DeviceRef::try_get(dev).ok_or(ENODEV)?;
        let raw = dev.as_raw();
        Ok(try_pin_init!(Self {
            // SAFETY: Only initializes the memory it is given.
            handler <- Opaque::ffi_init(|h| unsafe {
                bindings::ibext_shim_init_event_handler(h, raw, Some(Self::handler_fn))
            }),
            // SAFETY: As above; `name` and `key` are static.
            work <- Opaque::ffi_init(|w| unsafe {
                bindings::ibext_shim_init_work(
                    w,
                    Some(Self::work_fn),
                    name.as_char_ptr(),
                    key.as_ptr(),
                )
            }),
            registered: AtomicBool::new(false),
            dev: dev_ref,
            data <- data,
            _pin: PhantomPinned,
        }? Error))
    }

    /// Returns the device.
    pub(crate) fn device(&self) -> &Device {
        &self.dev
    }

    /// Returns the data.
    pub(crate) fn data(&self) -> &T {
        &self.data
    }

    /// Registers the event handler; a no-op if it is registered.
    pub(crate) fn register(&self) {
        if !self.registered.swap(true, Ordering::AcqRel) {
            // SAFETY: `handler` is initialized (type invariant) and pinned (an `EventWork` is
            // made only in place); `drop` unregisters it before the memory goes.
            unsafe { bindings::ib_register_event_handler(self.handler.get()) };
        }
    }

    /// Unregisters the event handler, waiting for a running call; a no-op if not registered.
    pub(crate) fn unregister(&self) {
        if self.registered.swap(false, Ordering::AcqRel) {
            // SAFETY: Registered (type invariant).
            unsafe { bindings::ib_unregister_event_handler(self.handler.get()) };
        }
    }

    /// Queues the work item on the system's unbound workqueue (allowed in atomic context; a
    /// no-op while it is queued).
    pub(crate) fn queue(&self) {
        // SAFETY: `work` is initialized (type invariant) and cancelled before the memory goes.
        unsafe { bindings::ibext_shim_queue_work_unbound(self.work.get()) };
    }

    /// Cancels the work item, waiting for a running call. It may be queued again afterwards.
    pub(crate) fn cancel(&self) {
        // SAFETY: `work` is initialized (type invariant).
        unsafe { bindings::cancel_work_sync(self.work.get()) };
    }

    /// The handler's function.
    ///
    /// # Safety
    ///
    /// Called by ib_core only, for a registered `handler` of an `EventWork<T>`.
    unsafe extern "C" fn handler_fn(
        h: *mut bindings::ib_event_handler,
        ev: *mut bindings::ib_event,
    ) {
        // SAFETY: `h` is the `handler` field of a live `EventWork<T>` (registered only by
        // `register`, unregistered before it is dropped); `Opaque<T>` has the layout of `T`.
        let this = unsafe { &*kernel::container_of!(h, Self, handler) };
        // SAFETY: ib_core passes an event valid for the call; `Event` is transparent.
        let ev = unsafe { &*ev.cast::<Event>() };
        T::event(this, ev);
    }

    /// The work item's function.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, for the `work` of an `EventWork<T>`.
    unsafe extern "C" fn work_fn(w: *mut bindings::work_struct) {
        // SAFETY: `w` is the `work` field of a live `EventWork<T>`: drop cancels it first.
        let this = unsafe { &*kernel::container_of!(w, Self, work) };
        T::work(this);
    }
}

#[pinned_drop]
impl<T: EventWorker> PinnedDrop for EventWork<T> {
    fn drop(self: Pin<&mut Self>) {
        // No event can queue the work after this; then the last queueing is cancelled.
        self.unregister();
        self.cancel();
    }
}

/// An initializer of an [`EventWork`] whose work item has a lockdep class of this call site's own.
macro_rules! new_event_work {
    ($dev:expr, $name:literal, $data:expr) => {{
        static KEY: $crate::backport::sync::LockClass = $crate::backport::sync::LockClass::new();
        $crate::ib::event::EventWork::new_with($dev, ::kernel::c_str!($name), &KEY, $data)
    }};
}
pub(crate) use new_event_work;
