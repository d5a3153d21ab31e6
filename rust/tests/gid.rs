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
use crate::tests::guest::{msleep, required, run, wait_for, DeviceRef, XorShift};
use crate::{
    api, bindings,
    capi::{ibext_find_gid, ibext_find_gid_by_port},
    device::{device_state, DeviceState},
    gid_index::Counter,
    ib::{gid::GidAttr, Device},
    kunit::{bad_input_ok, kassert, kassert_eq, kunit_suite, Failed, TestResult},
    policy::gid_index::{bitmap_test, GidKey},
};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use kernel::{c_str, fmt, prelude::*, str::CString, sync::Arc, workqueue};

/// RoCE v2, the one type of rxe's GIDs.
const V2: u32 = bindings::ib_gid_type_IB_GID_TYPE_ROCE_UDP_ENCAP;

/// RoCE v1 and v2: lookups ask for both; only v2 is ever found on rxe.
const TYPES: [u32; 2] = [
    bindings::ib_gid_type_IB_GID_TYPE_ROCE,
    bindings::ib_gid_type_IB_GID_TYPE_ROCE_UDP_ENCAP,
];

/// A device and ibext's state for it.
fn device(name: &CStr) -> core::result::Result<(DeviceRef, Arc<DeviceState>), Failed> {
    let dev = required(name)?;
    let state = device_state(dev.device());
    kassert!(state.is_some(), "no ibext state for {}", name);
    Ok((dev, state.ok_or(Failed)?))
}

/// Port numbers of `dev`.
fn ports(dev: &Device) -> core::ops::RangeInclusive<u32> {
    // SAFETY: `dev` is registered.
    unsafe {
        bindings::ibext_shim_start_port(dev.as_raw())..=bindings::ibext_shim_end_port(dev.as_raw())
    }
}

fn tbl_len(dev: &Device, port: u32) -> u32 {
    // SAFETY: `port` is one of `ports(dev)`.
    unsafe { bindings::ibext_shim_gid_tbl_len(dev.as_raw(), port) }
}

fn get_attr(dev: &Device, port: u32, index: u32) -> Option<GidAttr> {
    crate::ib::gid::get_gid_attr(dev, port, index).ok()
}

/// The valid entries of every port of `dev`, as ib_core has them now.
fn valid_entries(dev: &Device) -> Result<KVec<GidAttr>> {
    let mut out = KVec::new();
    for p in ports(dev) {
        for i in 0..tbl_len(dev, p) {
            if let Some(a) = get_attr(dev, p, i) {
                out.push(a, GFP_KERNEL)?;
            }
        }
    }
    Ok(out)
}

fn key_of(a: &GidAttr) -> GidKey {
    GidKey {
        gid: a.gid(),
        gid_type: a.gid_type(),
    }
}

/// What a lookup returned, comparable across implementations.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Entry {
        ptr: usize,
        port: u32,
        index: u32,
        gid_type: u32,
        ndev: NdevPtr,
    },
    Err(i32),
}

fn found(r: Result<GidAttr>) -> Found {
    match r {
        Ok(a) => Found::Entry {
            ptr: a.as_raw() as usize,
            port: a.port(),
            index: a.index(),
            gid_type: a.gid_type(),
            ndev: a.ndev(),
        },
        Err(e) => Found::Err(e.to_errno()),
    }
}

/// Compares ibext with ib_core for `key` on `dev`: every port and each port, with `ndev` or any.
fn compare(dev: &Device, key: &GidKey, ndev: NdevPtr) -> TestResult {
    let ours = found(api::gid_find(dev, key, None, ndev));
    let theirs = found(crate::ib::gid::upstream_find(
        dev,
        &key.gid,
        key.gid_type,
        ndev,
    ));
    kassert_eq!(ours, theirs, "rdma_find_gid of {:?}", key);
    for p in ports(dev) {
        let ours = found(api::gid_find(dev, key, Some(p), ndev));
        let theirs = found(crate::ib::gid::upstream_find_by_port(
            dev,
            &key.gid,
            key.gid_type,
            p,
            ndev,
        ));
        kassert_eq!(ours, theirs, "rdma_find_gid_by_port {} of {:?}", p, key);
    }
    Ok(())
}

/// Waits until the index of `state` reflects every GID change ib_core announced.
fn settle(state: &DeviceState) -> TestResult {
    kassert!(
        wait_for(20_000, || state.gid_index().current()),
        "the GID index did not catch up"
    );
    Ok(())
}

/// The index's bitmap of every port equals ib_core's valid entries.
fn mirror_equals_table(dev: &Device, state: &DeviceState) -> TestResult {
    for p in ports(dev) {
        let mut wrong = 0u32;
        let mut valid = 0u32;
        let seen = state.gid_index().with_valid(p, |map| {
            for i in 0..tbl_len(dev, p) {
                let v = get_attr(dev, p, i).is_some();
                valid += u32::from(v);
                if bitmap_test(map, i as usize) != v {
                    wrong += 1;
                }
            }
        });
        kassert!(seen.is_some(), "port {} has no snapshot", p);
        kassert_eq!(wrong, 0, "port {}: {} valid entries", p, valid);
    }
    Ok(())
}

/// `2001:db8:<net>::<host>` as a GID.
fn addr_gid(net: u16, host: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0]);
    g[4..6].copy_from_slice(&net.to_be_bytes());
    g[14..].copy_from_slice(&host.to_be_bytes());
    g
}

/// Runs `ip -6 addr <verb> 2001:db8:<net>::<host>/64 dev <dev>` for every host in `hosts`, in one
/// `ip -batch`; returns its exit status.
fn ip_addrs(verb: &str, net: u16, hosts: impl IntoIterator<Item = u16>, dev: &str) -> Result<i32> {
    let mut cmd = KVec::<u8>::new();
    cmd.extend_from_slice(b"{ ", GFP_KERNEL)?;
    for h in hosts {
        let line = CString::try_from_fmt(fmt!(
            "echo addr {verb} 2001:db8:{net:x}::{h:x}/64 dev {dev}; "
        ))?;
        cmd.extend_from_slice(line.as_bytes(), GFP_KERNEL)?;
    }
    cmd.extend_from_slice(b"} | /usr/sbin/ip -6 -batch -\0", GFP_KERNEL)?;
    let cmd = CStr::from_bytes_with_nul(&cmd)?;
    run(&[c_str!("/bin/sh"), c_str!("-c"), cmd])
}

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

/// A worker adds and removes addresses while three others look them up; no lookup returns a
/// wrong entry, and afterwards the index equals the table again.
fn churn_never_wrong() -> TestResult {
    const NET: u16 = 0x78;
    const HOSTS: u16 = 12;
    const ROUNDS: u32 = 8;
    const LOOKERS: u32 = 3;
    let (dev, state) = device(c_str!("rxe0"))?;
    let stop = Arc::new(AtomicBool::new(false), GFP_KERNEL).map_err(|_| Failed)?;
    let tally = Arc::new(Tally::default(), GFP_KERNEL).map_err(|_| Failed)?;
    let done = Arc::new(AtomicU32::new(0), GFP_KERNEL).map_err(|_| Failed)?;
    let churn_ok = Arc::new(AtomicBool::new(true), GFP_KERNEL).map_err(|_| Failed)?;
    let rescans = state.gid_index().count(Counter::Rescans);
    for w in 0..LOOKERS {
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
    let all_done = wait_for(300_000, || done.load(Ordering::Acquire) == LOOKERS + 1);
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

kunit_suite!(
    ibext_gid,
    [
        bad_input_is_einval,
        lookups_equal_upstream,
        removed_addresses_miss,
        unindexed_ports_ask_ib_core,
        churn_never_wrong,
    ]
);

/// How one benchmark setup finds a GID.
#[derive(Clone, Copy)]
enum Finder {
    /// `ibext_find_gid`, the C entry point.
    Ibext,
    /// Upstream `rdma_find_gid`.
    Upstream,
    /// The naive loop: `rdma_query_gid` on every index of every port, then the type.
    QueryLoop,
    /// A part of ibext's lookup, for the breakdown: only the confirmation of a hit
    /// (`rdma_get_gid_attr` of the known port and index, and the reference put).
    ConfirmOnly(u32, u32),
    /// A part of ibext's lookup, for the breakdown: only reaching the device's state (the
    /// client data under RCU).
    StateOnly,
}

impl Finder {
    const ALL: [(Finder, &'static str); 3] = [
        (Finder::Ibext, "ibext"),
        (Finder::Upstream, "rdma_find_gid"),
        (Finder::QueryLoop, "query_loop"),
    ];

    /// Finds `key` on the first of `devs` that has it; the entry found is put at once.
    fn find(self, devs: &[&Device], key: &GidKey) -> bool {
        let gid = bindings::ib_gid { raw: key.gid };
        for dev in devs {
            let found = match self {
                // SAFETY: `dev` is registered and held by the caller; `gid` outlives the call.
                Finder::Ibext => unsafe {
                    GidAttr::from_result(ibext_find_gid(
                        dev.as_raw(),
                        &gid,
                        key.gid_type,
                        core::ptr::null_mut(),
                    ))
                },
                Finder::Upstream => {
                    crate::ib::gid::upstream_find(dev, &key.gid, key.gid_type, NdevPtr::ANY)
                }
                Finder::QueryLoop => query_loop(dev, key),
                Finder::ConfirmOnly(port, index) => crate::ib::gid::get_gid_attr(dev, port, index),
                Finder::StateOnly => {
                    return crate::device::with_device_state(dev, |s, _| {
                        core::hint::black_box(&*s);
                    })
                    .is_some()
                }
            };
            if found.is_ok() {
                return true;
            }
        }
        false
    }
}

/// The per-index loop ULPs used before the GID cache (the 2013 thread's baseline).
fn query_loop(dev: &Device, key: &GidKey) -> Result<GidAttr> {
    for p in ports(dev) {
        for i in 0..tbl_len(dev, p) {
            let mut gid = bindings::ib_gid::default();
            // SAFETY: `dev` is registered; `gid` is valid for writes.
            if unsafe { bindings::rdma_query_gid(dev.as_raw(), p, i as i32, &mut gid) } != 0 {
                continue;
            }
            // SAFETY: Every bit pattern is a valid `raw` array.
            if unsafe { gid.raw } != key.gid {
                continue;
            }
            if let Some(a) = get_attr(dev, p, i) {
                if key_of(&a) == *key {
                    return Ok(a);
                }
            }
        }
    }
    Err(ENOENT)
}

/// Nanoseconds per lookup of `key` through `finder`: repeated for at least 20 ms (and at least
/// 64 times), so that one reading is not a clock tick. The clock is read once per 64 lookups,
/// so that its own cost (large under TCG) is not added to every lookup of every setup, which
/// would pull their ratios towards 1.
fn ns_per_lookup(finder: Finder, devs: &[&Device], key: &GidKey) -> Option<(u64, u64)> {
    const BATCH: u64 = 64;
    let start = crate::tests::stream::now_ns();
    let mut n = 0u64;
    loop {
        for _ in 0..BATCH {
            if !finder.find(devs, key) {
                return None;
            }
        }
        n += BATCH;
        let t = crate::tests::stream::now_ns() - start;
        if t >= 20_000_000 || n >= 1_000_000 {
            return Some((t / n, n));
        }
        // SAFETY: FFI call in process context.
        unsafe { bindings::ibext_shim_cond_resched() };
    }
}

/// Grows rxe1's table (on veth2) to `want` valid entries with addresses of 2001:db8:50::/64;
/// returns the hosts added so far.
fn grow_rxe1(dev: &Device, state: &DeviceState, have_hosts: u16, want: usize) -> Result<u16> {
    let now = valid_entries(dev)?.len();
    let add = want.saturating_sub(now) as u16;
    if add > 0 {
        let status = ip_addrs("add", 0x50, have_hosts + 1..have_hosts + add + 1, "veth2")?;
        if status != 0 {
            return Err(EIO);
        }
    }
    let hosts = have_hosts + add;
    if !wait_for(20_000, || valid_entries(dev).is_ok_and(|v| v.len() >= want)) {
        return Err(EAGAIN);
    }
    if !wait_for(20_000, || state.gid_index().current()) {
        return Err(EAGAIN);
    }
    Ok(hosts)
}

/// The GID lookup benchmark: ns per lookup for the first, middle and last valid entry of tables of 4, 128 and
/// about 1000 entries, and for a GID on the second of two devices searched in turn, through
/// ibext, `rdma_find_gid` and a `rdma_query_gid` loop, side by side.
pub(crate) fn gid_bench() -> TestResult {
    use crate::tests::bench::REPS;
    let (rxe0, s0) = device(c_str!("rxe0"))?;
    let (rxe1, s1) = device(c_str!("rxe1"))?;
    let (d0, d1) = (rxe0.device(), rxe1.device());
    settle(&s0)?;
    let mut hosts = 0u16;
    let run_tables = |tables: &[(&Device, usize)], hosts: &mut u16| -> TestResult {
        for &(dev, want) in tables {
            if dev.as_raw() == d1.as_raw() {
                *hosts = grow_rxe1(d1, &s1, *hosts, want).map_err(|_| Failed)?;
            }
            let entries = valid_entries(dev).map_err(|_| Failed)?;
            kassert!(!entries.is_empty());
            let n = entries.len();
            // (position, table size, key, on the second device, (port, index) of the entry)
            type Case<'a> = (&'a str, usize, GidKey, bool, (u32, u32));
            let mut cases: KVec<Case<'_>> = KVec::new();
            for (pos, i) in [("first", 0), ("middle", n / 2), ("last", n - 1)] {
                let at = (entries[i].port(), entries[i].index());
                let _ = cases.push((pos, n, key_of(&entries[i]), false, at), GFP_KERNEL);
            }
            if dev.as_raw() == d1.as_raw() {
                // rxe0 searched first, then rxe1: the GID is on the second device.
                let _ = cases.push(
                    ("second_device", n, key_of(&entries[n - 1]), true, (0, 0)),
                    GFP_KERNEL,
                );
            }
            for &(pos, n, key, both, (port, index)) in cases.iter() {
                let devs_both = [d0, d1];
                let devs_one = [dev];
                let devs: &[&Device] = if both { &devs_both } else { &devs_one };
                // The three finders, then where ibext's time goes: its confirmation alone and
                // reaching the device's state alone (one device only).
                let [a, b, c] = Finder::ALL;
                let all = [
                    a,
                    b,
                    c,
                    (Finder::ConfirmOnly(port, index), "confirm_only"),
                    (Finder::StateOnly, "state_only"),
                ];
                let setups = if both { &all[..3] } else { &all[..] };
                for rep in 0..REPS {
                    for j in 0..setups.len() {
                        let (finder, label) = setups[(rep + j) % setups.len()];
                        let r = ns_per_lookup(finder, devs, &key);
                        kassert!(r.is_some(), "{} {} of {}: not found", label, pos, n);
                        let (t, cnt) = r.ok_or(Failed)?;
                        pr_info!(
                            "ibext-bench: {{\"bench\":\"gid\",\"setup\":\"{}\",\"table\":{},\"position\":\"{}\",\"rep\":{},\"order\":{},\"lookups\":{},\"ns_per_lookup\":{}}}\n",
                            label,
                            n,
                            pos,
                            rep,
                            j,
                            cnt,
                            t
                        );
                    }
                }
            }
        }
        Ok(())
    };
    let res = run_tables(&[(d1, 4), (d1, 128), (d0, 0)], &mut hosts);
    if hosts > 0 {
        let _ = ip_addrs("del", 0x50, 1..hosts + 1, "veth2");
    }
    res
}
