// SPDX-License-Identifier: GPL-2.0

//! ibext's completion engine: the budgeted, NAPI-like poll loop behind every pooled CQ.
//!
//! A CQ's completion handler may run in hard-IRQ context, or, for rxe, with the CQ's spinlock
//! held and interrupts off, so it only schedules: `irq_poll` for `IB_POLL_SOFTIRQ`, a work item
//! on ibext's own workqueues for the two workqueue contexts.
//!
//! What a poll pass does, and in which order, is `policy::engine::run_pass`, pure code that the
//! host tests drive with a fake CQ; this file implements its `Cq` trait for a pooled CQ
//! ([`Poller`]): `ib_poll_cq` in batches of [`POLL_BATCH`] with every completion handed to its
//! `wr_cqe->done`, up to the context's budget; `IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS`
//! re-arms (another pass if completions were missed: the race-free loop from the IB/srp thread);
//! and staying in polling mode without re-arming after a pass that used its whole budget.
//!
//! Moderation (`policy::moderation`): with DIM, every pass feeds `rdma_dim()` one sample;
//! a new profile goes to the device's `modify_cq` where it has one, and otherwise is applied in
//! software by deferring the next poll with an hrtimer instead of re-arming. The adaptive mode
//! switches between interrupt mode and polling mode.
//!
//! Teardown: a CQ is marked dying and the handlers that may not have seen the mark are waited
//! for (they run inside `rcu_read_lock()`); then the poller is disabled or cancelled, the
//! moderation timer (whose callback schedules nothing once the CQ is dying) and DIM's work are
//! cancelled, and only then is the CQ destroyed.

use crate::{
    bindings, dim,
    ib::Device,
    ledger::{Kind, Token},
    policy::{
        engine::{self, PassStats},
        moderation::{ModState, Moderation},
    },
    warn::warn_on_once,
};
use core::{
    ffi::c_void,
    marker::PhantomPinned,
    pin::Pin,
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering},
};
use kernel::{error::from_err_ptr, ffi::c_int, prelude::*, types::Opaque};

/// Completions polled per `ib_poll_cq` call (upstream `IB_POLL_BATCH`).
pub(crate) const POLL_BATCH: usize = engine::POLL_BATCH as usize;
/// Completions per pass in softirq context (upstream `IB_POLL_BUDGET_IRQ`).
pub(crate) const BUDGET_SOFTIRQ: u32 = 256;
/// Completions per pass in workqueue context (upstream `IB_POLL_BUDGET_WORKQUEUE`).
pub(crate) const BUDGET_WORKQUEUE: u32 = 65536;

/// The tests' gate on a CQ's passes (see `CqEngine::test_hold`): open, held, held with a pass
/// wanted.
const GATE_OPEN: u8 = 0;
#[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
const GATE_HELD: u8 = 1;
#[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
const GATE_PENDING: u8 = 2;

/// Re-arm flags at the end of a pass that stayed under budget.
const REARM_FLAGS: bindings::ib_cq_notify_flags = bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP
    | bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS;

/// The contexts a pooled CQ can be polled in; `IB_POLL_DIRECT` cannot be pooled.
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

/// The lockdep class of pooled CQs' DIM work.
static DIM_CLASS: crate::ib::LockClass = crate::ib::LockClass::new();

/// ibext's completion workqueues, bound and unbound; published while the module is loaded.
static COMP_WQ: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(core::ptr::null_mut());
static COMP_UNBOUND_WQ: AtomicPtr<bindings::workqueue_struct> =
    AtomicPtr::new(core::ptr::null_mut());

/// Owns ibext's completion workqueues; made before the client registers, destroyed after it
/// unregisters (so after every pooled CQ is gone).
pub(crate) struct Workqueues(());

impl Workqueues {
    /// Allocates and publishes both workqueues.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: FFI call without preconditions.
        let bound = unsafe { bindings::ibext_shim_alloc_comp_wq(false) };
        if bound.is_null() {
            return Err(ENOMEM);
        }
        // SAFETY: FFI call without preconditions.
        let unbound = unsafe { bindings::ibext_shim_alloc_comp_wq(true) };
        if unbound.is_null() {
            // SAFETY: `bound` was allocated above and nothing has used it.
            unsafe { bindings::destroy_workqueue(bound) };
            return Err(ENOMEM);
        }
        COMP_WQ.store(bound, Ordering::Release);
        COMP_UNBOUND_WQ.store(unbound, Ordering::Release);
        Ok(Workqueues(()))
    }
}

impl Drop for Workqueues {
    fn drop(&mut self) {
        let live = crate::ledger::counts(Kind::PooledCq).live();
        if live != 0 {
            // A ULP leaked pooled CQs (reported at unload): they may still queue work, so the
            // queues are leaked with them rather than destroyed under them.
            pr_err!(
                "{} pooled CQs still live: keeping the completion workqueues\n",
                live
            );
            return;
        }
        for wq in [&COMP_WQ, &COMP_UNBOUND_WQ] {
            let q = wq.swap(core::ptr::null_mut(), Ordering::AcqRel);
            if !q.is_null() {
                // SAFETY: `q` was allocated by `new`; every CQ that queued work on it was
                // destroyed (and its work cancelled) before the module object drops this.
                unsafe { bindings::destroy_workqueue(q) };
            }
        }
    }
}

/// Counters of one pooled CQ, shown in debugfs.
#[derive(Default)]
pub(crate) struct CqStats {
    /// Completion events: calls of the CQ's completion handler, our "interrupts".
    pub(crate) events: AtomicU64,
    /// Poll passes.
    pub(crate) passes: AtomicU64,
    /// Completions handed to `wr_cqe->done`.
    pub(crate) completions: AtomicU64,
    /// Passes that used their whole budget and stayed in polling mode.
    pub(crate) budget_exhausted: AtomicU64,
    /// DIM samples (`rdma_dim()` calls, one per pass).
    pub(crate) samples: AtomicU64,
    /// DIM profile changes applied.
    pub(crate) profile_changes: AtomicU64,
    /// The highest DIM profile index applied so far.
    pub(crate) profile_max: AtomicU64,
    /// Passes run by the software-moderation timer instead of a completion event.
    pub(crate) deferred_polls: AtomicU64,
    /// Microseconds the software-moderation timer was asked to wait, summed.
    pub(crate) deferred_asked_us: AtomicU64,
    /// Microseconds from starting the timer to its callback, summed: how closely the timer
    /// follows the profile (under TCG, not closely).
    pub(crate) deferred_waited_us: AtomicU64,
    /// Adaptive mode: switches between interrupt and polling mode.
    pub(crate) mode_switches: AtomicU64,
    /// DIM profiles the device's `modify_cq` took.
    pub(crate) hw_applied: AtomicU64,
    /// DIM profiles the device's `modify_cq` refused (software moderation took over).
    pub(crate) hw_refused: AtomicU64,
    /// Re-arms that reported missed completions (another pass followed at once).
    pub(crate) missed_at_rearm: AtomicU64,
}

impl CqStats {
    /// Adds one pass's counters. Only the poller writes these (one pass at a time), so a load
    /// and a store suffice: no read-modify-write on the completion path; readers see whole
    /// values.
    fn add_pass(&self, p: &PassStats) {
        let add = |c: &AtomicU64, n: u64| {
            if n != 0 {
                c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            }
        };
        add(&self.passes, p.passes);
        add(&self.completions, p.completions);
        add(&self.budget_exhausted, p.budget_exhausted);
        add(&self.samples, p.samples);
        add(&self.mode_switches, p.mode_switches);
        add(&self.missed_at_rearm, p.missed_at_rearm);
    }
}

/// A snapshot of a pooled CQ's counters and DIM profile, for debugfs, the tests and the
/// benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CqSnapshot {
    /// See [`CqStats::events`].
    pub(crate) events: u64,
    /// See [`CqStats::passes`].
    pub(crate) passes: u64,
    /// See [`CqStats::completions`].
    pub(crate) completions: u64,
    /// See [`CqStats::budget_exhausted`].
    pub(crate) budget_exhausted: u64,
    /// See [`CqStats::samples`].
    pub(crate) samples: u64,
    /// See [`CqStats::profile_changes`].
    pub(crate) profile_changes: u64,
    /// See [`CqStats::profile_max`].
    pub(crate) profile_max: u64,
    /// See [`CqStats::deferred_polls`].
    pub(crate) deferred_polls: u64,
    /// See [`CqStats::deferred_asked_us`].
    pub(crate) deferred_asked_us: u64,
    /// See [`CqStats::deferred_waited_us`].
    pub(crate) deferred_waited_us: u64,
    /// See [`CqStats::mode_switches`].
    pub(crate) mode_switches: u64,
    /// See [`CqStats::hw_applied`].
    pub(crate) hw_applied: u64,
    /// See [`CqStats::hw_refused`].
    pub(crate) hw_refused: u64,
    /// See [`CqStats::missed_at_rearm`].
    pub(crate) missed_at_rearm: u64,
    /// Whether the device moderates the CQ's events itself now.
    pub(crate) hw_moderation: bool,
    /// The DIM profile index now.
    pub(crate) profile_ix: u8,
}

/// A pooled CQ's engine: its poller, its completion buffer and its counters.
///
/// # Invariants
///
/// - `cq` is null until the CQ exists; from then until the CQ is destroyed it is that CQ, whose
///   `cq_context` is this engine.
/// - Only the poller (irq_poll or the work item, never both, never concurrently with itself)
///   touches `wc` and `modstate`, and calls `rdma_dim()` on `dim`.
#[pin_data]
pub(crate) struct CqEngine {
    cq: AtomicPtr<bindings::ib_cq>,
    ctx: PollCtx,
    vector: u32,
    moderation: Moderation,
    /// The device applies DIM profiles itself: it has `modify_cq`, and took the last profile.
    hw_moderation: AtomicBool,
    /// What owns the CQ (the device state whose pools hold it), for `ibext_cq_pool_put` to find
    /// its way back from the CQ alone; opaque to the engine.
    owner: *const c_void,
    #[pin]
    iop: Opaque<bindings::irq_poll>,
    #[pin]
    work: Opaque<bindings::work_struct>,
    wc: Opaque<[bindings::ib_wc; POLL_BATCH]>,
    /// lib/dim's state; its `work` applies a new profile.
    #[pin]
    dim: Opaque<bindings::dim>,
    /// Software moderation: the deferred poll.
    #[pin]
    timer: Opaque<bindings::hrtimer>,
    /// When `timer` was started (ns, monotonic clock).
    timer_started: AtomicU64,
    modstate: Opaque<ModState>,
    stats: CqStats,
    dying: AtomicBool,
    /// The tests' gate (`GATE_*`); always open in the product module.
    gate: AtomicU8,
    _token: Token,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: The poller state (`iop`, `work`, `wc`) is used by one poller at a time, serialized by
// irq_poll or the workqueue; everything else is atomic or immutable.
unsafe impl Send for CqEngine {}
// SAFETY: As for `Send`.
unsafe impl Sync for CqEngine {}

impl CqEngine {
    fn cq(&self) -> *mut bindings::ib_cq {
        self.cq.load(Ordering::Acquire)
    }

    /// Returns the engine of `cq` if `cq` is one of ibext's pooled CQs (its completion handler
    /// is the engine's), `None` for any other CQ.
    ///
    /// # Safety
    ///
    /// `cq` is a live CQ, and stays live for `'a`.
    pub(crate) unsafe fn of_cq<'a>(cq: *mut bindings::ib_cq) -> Option<&'a Self> {
        // SAFETY: `cq` is live (caller contract).
        let handler = unsafe { bindings::ibext_shim_cq_comp_handler(cq) };
        let ours: unsafe extern "C" fn(*mut bindings::ib_cq, *mut c_void) = Self::comp_handler;
        if handler != ours as *mut c_void {
            return None;
        }
        // SAFETY: Only `create` makes CQs with this handler, and their `cq_context` is the
        // engine, which outlives the CQ (`OwnedCq`).
        unsafe { ((*cq).cq_context as *const Self).as_ref() }
    }

    /// Returns the owner given to [`CqEngine::create`].
    pub(crate) fn owner(&self) -> *const c_void {
        self.owner
    }

    /// Returns the CQ's moderation mode.
    pub(crate) fn moderation(&self) -> Moderation {
        self.moderation
    }

    /// Returns a snapshot of the counters and the DIM profile.
    pub(crate) fn snapshot(&self) -> CqSnapshot {
        let st = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CqSnapshot {
            events: get(&st.events),
            passes: get(&st.passes),
            completions: get(&st.completions),
            budget_exhausted: get(&st.budget_exhausted),
            samples: get(&st.samples),
            profile_changes: get(&st.profile_changes),
            profile_max: get(&st.profile_max),
            deferred_polls: get(&st.deferred_polls),
            deferred_asked_us: get(&st.deferred_asked_us),
            deferred_waited_us: get(&st.deferred_waited_us),
            mode_switches: get(&st.mode_switches),
            hw_applied: get(&st.hw_applied),
            hw_refused: get(&st.hw_refused),
            missed_at_rearm: get(&st.missed_at_rearm),
            hw_moderation: self.hw_moderation.load(Ordering::Relaxed),
            profile_ix: self.profile_ix(),
        }
    }

    /// Returns the current DIM profile index (0 without DIM).
    pub(crate) fn profile_ix(&self) -> u8 {
        dim::profile_ix(&self.dim)
    }

    /// Starts the software-moderation timer: the next pass in `usec` microseconds.
    fn defer(&self, usec: u16) {
        self.stats
            .deferred_asked_us
            .fetch_add(usec.into(), Ordering::Relaxed);
        // Stored before the timer is started, so before its callback reads it.
        // SAFETY: FFI call without preconditions.
        let now = unsafe { bindings::ktime_get() };
        self.timer_started.store(now as u64, Ordering::Release);
        // SAFETY: `timer` was initialized in `create` and is cancelled before the engine goes.
        // A timer still pending (a pass that a completion event started while a deferral was
        // due) is moved to the new expiry.
        unsafe { bindings::ibext_shim_hrtimer_start_us(self.timer.get(), usec.into()) };
    }

    /// The software-moderation timer: poll again.
    ///
    /// # Safety
    ///
    /// Called by the hrtimer core only, with the `timer` of a live engine.
    unsafe extern "C" fn timer_fn(timer: *mut bindings::hrtimer) -> bindings::hrtimer_restart {
        // SAFETY: `timer` is the `timer` field of an engine (`Opaque` is transparent).
        let engine = unsafe { &*kernel::container_of!(timer, Self, timer) };
        engine.stats.deferred_polls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: FFI call without preconditions.
        let now = unsafe { bindings::ktime_get() } as u64;
        let waited = now.saturating_sub(engine.timer_started.load(Ordering::Acquire));
        engine
            .stats
            .deferred_waited_us
            .fetch_add(waited / 1000, Ordering::Relaxed);
        if !engine.dying.load(Ordering::Acquire) {
            engine.schedule();
        }
        bindings::hrtimer_restart_HRTIMER_NORESTART
    }

    /// lib/dim's work: a new profile was chosen; apply it.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, with the `work` of an engine's `dim`.
    unsafe extern "C" fn dim_work_fn(work: *mut bindings::work_struct) {
        // SAFETY: `work` is the `work` field of the `dim` field of a live engine.
        let engine = unsafe { &*kernel::container_of!(dim::dim_of_work(work), Self, dim) };
        // SAFETY: The CQ is alive: this work is cancelled before the CQ is destroyed.
        let (ix, applied) = unsafe { dim::apply_profile(&engine.dim, engine.cq()) };
        // What the device took decides what the poller does: re-arm (the device moderates) or
        // software moderation (no `modify_cq`, or it refused).
        engine
            .hw_moderation
            .store(applied.in_hardware(), Ordering::Release);
        match applied {
            dim::Applied::Hardware => {
                engine.stats.hw_applied.fetch_add(1, Ordering::Relaxed);
            }
            dim::Applied::Refused(_) => {
                engine.stats.hw_refused.fetch_add(1, Ordering::Relaxed);
            }
            dim::Applied::Software => {}
        }
        engine.stats.profile_changes.fetch_add(1, Ordering::Relaxed);
        engine
            .stats
            .profile_max
            .fetch_max(u64::from(ix), Ordering::Relaxed);
    }

    /// Runs one poll pass of at most `budget` completions (`policy::engine::run_pass`);
    /// returns how many it handled.
    ///
    /// # Safety
    ///
    /// Must be called by the engine's poller only (see the type invariants), with the CQ alive;
    /// `iop` is true when called as irq_poll's poll function.
    unsafe fn pass(&self, budget: u32, iop: bool) -> u32 {
        // Handlers run inside the engine's SRCU section, so that their owners can wait for them
        // (`wait_for_dispatch`) in any poll context, also where handlers sleep.
        // SAFETY: FFI call; paired with the exit below.
        let idx = unsafe { bindings::ibext_shim_handlers_enter() };
        let mut poller = Poller {
            engine: self,
            cq: self.cq(),
            iop,
        };
        let mut stats = PassStats::default();
        // SAFETY: Only the poller touches `modstate` (type invariant), and we are the poller.
        let st = unsafe { &mut *self.modstate.get() };
        let report = engine::run_pass(&mut poller, self.moderation, st, budget, &mut stats);
        self.stats.add_pass(&stats);
        // SAFETY: Paired with the enter above.
        unsafe { bindings::ibext_shim_handlers_exit(idx) };
        report.completed
    }

    /// Schedules a poll pass in the CQ's context.
    fn schedule(&self) {
        #[cfg(ibext_kunit)]
        if self.test_gate_closed() {
            return;
        }
        match self.ctx {
            // SAFETY: `iop` was initialized by `irq_poll_init` in `create`.
            PollCtx::Softirq => unsafe { bindings::irq_poll_sched(self.iop.get()) },
            PollCtx::Workqueue | PollCtx::UnboundWorkqueue => {
                let wq = if self.ctx == PollCtx::Workqueue {
                    &COMP_WQ
                } else {
                    &COMP_UNBOUND_WQ
                };
                // SAFETY: The workqueues outlive every CQ (see `Workqueues`), and `work` was
                // initialized in `create`.
                unsafe {
                    bindings::ibext_shim_queue_work(wq.load(Ordering::Acquire), self.work.get())
                };
            }
        }
    }

    /// Tests only: makes lib/dim's decision `ix` for this CQ, as `rdma_dim()` does when it picks
    /// a profile (sets `profile_ix`, schedules the DIM work), and waits for the work to apply it.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_force_profile(&self, ix: u8) {
        dim::test_force_profile(&self.dim, ix);
    }

    /// Test gate: returns whether the gate is closed, remembering that a pass was wanted.
    #[cfg(ibext_kunit)]
    fn test_gate_closed(&self) -> bool {
        match self.gate.compare_exchange(
            GATE_HELD,
            GATE_PENDING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(g) => g == GATE_PENDING,
        }
    }

    /// Tests only: no poll pass starts from now on (events, missed events at re-arm, polling
    /// mode and the moderation timer all go through `schedule`), so completions accumulate in
    /// the CQ until [`CqEngine::test_release`]. A pass already running finishes.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_hold(&self) {
        self.gate.store(GATE_HELD, Ordering::Release);
    }

    /// Tests only: opens the gate, and runs the pass that was wanted while it was closed.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_release(&self) {
        if self.gate.swap(GATE_OPEN, Ordering::AcqRel) == GATE_PENDING {
            self.schedule();
        }
    }

    /// Re-arms the CQ; returns whether completions may have been missed (so poll again).
    fn rearm(&self) -> bool {
        // SAFETY: Called by the poller, with the CQ alive.
        unsafe { bindings::ibext_shim_req_notify_cq(self.cq(), REARM_FLAGS) > 0 }
    }

    /// The CQ's completion handler.
    ///
    /// # Safety
    ///
    /// Called by the driver only, with the `cq_context` given to `__ib_create_cq`: an engine.
    unsafe extern "C" fn comp_handler(_cq: *mut bindings::ib_cq, ctx: *mut c_void) {
        // SAFETY: `ctx` is the engine, which outlives its CQ (see `OwnedCq::drop`).
        let engine = unsafe { &*ctx.cast::<Self>() };
        engine.stats.events.fetch_add(1, Ordering::Relaxed);
        // Teardown waits for this read-side section after setting `dying`, so nothing is
        // scheduled once it has moved on.
        // SAFETY: FFI call; paired with the unlock below.
        unsafe { bindings::ibext_shim_rcu_read_lock() };
        if !engine.dying.load(Ordering::Acquire) {
            engine.schedule();
        }
        // SAFETY: Paired with the lock above.
        unsafe { bindings::ibext_shim_rcu_read_unlock() };
    }

    /// The CQ's asynchronous event handler (`IB_EVENT_CQ_ERR`).
    ///
    /// # Safety
    ///
    /// Called by ib_core only, with a valid event and the engine as context.
    unsafe extern "C" fn event_handler(event: *mut bindings::ib_event, ctx: *mut c_void) {
        // SAFETY: As in `comp_handler`; `event` is valid for the call.
        let (engine, ev) = unsafe { (&*ctx.cast::<Self>(), (*event).event) };
        pr_warn!(
            "pooled CQ (vector {}, {}) got async event {}\n",
            engine.vector,
            engine.ctx.name(),
            ev
        );
    }

    /// irq_poll's poll function.
    ///
    /// # Safety
    ///
    /// Called by irq_poll only, with the `iop` of an engine whose CQ is alive.
    unsafe extern "C" fn irq_poll_fn(iop: *mut bindings::irq_poll, budget: c_int) -> c_int {
        // SAFETY: `iop` is the `iop` field of an engine (`Opaque` is transparent).
        let engine = unsafe { &*kernel::container_of!(iop, Self, iop) };
        let budget = u32::try_from(budget).unwrap_or(0);
        // SAFETY: irq_poll runs one poll of this `iop` at a time: we are the poller. A pass that
        // returns its whole budget stays on irq_poll's list (`irq_poll_softirq`): polling mode.
        let done = unsafe { engine.pass(budget, true) };
        c_int::try_from(done).unwrap_or(c_int::MAX)
    }

    /// The work function of the workqueue contexts.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, with the `work` of an engine whose CQ is alive.
    unsafe extern "C" fn work_fn(work: *mut bindings::work_struct) {
        // SAFETY: `work` is the `work` field of an engine (`Opaque` is transparent).
        let engine = unsafe { &*kernel::container_of!(work, Self, work) };
        // SAFETY: A work item does not run concurrently with itself: we are the poller.
        unsafe { engine.pass(BUDGET_WORKQUEUE, false) };
    }

    /// Makes a CQ of at least `nr_cqe` entries on `vector`, polled in `ctx` and moderated by
    /// `moderation`, with its engine.
    pub(crate) fn create(
        dev: &Device,
        nr_cqe: u32,
        vector: u32,
        ctx: PollCtx,
        moderation: Moderation,
        owner: *const c_void,
    ) -> Result<OwnedCq> {
        let hw_moderation = AtomicBool::new(dev.has_modify_cq());
        let engine = KBox::pin_init(
            pin_init!(Self {
                cq: AtomicPtr::new(core::ptr::null_mut()),
                ctx,
                vector,
                moderation,
                hw_moderation,
                owner,
                iop <- Opaque::ffi_init(|p: *mut bindings::irq_poll| {
                    // SAFETY: `p` is valid for writes; the budget fits a `c_int`.
                    unsafe {
                        bindings::irq_poll_init(p, BUDGET_SOFTIRQ as c_int, Some(Self::irq_poll_fn))
                    }
                }),
                work <- Opaque::ffi_init(|p: *mut bindings::work_struct| {
                    // SAFETY: `p` is valid for writes.
                    unsafe { crate::ib::init_work!(p, Self::work_fn, "ibext_cq_poll") }
                }),
                wc: Opaque::uninit(),
                dim <- dim::new_dim(Self::dim_work_fn, c"ibext_cq_dim", &DIM_CLASS),
                timer <- Opaque::ffi_init(|p: *mut bindings::hrtimer| {
                    // SAFETY: `p` is valid for writes.
                    unsafe { bindings::ibext_shim_hrtimer_init(p, Some(Self::timer_fn)) }
                }),
                timer_started: AtomicU64::new(0),
                modstate: Opaque::new(ModState::default()),
                stats: CqStats::default(),
                dying: AtomicBool::new(false),
                gate: AtomicU8::new(GATE_OPEN),
                _token: Token::new(Kind::PooledCq),
                _pin: PhantomPinned,
            }),
            GFP_KERNEL,
        )?;
        let attr = bindings::ib_cq_init_attr {
            cqe: nr_cqe,
            comp_vector: vector,
            flags: 0,
        };
        let context = core::ptr::from_ref::<Self>(&engine)
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: `dev` is registered; the handlers match ib_core's prototypes; `context` is the
        // pinned engine, which outlives the CQ (`OwnedCq`); `attr` and the name outlive the call.
        let cq = unsafe {
            bindings::__ib_create_cq(
                dev.as_raw(),
                Some(Self::comp_handler),
                Some(Self::event_handler),
                context,
                &attr,
                c"ibext".as_ptr().cast(),
            )
        };
        // On error the engine is dropped: nothing was armed or scheduled.
        let cq = from_err_ptr(cq)?;
        // INVARIANT: the CQ exists and its `cq_context` is this engine.
        engine.cq.store(cq, Ordering::Release);
        // SAFETY: We own the new CQ; nothing else has seen it yet.
        unsafe {
            (*cq).poll_ctx = ctx.raw();
            (*cq).comp_vector = vector;
            bindings::ibext_shim_cq_set_pooled(cq, true);
        }
        let owned = OwnedCq(Some(engine));
        // The first completion raises an event. Missed ones cannot exist yet.
        // SAFETY: The CQ is alive.
        unsafe {
            bindings::ibext_shim_req_notify_cq(cq, bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP)
        };
        Ok(owned)
    }
}

/// [`CqEngine::pass`]'s view of the CQ, for `policy::engine::run_pass`.
///
/// # Invariants
///
/// Exists only inside [`CqEngine::pass`]: made by the engine's poller, with `cq` the engine's
/// live CQ; `iop` says whether the poller is irq_poll's poll function.
struct Poller<'a> {
    engine: &'a CqEngine,
    cq: *mut bindings::ib_cq,
    iop: bool,
}

impl engine::Cq for Poller<'_> {
    fn poll(&mut self, max: u32) -> u32 {
        let wcs = self.engine.wc.get().cast::<bindings::ib_wc>();
        let want = max.min(engine::POLL_BATCH) as c_int;
        // SAFETY: `cq` is alive and `wcs` holds `POLL_BATCH >= want` entries that only this
        // poller uses (type invariants).
        let n = unsafe { bindings::ibext_shim_poll_cq(self.cq, want, wcs) };
        // A negative return is an error of the driver's; the pass ends as if the CQ were empty.
        let n = u32::try_from(n).unwrap_or(0).min(want as u32);
        for i in 0..n as usize {
            // SAFETY: `ib_poll_cq` filled entries `0..n`, and `i < n <= POLL_BATCH`.
            unsafe { dispatch(self.cq, wcs.add(i)) };
        }
        n
    }

    fn rearm(&mut self) -> bool {
        self.engine.rearm()
    }

    fn schedule(&mut self) {
        self.engine.schedule();
    }

    fn defer(&mut self, usec: u16) {
        self.engine.defer(usec);
    }

    fn dim_sample(&mut self, completed: u32) {
        // As upstream's `ib_poll_handler`: one sample per pass.
        // SAFETY: Only the poller calls `rdma_dim()` (`CqEngine`'s invariants).
        unsafe { bindings::rdma_dim(self.engine.dim.get(), u64::from(completed)) };
    }

    fn profile_ix(&self) -> u8 {
        self.engine.profile_ix()
    }

    fn hw_moderation(&self) -> bool {
        self.engine.hw_moderation.load(Ordering::Acquire)
    }

    fn leave_poll_list(&mut self) {
        if self.iop {
            // SAFETY: We are the poll function of the engine's `iop` (type invariant).
            unsafe { bindings::irq_poll_complete(self.engine.iop.get()) };
        }
    }

    fn keep_polling(&mut self) {
        // irq_poll keeps a poll function that used its budget on its list; a work item
        // requeues itself without re-arming.
        if !self.iop {
            self.engine.schedule();
        }
    }
}

/// Hands one completion to its `wr_cqe->done`.
///
/// # Safety
///
/// `cq` is alive and `wc` is a completion just polled from it.
unsafe fn dispatch(cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `wc` is valid (caller contract); ULPs of the pool set `wr_cqe`, not `wr_id`.
    let (cqe, status) = unsafe { ((*wc).__bindgen_anon_1.wr_cqe, (*wc).status) };
    if let Some(cqe) = NonNull::new(cqe) {
        // SAFETY: A non-null `wr_cqe` is the ULP's live `ib_cqe` for this work request.
        if let Some(done) = unsafe { (*cqe.as_ptr()).done } {
            // SAFETY: The ULP's callback with the CQ and completion it expects.
            unsafe { done(cq, wc) };
            return;
        }
    }
    // Flushed work requests may carry no wr_cqe; a successful one must.
    warn_on_once!(
        status == bindings::ib_wc_status_IB_WC_SUCCESS,
        "successful completion without wr_cqe->done"
    );
}

/// A pooled CQ with its engine; dropping it stops the engine and destroys the CQ.
///
/// # Invariants
///
/// `self.0` is `Some` until dropped, and its engine's CQ exists.
pub(crate) struct OwnedCq(Option<Pin<KBox<CqEngine>>>);

impl OwnedCq {
    /// Returns the engine.
    pub(crate) fn engine(&self) -> Option<&CqEngine> {
        self.0.as_deref()
    }

    /// Returns the CQ.
    pub(crate) fn cq(&self) -> *mut bindings::ib_cq {
        self.0.as_ref().map_or(core::ptr::null_mut(), |e| e.cq())
    }

    /// Marks the CQ dying, so its handler schedules nothing more once readers are waited for.
    ///
    /// Teardown of many CQs marks them all, waits once ([`wait_for_handlers`]), then drops them.
    pub(crate) fn mark_dying(&self) {
        if let Some(e) = self.engine() {
            e.dying.store(true, Ordering::Release);
        }
    }
}

/// Waits until every `wr_cqe->done` that any pooled CQ's engine is running, in any poll
/// context, has returned. Completions polled after this returns are dispatched afresh.
pub(crate) fn wait_for_dispatch() {
    // SAFETY: FFI call; callers are in process context.
    unsafe { bindings::ibext_shim_handlers_wait() };
}

/// Waits until every completion handler that may have missed a `dying` mark has returned.
pub(crate) fn wait_for_handlers() {
    // SAFETY: FFI call; we may sleep here (teardown is process context).
    unsafe { bindings::synchronize_rcu() };
}

impl Drop for OwnedCq {
    fn drop(&mut self) {
        let Some(engine) = self.0.take() else { return };
        if !engine.dying.swap(true, Ordering::AcqRel) {
            wait_for_handlers();
        }
        match engine.ctx {
            // SAFETY: `iop` was initialized in `create`; this waits for a running poll.
            PollCtx::Softirq => unsafe { bindings::irq_poll_disable(engine.iop.get()) },
            // SAFETY: `work` was initialized in `create`; this waits for a running pass and
            // stops it from requeueing itself.
            _ => unsafe {
                bindings::cancel_work_sync(engine.work.get());
            },
        }
        // SAFETY: Initialized in `create`. The timer's callback schedules nothing once `dying`
        // is set; DIM's work is only queued by the poller, which is stopped.
        unsafe {
            bindings::hrtimer_cancel(engine.timer.get());
            bindings::cancel_work_sync(core::ptr::addr_of_mut!((*engine.dim.get()).work));
        }
        let cq = engine.cq();
        // SAFETY: The CQ exists (type invariant) and no poller runs any more.
        let ret = unsafe {
            bindings::ibext_shim_cq_set_pooled(cq, false);
            bindings::ib_destroy_cq_user(cq, core::ptr::null_mut())
        };
        if ret != 0 {
            // A QP still uses the CQ (a caller bug): the CQ may still call its handler, so the
            // engine must stay. Leak both rather than free memory the CQ points to.
            pr_err!("cannot destroy a pooled CQ (error {}): leaking it\n", ret);
            warn_on_once!(true, "pooled CQ still in use when destroyed");
            // SAFETY: The CQ is alive again for ib_core's purposes; restore the mark.
            unsafe { bindings::ibext_shim_cq_set_pooled(cq, true) };
            core::mem::forget(engine);
        }
    }
}
