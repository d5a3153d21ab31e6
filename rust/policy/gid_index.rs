// SPDX-License-Identifier: GPL-2.0

//! GID index policy: an open-addressing hash over one port's valid GID table entries, and the
//! bitmap of which table indices are valid.
//!
//! Upstream `rdma_find_gid` and `rdma_find_gid_by_port` (6.12, `drivers/infiniband/core/cache.c`)
//! scan the whole table with `memcmp` for every lookup. This is the index ibext keeps instead: a
//! snapshot of one port's table, built by a rescan and never changed afterwards, so readers need
//! no lock. The caller owns the memory: these functions work on slices and never allocate.
//!
//! Lookups give table indices of *candidates*; the kernel side confirms each one against the
//! core's table before it returns it, so a stale snapshot can cost a fallback, never a wrong
//! answer.

/// The part of a GID table entry the index is keyed by (the port is the snapshot's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GidKey {
    /// The GID, in network byte order, as in `union ib_gid`.
    pub(crate) gid: [u8; 16],
    /// `enum ib_gid_type`.
    pub(crate) gid_type: u32,
}

/// One valid entry of a port's GID table, as a rescan saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) key: GidKey,
    /// The entry's index in the port's table.
    pub(crate) index: u32,
}

/// A slot of the hash table that holds no entry.
pub(crate) const EMPTY: u32 = u32::MAX;

/// Returns the number of hash slots for `n` entries: the smallest power of two that is at least
/// `2 * n` and at least 8, so the load factor stays at or below 1/2 and probes stay short.
pub(crate) fn slots_for(n: usize) -> usize {
    n.saturating_mul(2).max(8).next_power_of_two()
}

/// Returns the hash of `key`: the GID's two halves and the type, mixed by one multiply.
///
/// GIDs of one port often differ only in a few bytes (the interface identifier, or the last
/// octets of an address range), so every byte reaches the high bits that pick the slot.
pub(crate) fn hash(key: &GidKey) -> u64 {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&key.gid[..8]);
    hi.copy_from_slice(&key.gid[8..]);
    let a = u64::from_le_bytes(lo);
    let b = u64::from_le_bytes(hi);
    // murmur3's 64-bit finalizer over the two halves and the type.
    let mut x = a.wrapping_mul(0x87c3_7b91_1142_53d5)
        ^ b.rotate_left(31)
        ^ u64::from(key.gid_type).wrapping_mul(0x4cf5_ad43_2745_937f);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The index could not be built: the slots are too few or not a power of two, or an entry's
/// position does not fit in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BadShape;

/// Fills `slots` with the positions in `entries` of every entry, by linear probing.
///
/// `slots.len()` must be a power of two greater than `entries.len()` ([`slots_for`] gives one).
/// Entries are inserted in order, so entries with the same key are met by [`lookup`] in the
/// order they have in `entries`: by table index if `entries` is.
pub(crate) fn build(entries: &[Entry], slots: &mut [u32]) -> Result<(), BadShape> {
    let n = slots.len();
    if !n.is_power_of_two() || n <= entries.len() || entries.len() >= EMPTY as usize {
        return Err(BadShape);
    }
    slots.fill(EMPTY);
    let mask = n - 1;
    for (pos, e) in entries.iter().enumerate() {
        let mut s = (hash(&e.key) as usize) & mask;
        while slots[s] != EMPTY {
            s = (s + 1) & mask;
        }
        // `pos < entries.len() < EMPTY`, checked above.
        slots[s] = pos as u32;
    }
    Ok(())
}

/// The entries with one key, in the order [`build`] inserted them.
pub(crate) struct Matches<'a> {
    entries: &'a [Entry],
    slots: &'a [u32],
    key: GidKey,
    slot: usize,
    /// Slots left to look at: a full table (which [`build`] never makes) still ends.
    left: usize,
}

impl Iterator for Matches<'_> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        let mask = self.slots.len().wrapping_sub(1);
        while self.left > 0 {
            let pos = self.slots[self.slot];
            if pos == EMPTY {
                self.left = 0;
                return None;
            }
            self.slot = (self.slot + 1) & mask;
            self.left -= 1;
            if let Some(e) = self.entries.get(pos as usize) {
                if e.key == self.key {
                    return Some(*e);
                }
            }
        }
        None
    }
}

/// Returns the entries with `key`, from an index [`build`] made of `entries` and `slots`.
pub(crate) fn lookup<'a>(entries: &'a [Entry], slots: &'a [u32], key: &GidKey) -> Matches<'a> {
    let n = slots.len();
    let slot = if n.is_power_of_two() {
        (hash(key) as usize) & (n - 1)
    } else {
        0
    };
    Matches {
        entries,
        slots,
        key: *key,
        slot,
        // Not a power of two: not from `build`; find nothing.
        left: if n.is_power_of_two() { n } else { 0 },
    }
}

/// Returns the number of `u64` words of a bitmap of `bits` bits.
pub(crate) fn bitmap_words(bits: usize) -> usize {
    bits.div_ceil(64)
}

/// Sets bit `i`; out of range is ignored.
pub(crate) fn bitmap_set(map: &mut [u64], i: usize) {
    if let Some(w) = map.get_mut(i / 64) {
        *w |= 1 << (i % 64);
    }
}

/// Returns bit `i`; out of range is clear.
#[cfg_attr(
    not(any(test, ibext_kunit)),
    expect(dead_code, reason = "used by the tests only")
)]
pub(crate) fn bitmap_test(map: &[u64], i: usize) -> bool {
    map.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

/// Returns the number of set bits.
pub(crate) fn bitmap_weight(map: &[u64]) -> usize {
    map.iter().map(|w| w.count_ones() as usize).sum()
}

/// Returns how many bits differ between two bitmaps (bits past the shorter one count as clear).
pub(crate) fn bitmap_changes(a: &[u64], b: &[u64]) -> usize {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
            x.count_ones() as usize
        })
        .sum()
}

/// Whether a lookup that found no confirmed candidate on a port may answer "no such GID"
/// itself, instead of asking ib_core.
///
/// - `indexed`: the port's table is mirrored at all. Only RoCE tables are: ib_core rewrites IB
///   and iWARP tables (`config_non_roce_gid_cache`) without dispatching `IB_EVENT_GID_CHANGE`,
///   so a mirror of them would go stale unannounced.
/// - `stale`: a candidate did not confirm, or there is no snapshot yet.
/// - `snapshot_gen`: the event count the snapshot the lookup searched reflects.
/// - `requested_before`: the port's event count, read *before* the snapshot was loaded. A miss
///   is trusted only against a snapshot at least that new: one loaded before a rescan finished
///   must not be confirmed by the rescan having finished since.
pub(crate) fn miss_is_confirmed(
    indexed: bool,
    stale: bool,
    snapshot_gen: u64,
    requested_before: u64,
) -> bool {
    indexed && !stale && snapshot_gen >= requested_before
}
