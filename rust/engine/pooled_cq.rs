// SPDX-License-Identifier: GPL-2.0

//! A CQ of ibext's pools ([`Cq`]): the CQ, its poller (irq_poll, or a work item on
//! ibext's completion workqueues), its software-moderation hrtimer, its `struct dim`, and the
//! teardown order that makes them safe to free.
//!
//! What happens in a pass, on an event, when the timer fires and when DIM picks a profile is the
//! [`Handler`]'s (the engine's `EngineState`, `engine/mod.rs`, which has no `unsafe` code); this
//! file only calls it, from the one context each callback runs in, and holds the invariants that
//! make those calls sound:
//!
//! - the poller state ([`Handler::PollerState`]) is reached only from a pass ([`Handler::pass`]), and
//!   irq_poll and the workqueue each run one pass of a CQ at a time (a CQ has one of the two).
//!   irq_poll guarantees it only while the pass is on its list: once the pass leaves it
//!   (`irq_poll_complete`), an event on another CPU may start the next pass there. So the pass
//!   finishes every write of its own before it leaves, and its tail ([`Handler::tail`]:
//!   re-arm, schedule, defer, or stay listed) touches no poller state; debug kernels assert the
//!   rule;
//! - every `wr_cqe->done` runs inside an SRCU read-side section of ibext's (workqueue
//!   contexts) or in softirq context (irq_poll), both of which `queues::wait_for_dispatch`
//!   waits for, and every completion handler and timer callback inside
//!   `rcu_read_lock()` or after a `dying` check that teardown waits out ([`wait_for_handlers`]);
//! - teardown ([`quiesce`], then [`Owned`]'s drop) marks the CQ dying, waits for the
//!   handlers that may not have seen the mark, disables irq_poll or cancels the work item,
//!   waits for the tail of an irq_poll pass that was running (`irq_poll_disable` does not: it
//!   returns once the pass has left irq_poll's list), cancels the timer and DIM's work, and only
//!   then destroys the CQ and frees the memory its callbacks use.
//!
//! The file is long because the object, its six callbacks and its teardown are one argument: each callback's SAFETY comment relies on the teardown order,
//! and the teardown on what each callback checks.

use crate::{
    backport::{bug::warn_on_once, sync::LockClass, workqueue::init_work},
    bindings,
    engine::queues::{comp_queue, wait_for_handlers, BUDGET_SOFTIRQ, BUDGET_WORKQUEUE, POLL_BATCH},
    ib::{
        cq::{CqPtr, PollCtx},
        dim, CqOps, Device,
    },
    policy::engine::PassOps,
};
use core::{
    ffi::c_void,
    marker::PhantomPinned,
    pin::Pin,
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicPtr, Ordering},
};
use kernel::{error::from_err_ptr, ffi::c_int, prelude::*, types::Opaque};

/// What a pooled CQ's owner does on each of its callbacks, and what a pass asks of it. Each
/// runs in one context only; see the file comment. The engine (`engine::EngineState`) is the
/// one implementation; the trait keeps this file free of it, as `kernel::net::phy`'s
/// `Adapter<T: Driver>` keeps the registration free of the driver.
pub(crate) trait Handler: Sized + Send + Sync {
    /// State that only passes touch, one pass at a time.
    type PollerState: Default + Send;

    /// What a pass leaves for its tail ([`Handler::tail`]).
    type Tail: Copy;

    /// A poll pass of at most `budget` completions; returns how many it handled and what its
    /// tail does. Runs in softirq (irq_poll) or workqueue context, never concurrently with
    /// another pass of `cq`, and stays on irq_poll's list throughout: every write of the
    /// poller's is done when it returns.
    fn pass(
        cq: &Cq<Self>,
        pass: &mut PassCtl<'_, Self>,
        state: &mut Self::PollerState,
        budget: u32,
    ) -> (u32, Self::Tail);

    /// The end of the pass: leave irq_poll's list, then re-arm, schedule or defer; or stay on
    /// it to be polled again. After leaving the list another pass of the CQ may run beside it,
    /// so it touches no poller state (it has none to touch).
    fn tail(pass: &mut PassCtl<'_, Self>, tail: Self::Tail);

    /// The CQ's completion event, from the driver (hard-IRQ context, or rxe's CQ lock held with
    /// interrupts off): schedule a pass. Not called once the CQ is dying.
    fn event(cq: &Cq<Self>);

    /// The software-moderation timer fired (softirq context). Not called once the CQ is dying.
    fn timer(cq: &Cq<Self>);

    /// lib/dim picked a new profile (process context): apply it ([`Cq::apply_profile`]).
    fn dim_work(cq: &Cq<Self>);

    /// An asynchronous event on the CQ (`IB_EVENT_CQ_ERR`).
    fn async_event(cq: &Cq<Self>, event: u32);

    /// A pass (or its tail) wants another pass: schedule it ([`Cq::schedule`]), or not.
    fn schedule(cq: &Cq<Self>);

    /// A pass's tail defers the next pass by `usec` microseconds (software moderation).
    fn defer(cq: &Cq<Self>, usec: u16);

    /// A pass's tail re-armed and was told completions may have been missed.
    fn missed_at_rearm(cq: &Cq<Self>);

    /// Whether the device applies DIM profiles itself now.
    fn hw_moderation(cq: &Cq<Self>) -> bool;
}

/// A CQ of ibext's pools, polled by ibext: the CQ, its poller, timer and DIM state, and its
/// handler (the engine's part). Outside this file it is `engine::PooledCq`.
///
/// # Invariants
///
/// - `cq` is null until the CQ exists; from then until [`Owned`]'s drop destroys it, it
///   is that CQ, whose `cq_context` is this object and whose handlers are this file's.
/// - Only passes (irq_poll's poll function or the work item, never both, never two at once)
///   touch `wc` and `poller`, and call `rdma_dim()` on `dim`.
/// - The object is pinned in a [`Owned`], which stops every callback before it frees
///   it.
#[pin_data]
pub(crate) struct Cq<H: Handler> {
    cq: AtomicPtr<bindings::ib_cq>,
    ctx: PollCtx,
    vector: u32,
    #[pin]
    iop: Opaque<bindings::irq_poll>,
    #[pin]
    work: Opaque<bindings::work_struct>,
    #[pin]
    timer: Opaque<bindings::hrtimer>,
    /// lib/dim's state; its `work` applies a new profile.
    #[pin]
    dim: Opaque<bindings::dim>,
    wc: Opaque<[bindings::ib_wc; POLL_BATCH]>,
    /// The driver's `poll_cq` and `req_notify_cq`, those of the device the CQ is on.
    ops: CqOps,
    poller: Opaque<H::PollerState>,
    dying: AtomicBool,
    /// The poller is stopped for good (`irq_poll_disable`, or the work cancelled), by
    /// [`quiesce`]; it must not be stopped twice (a second `irq_poll_disable` would wait for
    /// ever).
    stopped: AtomicBool,
    /// A pass is running (debug kernels only): asserts "one pass at a time".
    in_pass: OnePass,
    handler: H,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: The poller state (`iop`, `work`, `wc`, `poller`) is used by one pass at a time,
// serialized by irq_poll or the workqueue (type invariants); the timer, the DIM work and the
// atomics are safe to use from any CPU; `H` is `Send + Sync`.
unsafe impl<H: Handler> Send for Cq<H> {}
// SAFETY: As for `Send`.
unsafe impl<H: Handler> Sync for Cq<H> {}

/// The lockdep class of polled CQs' DIM work.
static DIM_CLASS: LockClass = LockClass::new();

impl<H: Handler> Cq<H> {
    /// Makes a CQ of at least `nr_cqe` entries on `vector`, polled in `ctx`, with `engine`. It is
    /// marked shared (ib_core's pooled-CQ mark, so ULPs cannot destroy it) and armed.
    pub(crate) fn create(
        dev: &Device,
        nr_cqe: u32,
        vector: u32,
        ctx: PollCtx,
        handler: H,
    ) -> Result<Owned<H>> {
        let ops = dev
            .cq_ops()
            .ok_or_else(crate::backport::error::eopnotsupp)?;
        let this = KBox::pin_init(
            pin_init!(Self {
                cq: AtomicPtr::new(core::ptr::null_mut()),
                ctx,
                vector,
                iop <- Opaque::ffi_init(|p: *mut bindings::irq_poll| {
                    // SAFETY: `p` is valid for writes; the budget fits a `c_int`.
                    unsafe {
                        bindings::irq_poll_init(p, BUDGET_SOFTIRQ as c_int, Some(Self::irq_poll_fn))
                    }
                }),
                work <- Opaque::ffi_init(|p: *mut bindings::work_struct| {
                    // SAFETY: `p` is valid for writes.
                    unsafe { init_work!(p, Self::work_fn, "ibext_cq_poll") }
                }),
                timer <- Opaque::ffi_init(|p: *mut bindings::hrtimer| {
                    // SAFETY: `p` is valid for writes.
                    unsafe { bindings::ibext_shim_hrtimer_init(p, Some(Self::timer_fn)) }
                }),
                dim <- dim::new_dim(Self::dim_work_fn, c"ibext_cq_dim", &DIM_CLASS),
                wc: Opaque::uninit(),
                ops,
                poller: Opaque::new(H::PollerState::default()),
                dying: AtomicBool::new(false),
                stopped: AtomicBool::new(false),
                in_pass: OnePass::new(),
                handler,
                _pin: PhantomPinned,
            }),
            GFP_KERNEL,
        )?;
        let attr = bindings::ib_cq_init_attr {
            cqe: nr_cqe,
            comp_vector: vector,
            flags: 0,
        };
        let context = core::ptr::from_ref::<Self>(&this)
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: `dev` is registered; the handlers match ib_core's prototypes; `context` is the
        // pinned object, which outlives the CQ (`Owned`); `attr` and the name outlive
        // the call.
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
        // On error the object is dropped: nothing was armed or scheduled.
        let cq = from_err_ptr(cq)?;
        // INVARIANT: the CQ exists and its `cq_context` is this object.
        this.cq.store(cq, Ordering::Release);
        // SAFETY: We own the new CQ; nothing else has seen it yet.
        unsafe {
            (*cq).poll_ctx = ctx.raw();
            (*cq).comp_vector = vector;
            bindings::ibext_shim_cq_set_pooled(cq, true);
        }
        let owned = Owned(Some(this));
        // The first completion raises an event. Missed ones cannot exist yet.
        // SAFETY: The CQ is alive, and `notify` is its device's.
        unsafe { (ops.notify)(cq, bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP) };
        Ok(owned)
    }

    /// Returns the pooled CQ of `cq` if `cq` is one of ibext's (its completion handler is
    /// this file's), `None` for any other CQ.
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
        // object, which outlives the CQ (`Owned`).
        unsafe { ((*cq).cq_context as *const Self).as_ref() }
    }

    /// Returns the handler.
    pub(crate) fn handler(&self) -> &H {
        &self.handler
    }

    /// Returns the CQ, for ib_core calls by its holders (`ib_create_qp`, ...).
    pub(crate) fn raw(&self) -> *mut bindings::ib_cq {
        self.cq.load(Ordering::Acquire)
    }

    /// Returns the CQ's size as the driver made it (it may round the size asked for up).
    pub(crate) fn cqe(&self) -> u32 {
        // SAFETY: The CQ is alive while `self` is reachable (type invariants); `cqe` is set when
        // it is made and not changed for a CQ nobody resizes (ibext never does).
        let n = unsafe { (*self.raw()).cqe };
        u32::try_from(n).unwrap_or(0)
    }

    /// Sets the CQ's `cqe_used` to the entries its holders took, so that 6.12's `ib_free_cq()`
    /// (which checks `cqe_used`, not `shared`) warns and refuses while any are in use, as for
    /// ib_core's own pooled CQs (`ib_cq_pool_get`). Callers serialize (the pool's lock).
    pub(crate) fn set_used(&self, used: u32) {
        // SAFETY: The CQ is alive while `self` is reachable (type invariants).
        unsafe { bindings::ibext_shim_cq_set_used(self.raw(), used) };
    }

    /// Returns the poll context.
    pub(crate) fn ctx(&self) -> PollCtx {
        self.ctx
    }

    /// Returns the completion vector.
    pub(crate) fn vector(&self) -> u32 {
        self.vector
    }

    /// Schedules a pass in the CQ's context (nothing if one is already scheduled).
    pub(crate) fn schedule(&self) {
        match self.ctx {
            // SAFETY: `iop` was initialized by `irq_poll_init` in `create`; a disabled one
            // ignores this.
            PollCtx::Softirq => unsafe { bindings::irq_poll_sched(self.iop.get()) },
            PollCtx::Workqueue | PollCtx::UnboundWorkqueue => {
                let wq = comp_queue(self.ctx == PollCtx::UnboundWorkqueue);
                // SAFETY: The workqueues outlive every polled CQ (`CompQueues`), and `work`
                // was initialized in `create` and is cancelled before the object goes.
                unsafe { bindings::ibext_shim_queue_work(wq, self.work.get()) };
            }
        }
    }

    /// Starts (or moves) the software-moderation timer: a pass in `usec` microseconds, through
    /// [`Handler::timer`].
    pub(crate) fn defer_us(&self, usec: u32) {
        // SAFETY: `timer` was initialized in `create` and is cancelled before the object goes.
        // `hrtimer_start` on a pending timer moves it.
        unsafe { bindings::ibext_shim_hrtimer_start_us(self.timer.get(), usec) };
    }

    /// Returns the profile index lib/dim chose last (0 without DIM).
    pub(crate) fn profile_ix(&self) -> u8 {
        dim::profile_ix(&self.dim)
    }

    /// Applies lib/dim's profile with the device's own `modify_cq`, if it has one (see
    /// `dim::apply_profile`); returns the index and how it was applied.
    pub(crate) fn apply_profile(&self, profile: dim::Profiles) -> (u8, dim::Applied) {
        // SAFETY: `dim` was initialized in `create`; the CQ is alive while `self` is reachable
        // (it is destroyed only after every callback is stopped, in `Owned`'s drop).
        unsafe { dim::apply_profile(&self.dim, self.raw(), profile) }
    }

    /// Tests only: makes lib/dim's decision `ix`, as `rdma_dim()` does when it picks a profile,
    /// and waits for [`Handler::dim_work`] to apply it.
    #[cfg(ibext_kunit)]
    pub(crate) fn test_force_profile(&self, ix: u8) {
        dim::test_force_profile(&self.dim, ix);
    }

    /// Runs a pass as the CQ's poller.
    ///
    /// # Safety
    ///
    /// Called by irq_poll's poll function (`iop`) or the work function only, so by the CQ's only
    /// poller, with the CQ alive.
    unsafe fn run(&self, budget: u32, iop: bool) -> u32 {
        // Owners wait for handlers in flight with `wait_for_dispatch`. A work item's handlers
        // may sleep, so they run inside ibext's SRCU section; irq_poll's run in softirq
        // context, which `synchronize_rcu()` (also in `wait_for_dispatch`) waits for.
        // SAFETY: FFI call; paired with the exit below.
        let idx = (!iop).then(|| unsafe { bindings::ibext_shim_handlers_enter() });
        self.in_pass.enter();
        let mut ctl = PassCtl {
            cq: self,
            iop,
            stay: false,
        };
        if iop {
            crate::seams::softirq_pass_begins(self.raw().cast());
        }
        let (n, tail) = {
            // SAFETY: Only passes touch `poller`, one at a time (type invariant; caller
            // contract): the pass is on irq_poll's list, or is the work item, until `tail`.
            let state = unsafe { &mut *self.poller.get() };
            H::pass(self, &mut ctl, state, budget)
        };
        // The poller's exclusive part ends here, with the borrow of its state: the tail may
        // leave irq_poll's list, after which another pass of this CQ may start on another CPU.
        self.in_pass.leave();
        H::tail(&mut ctl, tail);
        if let Some(idx) = idx {
            // SAFETY: Paired with the enter above.
            unsafe { bindings::ibext_shim_handlers_exit(idx) };
        }
        // A pass that stays on irq_poll's list must report at least its weight: irq_poll then
        // keeps it there (`irq_poll_softirq`); one that reports less must have left it.
        if ctl.stay {
            n.max(budget)
        } else {
            n
        }
    }

    /// The CQ's completion handler.
    ///
    /// # Safety
    ///
    /// Called by the driver only, with the `cq_context` given to `__ib_create_cq`: a
    /// `Cq`.
    unsafe extern "C" fn comp_handler(_cq: *mut bindings::ib_cq, ctx: *mut c_void) {
        // SAFETY: `ctx` is the object, which outlives its CQ (`Owned::drop`).
        let this = unsafe { &*ctx.cast::<Self>() };
        // Teardown waits for this read-side section after setting `dying`, so nothing is
        // scheduled once it has moved on.
        let _rcu = crate::backport::sync::RcuGuard::new();
        if !this.dying.load(Ordering::Acquire) {
            H::event(this);
        }
    }

    /// The CQ's asynchronous event handler.
    ///
    /// # Safety
    ///
    /// Called by ib_core only, with a valid event and the object as context.
    unsafe extern "C" fn event_handler(event: *mut bindings::ib_event, ctx: *mut c_void) {
        // SAFETY: As in `comp_handler`; `event` is valid for the call.
        let (this, ev) = unsafe { (&*ctx.cast::<Self>(), (*event).event) };
        H::async_event(this, ev);
    }

    /// irq_poll's poll function.
    ///
    /// # Safety
    ///
    /// Called by irq_poll only, with the `iop` of a live object.
    unsafe extern "C" fn irq_poll_fn(iop: *mut bindings::irq_poll, budget: c_int) -> c_int {
        // SAFETY: `iop` is the `iop` field of an object (`Opaque` is transparent).
        let this = unsafe { &*kernel::container_of!(iop, Self, iop) };
        let budget = u32::try_from(budget).unwrap_or(0);
        // SAFETY: irq_poll runs one poll of this `iop` at a time: we are the poller. A pass that
        // returns its whole budget stays on irq_poll's list (`irq_poll_softirq`).
        let done = unsafe { this.run(budget, true) };
        c_int::try_from(done).unwrap_or(c_int::MAX)
    }

    /// The work function of the workqueue contexts.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, with the `work` of a live object.
    unsafe extern "C" fn work_fn(work: *mut bindings::work_struct) {
        // SAFETY: `work` is the `work` field of an object (`Opaque` is transparent).
        let this = unsafe { &*kernel::container_of!(work, Self, work) };
        // SAFETY: A work item does not run concurrently with itself: we are the poller.
        unsafe { this.run(BUDGET_WORKQUEUE, false) };
    }

    /// The software-moderation timer.
    ///
    /// # Safety
    ///
    /// Called by the hrtimer core only, with the `timer` of a live object.
    unsafe extern "C" fn timer_fn(timer: *mut bindings::hrtimer) -> bindings::hrtimer_restart {
        // SAFETY: `timer` is the `timer` field of an object (`Opaque` is transparent).
        let this = unsafe { &*kernel::container_of!(timer, Self, timer) };
        // Teardown sets `dying` before it cancels the timer, so a callback that reads it set
        // schedules nothing; one that read it clear finishes before `hrtimer_cancel` returns.
        if !this.dying.load(Ordering::Acquire) {
            H::timer(this);
        }
        bindings::hrtimer_restart_HRTIMER_NORESTART
    }

    /// lib/dim's work: a new profile was chosen.
    ///
    /// # Safety
    ///
    /// Called by the workqueue only, with the `work` of a live object's `dim`.
    unsafe extern "C" fn dim_work_fn(work: *mut bindings::work_struct) {
        // SAFETY: `work` is the `work` field of the `dim` field of a live object: this work is
        // cancelled before the object goes.
        let this = unsafe { &*kernel::container_of!(dim::dim_of_work(work), Self, dim) };
        H::dim_work(this);
    }
}

/// What a pass may do to its CQ besides reading it: made only by [`Cq`]'s poll functions,
/// for the duration of one pass.
///
/// # Invariants
///
/// Exists only inside `Cq::run`, on the CQ's poller; `iop` says whether the poller is
/// irq_poll's poll function.
pub(crate) struct PassCtl<'a, H: Handler> {
    cq: &'a Cq<H>,
    iop: bool,
    /// irq_poll only: the pass stays on irq_poll's list and reports its whole budget.
    stay: bool,
}

/// A pass's CQ as the engine's policy drives it (`policy::engine::poll_pass` and `end_pass`).
impl<H: Handler> PassOps for PassCtl<'_, H> {
    /// Polls at most `max` completions (at most [`POLL_BATCH`]) and hands each to its
    /// `wr_cqe->done`; returns how many.
    ///
    /// Inlined into the pass, as `__ib_process_cq`'s loop is one function: a call per batch
    /// cost more than the batch's own bookkeeping (the drain benchmark, `rust/tests/drain.rs`).
    #[inline(always)]
    fn poll(&mut self, max: u32) -> u32 {
        let cq = self.cq.raw();
        let wcs = self.cq.wc.get().cast::<bindings::ib_wc>();
        let want = max.min(POLL_BATCH as u32);
        // SAFETY: The CQ is alive, `poll` is its device's `poll_cq` (what `ib_poll_cq` calls),
        // and `wcs` holds `POLL_BATCH >= want` entries that only this poller uses (type
        // invariants).
        let n = unsafe { (self.cq.ops.poll)(cq, want as c_int, wcs) };
        // A negative return is the driver's error; the pass ends as if the CQ were empty.
        let n = u32::try_from(n).unwrap_or(0).min(want);
        for i in 0..n as usize {
            // SAFETY: `ib_poll_cq` filled entries `0..n`, and `i < n <= POLL_BATCH`.
            unsafe { dispatch(cq, wcs.add(i)) };
        }
        n
    }

    /// Re-arms with `IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS`; returns whether completions
    /// may have been missed (so poll again), counted in the pass's tail.
    fn rearm(&mut self) -> bool {
        const FLAGS: bindings::ib_cq_notify_flags = bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP
            | bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS;
        // SAFETY: The CQ is alive (type invariant), and `notify` is its device's
        // `req_notify_cq` (what `ib_req_notify_cq` calls).
        let missed = unsafe { (self.cq.ops.notify)(self.cq.raw(), FLAGS) > 0 };
        if missed {
            H::missed_at_rearm(self.cq);
        }
        missed
    }

    fn schedule(&mut self) {
        H::schedule(self.cq);
    }

    fn defer(&mut self, usec: u16) {
        H::defer(self.cq, usec);
    }

    /// Feeds lib/dim one sample: a pass that handled `completed` completions (upstream's
    /// `ib_poll_handler` does the same, once per pass).
    fn dim_sample(&mut self, completed: u32) {
        // SAFETY: Only the poller calls `rdma_dim()` on `dim` (type invariants of `Cq`).
        unsafe { bindings::rdma_dim(self.cq.dim.get(), u64::from(completed)) };
    }

    fn profile_ix(&self) -> u8 {
        self.cq.profile_ix()
    }

    fn hw_moderation(&self) -> bool {
        H::hw_moderation(self.cq)
    }

    /// Leaves irq_poll's list (`irq_poll_complete`), before re-arming or scheduling another
    /// pass; nothing in the workqueue contexts.
    fn leave_poll_list(&mut self) {
        if self.iop {
            // SAFETY: We are the poll function of the CQ's `iop` (type invariant).
            unsafe { bindings::irq_poll_complete(self.cq.iop.get()) };
        }
        crate::seams::park_point(crate::seams::Point::PassTail, self.cq.raw().cast());
    }

    /// irq_poll keeps a poll function that used its budget on its list; a work item requeues
    /// itself without re-arming.
    fn keep_polling(&mut self) {
        if self.iop {
            self.stay_on_poll_list();
        } else {
            H::schedule(self.cq);
        }
    }

    fn repoll(&mut self) {
        if self.iop {
            // NAPI's yield: the pass reports its whole budget to irq_poll, which keeps the CQ
            // on its list and ends its run (`irq_poll_softirq`: the budget is spent); the
            // softirq core restarts it a few times, then leaves the rest to `ksoftirqd`, which
            // shares the CPU with the device's completion producers (rxe's `rxe_wq` workers).
            // Leaving the list and scheduling again instead ran the next pass in the same run
            // (139 of 141 repolls in `ibext_yield`), for as long as each pass found a completion
            // and the jiffy lasted.
            self.stay_on_poll_list();
        } else {
            // A work item requeues itself. It runs at `WQ_HIGHPRI`, but it polls only what the
            // producers (unbound `rxe_wq` workers) post: a producer kept off the CPU posts
            // nothing, the next pass finds the CQ empty and polling mode ends. Deferring these
            // passes on the timer instead made `ibext_yield`'s oversubscribed run slower, not
            // safer (1341 against 617 ms), so they are not deferred.
            self.leave_poll_list();
            H::schedule(self.cq);
        }
    }
}

impl<H: Handler> PassCtl<'_, H> {
    /// irq_poll only: the pass stays on irq_poll's list, as one that used its whole budget
    /// (`Cq::run` reports the budget): irq_poll polls it again after its other CQs, and
    /// ends its run first if its own budget is spent.
    fn stay_on_poll_list(&mut self) {
        if crate::seams::pass_held(self.cq.raw().cast()) {
            // A test holds the CQ's passes: the one asked for here waits for the test, as one
            // asked for through `Handler::schedule` does.
            return self.leave_poll_list();
        }
        self.stay = true;
        crate::seams::softirq_repoll_asked(self.cq.raw().cast());
    }
}

/// Hands one completion to its `wr_cqe->done`.
///
/// # Safety
///
/// `cq` is alive and `wc` is a completion just polled from it.
#[inline(always)]
unsafe fn dispatch(cq: *mut bindings::ib_cq, wc: *mut bindings::ib_wc) {
    // SAFETY: `wc` is valid (caller contract); ULPs of the pool set `wr_cqe`, not `wr_id`.
    let cqe = unsafe { (*wc).__bindgen_anon_1.wr_cqe };
    if let Some(cqe) = NonNull::new(cqe) {
        // SAFETY: A non-null `wr_cqe` is the ULP's live `ib_cqe` for this work request.
        if let Some(done) = unsafe { (*cqe.as_ptr()).done } {
            // SAFETY: The ULP's callback with the CQ and completion it expects.
            unsafe { done(cq, wc) };
            return;
        }
    }
    // SAFETY: As above.
    unsafe { no_done(wc) };
}

/// A completion without `wr_cqe->done`: out of the per-completion path, so that the loop does
/// not load the status for every completion.
///
/// # Safety
///
/// `wc` is a completion just polled.
#[cold]
#[inline(never)]
unsafe fn no_done(wc: *mut bindings::ib_wc) {
    // SAFETY: `wc` is valid (caller contract).
    let status = unsafe { (*wc).status };
    // Flushed work requests may carry no wr_cqe; a successful one must.
    warn_on_once!(
        status == bindings::ib_wc_status_IB_WC_SUCCESS,
        "successful completion without wr_cqe->done"
    );
}

/// The "one pass at a time" rule of a [`Cq`], asserted on debug kernels
/// (`CONFIG_RUST_DEBUG_ASSERTIONS`); nothing elsewhere.
struct OnePass {
    #[cfg(debug_assertions)]
    running: AtomicBool,
}

impl OnePass {
    const fn new() -> Self {
        OnePass {
            #[cfg(debug_assertions)]
            running: AtomicBool::new(false),
        }
    }

    /// A pass begins its exclusive part; warns if another one is in its own.
    #[inline(always)]
    fn enter(&self) {
        #[cfg(debug_assertions)]
        warn_on_once!(
            self.running.swap(true, Ordering::AcqRel),
            "ibext: two passes of one polled CQ at once"
        );
    }

    /// The pass's exclusive part is over.
    #[inline(always)]
    fn leave(&self) {
        #[cfg(debug_assertions)]
        self.running.store(false, Ordering::Release);
    }
}

/// A polled CQ; dropping it stops every callback and destroys the CQ.
///
/// # Invariants
///
/// `self.0` is `Some` until dropped, and its object's CQ exists.
pub(crate) struct Owned<H: Handler>(Option<Pin<KBox<Cq<H>>>>);

impl<H: Handler> Owned<H> {
    /// Returns the polled CQ.
    pub(crate) fn get(&self) -> Option<&Cq<H>> {
        self.0.as_deref()
    }

    /// Returns the CQ.
    pub(crate) fn raw(&self) -> *mut bindings::ib_cq {
        self.get().map_or(core::ptr::null_mut(), Cq::raw)
    }

    /// Returns the CQ's address as a handle; `None` once destroyed.
    pub(crate) fn ptr(&self) -> Option<CqPtr> {
        CqPtr::from_raw(self.raw())
    }

    /// Marks the CQ dying, so its handlers schedule nothing more once they are waited for.
    /// Returns whether it was not marked yet.
    pub(crate) fn mark_dying(&self) -> bool {
        self.get()
            .is_some_and(|c| !c.dying.swap(true, Ordering::AcqRel))
    }

    /// Stops the poller for good, once: returns whether this call stopped an irq_poll poller,
    /// whose pass may still be in its tail.
    fn stop_poller(&self) -> bool {
        let Some(c) = self.get() else { return false };
        if c.stopped.swap(true, Ordering::AcqRel) {
            return false;
        }
        match c.ctx {
            PollCtx::Softirq => {
                // SAFETY: `iop` was initialized in `create`, and is disabled only here, once.
                // `irq_poll_disable` (lib/irq_poll.c) returns once no pass is *scheduled*: a
                // pass clears that mark itself in `irq_poll_complete`, before its tail re-arms,
                // schedules or defers, so the tail may still be running. It keeps irq_poll from
                // scheduling the CQ again.
                unsafe { bindings::irq_poll_disable(c.iop.get()) };
                true
            }
            _ => {
                // SAFETY: `work` was initialized in `create`; this waits for a running pass,
                // tail included, and stops it from requeueing itself.
                unsafe { bindings::cancel_work_sync(c.work.get()) };
                false
            }
        }
    }
}

/// Stops every callback of `cqs` that could reach the CQ, before they are dropped: marks them
/// dying and waits once for the handlers that may have missed the mark, then stops their pollers
/// and waits once more for the tail of an irq_poll pass that was running (softirq context, which
/// `synchronize_rcu()` waits for: see `wait_for_handlers`). Each drop then only cancels the
/// timer and DIM's work and destroys its CQ. One wait of each kind for many CQs, instead of two
/// per CQ.
pub(crate) fn quiesce<'a, H: Handler + 'a>(cqs: impl Iterator<Item = &'a Owned<H>> + Clone) {
    let mut marked = false;
    for cq in cqs.clone() {
        marked |= cq.mark_dying();
    }
    if marked {
        wait_for_handlers();
    }
    let mut tails = false;
    for cq in cqs {
        tails |= cq.stop_poller();
    }
    if tails {
        crate::seams::reached(crate::seams::Point::PollerStopped);
        wait_for_handlers();
    }
}

impl<H: Handler> Drop for Owned<H> {
    fn drop(&mut self) {
        quiesce(core::iter::once(&*self));
        let Some(this) = self.0.take() else { return };
        // SAFETY: Initialized in `create`. The timer's callback schedules nothing once `dying`
        // is set; DIM's work is only queued by passes, which are stopped.
        unsafe {
            bindings::hrtimer_cancel(this.timer.get());
            bindings::cancel_work_sync(core::ptr::addr_of_mut!((*this.dim.get()).work));
        }
        let cq = this.raw();
        // SAFETY: The CQ exists (type invariant) and no callback runs any more.
        let ret = unsafe {
            bindings::ibext_shim_cq_set_pooled(cq, false);
            bindings::ib_destroy_cq_user(cq, core::ptr::null_mut())
        };
        if ret != 0 {
            // A QP still uses the CQ (a caller bug): the CQ may still call its handler, so the
            // object must stay. Leak both rather than free memory the CQ points to.
            pr_err!("cannot destroy a polled CQ (error {}): leaking it\n", ret);
            warn_on_once!(true, "polled CQ still in use when destroyed");
            // SAFETY: The CQ is alive again for ib_core's purposes; restore the mark.
            unsafe { bindings::ibext_shim_cq_set_pooled(cq, true) };
            core::mem::forget(this);
        }
    }
}
