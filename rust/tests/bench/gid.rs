// SPDX-License-Identifier: GPL-2.0

//! The GID lookup benchmark.

use crate::ib::gid::NdevPtr;
use crate::tests::fixtures::guest::wait_for;
use crate::{
    bindings,
    capi::ibext_find_gid,
    device::DeviceState,
    ib::{gid::GidAttr, Device},
    kunit::{kassert, Failed, TestResult},
    policy::gid_index::GidKey,
};

use kernel::{c_str, prelude::*};

use crate::tests::fixtures::{gid::*, REPS};

/// How one benchmark setup finds a GID.
#[derive(Clone, Copy)]
enum Finder {
    /// `ibext_find_gid`, the C entry point.
    Ibext,
    /// Upstream `rdma_find_gid`.
    Upstream,
    /// The naive loop: `rdma_query_gid` on every index of every port, then the type.
    QueryLoop,
    /// ibext's hashed, confirmed lookup whatever the table's size (`ibext_find_gid` leaves
    /// tables of at most `CORE_SCAN_MAX` entries to ib_core's scan): where the two cross.
    Hashed,
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
                // As a C ULP calls it, with its own `ib_gid` (no copy).
                // SAFETY: `dev` is registered and held by the caller; `gid` outlives the call.
                Finder::Upstream => unsafe {
                    GidAttr::from_result(bindings::rdma_find_gid(
                        dev.as_raw(),
                        &gid,
                        key.gid_type,
                        core::ptr::null_mut(),
                    ))
                },
                Finder::QueryLoop => query_loop(dev, key),
                Finder::Hashed => crate::api::gid_find_hashed(dev, key, None, NdevPtr::ANY),
                Finder::ConfirmOnly(port, index) => crate::ib::gid::get_gid_attr(dev, port, index),
                Finder::StateOnly => {
                    let rcu = crate::backport::sync::RcuGuard::new();
                    return crate::device::device_state_in(dev, &rcu)
                        .map(|s| {
                            core::hint::black_box(&*s);
                        })
                        .is_some();
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
    let start = crate::tests::fixtures::stream::now_ns();
    let mut n = 0u64;
    loop {
        for _ in 0..BATCH {
            if !finder.find(devs, key) {
                return None;
            }
        }
        n += BATCH;
        let t = crate::tests::fixtures::stream::now_ns() - start;
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

/// The GID lookup benchmark: ns per lookup for the first, middle and last valid entry of tables
/// of 4, 8, 16, ... 512 and about 1000 entries, and for a GID on the second of two devices
/// searched in turn, through ibext, `rdma_find_gid`, a `rdma_query_gid` loop and ibext's hashed
/// path alone, side by side.
pub(crate) fn gid_bench() -> TestResult {
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
                    (Finder::Hashed, "ibext_hashed"),
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
    // The sweep: rxe1 grown from 4 to 512 entries, then rxe0's nearly full table.
    let sweep = [4, 8, 16, 32, 64, 128, 256, 512].map(|n| (d1, n));
    let mut tables = KVec::with_capacity(sweep.len() + 1, GFP_KERNEL)?;
    for t in sweep {
        tables.push(t, GFP_KERNEL)?;
    }
    tables.push((d0, 0), GFP_KERNEL)?;
    let res = run_tables(&tables, &mut hosts);
    if hosts > 0 {
        let _ = ip_addrs("del", 0x50, 1..hosts + 1, "veth2");
    }
    res
}
