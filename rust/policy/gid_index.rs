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

/// A slot of the hash table: an entry's key and table index inline, so that a probe reads one
/// slot and no second array; or no entry ([`Slot::EMPTY`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    key: GidKey,
    /// The entry's index in the port's table, or [`EMPTY`].
    index: u32,
}

/// The `index` of a slot that holds no entry (no table has `u32::MAX` entries).
pub(crate) const EMPTY: u32 = u32::MAX;

impl Slot {
    /// A slot that holds no entry.
    pub(crate) const EMPTY: Slot = Slot {
        key: GidKey {
            gid: [0; 16],
            gid_type: 0,
        },
        index: EMPTY,
    };

    /// Returns the table index of the entry in this slot, if it holds one.
    #[cfg_attr(not(test), expect(dead_code, reason = "used by the host tests only"))]
    pub(crate) fn index(&self) -> Option<u32> {
        (self.index != EMPTY).then_some(self.index)
    }
}

/// Returns the number of hash slots for `n` entries: the smallest power of two that is at least
/// `2 * n` and at least 8, so the load factor stays at or below 1/2 and probes stay short.
pub(crate) fn slots_for(n: usize) -> usize {
    n.saturating_mul(2).max(8).next_power_of_two()
}

/// Returns the hash of `key`: the GID's two halves and the type folded into one word, then one
/// multiply by 2^64 / φ (Fibonacci hashing); [`home`] takes the product's high bits.
///
/// GIDs of one port often differ only in a few bytes (the interface identifier, or the last
/// octets of an address range: the high bytes of the second half, read little-endian). The
/// rotation moves those to the low half of the word, and the product's high bits depend on every
/// bit of it. The lookup is on the GID cache's hot path, where the murmur3 finalizer's three
/// multiplies cost a sixth of ibext's own instructions (instruction profile of one lookup,
/// `scripts/insn-profile.py`).
pub(crate) fn hash(key: &GidKey) -> u64 {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&key.gid[..8]);
    hi.copy_from_slice(&key.gid[8..]);
    let a = u64::from_le_bytes(lo);
    let b = u64::from_le_bytes(hi);
    (a.rotate_left(17) ^ b.rotate_left(32) ^ u64::from(key.gid_type))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Returns the home slot of `key` in a table of `n` slots (a power of two, at least 2): the
/// hash's top `log2(n)` bits.
pub(crate) fn home(key: &GidKey, n: usize) -> usize {
    (hash(key) >> (64 - n.trailing_zeros())) as usize
}

/// The index could not be built: the slots are too few or not a power of two, or an entry's
/// table index is [`EMPTY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BadShape;

/// Fills `slots` with every entry, by linear probing.
///
/// `slots.len()` must be a power of two greater than `entries.len()` ([`slots_for`] gives one).
/// Entries are inserted in order, so entries with the same key are met by [`lookup`] in the
/// order they have in `entries`: by table index if `entries` is.
pub(crate) fn build(entries: &[Entry], slots: &mut [Slot]) -> Result<(), BadShape> {
    let n = slots.len();
    if !n.is_power_of_two() || n < 2 || n <= entries.len() {
        return Err(BadShape);
    }
    if entries.iter().any(|e| e.index == EMPTY) {
        return Err(BadShape);
    }
    slots.fill(Slot::EMPTY);
    let mask = n - 1;
    for e in entries {
        let mut s = home(&e.key, n);
        while slots[s].index != EMPTY {
            s = (s + 1) & mask;
        }
        slots[s] = Slot {
            key: e.key,
            index: e.index,
        };
    }
    Ok(())
}

/// The table indices of the entries with one key, in the order [`build`] inserted them.
pub(crate) struct Matches<'a> {
    slots: &'a [Slot],
    key: &'a GidKey,
    slot: usize,
    /// Slots left to look at: a full table (which [`build`] never makes) still ends.
    left: usize,
}

impl Iterator for Matches<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let mask = self.slots.len().wrapping_sub(1);
        while self.left > 0 {
            let s = self.slots.get(self.slot)?;
            if s.index == EMPTY {
                self.left = 0;
                return None;
            }
            self.slot = (self.slot + 1) & mask;
            self.left -= 1;
            if s.key == *self.key {
                return Some(s.index);
            }
        }
        None
    }
}

/// Returns the table indices of the entries with `key`, from `slots` as [`build`] made them.
pub(crate) fn lookup<'a>(slots: &'a [Slot], key: &'a GidKey) -> Matches<'a> {
    let n = slots.len();
    // Not a power of two of at least 2: not from `build`; find nothing.
    let ok = n.is_power_of_two() && n >= 2;
    Matches {
        slots,
        key,
        slot: if ok { home(key, n) } else { 0 },
        left: if ok { n } else { 0 },
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

/// The most valid entries a port may hold for ib_core's own scan to answer its lookups.
///
/// Under the instruction-count clock (`make bench`, the `gid` benchmark), a hashed lookup
/// through `ibext_find_gid` costs about 334 ns at any table size: 143 of them confirming the
/// candidate with `rdma_get_gid_attr`, about 45 reaching the device's state. ib_core's scan
/// (`rdma_find_gid`) costs about 166 ns for the first entry and 19 more for each entry before
/// the one it finds: over the positions of an `n`-entry table, `166 + 19 (n - 1) / 2`, which
/// passes 334 between 18 and 19 entries.
pub(crate) const CORE_SCAN_MAX: usize = 18;

/// Whether ib_core's own scan is the cheaper way to answer lookups on a device whose ports
/// hold `entries` valid entries each: every port at most [`CORE_SCAN_MAX`]. A device without
/// ports has nothing to find and takes the scan.
pub(crate) fn core_scan_cheaper(entries: impl IntoIterator<Item = usize>) -> bool {
    entries.into_iter().all(|n| n <= CORE_SCAN_MAX)
}
