// SPDX-License-Identifier: GPL-2.0

//! Object accounting.
//!
//! Every object ibext allocates carries a [`Token`] of its kind. Making the token counts one
//! made, dropping it counts one freed, so at any quiescent point `made - freed` is the number of
//! live objects. Module unload warns if anything is still live, and the tests compare snapshots
//! around device removal and re-addition.

use core::sync::atomic::{AtomicUsize, Ordering};

/// The kinds of object ibext accounts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Kind {
    /// Per-device state, one per registered `ib_device`.
    DeviceState = 0,
    /// A pooled CQ with its completion engine.
    PooledCq = 1,
    /// A set of pooled CQs, one per completion vector, made when a pool grows.
    CqSet = 2,
    /// DIM attached to a legacy ULP's own CQ.
    LegacyDim = 3,
    /// A snapshot of one port's GID table, in the GID index.
    GidSnapshot = 4,
    /// An SRQ pool made by a ULP.
    SrqPool = 5,
}

impl Kind {
    /// Every kind, in index order.
    pub(crate) const ALL: [Kind; 6] = [
        Kind::DeviceState,
        Kind::PooledCq,
        Kind::CqSet,
        Kind::LegacyDim,
        Kind::GidSnapshot,
        Kind::SrqPool,
    ];

    /// The name shown in debugfs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::DeviceState => "device_state",
            Kind::PooledCq => "pooled_cq",
            Kind::CqSet => "cq_set",
            Kind::LegacyDim => "legacy_dim",
            Kind::GidSnapshot => "gid_snapshot",
            Kind::SrqPool => "srq_pool",
        }
    }
}

const NR_KINDS: usize = Kind::ALL.len();

static MADE: [AtomicUsize; NR_KINDS] = [const { AtomicUsize::new(0) }; NR_KINDS];
static FREED: [AtomicUsize; NR_KINDS] = [const { AtomicUsize::new(0) }; NR_KINDS];

/// Proof that one object of a kind is live; dropping it counts the object freed.
///
/// # Invariants
///
/// Each `Token` incremented `MADE[kind]` exactly once when made and increments `FREED[kind]`
/// exactly once when dropped.
#[derive(Debug)]
pub(crate) struct Token(Kind);

impl Token {
    /// Counts one object of `kind` made.
    pub(crate) fn new(kind: Kind) -> Self {
        MADE[kind as usize].fetch_add(1, Ordering::Relaxed);
        // INVARIANT: `MADE[kind]` was incremented above.
        Token(kind)
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        FREED[self.0 as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts for one kind at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Objects made since the module was loaded.
    pub(crate) made: usize,
    /// Objects freed since the module was loaded.
    pub(crate) freed: usize,
}

impl Counts {
    /// Objects still live.
    pub(crate) fn live(&self) -> usize {
        self.made.saturating_sub(self.freed)
    }
}

/// Returns the counts of `kind` now.
pub(crate) fn counts(kind: Kind) -> Counts {
    Counts {
        made: MADE[kind as usize].load(Ordering::Relaxed),
        freed: FREED[kind as usize].load(Ordering::Relaxed),
    }
}

/// Returns the number of live objects of every kind together.
pub(crate) fn live_total() -> usize {
    Kind::ALL.iter().map(|k| counts(*k).live()).sum()
}
