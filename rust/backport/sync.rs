// SPDX-License-Identifier: GPL-2.0

//! RCU and lockdep: [`RcuGuard`] (mainline's `kernel::sync::rcu::Guard`), [`RcuBox`] (a value
//! published through RCU, mainline has no counterpart yet) and [`LockClass`] (a static lockdep
//! key, as `kernel::sync::LockClassKey` is in mainline).

use crate::bindings;
use core::sync::atomic::{AtomicPtr, Ordering};
use kernel::{prelude::*, types::Opaque};

/// An RCU read-side critical section, ended when dropped (the shape of mainline's
/// `kernel::sync::rcu::Guard`, which 6.12 lacks).
pub(crate) struct RcuGuard(core::marker::PhantomData<*mut ()>);

impl RcuGuard {
    /// Enters a read-side critical section.
    pub(crate) fn new() -> Self {
        // SAFETY: FFI call; paired with the unlock in `drop`. The guard is `!Send`, so the
        // unlock runs on the same CPU context.
        unsafe { bindings::ibext_shim_rcu_read_lock() };
        RcuGuard(core::marker::PhantomData)
    }
}

impl Drop for RcuGuard {
    fn drop(&mut self) {
        // SAFETY: Paired with the lock in `new`.
        unsafe { bindings::ibext_shim_rcu_read_unlock() };
    }
}

/// A lockdep class: one static per initialization site (see [`init_work!`]).
#[repr(transparent)]
pub(crate) struct LockClass(Opaque<bindings::lock_class_key>);

// SAFETY: lockdep only uses the key's address and its own fields, under its own locks.
unsafe impl Sync for LockClass {}

impl LockClass {
    /// A key for a `static`; lockdep needs no initialization of static keys.
    pub(crate) const fn new() -> Self {
        LockClass(Opaque::uninit())
    }

    /// Returns the key, for lockdep.
    pub(crate) fn as_ptr(&'static self) -> *mut bindings::lock_class_key {
        self.0.get()
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
