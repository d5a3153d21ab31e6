// SPDX-License-Identifier: GPL-2.0

//! The RDMA DIM profiles, which hardware applies through `modify_cq` and software through
//! deferrals (`policy::moderation`, `policy::soft_dim`).

/// One DIM profile: raise an event after `comps` completions or `usec` microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Profile {
    /// Microseconds.
    pub(crate) usec: u16,
    /// Completions.
    pub(crate) comps: u16,
}

/// The RDMA DIM profiles, as ib_core's `rdma_dim_prof` (static in `drivers/infiniband/core/cq.c`
/// on 6.12, so not reachable from a module): index 0 is the lowest moderation.
pub(crate) const RDMA_DIM_PROFILES: [Profile; 9] = [
    Profile { usec: 1, comps: 1 },
    Profile { usec: 1, comps: 4 },
    Profile { usec: 2, comps: 4 },
    Profile { usec: 2, comps: 8 },
    Profile { usec: 4, comps: 8 },
    Profile { usec: 16, comps: 8 },
    Profile {
        usec: 16,
        comps: 16,
    },
    Profile {
        usec: 32,
        comps: 16,
    },
    Profile {
        usec: 32,
        comps: 32,
    },
];

/// Returns profile `ix`, clamped to the table.
pub(crate) fn profile(ix: u8) -> Profile {
    RDMA_DIM_PROFILES[(ix as usize).min(RDMA_DIM_PROFILES.len() - 1)]
}

/// Returns profile `ix`'s `(completions, microseconds)`, for a device's `modify_cq`.
pub(crate) fn comps_usec(ix: u8) -> (u16, u16) {
    let p = profile(ix);
    (p.comps, p.usec)
}
