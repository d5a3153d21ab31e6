// SPDX-License-Identifier: GPL-2.0

//! CQ pool policy: which completion vector, which CQ, and how big a new set of CQs is.
//!
//! Upstream `ib_cq_pool_get` (6.12, `drivers/infiniband/core/cq.c`) is first-fit although its
//! kernel-doc promises least-used, and shares one round-robin counter among all devices. Here
//! the CQ with the fewest entries in use wins, and the round-robin counter is the device's own.

/// Entries in each CQ of a new set when the request is smaller (upstream's `IB_CQE_BATCH` x 4).
pub(crate) const MIN_GROW_CQE: u32 = 4096;

/// A request the pool must refuse without changing anything (`-EINVAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Invalid;

/// Checks the size of a request: between 1 and the device's `max_cqe` entries.
///
/// Upstream accepts 0 (and hands out a CQ for nothing) and, for `nr_cqe > max_cqe`, grows the
/// pool in an endless loop, since no CQ it can make ever fits.
pub(crate) fn check_nr_cqe(nr_cqe: u32, max_cqe: u32) -> Result<(), Invalid> {
    if nr_cqe == 0 || nr_cqe > max_cqe {
        return Err(Invalid);
    }
    Ok(())
}

/// Returns the completion vector for `hint`.
///
/// A hint `>= 0` maps to `hint % usable`, where `usable` is `min(num_comp_vectors,
/// num_online_cpus())`; a negative hint takes the device's next round-robin value, which
/// `next_rr` returns (and advances).
pub(crate) fn vector_for_hint(hint: i32, usable: u32, next_rr: impl FnOnce() -> u32) -> u32 {
    let usable = usable.max(1);
    match u32::try_from(hint) {
        Ok(h) => h % usable,
        Err(_) => next_rr() % usable,
    }
}

/// Returns the number of entries of each CQ in a new set for a request of `nr_cqe` entries:
/// `min(max_cqe, max(nr_cqe, MIN_GROW_CQE))`.
pub(crate) fn grow_cqe(nr_cqe: u32, max_cqe: u32) -> u32 {
    nr_cqe.max(MIN_GROW_CQE).min(max_cqe)
}

/// What the pool policy needs to know of one pooled CQ.
pub(crate) trait Slot {
    /// The completion vector the CQ was created on.
    fn vector(&self) -> u32;
    /// The entries the CQ really has (drivers round up: rxe makes 8191 of 4096).
    fn capacity(&self) -> u32;
    /// The entries handed out and not yet put back.
    fn used(&self) -> u32;
}

/// Returns the position (in `slots` order, oldest first) of the CQ to take `nr_cqe` entries from
/// on `vector`: among the CQs on that vector with room, the one with the fewest entries in use,
/// the oldest on a tie.
///
/// The vector test compares the vector each CQ was *created on*, recorded when its set was made
/// (CQ `i` of a set is on vector `i`), so vector 0 is an ordinary vector here: no slot has an
/// unset vector that would read as 0.
pub(crate) fn pick_least_used<'a, S: Slot + 'a>(
    slots: impl IntoIterator<Item = &'a S>,
    vector: u32,
    nr_cqe: u32,
) -> Option<usize> {
    let mut best: Option<(usize, u32)> = None;
    for (i, s) in slots.into_iter().enumerate() {
        if s.vector() != vector || s.capacity().saturating_sub(s.used()) < nr_cqe {
            continue;
        }
        match best {
            Some((_, used)) if used <= s.used() => {}
            _ => best = Some((i, s.used())),
        }
    }
    best.map(|(i, _)| i)
}

/// How long a pooled CQ stays with no entries in use before aging destroys it, by default (the
/// module parameter `ibext.age_ms` sets another): 60 s, the age after which upstream's FRMR
/// pools (7.1) free idle objects. Long enough that a ULP reconnecting its queues finds its CQs
/// still there; short against the life of a device.
pub(crate) const AGE_MS: u64 = 60_000;

/// What aging needs to know of one pooled CQ beyond [`Slot`].
pub(crate) trait AgingSlot: Slot {
    /// When the CQ last became idle (its entries in use dropped to 0, or it was made), in
    /// milliseconds of a monotonic clock.
    fn idle_since_ms(&self) -> u64;
}

/// One aging pass over a pool's CQs at `now_ms`, with an aging period of `age_ms`, in `slots`
/// order (oldest first): calls `destroy(pos)` for every CQ to destroy, and returns the
/// milliseconds until the next CQ that is idle but not old enough would age out (`None`: no
/// such CQ, no pass needed).
///
/// A CQ ages out when it is live (`capacity() > 0`), has had no entries in use for
/// `age_ms`, and is not its vector's floor: the oldest live CQ on its vector, busy or idle,
/// always stays, so that a get on a vector the pool has served finds a CQ without allocating.
pub(crate) fn age_pass<'a, S, I>(
    slots: I,
    now_ms: u64,
    age_ms: u64,
    mut destroy: impl FnMut(usize),
) -> Option<u64>
where
    S: AgingSlot + 'a,
    I: Iterator<Item = &'a S> + Clone,
{
    let mut next: Option<u64> = None;
    for (pos, s) in slots.clone().enumerate() {
        if s.capacity() == 0 || s.used() != 0 {
            continue;
        }
        let floor = !slots
            .clone()
            .take(pos)
            .any(|o| o.capacity() > 0 && o.vector() == s.vector());
        if floor {
            continue;
        }
        let idle = now_ms.saturating_sub(s.idle_since_ms());
        if idle >= age_ms {
            destroy(pos);
        } else {
            let left = age_ms - idle;
            next = Some(next.map_or(left, |n| n.min(left)));
        }
    }
    next
}

/// A put the pool must refuse: more entries than the CQ has in use, or none at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OverPut;

/// Returns the entries in use after putting back `nr_cqe` of `used`; never underflows.
pub(crate) fn put_back(used: u32, nr_cqe: u32) -> Result<u32, OverPut> {
    if nr_cqe == 0 {
        return Err(OverPut);
    }
    used.checked_sub(nr_cqe).ok_or(OverPut)
}
