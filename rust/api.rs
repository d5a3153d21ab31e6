// SPDX-License-Identifier: GPL-2.0

//! The safe Rust API the crate's own users call; the C entry points that ULPs call through
//! `include/rdma/ibext.h` are thin conversions onto it in `ib/capi.rs`.

use crate::{
    backport::sync::RcuGuard,
    device::DeviceState,
    engine::PollCtx,
    ib::{
        cq::CqPtr,
        gid::{self, GidAttr, NdevPtr},
        Device,
    },
    policy::{gid_index::GidKey, moderation::Moderation},
};
use kernel::{prelude::*, sync::Arc};

/// The moderation `ibext_cq_pool_get()` gives a CQ of `dev`: upstream's default
/// (`ib_cq_pool_get` allocates with `ib_alloc_cq`), DIM where the driver sets `use_cq_dim`,
/// none elsewhere.
pub(crate) fn default_moderation(dev: &Device) -> Moderation {
    if dev.use_cq_dim() {
        Moderation::Dim
    } else {
        Moderation::None
    }
}

/// Entries on a pooled CQ, given back to the pool when dropped.
///
/// The Rust form of `ibext_cq_pool_get`/`ibext_cq_pool_put`: a caller cannot put back twice,
/// put back the wrong count, or forget to put back.
///
/// # Invariants
///
/// `nr_cqe` entries of `cq` are taken from `state`'s pool and not yet given back.
pub(crate) struct CqEntries {
    state: Arc<DeviceState>,
    cq: CqPtr,
    nr_cqe: u32,
}

#[cfg_attr(
    not(ibext_kunit),
    expect(dead_code, reason = "the crate's tests are its only Rust users so far")
)]
impl CqEntries {
    /// Takes `nr_cqe` entries on a pooled CQ of `dev` polled in `ctx` and moderated by
    /// `moderation` (see `ibext_cq_pool_get_attr`).
    pub(crate) fn get(
        dev: &Device,
        nr_cqe: u32,
        hint: i32,
        ctx: PollCtx,
        moderation: Moderation,
    ) -> Result<Self> {
        let state = crate::device::device_state(dev).ok_or(ENODEV)?;
        let cq = state.cq_pool_get(nr_cqe, hint, ctx, moderation)?;
        // INVARIANT: `nr_cqe` entries of `cq` were just taken from `state`'s pool.
        Ok(CqEntries { state, cq, nr_cqe })
    }

    /// Returns the CQ, for `ib_create_qp` and friends.
    pub(crate) fn cq(&self) -> CqPtr {
        self.cq
    }

    /// Returns the entries taken.
    pub(crate) fn nr_cqe(&self) -> u32 {
        self.nr_cqe
    }
}

impl Drop for CqEntries {
    fn drop(&mut self) {
        // Dropped here, after the state's last use: possibly its last reference.
        drop(self.state.cq_put(self.cq, self.nr_cqe));
    }
}

/// Takes `nr_cqe` entries on a pooled CQ of `dev` (the checked form of `ibext_cq_pool_get_attr`);
/// the caller gives them back with [`DeviceState::cq_put`] through the CQ's state.
pub(crate) fn cq_pool_get(
    dev: &Device,
    nr_cqe: u32,
    hint: i32,
    ctx: PollCtx,
    moderation: Moderation,
) -> Result<CqPtr> {
    // The reference, taken under RCU, keeps the state alive across a racing `remove`.
    let state = crate::device::device_state(dev).ok_or(ENODEV)?;
    state.cq_pool_get(nr_cqe, hint, ctx, moderation)
}

/// Finds `key` on `dev`: on `port`, or on every port in order (`None`). The checked form of
/// `ibext_find_gid`/`ibext_find_gid_by_port`: `port`, if given, is valid.
///
/// A device whose ports hold so few GIDs that ib_core's scan is cheaper than the hashed lookup
/// (`gid_index::core_scan_cheaper`) is answered by that scan.
#[cfg_attr(
    not(ibext_kunit),
    expect(
        dead_code,
        reason = "the C entry points and the tests are its only callers so far"
    )
)]
pub(crate) fn gid_find(
    dev: &Device,
    key: &GidKey,
    port: Option<u32>,
    ndev: NdevPtr,
) -> Result<GidAttr> {
    if crate::gid_index::core_scan_cheaper(dev) {
        return gid::upstream_find_gid(dev, &key.gid, key.gid_type, port, ndev);
    }
    gid_find_hashed(dev, key, port, ndev)
}

/// [`gid_find`] through ibext's index, whatever the table's size. On a device ibext is not
/// attached to (its `add` failed), ib_core's own search answers.
#[inline(always)]
pub(crate) fn gid_find_hashed(
    dev: &Device,
    key: &GidKey,
    port: Option<u32>,
    ndev: NdevPtr,
) -> Result<GidAttr> {
    // Inside the RCU section that keeps the state alive: no reference taken on the hot path.
    let rcu = RcuGuard::new();
    if let Some(s) = crate::device::device_state_in(dev, &rcu) {
        return s.gid_index().find(&rcu, key, port, ndev);
    }
    drop(rcu);
    gid::upstream_find_gid(dev, &key.gid, key.gid_type, port, ndev)
}
