// SPDX-License-Identifier: GPL-2.0

//! Glue to the kernel's `lib/dim`, shared by pooled CQs (`ib::cq::PooledCq`) and legacy ULPs'
//! CQs (`legacy_dim`): the `struct dim` they keep, applying the profile it picks, and
//! [`Attached`], a DIM hung off a ULP's own CQ, with its deferred pass.

use crate::{
    backport::sync::LockClass,
    bindings,
    ib::cq::{ArmFlags, UlpCq},
};
use core::{
    pin::Pin,
    ptr::NonNull,
    sync::atomic::{AtomicU64, AtomicU8, Ordering},
};
use kernel::{prelude::*, time::Ktime, types::Opaque};

/// The work function lib/dim schedules when it picks a new profile.
pub(crate) type WorkFn = unsafe extern "C" fn(*mut bindings::work_struct);

/// An initializer for a `struct dim` as upstream's `rdma_dim_init` makes one, whose work runs
/// `work_fn` and belongs to the lockdep class `key` named `name` (one per owner kind).
/// `priv` is left null for the owner to use.
pub(crate) fn new_dim(
    work_fn: WorkFn,
    name: &'static core::ffi::CStr,
    key: &'static LockClass,
) -> impl PinInit<Opaque<bindings::dim>> {
    Opaque::ffi_init(move |p: *mut bindings::dim| {
        // SAFETY: `p` is valid for writes (guaranteed by `ffi_init`).
        unsafe {
            p.write(bindings::dim {
                state: bindings::dim_state_DIM_START_MEASURE as u8,
                tune_state: bindings::dim_tune_state_DIM_GOING_RIGHT as u8,
                profile_ix: 0,
                ..Default::default()
            });
            bindings::ibext_shim_init_work(
                core::ptr::addr_of_mut!((*p).work),
                Some(work_fn),
                name.as_ptr().cast(),
                key.as_ptr(),
            );
        }
    })
}

/// Returns the `struct dim` whose `work` this is.
///
/// # Safety
///
/// `work` is the `work` field of a `struct dim`.
pub(crate) unsafe fn dim_of_work(work: *mut bindings::work_struct) -> *mut bindings::dim {
    let off = core::mem::offset_of!(bindings::dim, work);
    // SAFETY: Caller contract: `work` lies `off` bytes into a `struct dim`.
    unsafe { work.cast::<u8>().sub(off).cast() }
}

/// Returns the profile index lib/dim chose last.
pub(crate) fn profile_ix(dim: &Opaque<bindings::dim>) -> u8 {
    // SAFETY: `dim` is initialized; lib/dim reads and writes its `u8`s racily by design, and a
    // stale index is only a stale profile.
    unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*dim.get()).profile_ix)) }
}

/// Tests only: makes lib/dim's decision `ix`, as `rdma_dim()` does when it picks a profile
/// (`profile_ix`, then `schedule_work(&dim->work)`), and waits until the work has run.
#[cfg(ibext_kunit)]
pub(crate) fn test_force_profile(dim: &Opaque<bindings::dim>, ix: u8) {
    // SAFETY: `dim` is initialized and its work was initialized with it; the owner cancels the
    // work before freeing it, and the caller keeps the owner alive across this call.
    unsafe {
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*dim.get()).profile_ix), ix);
        let work = core::ptr::addr_of_mut!((*dim.get()).work);
        bindings::ibext_shim_queue_work_unbound(work);
        bindings::flush_work(work);
    }
}

/// How a profile was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The device's `modify_cq` took it.
    Hardware,
    /// The device has no `modify_cq`: software moderation applies it.
    Software,
    /// The device's `modify_cq` refused it (the errno): software moderation applies it.
    Refused(i32),
}

impl Applied {
    /// Whether the device moderates events itself now.
    pub(crate) fn in_hardware(self) -> bool {
        self == Applied::Hardware
    }
}

/// The moderation of each DIM profile index, `(completions, microseconds)`: the caller's
/// table (ibext's is `policy::profiles::profile`, lib/dim's `rdma_dim_prof`).
pub(crate) type Profiles = fn(u8) -> (u16, u16);

/// Applies the profile lib/dim chose for `cq` (its work function's job, as upstream's
/// `ib_cq_rdma_dim_work`): the device's own `modify_cq` where it has one, then measure afresh.
/// Returns the profile index applied, and how.
///
/// # Safety
///
/// `dim` is initialized and `cq` is alive.
pub(crate) unsafe fn apply_profile(
    dim: &Opaque<bindings::dim>,
    cq: *mut bindings::ib_cq,
    profile: Profiles,
) -> (u8, Applied) {
    let ix = profile_ix(dim);
    let (comps, usec) = profile(ix);
    // SAFETY: `cq` is alive (caller contract).
    let r = unsafe { bindings::ibext_shim_modify_cq(cq, comps, usec) };
    let applied = if r == 0 {
        Applied::Hardware
    } else if r == -(kernel::bindings::EOPNOTSUPP as i32) {
        Applied::Software
    } else {
        Applied::Refused(r)
    };
    // SAFETY: As in `profile_ix`.
    unsafe {
        core::ptr::write_volatile(
            core::ptr::addr_of_mut!((*dim.get()).state),
            bindings::dim_state_DIM_START_MEASURE as u8,
        )
    };
    (ix, applied)
}

/// What the owner of an [`Attached`] DIM does when lib/dim picks a new profile.
pub(crate) trait AttachedHandler: Sized + Send + Sync {
    /// lib/dim picked a new profile (process context, lib/dim's work): apply it
    /// ([`Attached::apply_profile`]).
    fn profile_chosen(d: &Attached<Self>);

    /// A deferred pass ([`Attached::defer_pass`]) is about to call the CQ's completion
    /// handler, `waited_us` after its timer was started; the ULP's run that call starts may
    /// already be running.
    fn deferred_pass_raising(d: &Attached<Self>, waited_us: u64);
}

/// lib/dim's state for a CQ that a ULP polls itself, hung off the CQ's own `dim` pointer, with
/// the owner's `data`, and a timer for the ULP's deferred passes (software moderation).
///
/// # Invariants
///
/// While attached, the CQ's `dim` points to `dim`, `dim.priv` to this object and `dim.work`'s
/// function is `Attached::<T>::work_fn` (how [`Attached::of`] recognises it); the object was
/// leaked from a pinned `KBox` by [`Attached::attach`] and is freed in place by
/// [`Attached::detach`], after the timer and the work are cancelled. `pending` is 0 or the
/// or-ed [`ArmFlags::bits`] of the arms deferred since the timer last ran; the timer is queued
/// whenever it is not 0, and the CQ then has a completion handler. While `pending` is not 0 the
/// CQ is not armed by ibext.
#[pin_data]
pub(crate) struct Attached<T: AttachedHandler> {
    #[pin]
    dim: Opaque<bindings::dim>,
    #[pin]
    timer: Opaque<bindings::hrtimer>,
    pending: AtomicU8,
    /// When the timer was last started (`ktime_get()`, ns).
    timer_started_ns: AtomicU64,
    cq: *mut bindings::ib_cq,
    data: T,
    #[pin]
    _pin: core::marker::PhantomPinned,
}

// SAFETY: `dim` is used by one sampler at a time (`UlpCq`'s invariants) and by lib/dim's work;
// `timer` by the hrtimer core, `pending` and `timer_started_ns` atomically; `cq` is only passed
// to ib_core; `T` is `Send + Sync`.
unsafe impl<T: AttachedHandler> Send for Attached<T> {}
// SAFETY: As for `Send`.
unsafe impl<T: AttachedHandler> Sync for Attached<T> {}

/// The lockdep class of attached DIMs' work.
static ATTACHED_CLASS: LockClass = LockClass::new();

impl<T: AttachedHandler> Attached<T> {
    /// Attaches a DIM with `data` to `cq`; `EBUSY` if the CQ already has one (ibext's or
    /// ib_core's), `ENOMEM` if it cannot be allocated. Nothing changes on error.
    pub(crate) fn attach(cq: &UlpCq, data: T) -> Result {
        let slot = cq.dim_slot();
        if !slot.load(Ordering::Acquire).is_null() {
            return Err(EBUSY);
        }
        let this = KBox::pin_init(
            pin_init!(Self {
                dim <- new_dim(Self::work_fn, c"ibext_legacy_dim", &ATTACHED_CLASS),
                timer <- Opaque::ffi_init(|p: *mut bindings::hrtimer| {
                    // SAFETY: `p` is valid for writes.
                    unsafe { bindings::ibext_shim_hrtimer_init(p, Some(Self::timer_fn)) }
                }),
                pending: AtomicU8::new(0),
                timer_started_ns: AtomicU64::new(0),
                cq: cq.as_raw(),
                data,
                _pin: core::marker::PhantomPinned,
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: The object is never moved: from here on it is reached through `raw` only,
        // and freed in place by `detach` (or below).
        let raw = KBox::into_raw(unsafe { Pin::into_inner_unchecked(this) });
        // SAFETY: `raw` is the live object; its `dim` is initialized and not yet published.
        let dim = unsafe {
            let dim = (*raw).dim.get();
            (*dim).priv_ = raw.cast();
            dim
        };
        if slot
            .compare_exchange(
                core::ptr::null_mut(),
                dim,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Another attach won the race.
            // SAFETY: `raw` came from `KBox::into_raw` above and was never published.
            drop(unsafe { KBox::from_raw(raw) });
            return Err(EBUSY);
        }
        // INVARIANT: published: the CQ's `dim` points to ours, whose `priv` points back.
        Ok(())
    }

    /// Returns the DIM attached to `cq` by [`Attached::attach`] with this `T`, or `None` (none,
    /// ib_core's, or another owner's).
    pub(crate) fn of(cq: &UlpCq) -> Option<&Self> {
        let dim = NonNull::new(cq.dim_slot().load(Ordering::Acquire))?;
        // Identity by work function: the kernel builds Rust with `-Ccodegen-units=1`, so each
        // `T` has one `work_fn`; a mismatch could only make this `None`, never a wrong `T`.
        let ours: WorkFn = Self::work_fn;
        // SAFETY: A non-null `dim` is a live `struct dim`, ibext's or ib_core's (ib_core's
        // `rdma_dim_init` in drivers/infiniband/core/cq.c fills `work` and sets `priv` to the
        // CQ); `work.func` and `priv` are plain fields of both, set before publication.
        let (func, owner) = unsafe { ((*dim.as_ptr()).work.func, (*dim.as_ptr()).priv_) };
        if func.map(|f| f as usize) != Some(ours as usize) || owner.is_null() {
            return None;
        }
        // SAFETY: Its work function is ours, so `attach` made it: `priv` is the live object,
        // alive until `detach`, which `UlpCq`'s invariants keep from running while the caller
        // holds `cq`.
        let this = unsafe { &*owner.cast::<Self>().cast_const() };
        (this.dim.get() == dim.as_ptr()).then_some(this)
    }

    /// Detaches and frees the DIM attached to `cq`; false if it had none of this `T`. A pass
    /// still deferred ends here in the re-arm the ULP asked for (see [`Attached::defer_pass`]):
    /// the CQ is armed with the deferred flags and `IB_CQ_REPORT_MISSED_EVENTS`, and if
    /// completions are waiting its handler is called, so nothing that arrived meanwhile is
    /// lost.
    pub(crate) fn detach(cq: &UlpCq) -> bool {
        let Some(this) = Self::of(cq) else {
            return false;
        };
        let raw = core::ptr::from_ref(this).cast_mut();
        // SAFETY: The timer was initialized in `attach`; only `defer_pass` starts it, which the
        // ULP no longer calls (`UlpCq`'s invariants), so once cancelled it stays idle.
        unsafe { bindings::hrtimer_cancel(this.timer.get()) };
        if let Some(flags) = ArmFlags::merged(this.pending.swap(0, Ordering::AcqRel)) {
            // SAFETY: The CQ is alive while attached and has a completion handler (type
            // invariants); `flags` includes `IB_CQ_REPORT_MISSED_EVENTS`.
            unsafe { bindings::ibext_shim_cq_arm_or_raise(this.cq, flags.raw()) };
        }
        cq.dim_slot()
            .store(core::ptr::null_mut(), Ordering::Release);
        // SAFETY: The work belongs to the object, which is still alive; nothing queues it any
        // more: only `rdma_dim()` does, from `sample`, which the ULP has stopped (`UlpCq`).
        unsafe { bindings::cancel_work_sync(core::ptr::addr_of_mut!((*this.dim.get()).work)) };
        // SAFETY: `raw` came from `KBox::into_raw` in `attach` and is no longer reachable.
        drop(unsafe { KBox::from_raw(raw) });
        true
    }

    /// Feeds lib/dim one sample: a poll loop that handled `completed` completions.
    pub(crate) fn sample(&self, completed: u32) {
        // SAFETY: One sampler at a time (`UlpCq`'s invariants, through which `self` was found).
        unsafe { bindings::rdma_dim(self.dim.get(), u64::from(completed)) };
    }

    /// Returns the profile index lib/dim chose last.
    pub(crate) fn profile_ix(&self) -> u8 {
        profile_ix(&self.dim)
    }

    /// Applies the profile lib/dim chose (see [`apply_profile`]).
    pub(crate) fn apply_profile(&self, profile: Profiles) -> (u8, Applied) {
        // SAFETY: `dim` is initialized; the CQ is alive while attached (type invariants).
        unsafe { apply_profile(&self.dim, self.cq, profile) }
    }

    /// Returns the owner's data.
    pub(crate) fn data(&self) -> &T {
        &self.data
    }

    /// Defers the ULP's re-arm by `usec` microseconds, leaving the CQ unarmed: the device
    /// raises nothing for what arrives meanwhile. Then ibext calls the CQ's completion handler
    /// once, as the device would have called it (`ibext_shim_cq_raise`), without arming: the
    /// ULP polls what arrived and re-arms again through ibext, which then decides on the pass
    /// it sampled. Arms deferred together become one pass; [`Attached::detach`] needs their
    /// flags, the widest asked ([`ArmFlags::merged`]). The CQ must have a completion handler.
    /// Returns whether this arm started the timer (false: it joined a pass already deferred).
    pub(crate) fn defer_pass(&self, flags: ArmFlags, usec: u32) -> bool {
        // The first arm of a batch starts the timer; later ones join it. A callback running
        // now may take this arm's bits or leave them to the timer started here: either way
        // the handler is called once for them.
        if self.pending.fetch_or(flags.bits(), Ordering::AcqRel) != 0 {
            return false;
        }
        // Before the timer starts: its callback reads it.
        self.timer_started_ns
            .store(Ktime::ktime_get().to_ns() as u64, Ordering::Release);
        // SAFETY: The timer was initialized in `attach` and is cancelled in `detach`.
        unsafe { bindings::ibext_shim_hrtimer_start_us(self.timer.get(), usec) };
        true
    }

    /// Runs the deferred pass, if one is pending: calls the CQ's completion handler.
    fn run_deferred(&self) {
        if self.pending.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        let started = self.timer_started_ns.load(Ordering::Acquire);
        let waited_us = (Ktime::ktime_get().to_ns() as u64).saturating_sub(started) / 1000;
        // Before the call: the ULP's run it starts may arm (and decide) before it returns.
        T::deferred_pass_raising(self, waited_us);
        // SAFETY: The CQ is alive while attached and has a completion handler (type
        // invariants: `pending` was not 0).
        unsafe { bindings::ibext_shim_cq_raise(self.cq) };
    }

    /// Tests only: runs the deferred pass now, as if its time had come.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_expire_deferred(&self) {
        // SAFETY: As in `detach`; a callback running now finishes first.
        unsafe { bindings::hrtimer_cancel(self.timer.get()) };
        self.run_deferred();
    }

    /// The deferred pass's timer (softirq context).
    ///
    /// # Safety
    ///
    /// Called by the hrtimer core only, with the `timer` of an attached object.
    unsafe extern "C" fn timer_fn(timer: *mut bindings::hrtimer) -> bindings::hrtimer_restart {
        // SAFETY: `timer` is the `timer` field of a live object: `detach` cancels the timer
        // before it frees the object.
        let this = unsafe { &*kernel::container_of!(timer, Self, timer) };
        this.run_deferred();
        bindings::hrtimer_restart_HRTIMER_NORESTART
    }

    /// Tests only: forces lib/dim's decision `ix` (see [`test_force_profile`]).
    #[cfg(ibext_kunit)]
    pub(crate) fn test_force_profile(&self, ix: u8) {
        test_force_profile(&self.dim, ix);
    }

    /// lib/dim's work: a new profile was chosen.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, with the `work` of an attached object's `dim`.
    unsafe extern "C" fn work_fn(work: *mut bindings::work_struct) {
        // SAFETY: `work` is the `work` field of the `dim` field of a live object: the work is
        // cancelled before the object is freed.
        let this = unsafe { &*kernel::container_of!(dim_of_work(work), Self, dim) };
        T::profile_chosen(this);
    }
}
