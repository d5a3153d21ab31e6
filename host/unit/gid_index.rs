// SPDX-License-Identifier: GPL-2.0

use super::Rng;
use crate::policy::gid_index::*;

fn key(rng: &mut Rng, prefix_only: bool) -> GidKey {
    let mut gid = [0u8; 16];
    if prefix_only {
        // Addresses of one /64 with a small interface identifier: the common case on RoCE.
        gid[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0]);
        gid[14..].copy_from_slice(&(rng.below(4096) as u16).to_be_bytes());
    } else {
        for b in gid.iter_mut() {
            *b = rng.next() as u8;
        }
    }
    GidKey {
        gid,
        gid_type: rng.below(2) as u32,
    }
}

/// A table of `sz` indices with about `fill` of them valid, some keys repeated.
fn table(rng: &mut Rng, sz: u32, fill: u32, prefix_only: bool) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for index in 0..sz {
        if rng.below(u64::from(sz)) >= u64::from(fill) {
            continue;
        }
        let k = if !out.is_empty() && rng.below(10) == 0 {
            // The same GID and type again, as on a second netdev of the port.
            out[rng.below(out.len() as u64) as usize].key
        } else {
            key(rng, prefix_only)
        };
        out.push(Entry { key: k, index });
    }
    out
}

/// The linear scan upstream does: every index with the key, in table order.
fn scan(entries: &[Entry], k: &GidKey) -> Vec<u32> {
    entries
        .iter()
        .filter(|e| e.key == *k)
        .map(|e| e.index)
        .collect()
}

fn built(entries: &[Entry]) -> Vec<Slot> {
    let mut slots = vec![Slot::EMPTY; slots_for(entries.len())];
    assert_eq!(build(entries, &mut slots), Ok(()));
    slots
}

#[test]
fn lookup_equals_linear_scan() {
    let mut rng = Rng::new(7);
    for round in 0..300 {
        let sz = [1u32, 4, 16, 128, 256, 1024][round % 6];
        let fill = (rng.below(u64::from(sz)) + 1) as u32;
        let entries = table(&mut rng, sz, fill, round % 2 == 0);
        let slots = built(&entries);
        for e in &entries {
            let got: Vec<u32> = lookup(&slots, &e.key).collect();
            assert_eq!(got, scan(&entries, &e.key), "round {round}");
        }
        for _ in 0..64 {
            let k = key(&mut rng, round % 2 == 0);
            let got: Vec<u32> = lookup(&slots, &k).collect();
            assert_eq!(got, scan(&entries, &k), "absent key, round {round}");
        }
    }
}

#[test]
fn type_is_part_of_the_key() {
    let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0xff, 0xfe, 0, 0, 1];
    let v1 = GidKey { gid, gid_type: 0 };
    let v2 = GidKey { gid, gid_type: 2 };
    let entries = [Entry { key: v1, index: 0 }, Entry { key: v2, index: 1 }];
    let slots = built(&entries);
    assert_eq!(lookup(&slots, &v1).collect::<Vec<_>>(), [0]);
    assert_eq!(lookup(&slots, &v2).collect::<Vec<_>>(), [1]);
    let v3 = GidKey { gid, gid_type: 1 };
    assert_eq!(lookup(&slots, &v3).count(), 0);
}

#[test]
fn empty_table_finds_nothing() {
    let slots = built(&[]);
    assert_eq!(slots.len(), 8);
    let k = GidKey {
        gid: [0; 16],
        gid_type: 0,
    };
    assert_eq!(lookup(&slots, &k).count(), 0);
}

#[test]
fn bad_shapes_are_refused() {
    let k = GidKey {
        gid: [1; 16],
        gid_type: 0,
    };
    let entries = [Entry { key: k, index: 3 }; 4];
    assert_eq!(
        build(&entries, &mut [Slot::EMPTY; 4]),
        Err(BadShape),
        "no free slot"
    );
    assert_eq!(
        build(&entries, &mut [Slot::EMPTY; 6]),
        Err(BadShape),
        "not a power of two"
    );
    let empty_index = [Entry {
        key: k,
        index: EMPTY,
    }];
    assert_eq!(
        build(&empty_index, &mut [Slot::EMPTY; 8]),
        Err(BadShape),
        "an index that marks an empty slot"
    );
    let mut slots = [Slot::EMPTY; 8];
    assert_eq!(build(&entries, &mut slots), Ok(()));
    assert_eq!(lookup(&slots, &k).collect::<Vec<_>>(), [3, 3, 3, 3]);
    // Slots that `build` did not make find nothing and do not loop.
    assert_eq!(lookup(&[Slot::EMPTY; 6], &k).count(), 0);
    assert_eq!(lookup(&[Slot::EMPTY; 1], &k).count(), 0);
    let mut full = [Slot::EMPTY; 8];
    assert_eq!(build(&[Entry { key: k, index: 3 }; 7], &mut full), Ok(()));
    let mut full_too = full;
    // The last free slot taken by hand: a table `build` never makes, still ends.
    let free = full.iter().position(|s| s.index().is_none()).unwrap();
    full_too[free] = full[(free + 1) % 8];
    assert_eq!(lookup(&full_too, &k).count(), 8, "a full table still ends");
}

#[test]
fn probes_stay_short_for_one_prefix() {
    // 1000 addresses of one /64: the worst case for a weak hash.
    let mut entries = Vec::new();
    for i in 0..500u32 {
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0]);
        gid[12..].copy_from_slice(&(i + 1).to_be_bytes());
        for (t, gid_type) in [0u32, 2].into_iter().enumerate() {
            entries.push(Entry {
                key: GidKey { gid, gid_type },
                index: 2 * i + t as u32,
            });
        }
    }
    let slots = built(&entries);
    let mask = slots.len() - 1;
    let (mut worst, mut total) = (0, 0);
    for e in &entries {
        let home = home(&e.key, slots.len());
        let at = slots
            .iter()
            .position(|s| s.index() == Some(e.index))
            .unwrap();
        let probe = (at + slots.len() - home) & mask;
        worst = worst.max(probe);
        total += probe;
    }
    let mean = total as f64 / entries.len() as f64;
    assert!(
        worst < 24 && mean < 1.0,
        "longest probe {worst}, mean {mean}"
    );
}

#[test]
fn bitmap_ops() {
    let mut map = vec![0u64; bitmap_words(1024)];
    assert_eq!(map.len(), 16);
    for i in [0, 63, 64, 1023] {
        bitmap_set(&mut map, i);
    }
    bitmap_set(&mut map, 1024);
    assert_eq!(bitmap_weight(&map), 4);
    assert!(bitmap_test(&map, 63) && bitmap_test(&map, 64) && !bitmap_test(&map, 65));
    assert!(!bitmap_test(&map, 5000));
    let mut other = vec![0u64; bitmap_words(1024)];
    bitmap_set(&mut other, 0);
    bitmap_set(&mut other, 5);
    assert_eq!(bitmap_changes(&map, &other), 4);
    assert_eq!(bitmap_changes(&map, &[]), 4);
    assert_eq!(bitmap_words(0), 0);
}

#[test]
fn misses_are_confirmed_only_by_a_current_roce_mirror() {
    // A RoCE port whose snapshot reflects every event announced before the lookup began.
    assert!(miss_is_confirmed(true, false, 7, 7));
    assert!(
        miss_is_confirmed(true, false, 8, 7),
        "a newer snapshot is as good"
    );
    // The race of issue 14: the lookup loaded the snapshot of event 6 while event 7 was being
    // rescanned; the rescan finished before the lookup checked. Its own snapshot is older than
    // what was announced when it began: ask ib_core.
    assert!(!miss_is_confirmed(true, false, 6, 7));
    // A candidate that did not confirm, or no snapshot yet (initial scan failed).
    assert!(!miss_is_confirmed(true, true, 7, 7));
    // IB and iWARP ports are never mirrored: every miss goes to ib_core.
    assert!(!miss_is_confirmed(false, false, 7, 7));
    assert!(!miss_is_confirmed(false, false, u64::MAX, 0));
}

#[test]
fn small_tables_are_left_to_the_core_scan() {
    assert!(core_scan_cheaper([1, CORE_SCAN_MAX]));
    assert!(!core_scan_cheaper([1, CORE_SCAN_MAX + 1]));
    assert!(!core_scan_cheaper([CORE_SCAN_MAX + 1]));
    assert!(core_scan_cheaper(core::iter::empty()));
    // Where the scan's cost over a table's positions passes a hashed lookup's (see the
    // constant's comment): 166 + 19 (n - 1) / 2 against 334 ns.
    let scan = |n: usize| 166 + 19 * (n - 1) / 2;
    assert!(scan(CORE_SCAN_MAX) <= 334 && scan(CORE_SCAN_MAX + 1) > 334);
}
