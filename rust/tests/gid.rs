// SPDX-License-Identifier: GPL-2.0

//! `ibext_gid`: the cached GID index against ib_core's own lookups, on real GID tables.
//!
//! The guest's init gives veth0 hundreds of IPv6 addresses before rxe0 is made, so rxe0's table
//! (1024 entries) is nearly full: each address is one RoCE v1 and one RoCE v2 GID. rxe1 keeps a
//! small table. Tests add and remove more addresses with `ip`, so ib_core changes its tables the
//! way it does in production (netdev events, `roce_gid_mgmt`).
//!
//! About 790 lines: the comparison with ib_core over every port, type and netdev, the churn
//! workers and the benchmark's lookups share the fixtures here.

use crate::ib::gid::NdevPtr;
use crate::tests::fixtures::guest::{msleep, wait_for, XorShift};
use crate::{
    api, bindings,
    capi::{ibext_find_gid, ibext_find_gid_by_port},
    device::DeviceState,
    gid_index::Counter,
    ib::{gid::GidAttr, Device},
    kunit::{bad_input_ok, kassert, kassert_eq, kunit_suite, Failed, TestResult},
    policy::gid_index::GidKey,
};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use kernel::{c_str, prelude::*, sync::Arc, workqueue};

use crate::gid_index::core_scan_cheaper;
use crate::policy::gid_index::CORE_SCAN_MAX;
use crate::tests::fixtures::gid::*;

/// Every GID of every table equals ib_core's answer, for both devices, and so do GIDs that are
/// in neither table; with the index current, no lookup falls back.
fn lookups_equal_upstream() -> TestResult {
    // Give rxe1's small table 24 more entries, so both devices have a table worth the name.
    const NET: u16 = 0x60;
    const HOSTS: core::ops::Range<u16> = 1..25;
    kassert_eq!(ip_addrs("add", NET, HOSTS, "veth2")?, 0);
    let res = equal_on_both();
    let _ = ip_addrs("del", NET, HOSTS, "veth2");
    res
}

fn equal_on_both() -> TestResult {
    let (rxe0, s0) = device(c_str!("rxe0"))?;
    let (rxe1, s1) = device(c_str!("rxe1"))?;
    kassert!(
        wait_for(20_000, || valid_entries(rxe1.device())
            .is_ok_and(|v| v.len() > 24)),
        "rxe1 did not get its GIDs"
    );
    for (dev, state) in [(rxe0.device(), &s0), (rxe1.device(), &s1)] {
        settle(state)?;
        let entries = valid_entries(dev).map_err(|_| Failed)?;
        if dev.as_raw() == rxe0.device().as_raw() {
            // The init script's addresses: fail loudly if the table is not what the test needs.
            kassert!(entries.len() >= 900, "rxe0 has only {} GIDs", entries.len());
        }
        let (hits, fallbacks) = (
            state.gid_index().count(Counter::Hits),
            state.gid_index().count(Counter::Fallbacks),
        );
        let others = [rxe0.device(), rxe1.device()];
        for a in entries.iter() {
            let key = key_of(a);
            compare(dev, &key, NdevPtr::ANY)?;
            compare(dev, &key, a.ndev())?;
            // The same GID with the other RoCE type, and on the other device.
            for t in TYPES {
                compare(dev, &GidKey { gid_type: t, ..key }, NdevPtr::ANY)?;
            }
            for other in others {
                compare(other, &key, NdevPtr::ANY)?;
            }
            // Absent: the GID with its last byte changed and with a foreign prefix.
            let mut absent = key;
            absent.gid[15] ^= 0xa5;
            compare(dev, &absent, NdevPtr::ANY)?;
            absent.gid[0] = 0x3f;
            compare(dev, &absent, NdevPtr::ANY)?;
        }
        let hits = state.gid_index().count(Counter::Hits) - hits;
        {
            kassert!(
                hits >= 3 * entries.len() as u64,
                "{} hits for {} entries",
                hits,
                entries.len()
            );
        }
        if state.gid_index().current() {
            kassert_eq!(state.gid_index().count(Counter::Fallbacks), fallbacks);
        }
        mirror_equals_table(dev, state)?;
    }
    Ok(())
}

/// All GIDs of `2001:db8:<net>::<hosts>` on `dev`, of each of `types`, pass `pred` on ibext's lookup.
fn all_addrs(
    dev: &Device,
    net: u16,
    hosts: core::ops::Range<u16>,
    types: &[u32],
    mut pred: impl FnMut(Result<GidAttr>, &GidKey) -> bool,
) -> bool {
    for h in hosts {
        for &t in types {
            let key = GidKey {
                gid: addr_gid(net, h),
                gid_type: t,
            };
            if !pred(api::gid_find(dev, &key, None, NdevPtr::ANY), &key) {
                return false;
            }
        }
    }
    true
}

/// Added addresses are found; once removed, they miss, first through the fallback and then
/// from the current index itself.
fn removed_addresses_miss() -> TestResult {
    const NET: u16 = 0x77;
    const HOSTS: core::ops::Range<u16> = 1..9;
    let (dev, state) = device(c_str!("rxe0"))?;
    let dev = dev.device();
    let rescans = state.gid_index().count(Counter::Rescans);
    kassert_eq!(ip_addrs("add", NET, HOSTS, "veth0")?, 0);
    let present = |r: Result<GidAttr>, k: &GidKey| r.is_ok_and(|a| key_of(&a) == *k);
    kassert!(
        wait_for(20_000, || all_addrs(dev, NET, HOSTS, &[V2], present)),
        "added addresses never found"
    );
    settle(&state)?;
    let fallbacks = state.gid_index().count(Counter::Fallbacks);
    kassert!(all_addrs(dev, NET, HOSTS, &[V2], present));
    kassert_eq!(state.gid_index().count(Counter::Fallbacks), fallbacks);
    kassert!(state.gid_index().count(Counter::Rescans) > rescans);

    kassert_eq!(ip_addrs("del", NET, HOSTS, "veth0")?, 0);
    let absent = |r: Result<GidAttr>, _: &GidKey| r.is_err_and(|e| e == ENOENT);
    kassert!(
        wait_for(20_000, || all_addrs(dev, NET, HOSTS, &TYPES, absent)),
        "removed addresses still found"
    );
    settle(&state)?;
    let (fallbacks, misses) = (
        state.gid_index().count(Counter::Fallbacks),
        state.gid_index().count(Counter::ConfirmedMisses),
    );
    kassert!(all_addrs(dev, NET, HOSTS, &TYPES, absent));
    kassert_eq!(state.gid_index().count(Counter::Fallbacks), fallbacks);
    kassert_eq!(
        state.gid_index().count(Counter::ConfirmedMisses),
        misses + (TYPES.len() * HOSTS.len()) as u64
    );
    mirror_equals_table(dev, &state)
}

/// A port that is not mirrored (as IB and iWARP ports are not: ib_core rewrites their tables
/// without announcing it) answers every lookup from ib_core: a GID added there is found at
/// once, a removed one misses, and no miss is ever confirmed by the index. rxe has only RoCE
/// ports, so the test takes rxe0's port out of the index for its duration.
fn unindexed_ports_ask_ib_core() -> TestResult {
    const NET: u16 = 0x79;
    const HOSTS: core::ops::Range<u16> = 1..5;
    let (dev, state) = device(c_str!("rxe0"))?;
    let dev = dev.device();
    settle(&state)?;
    state.gid_index().test_set_indexed(1, false);
    let r = unindexed_lookups(dev, &state, NET, HOSTS);
    state.gid_index().test_set_indexed(1, true);
    r?;
    settle(&state)?;
    mirror_equals_table(dev, &state)
}

fn unindexed_lookups(
    dev: &Device,
    state: &DeviceState,
    net: u16,
    hosts: core::ops::Range<u16>,
) -> TestResult {
    let idx = state.gid_index();
    let (unindexed, misses, hits) = (
        idx.count(Counter::Unindexed),
        idx.count(Counter::ConfirmedMisses),
        idx.count(Counter::Hits),
    );
    kassert_eq!(ip_addrs("add", net, hosts.clone(), "veth0")?, 0);
    let present = |r: Result<GidAttr>, k: &GidKey| r.is_ok_and(|a| key_of(&a) == *k);
    kassert!(
        wait_for(20_000, || all_addrs(
            dev,
            net,
            hosts.clone(),
            &[V2],
            present
        )),
        "added addresses never found"
    );
    for h in hosts.clone() {
        for t in TYPES {
            let key = GidKey {
                gid: addr_gid(net, h),
                gid_type: t,
            };
            compare(dev, &key, NdevPtr::ANY)?;
        }
    }
    kassert_eq!(ip_addrs("del", net, hosts.clone(), "veth0")?, 0);
    let absent = |r: Result<GidAttr>, _: &GidKey| r.is_err_and(|e| e == ENOENT);
    kassert!(
        wait_for(20_000, || all_addrs(
            dev,
            net,
            hosts.clone(),
            &TYPES,
            absent
        )),
        "removed addresses still found"
    );
    kassert!(idx.count(Counter::Unindexed) > unindexed);
    kassert_eq!(idx.count(Counter::ConfirmedMisses), misses);
    kassert_eq!(idx.count(Counter::Hits), hits);
    Ok(())
}

/// Counts of one looker in the churn test.
#[derive(Default)]
struct Tally {
    lookups: AtomicU64,
    found: AtomicU64,
    wrong: AtomicU32,
    /// Lookups of GIDs that stay present throughout, and how many of them missed.
    stable: AtomicU64,
    false_misses: AtomicU64,
}

/// Looks up the churned addresses and the stable ones until `stop`; every entry returned is
/// checked, and a few are held while the churn goes on and checked again before they are put
/// (on the debug kernel, KASAN would see an entry returned without its reference freed).
fn look(dev: &Device, net: u16, hosts: u16, seed: u32, stop: &AtomicBool, tally: &Tally) {
    let mut rng = XorShift::new(seed | 1);
    let mut held: [Option<(GidAttr, GidKey)>; 8] = Default::default();
    let stable: KVec<GidAttr> = valid_entries(dev).unwrap_or_default();
    let mut n = 0u64;
    while !stop.load(Ordering::Acquire) || n < 64 {
        let seed = rng.next();
        let is_stable = seed % 4 == 0 && !stable.is_empty();
        let key = if is_stable {
            key_of(&stable[(seed as usize / 4) % stable.len()])
        } else {
            GidKey {
                gid: addr_gid(net, 1 + (seed % u32::from(hosts)) as u16),
                gid_type: TYPES[(seed >> 8) as usize % 2],
            }
        };
        // Every fourth lookup in an RCU read-side critical section: atomic context on the debug
        // kernel, where sleeping there would be reported.
        let atomic = seed % 4 == 1;
        if atomic {
            // SAFETY: FFI call; unlocked below.
            unsafe { bindings::ibext_shim_rcu_read_lock() };
        }
        let port = if seed % 2 == 0 { None } else { Some(1) };
        let r = api::gid_find(dev, &key, port, NdevPtr::ANY);
        if atomic {
            // SAFETY: Paired with the lock above.
            unsafe { bindings::ibext_shim_rcu_read_unlock() };
        }
        tally.lookups.fetch_add(1, Ordering::Relaxed);
        if is_stable {
            // Present before the churn began and never removed: a miss here is the false miss
            // of a lookup that trusted an older snapshot than the changes it raced.
            tally.stable.fetch_add(1, Ordering::Relaxed);
            if r.is_err() {
                tally.false_misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        n += 1;
        if n % 64 == 0 {
            // A worker on a non-preemptible kernel: let RCU (the rescans wait for it) and the
            // churning `ip` run.
            // SAFETY: FFI call in process context.
            unsafe { bindings::ibext_shim_cond_resched() };
        }
        if let Ok(a) = r {
            tally.found.fetch_add(1, Ordering::Relaxed);
            if key_of(&a) != key || a.port() != 1 || a.index() >= tbl_len(dev, 1) {
                tally.wrong.fetch_add(1, Ordering::Relaxed);
            }
            let slot = &mut held[(seed >> 4) as usize % 8];
            if let Some((old, k)) = slot.take() {
                if key_of(&old) != k {
                    tally.wrong.fetch_add(1, Ordering::Relaxed);
                }
            }
            *slot = Some((a, key));
        }
    }
}

/// A worker adds and removes addresses while others, one per two CPUs (one to three), look them
/// up; no lookup returns a wrong entry, and afterwards the index equals the table again. The
/// lookers spin: the other CPUs are left to the worker and the `ip` it runs.
fn churn_never_wrong() -> TestResult {
    const NET: u16 = 0x78;
    const HOSTS: u16 = 12;
    const ROUNDS: u32 = 8;
    // SAFETY: FFI call without preconditions.
    let lookers = (unsafe { bindings::ibext_shim_num_online_cpus() } / 2).clamp(1, 3);
    let (dev, state) = device(c_str!("rxe0"))?;
    let stop = Arc::new(AtomicBool::new(false), GFP_KERNEL).map_err(|_| Failed)?;
    let tally = Arc::new(Tally::default(), GFP_KERNEL).map_err(|_| Failed)?;
    let done = Arc::new(AtomicU32::new(0), GFP_KERNEL).map_err(|_| Failed)?;
    let churn_ok = Arc::new(AtomicBool::new(true), GFP_KERNEL).map_err(|_| Failed)?;
    let rescans = state.gid_index().count(Counter::Rescans);
    for w in 0..lookers {
        let (state, stop, tally, done) = (state.clone(), stop.clone(), tally.clone(), done.clone());
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            look(
                state.device(),
                NET,
                HOSTS,
                0x2545_f491 ^ ((w + 1) * 7919),
                &stop,
                &tally,
            );
            done.fetch_add(1, Ordering::AcqRel);
        });
        kassert!(res.is_ok(), "cannot start looker {}", w);
    }
    {
        let (stop, done, churn_ok) = (stop.clone(), done.clone(), churn_ok.clone());
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            for r in 0..ROUNDS {
                // Add in an order rotated each round, so that the freed indices are taken by
                // other GIDs than last time and an unconfirmed index would name a wrong entry;
                // remove the two halves in an order that changes too.
                let rot = (r as u16 * 5) % HOSTS;
                let order = (0..HOSTS).map(move |i| 1 + (i + rot) % HOSTS);
                let (a, b) = (1..HOSTS / 2 + 1, HOSTS / 2 + 1..HOSTS + 1);
                let (first, second) = if r % 2 == 0 { (a, b) } else { (b, a) };
                let ok = matches!(ip_addrs("add", NET, order, "veth0"), Ok(0))
                    && [first, second]
                        .into_iter()
                        .all(|hosts| matches!(ip_addrs("del", NET, hosts, "veth0"), Ok(0)));
                if !ok {
                    churn_ok.store(false, Ordering::Release);
                }
                msleep(20);
            }
            stop.store(true, Ordering::Release);
            done.fetch_add(1, Ordering::AcqRel);
        });
        kassert!(res.is_ok(), "cannot start the churn worker");
    }
    let all_done = wait_for(300_000, || done.load(Ordering::Acquire) == lookers + 1);
    stop.store(true, Ordering::Release);
    kassert!(all_done, "churn or lookers did not finish");
    kassert!(churn_ok.load(Ordering::Acquire), "ip addr add/del failed");
    kernel::kunit::info(format_args!(
        "    # churn: {} lookups, {} found, {} rescans, {} fallbacks, {} stale\n",
        tally.lookups.load(Ordering::Relaxed),
        tally.found.load(Ordering::Relaxed),
        state.gid_index().count(Counter::Rescans) - rescans,
        state.gid_index().count(Counter::Fallbacks),
        state.gid_index().count(Counter::Stale),
    ));
    kassert_eq!(tally.wrong.load(Ordering::Relaxed), 0);
    kassert_eq!(tally.false_misses.load(Ordering::Relaxed), 0);
    // Every looker makes at least 64 lookups, a quarter of them of stable GIDs (seeded, not
    // timed), so this holds whatever the guest's speed.
    kassert!(tally.stable.load(Ordering::Relaxed) > 0);
    let dev = dev.device();
    let absent = |r: Result<GidAttr>, _: &GidKey| r.is_err_and(|e| e == ENOENT);
    kassert!(wait_for(20_000, || all_addrs(
        dev,
        NET,
        1..HOSTS + 1,
        &TYPES,
        absent
    )));
    settle(&state)?;
    mirror_equals_table(dev, &state)
}

/// Every request the lookups must refuse is `-EINVAL`, and nothing is counted.
fn bad_input_is_einval() -> TestResult {
    let (dev, state) = device(c_str!("rxe0"))?;
    let d = dev.device().as_raw();
    // In no table.
    let gid = bindings::ib_gid {
        raw: addr_gid(0x99, 1),
    };
    let g: *const bindings::ib_gid = &gid;
    let v2 = bindings::ib_gid_type_IB_GID_TYPE_ROCE_UDP_ENCAP;
    let bad_type = bindings::ib_gid_type_IB_GID_TYPE_SIZE;
    let last = *ports(dev.device()).end();
    let null_dev = core::ptr::null_mut();
    let null_gid = core::ptr::null();
    let null_nd = core::ptr::null_mut();
    let before: KVec<u64> = {
        let mut v = KVec::new();
        for c in [Counter::Hits, Counter::ConfirmedMisses, Counter::Fallbacks] {
            v.push(state.gid_index().count(c), GFP_KERNEL)
                .map_err(|_| Failed)?;
        }
        v
    };
    let is_einval = |p: *const bindings::ib_gid_attr| p as isize == EINVAL.to_errno() as isize;
    // The C entry points, `port == None` for `ibext_find_gid`.
    let find =
        |dev: *mut bindings::ib_device, gid: *const bindings::ib_gid, t: u32, port: Option<u32>| {
            // SAFETY: `dev` is null or rxe0, which the test holds; `gid` is null or `g`, valid for
            // reads; a null `ndev` is only compared.
            unsafe {
                match port {
                    None => ibext_find_gid(dev, gid, t, null_nd),
                    Some(p) => ibext_find_gid_by_port(dev, gid, t, p, null_nd),
                }
            }
        };
    let cases: [(&str, *const bindings::ib_gid_attr); 7] = [
        ("gid_find.null_dev", find(null_dev, g, v2, None)),
        ("gid_find.null_gid", find(d, null_gid, v2, None)),
        ("gid_find.bad_type", find(d, g, bad_type, None)),
        ("gid_find_by_port.null_dev", find(null_dev, g, v2, Some(1))),
        ("gid_find_by_port.null_gid", find(d, null_gid, v2, Some(1))),
        ("gid_find_by_port.port_zero", find(d, g, v2, Some(0))),
        (
            "gid_find_by_port.port_past_end",
            find(d, g, v2, Some(last + 1)),
        ),
    ];
    for (id, p) in cases {
        kassert!(is_einval(p), "{}: got {:?}", id, p);
        bad_input_ok(id);
    }
    for (i, c) in [Counter::Hits, Counter::ConfirmedMisses, Counter::Fallbacks]
        .into_iter()
        .enumerate()
    {
        kassert_eq!(state.gid_index().count(c), before[i]);
    }
    // A well-formed lookup of a GID nobody has is -ENOENT, through the C entry points too.
    // SAFETY: As above.
    let p = unsafe { ibext_find_gid_by_port(d, g, v2, last, null_nd) };
    // SAFETY: `p` is what `ibext_find_gid_by_port` returned; a found entry is put on drop.
    let found = unsafe { GidAttr::from_result(p) };
    kassert!(found.is_err_and(|e| e == ENOENT), "got {:?}", p);
    Ok(())
}

/// A device whose ports hold at most `CORE_SCAN_MAX` GIDs is answered by ib_core's own scan:
/// the index's counters do not move. Grown past that, by the hashed index (its hits count);
/// shrunk again, by the scan. Every answer, on both paths, equals ib_core's.
fn small_tables_ask_ib_core() -> TestResult {
    const NET: u16 = 0x61;
    let (rxe1, s1) = device(c_str!("rxe1"))?;
    let (dev, idx) = (rxe1.device(), s1.gid_index());
    settle(&s1)?;
    let small = valid_entries(dev).map_err(|_| Failed)?.len();
    kassert!(
        small > 0 && small <= CORE_SCAN_MAX,
        "rxe1 has {} GIDs, the test needs 1 to {}",
        small,
        CORE_SCAN_MAX
    );
    kassert!(
        wait_for(20_000, || core_scan_cheaper(dev)),
        "a table of {} entries is not left to ib_core",
        small
    );
    let check_all = || -> TestResult {
        for a in valid_entries(dev).map_err(|_| Failed)?.iter() {
            compare(dev, &key_of(a), NdevPtr::ANY)?;
            let mut absent = key_of(a);
            absent.gid[15] ^= 0xa5;
            compare(dev, &absent, NdevPtr::ANY)?;
        }
        Ok(())
    };
    // What a lookup through the index counts (rescans are not lookups).
    let counted = || {
        [
            Counter::Hits,
            Counter::ConfirmedMisses,
            Counter::Fallbacks,
            Counter::Stale,
            Counter::Unindexed,
        ]
        .iter()
        .map(|&c| idx.count(c))
        .sum::<u64>()
    };
    let before = counted();
    check_all()?;
    kassert_eq!(
        counted(),
        before,
        "the index answered lookups of a small table"
    );
    // Past the bound: one host address is one RoCE v2 GID.
    let hosts = 1..(CORE_SCAN_MAX - small + 2) as u16;
    kassert_eq!(ip_addrs("add", NET, hosts.clone(), "veth2")?, 0);
    let grown = (|| -> TestResult {
        kassert!(
            wait_for(20_000, || valid_entries(dev)
                .is_ok_and(|v| v.len() > CORE_SCAN_MAX)),
            "rxe1 did not get its GIDs"
        );
        settle(&s1)?;
        kassert!(
            wait_for(20_000, || !core_scan_cheaper(dev)),
            "a table past the bound is still left to ib_core"
        );
        let hits = idx.count(Counter::Hits);
        check_all()?;
        kassert!(
            idx.count(Counter::Hits) > hits,
            "the index answered nothing"
        );
        Ok(())
    })();
    kassert_eq!(ip_addrs("del", NET, hosts, "veth2")?, 0);
    grown?;
    kassert!(
        wait_for(20_000, || core_scan_cheaper(dev)),
        "a table shrunk back is not left to ib_core again"
    );
    check_all()
}

kunit_suite!(
    ibext_gid,
    [
        bad_input_is_einval,
        lookups_equal_upstream,
        removed_addresses_miss,
        unindexed_ports_ask_ib_core,
        small_tables_ask_ib_core,
        churn_never_wrong,
    ]
);
