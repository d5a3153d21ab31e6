// SPDX-License-Identifier: GPL-2.0

//! DIM for legacy ULPs: CQs a ULP made itself with `ib_create_cq` and polls itself.
//!
//! The ULP attaches ibext's DIM to its CQ, calls [`sample`] after each of its poll loops (as the
//! RDS patch called `rdma_dim()`), and detaches before it destroys the CQ. On a device with
//! `modify_cq` ibext runs the kernel's `rdma_dim()` on the samples, and a new profile goes to
//! the device. On a device without one (rxe) the ULP re-arms through [`arm`]
//! (`ibext_dim_arm()`) instead of `ib_req_notify_cq()`, and ibext applies the profile as the
//! engine does for its own CQs (`policy::moderation::end_of_pass`): it leaves the CQ unarmed
//! for the profile's time and then calls the ULP's handler once, so that completions batch as
//! they would under the device's own moderation. A ULP that samples and re-arms after every
//! run does both in one call, [`poll_done`]. Without `modify_cq` the profile is chosen by what
//! those deferrals find (`policy::soft_dim`), not by `rdma_dim()`, whose low profiles are too
//! short for a software deferral to batch anything.
//!
//! The DIM state hangs off the CQ's own `dim` pointer (`ib::dim::Attached`), which ib_core uses
//! only for the CQs it allocates itself (`ib_alloc_cq` on devices with `use_cq_dim`), and which
//! ibext refuses to attach to.

use crate::{
    backport::{
        bug::warn_on_once,
        debugfs::{SeqFile, Show},
    },
    ib::{
        cq::{ArmFlags, UlpCq},
        dim::{Attached, AttachedHandler},
    },
    ledger::{Kind, Token},
    policy::{
        profiles::{self, Profile},
        soft_dim::SoftDim,
    },
    seams,
};
#[cfg(ibext_kunit)]
use core::sync::atomic::AtomicU8;
use core::{
    fmt::Write,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
};
use kernel::prelude::*;

/// Module-wide totals of the legacy CQs' software moderation, shown in
/// `/sys/kernel/debug/ibext/legacy_dim`: how many deferrals ran their timer, how long they were
/// asked to wait and how long they did (from starting the timer to the handler call), summed,
/// and the completions that the ULP's runs started by ibext's handler calls found (what the
/// deferrals batched).
/// Under TCG the waits overshoot the profile's period by far (Documentation/ibext-testing.rst,
/// RDS); the RDS benchmark reports both per point.
static DEFERRALS: AtomicU64 = AtomicU64::new(0);
static ASKED_US: AtomicU64 = AtomicU64::new(0);
static WAITED_US: AtomicU64 = AtomicU64::new(0);
static FOUND: AtomicU64 = AtomicU64::new(0);

/// `LegacyDim::forced_ix` when no test forced a profile.
#[cfg(ibext_kunit)]
const NOT_FORCED: u8 = u8::MAX;

/// Renders `/sys/kernel/debug/ibext/legacy_dim` (see [`DEFERRALS`]).
pub(crate) struct TotalsView;

impl Show for TotalsView {
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        writeln!(
            m,
            "deferrals {} asked_us {} waited_us {} found {}",
            DEFERRALS.load(Ordering::Relaxed),
            ASKED_US.load(Ordering::Relaxed),
            WAITED_US.load(Ordering::Relaxed),
            FOUND.load(Ordering::Relaxed)
        )
    }
}

/// ibext's DIM state for one legacy CQ, besides lib/dim's own.
///
/// # Invariants
///
/// With `software` lib/dim is never fed; without, `soft` keeps its initial value.
struct LegacyDim {
    /// The device has no `modify_cq`: `soft` chooses the profile, lib/dim is not fed.
    software: bool,
    /// The device applies profiles itself: it has `modify_cq`, and took the last profile.
    hw_moderation: AtomicBool,
    /// With `software`: the selection's state ([`SoftDim::to_bits`]), written by the one
    /// sampler only.
    soft: AtomicU64,
    /// Tests only, with `software`: the profile index a test forced, or [`NOT_FORCED`];
    /// samples leave a forced profile alone.
    #[cfg(ibext_kunit)]
    forced_ix: AtomicU8,
    samples: AtomicU64,
    /// Completions of the last sample: the ULP's last poll run.
    last_completed: AtomicU32,
    /// ibext calls (or called) the handler at the end of a deferral, and the ULP has not
    /// re-armed since: its next arm decides on the pass that call started. Set before the
    /// call, which may start that pass on another CPU before it returns.
    after_raise: AtomicBool,
    profile_changes: AtomicU64,
    /// Re-arms deferred, and the handler calls that ended deferrals.
    deferred_arms: AtomicU64,
    raised: AtomicU64,
    _token: Token,
}

/// What a legacy CQ's DIM has done, for the tests and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) samples: u64,
    pub(crate) profile_changes: u64,
    pub(crate) deferred_arms: u64,
    pub(crate) raised: u64,
}

impl AttachedHandler for LegacyDim {
    fn profile_chosen(d: &Attached<Self>) {
        let (_, applied) = d.apply_profile(profiles::comps_usec);
        let this = d.data();
        this.hw_moderation
            .store(applied.in_hardware(), Ordering::Release);
        this.profile_changes.fetch_add(1, Ordering::Relaxed);
    }

    fn deferred_pass_raising(d: &Attached<Self>, waited_us: u64) {
        let this = d.data();
        this.raised.fetch_add(1, Ordering::Relaxed);
        WAITED_US.fetch_add(waited_us, Ordering::Relaxed);
        this.after_raise.store(true, Ordering::Release);
    }
}

/// Attaches ibext's DIM to `cq` (see `ibext_dim_attach`).
pub(crate) fn attach(cq: &UlpCq) -> Result {
    if cq.is_pooled() || cq.polled_by_core() {
        // ibext's own CQs are moderated by their pool's mode; ib_core polls the CQs of
        // `ib_alloc_cq` itself, and would feed its own DIM (or none) concurrently with ours.
        return Err(EINVAL);
    }
    let hw = cq.device().has_modify_cq();
    Attached::attach(
        cq,
        LegacyDim {
            software: !hw,
            hw_moderation: AtomicBool::new(hw),
            soft: AtomicU64::new(SoftDim::default().to_bits()),
            #[cfg(ibext_kunit)]
            forced_ix: AtomicU8::new(NOT_FORCED),
            samples: AtomicU64::new(0),
            last_completed: AtomicU32::new(0),
            after_raise: AtomicBool::new(false),
            profile_changes: AtomicU64::new(0),
            deferred_arms: AtomicU64::new(0),
            raised: AtomicU64::new(0),
            _token: Token::new(Kind::LegacyDim),
        },
    )
}

/// Feeds one sample (see `ibext_dim_sample`).
pub(crate) fn sample(cq: &UlpCq, ncompleted: u32) {
    let Some(d) = Attached::<LegacyDim>::of(cq) else {
        warn_on_once!(true, "ibext_dim_sample: no ibext DIM attached to the CQ");
        return;
    };
    sample_on(d, ncompleted);
}

/// Samples and re-arms at the end of one poll run (see `ibext_dim_poll_done`): [`sample`] and
/// then [`arm`], in one call. Nothing is sampled when the arm's input is bad.
pub(crate) fn poll_done(cq: &UlpCq, ncompleted: u32, flags: u32) -> Result<i32> {
    let flags = ArmFlags::from_raw(flags)?;
    if !cq.has_comp_handler() {
        return Err(EINVAL);
    }
    let Some(d) = Attached::<LegacyDim>::of(cq) else {
        warn_on_once!(true, "ibext_dim_poll_done: no ibext DIM attached to the CQ");
        return Ok(cq.req_notify(flags));
    };
    sample_on(d, ncompleted);
    Ok(arm_on(cq, d, flags))
}

/// [`sample`], on `cq`'s attached DIM `d`.
#[inline]
fn sample_on(d: &Attached<LegacyDim>, ncompleted: u32) {
    let this = d.data();
    this.samples.fetch_add(1, Ordering::Relaxed);
    this.last_completed.store(ncompleted, Ordering::Relaxed);
    // The run ibext's handler call started (the ULP samples before it re-arms).
    let raised = this.after_raise.load(Ordering::Acquire);
    if raised {
        // What the deferral batched.
        FOUND.fetch_add(u64::from(ncompleted), Ordering::Relaxed);
    }
    if !this.software {
        d.sample(ncompleted);
        return;
    }
    #[cfg(ibext_kunit)]
    if this.forced_ix.load(Ordering::Relaxed) != NOT_FORCED {
        return;
    }
    // One sampler at a time (`UlpCq`'s invariants): nothing else writes `soft`.
    let before = this.soft.load(Ordering::Relaxed);
    let mut soft = SoftDim::from_bits(before);
    soft.sample(ncompleted, raised);
    let after = soft.to_bits();
    if SoftDim::profile_changed(before, after) {
        this.profile_changes.fetch_add(1, Ordering::Relaxed);
    }
    this.soft.store(after, Ordering::Relaxed);
}

/// Detaches and frees ibext's DIM (see `ibext_dim_detach`).
pub(crate) fn detach(cq: &UlpCq) {
    if !Attached::<LegacyDim>::detach(cq) {
        warn_on_once!(true, "ibext_dim_detach: no ibext DIM attached to the CQ");
    }
}

/// The profile in force and whether it is profile 0: software's choice (whose period may be
/// longer than the table's, `policy::soft_dim`), or lib/dim's.
fn current(d: &Attached<LegacyDim>) -> (Profile, bool) {
    let this = d.data();
    if this.software {
        #[cfg(ibext_kunit)]
        {
            let forced = this.forced_ix.load(Ordering::Relaxed);
            if forced != NOT_FORCED {
                return (profiles::profile(forced), forced == 0);
            }
        }
        let soft = SoftDim::from_bits(this.soft.load(Ordering::Relaxed));
        (soft.profile(), soft.profile_ix() == 0)
    } else {
        let ix = d.profile_ix();
        (profiles::profile(ix), ix == 0)
    }
}

/// Returns the current profile as (usec, comps) (see `ibext_dim_profile`).
pub(crate) fn profile(cq: &UlpCq) -> Result<(u16, u16)> {
    let d = Attached::<LegacyDim>::of(cq).ok_or(EINVAL)?;
    let (p, _) = current(d);
    Ok((p.usec, p.comps))
}

/// Re-arms `cq` as the profile in force asks (see `ibext_dim_arm`), on the ULP's last sample,
/// which must be of the poll run just before: at once at profile 0, or where the device
/// moderates itself; at once when the run found at least the profile's completion count (a
/// device would raise the next event at once), or when a pass ibext started found nothing (the
/// CQ went quiet); otherwise the CQ stays unarmed and ibext calls its handler after the
/// profile's time. This is the rule of the engine's software moderation,
/// `policy::moderation::end_of_pass`. Returns what `ib_req_notify_cq()` returned, or 0 for a
/// deferred pass; `EINVAL` for bad flags or a CQ without a completion handler.
pub(crate) fn arm(cq: &UlpCq, flags: u32) -> Result<i32> {
    let flags = ArmFlags::from_raw(flags)?;
    if !cq.has_comp_handler() {
        // Nothing could tell the ULP of its completions.
        return Err(EINVAL);
    }
    let Some(d) = Attached::<LegacyDim>::of(cq) else {
        warn_on_once!(true, "ibext_dim_arm: no ibext DIM attached to the CQ");
        return Ok(cq.req_notify(flags));
    };
    Ok(arm_on(cq, d, flags))
}

/// [`arm`], with valid `flags`, on `cq`'s attached DIM `d`.
#[inline]
fn arm_on(cq: &UlpCq, d: &Attached<LegacyDim>, flags: ArmFlags) -> i32 {
    let this = d.data();
    let (p, zero) = current(d);
    let last = this.last_completed.load(Ordering::Relaxed);
    let after_raise = this.after_raise.swap(false, Ordering::AcqRel);
    let usec = if zero
        || this.hw_moderation.load(Ordering::Acquire)
        || last >= u32::from(p.comps)
        || (last == 0 && after_raise)
    {
        0
    } else {
        u32::from(p.usec)
    };
    let usec = seams::legacy_defer_us(usec);
    if usec == 0 {
        return cq.req_notify(flags);
    }
    this.deferred_arms.fetch_add(1, Ordering::Relaxed);
    if d.defer_pass(flags, usec) {
        DEFERRALS.fetch_add(1, Ordering::Relaxed);
        ASKED_US.fetch_add(u64::from(usec), Ordering::Relaxed);
    }
    0
}

/// Tests only: the module-wide totals shown in debugfs, `(deferrals, asked_us, waited_us)`.
#[cfg(ibext_kunit)]
pub(crate) fn totals() -> (u64, u64, u64) {
    (
        DEFERRALS.load(Ordering::Relaxed),
        ASKED_US.load(Ordering::Relaxed),
        WAITED_US.load(Ordering::Relaxed),
    )
}

/// Returns the counters of `cq`'s attached DIM.
#[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
pub(crate) fn counters(cq: &UlpCq) -> Option<Counters> {
    let d = Attached::<LegacyDim>::of(cq)?.data();
    Some(Counters {
        samples: d.samples.load(Ordering::Relaxed),
        profile_changes: d.profile_changes.load(Ordering::Relaxed),
        deferred_arms: d.deferred_arms.load(Ordering::Relaxed),
        raised: d.raised.load(Ordering::Relaxed),
    })
}

/// Tests only: runs `cq`'s deferred pass now, as if its time had come; false without ibext's
/// DIM.
#[cfg(ibext_kunit)]
pub(crate) fn test_expire_deferred(cq: &UlpCq) -> bool {
    let Some(d) = Attached::<LegacyDim>::of(cq) else {
        return false;
    };
    d.test_expire_deferred();
    true
}

/// Tests only: forces profile `ix` on `cq`'s attached DIM and returns whether the device
/// moderates the CQ itself afterwards: on a device with `modify_cq`, as lib/dim's decision (see
/// `ib::dim::test_force_profile`); without, as software's choice, which samples then leave
/// alone.
#[cfg(ibext_kunit)]
pub(crate) fn test_force_profile(cq: &UlpCq, ix: u8) -> Option<bool> {
    let d = Attached::<LegacyDim>::of(cq)?;
    let this = d.data();
    if this.software {
        this.forced_ix.store(ix, Ordering::Relaxed);
        return Some(false);
    }
    d.test_force_profile(ix);
    Some(this.hw_moderation.load(Ordering::Acquire))
}
