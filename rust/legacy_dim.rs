// SPDX-License-Identifier: GPL-2.0

//! DIM for legacy ULPs: CQs a ULP made itself with `ib_create_cq` and polls itself.
//!
//! The ULP attaches ibext's DIM to its CQ, calls [`sample`] after each of its poll loops (as the
//! RDS patch called `rdma_dim()`), and detaches before it destroys the CQ. ibext runs the
//! kernel's `rdma_dim()` on the samples; a new profile goes to the device's `modify_cq` where it
//! has one, and otherwise is kept for the ULP to read with `ibext_dim_profile()`, so that it can
//! defer its own re-arm.
//!
//! The DIM state hangs off the CQ's own `dim` pointer (`ib::dim::Attached`), which ib_core uses
//! only for the CQs it allocates itself (`ib_alloc_cq` on devices with `use_cq_dim`), and which
//! ibext refuses to attach to.

use crate::{
    backport::bug::warn_on_once,
    ib::{
        cq::UlpCq,
        dim::{Attached, AttachedHandler},
    },
    ledger::{Kind, Token},
    policy::moderation,
};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use kernel::prelude::*;

/// ibext's DIM state for one legacy CQ, besides lib/dim's own.
struct LegacyDim {
    /// The device applies profiles itself: it has `modify_cq`, and took the last profile.
    hw_moderation: AtomicBool,
    samples: AtomicU64,
    profile_changes: AtomicU64,
    _token: Token,
}

impl AttachedHandler for LegacyDim {
    fn profile_chosen(d: &Attached<Self>) {
        let (_, applied) = d.apply_profile(moderation::comps_usec);
        let this = d.data();
        this.hw_moderation
            .store(applied.in_hardware(), Ordering::Release);
        this.profile_changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Attaches ibext's DIM to `cq` (see `ibext_dim_attach`).
pub(crate) fn attach(cq: &UlpCq) -> Result {
    if cq.is_pooled() || cq.polled_by_core() {
        // ibext's own CQs are moderated by their pool's mode; ib_core polls the CQs of
        // `ib_alloc_cq` itself, and would feed its own DIM (or none) concurrently with ours.
        return Err(EINVAL);
    }
    Attached::attach(
        cq,
        LegacyDim {
            hw_moderation: AtomicBool::new(cq.device().has_modify_cq()),
            samples: AtomicU64::new(0),
            profile_changes: AtomicU64::new(0),
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
    d.sample(ncompleted);
    d.data().samples.fetch_add(1, Ordering::Relaxed);
}

/// Detaches and frees ibext's DIM (see `ibext_dim_detach`).
pub(crate) fn detach(cq: &UlpCq) {
    if !Attached::<LegacyDim>::detach(cq) {
        warn_on_once!(true, "ibext_dim_detach: no ibext DIM attached to the CQ");
    }
}

/// Returns the current profile as (usec, comps) (see `ibext_dim_profile`).
pub(crate) fn profile(cq: &UlpCq) -> Result<(u16, u16)> {
    let d = Attached::<LegacyDim>::of(cq).ok_or(EINVAL)?;
    let p = moderation::profile(d.profile_ix());
    Ok((p.usec, p.comps))
}

/// Returns the samples and profile changes of `cq`'s attached DIM.
#[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
pub(crate) fn counters(cq: &UlpCq) -> Option<(u64, u64)> {
    let d = Attached::<LegacyDim>::of(cq)?;
    Some((
        d.data().samples.load(Ordering::Relaxed),
        d.data().profile_changes.load(Ordering::Relaxed),
    ))
}

/// Tests only: forces lib/dim's decision `ix` on `cq`'s attached DIM (see
/// `ib::dim::test_force_profile`) and returns whether the device moderates the CQ itself
/// afterwards.
#[cfg(ibext_kunit)]
pub(crate) fn test_force_profile(cq: &UlpCq, ix: u8) -> Option<bool> {
    let d = Attached::<LegacyDim>::of(cq)?;
    d.test_force_profile(ix);
    Some(d.data().hw_moderation.load(Ordering::Acquire))
}
