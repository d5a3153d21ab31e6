// SPDX-License-Identifier: GPL-2.0

//! Delayed work embedded in the object it works on: [`DelayedWork`].
//!
//! 6.12's `kernel::workqueue` has no delayed work (it arrives in 6.16), and its work items own
//! an `Arc` of their object while queued. ibext's delayed work is housekeeping of an object
//! that must not be kept alive by it (a device state holds a device reference), so it borrows
//! instead: the object's drop cancels the work and waits for it before anything the work reads
//! is dropped (see [`HasDelayedWork`]).

use crate::{
    backport::{bug::warn_on_once, sync::LockClass},
    bindings,
};
use core::marker::PhantomData;
use kernel::{prelude::*, types::Opaque};

/// What a [`DelayedWork`] runs, in process context (`system_unbound_wq`).
pub(crate) trait DelayedRun: Sync {
    /// Runs the work on the object that holds it.
    fn run(&self);
}

/// An object with a [`DelayedWork`] field.
///
/// Implemented by [`impl_has_delayed_work!`] only.
///
/// # Safety
///
/// `OFFSET` is the offset in `Self` of a `DelayedWork<Self>` field that is declared before
/// every field [`DelayedRun::run`] reads: it is dropped first, and its drop cancels the work
/// and waits for a run in progress.
pub(crate) unsafe trait HasDelayedWork: DelayedRun + Sized {
    /// The field's offset.
    const OFFSET: usize;

    /// Returns the field (which also checks its type where the trait is implemented).
    fn delayed_work(&self) -> &DelayedWork<Self>;
}

/// Implements [`HasDelayedWork`] for `$t` (optionally generic: `impl<H: Bound> Type<H>`) with
/// its field `$field`, which must be declared before every field `$t`'s [`DelayedRun::run`]
/// reads, or be cancelled by `$t`'s own drop first.
macro_rules! impl_has_delayed_work {
    (impl<$g:ident: $b:path> $t:ty, $field:ident) => {
        // SAFETY: `$field` is a `DelayedWork<$t>` (`delayed_work` type-checks it), declared
        // before what `run` reads or cancelled first (the macro's contract, stated where it is
        // used).
        unsafe impl<$g: $b> $crate::backport::workqueue::HasDelayedWork for $t {
            const OFFSET: usize = ::core::mem::offset_of!($t, $field);

            fn delayed_work(&self) -> &$crate::backport::workqueue::DelayedWork<$t> {
                &self.$field
            }
        }
    };
    ($t:ty, $field:ident) => {
        // SAFETY: As above.
        unsafe impl $crate::backport::workqueue::HasDelayedWork for $t {
            const OFFSET: usize = ::core::mem::offset_of!($t, $field);

            fn delayed_work(&self) -> &$crate::backport::workqueue::DelayedWork<$t> {
                &self.$field
            }
        }
    };
}
pub(crate) use impl_has_delayed_work;

/// A delayed work item that runs `T::run` on the `T` holding it.
///
/// # Invariants
///
/// `dw` is initialized with [`run_delayed::<T>`] as its function, and lives inside a `T` at
/// `T::OFFSET` (`HasDelayedWork`); it is neither pending nor running once dropped.
#[pin_data(PinnedDrop)]
pub(crate) struct DelayedWork<T: HasDelayedWork> {
    #[pin]
    dw: Opaque<bindings::delayed_work>,
    _t: PhantomData<fn(&T)>,
}

// SAFETY: The work item is only touched through the workqueue API, which serializes itself.
unsafe impl<T: HasDelayedWork> Send for DelayedWork<T> {}
// SAFETY: As for `Send`.
unsafe impl<T: HasDelayedWork> Sync for DelayedWork<T> {}

impl<T: HasDelayedWork> DelayedWork<T> {
    /// An initializer; `key` is the lockdep class of the holder's work (a `static`).
    pub(crate) fn new(name: &'static CStr, key: &'static LockClass) -> impl PinInit<Self> {
        pin_init!(Self {
            // SAFETY: Only initializes the memory it is given.
            dw <- Opaque::ffi_init(|p| unsafe {
                bindings::ibext_shim_init_delayed_work(
                    p,
                    Some(run_delayed::<T>),
                    name.as_char_ptr(),
                    key.as_ptr(),
                )
            }),
            _t: PhantomData,
        })
    }

    /// Queues the work to run in `ms` milliseconds, unless it is pending already (then its
    /// time stays). May be called in any context, under spinlocks.
    pub(crate) fn queue(&self, ms: u32) -> bool {
        // SAFETY: Initialized (type invariant); the holder outlives the work (its drop cancels).
        unsafe { bindings::ibext_shim_queue_delayed_work(self.dw.get(), ms) }
    }

    /// Queues the work to run in `ms` milliseconds, or moves it there if it is pending for
    /// later or sooner (`mod_delayed_work`). May be called in any context.
    pub(crate) fn kick(&self, ms: u32) {
        // SAFETY: Initialized (type invariant); the holder outlives the work (its drop cancels).
        unsafe { bindings::ibext_shim_mod_delayed_work(self.dw.get(), ms) };
    }

    /// Cancels the work, waits for a run in progress, and disables it: queueing it again (a run
    /// in progress included) does nothing from now on (`disable_delayed_work_sync`, 6.12's
    /// kernel/workqueue.c). May sleep. Returns whether it was pending.
    pub(crate) fn disable_sync(&self) -> bool {
        // SAFETY: Initialized (type invariant).
        unsafe { bindings::ibext_shim_disable_delayed_work_sync(self.dw.get()) }
    }

    /// Runs the work now if it is pending, and waits for it to finish; may sleep.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn flush(&self) -> bool {
        // SAFETY: Initialized (type invariant).
        unsafe { bindings::ibext_shim_flush_delayed_work(self.dw.get()) }
    }

    /// Returns whether the work is queued and has not started.
    pub(crate) fn pending(&self) -> bool {
        // SAFETY: Initialized (type invariant).
        unsafe { bindings::ibext_shim_delayed_work_pending(self.dw.get()) }
    }
}

#[pinned_drop]
impl<T: HasDelayedWork> PinnedDrop for DelayedWork<T> {
    fn drop(self: Pin<&mut Self>) {
        // INVARIANT: neither pending nor running from here on, and a run in progress cannot
        // queue the work again.
        self.disable_sync();
    }
}

/// The work function of a [`DelayedWork<T>`].
///
/// # Safety
///
/// Called by the workqueue only, for the `dw` of a `DelayedWork<T>` inside a live `T`.
unsafe extern "C" fn run_delayed<T: HasDelayedWork>(w: *mut bindings::work_struct) {
    // SAFETY: `w` is the `work` field of a `delayed_work` (its first, so the same address),
    // which is the `dw` of a `DelayedWork<T>` at `T::OFFSET` in a `T` (invariants); the `T` is
    // live, since dropping its `DelayedWork` (declared before what `run` reads) waits for this
    // run to return.
    let (holder, field) = unsafe {
        let dw = kernel::container_of!(w, bindings::delayed_work, work);
        let field = kernel::container_of!(dw, DelayedWork<T>, dw);
        (&*field.cast::<u8>().sub(T::OFFSET).cast::<T>(), field)
    };
    // The offset and the field agree (both come from the macro); a mismatch would be a bug in
    // it, caught here before the holder is used.
    if warn_on_once!(
        !core::ptr::eq(holder.delayed_work(), field),
        "ibext: a delayed work item's holder is not where its offset says"
    ) {
        return;
    }
    holder.run();
}

/// Returns milliseconds of a monotonic clock with jiffy resolution (`get_jiffies_64`), for
/// aging: cheap, and never used to measure.
pub(crate) fn now_ms() -> u64 {
    // SAFETY: FFI call without preconditions.
    unsafe { bindings::ibext_shim_now_ms() }
}

/// Initializes a work item with a lockdep class and name of this call site's own, so that
/// lockdep tells ibext's work items apart (C's `INIT_WORK` does the same with a static per
/// expansion).
///
/// `$slot` is a `*mut bindings::work_struct` valid for writes, `$func` the work function.
macro_rules! init_work {
    ($slot:expr, $func:expr, $name:literal) => {{
        static KEY: $crate::backport::sync::LockClass = $crate::backport::sync::LockClass::new();
        $crate::bindings::ibext_shim_init_work(
            $slot,
            Some($func),
            concat!($name, "\0").as_ptr().cast(),
            KEY.as_ptr(),
        )
    }};
}
pub(crate) use init_work;
