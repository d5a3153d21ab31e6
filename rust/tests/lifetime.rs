// SPDX-License-Identifier: GPL-2.0

//! `ibext_lifetime`: ibext's state and objects against callers that hold their own device
//! reference, as rdma_cm does per cm_id, and so may be inside ibext while its `remove` runs.
//!
//! Workers hold a reference to rxe1 and call `ibext_find_gid()`, `ibext_cq_pool_get()`/`_put()`
//! and `ibext_srq_pool_create()`/`_destroy()` in a loop while the test deletes rxe1. Every call
//! must return a valid result or `-ENODEV` (KASAN, on the debug kernel, checks that nothing
//! reads freed state); a worker stops, and lets its device reference go, once the pool says
//! `-ENODEV`, so that the deletion can finish. The deletion starts only after every worker has
//! made calls that succeeded, so the race is run whatever the guest's speed. It runs twice:
//! with rxe1 in a slot of the fast device table (`ib/client.rs`), and without one.
//!
//! A third case forces one interleaving instead of running many: a put held at a park point
//! (`tests::hooks`) while the whole removal runs.

use crate::tests::fixtures::{
    gid::ip_addrs,
    guest::{link_add, link_delete, msleep, required, restore_links, wait_for, DeviceRef},
};
use crate::{
    bindings,
    capi::{
        ibext_cq_pool_get, ibext_cq_pool_put, ibext_find_gid, ibext_srq_pool_create,
        ibext_srq_pool_destroy,
    },
    ib::gid::get_gid_attr,
    kunit::{kassert, kassert_eq, kunit_suite, Failed, TestResult},
    ledger::{self, Kind},
    tests::hooks::{Parking, Point},
};
use crate::{gid_index::core_scan_cheaper, policy::gid_index::CORE_SCAN_MAX};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::{c_str, prelude::*, sync::Arc, workqueue};

const WORKERS: u32 = 3;
/// Successful rounds every worker makes before the device is deleted.
const WARMUP: u32 = 4;

/// What the workers report.
#[derive(Default)]
struct Tally {
    /// Workers at or past their warm-up.
    warm: AtomicU32,
    /// Workers that finished.
    done: AtomicU32,
    /// Workers that saw `-ENODEV` from the pools (the state was unpublished).
    saw_enodev: AtomicU32,
    /// Calls that returned something other than a valid result or `-ENODEV`.
    errors: AtomicU32,
    /// Rounds made.
    rounds: AtomicU32,
}

/// One worker's loop; returns when ibext reports the device gone, or after `limit` rounds.
fn worker(dev: DeviceRef, tally: &Tally, gid: [u8; 16], gid_type: u32, ctx: u32) {
    let enodev = ENODEV.to_errno() as isize;
    let enoent = ENOENT.to_errno() as isize;
    let raw = dev.device().as_raw();
    // SAFETY: `raw` is held by `dev`.
    let pd = unsafe { bindings::ibext_test_alloc_pd(raw) };
    let Ok(pd) = kernel::error::from_err_ptr(pd) else {
        tally.errors.fetch_add(1, Ordering::AcqRel);
        tally.done.fetch_add(1, Ordering::AcqRel);
        return;
    };
    let attr = bindings::ibext_srq_pool_attr {
        nr_srqs: 1,
        srq_size: 16,
        max_sge: 1,
        buf_size: 0,
        recv_done: None,
        ctx: core::ptr::null_mut(),
        max_srq_size: 0,
        pressure: None,
    };
    let g = bindings::ib_gid { raw: gid };
    let mut round = 0u32;
    // Bounded, so that a bug cannot hang the suite: the harness's timeout would say less.
    while round < 200_000 {
        let mut gone = false;
        // SAFETY: `raw` is held; `g` is valid for reads; a null netdev matches any.
        let a = unsafe { ibext_find_gid(raw, &g, gid_type, core::ptr::null_mut()) };
        if (a as isize) < 0 && (a as isize) >= -4095 {
            if a as isize != enoent && a as isize != enodev {
                tally.errors.fetch_add(1, Ordering::AcqRel);
            }
        } else {
            // SAFETY: A reference `ibext_find_gid` returned.
            unsafe { bindings::rdma_put_gid_attr(a) };
        }
        // SAFETY: As above.
        let cq = unsafe { ibext_cq_pool_get(raw, 8, -1, ctx) };
        match cq as isize {
            e if e == enodev => gone = true,
            e if (-4095..0).contains(&e) => {
                tally.errors.fetch_add(1, Ordering::AcqRel);
            }
            // SAFETY: The entries were just taken.
            _ => unsafe { ibext_cq_pool_put(cq, 8) },
        }
        // SAFETY: `pd` is live until deallocated below.
        let p = unsafe { ibext_srq_pool_create(pd, &attr) };
        match p as isize {
            e if e == enodev => gone = true,
            e if (-4095..0).contains(&e) => {
                tally.errors.fetch_add(1, Ordering::AcqRel);
            }
            _ => {
                // SAFETY: A pool made just above, with no references.
                if unsafe { ibext_srq_pool_destroy(p) } != 0 {
                    tally.errors.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        round += 1;
        tally.rounds.fetch_add(1, Ordering::AcqRel);
        if round == WARMUP {
            tally.warm.fetch_add(1, Ordering::AcqRel);
        }
        if gone {
            tally.saw_enodev.fetch_add(1, Ordering::AcqRel);
            break;
        }
    }
    // SAFETY: Ours; every pool made on it was destroyed.
    unsafe { bindings::ibext_test_dealloc_pd(pd) };
    drop(dev);
    tally.done.fetch_add(1, Ordering::AcqRel);
}

/// API calls from threads holding their own device reference race `rdma link delete rxe1`.
fn calls_racing_removal() -> TestResult {
    let r = calls_racing_removal_checks();
    restore_links();
    r
}

/// The same race with rxe1 found through ib_core's client-data xarray: every slot of the fast
/// device table is taken when rxe1 is added, so rxe1 has none.
fn calls_racing_removal_without_a_fast_slot() -> TestResult {
    let r = without_a_fast_slot_checks();
    <crate::device::DeviceState as crate::ib::client::ClientData>::client().test_free_fast();
    restore_links();
    r
}

fn without_a_fast_slot_checks() -> TestResult {
    kassert_eq!(link_delete(c_str!("rxe1")).map_err(|_| Failed)?, 0);
    kassert!(
        <crate::device::DeviceState as crate::ib::client::ClientData>::client().test_fill_fast()
            > 0
    );
    kassert_eq!(link_add(c_str!("rxe1")).map_err(|_| Failed)?, 0);
    {
        let dev = required(c_str!("rxe1"))?;
        kassert!(
            !<crate::device::DeviceState as crate::ib::client::ClientData>::client()
                .test_has_fast_slot(dev.device())
        );
        kassert!(crate::device::device_state(dev.device()).is_some());
    }
    calls_racing_removal_checks()
}

/// Grows rxe1's table past `CORE_SCAN_MAX`, so that `ibext_find_gid` goes through the device's
/// state (a small table is left to ib_core's scan and would not race the removal at all), and
/// runs the race.
fn calls_racing_removal_checks() -> TestResult {
    const NET: u16 = 0x62;
    let hosts = 1..(CORE_SCAN_MAX as u16 + 2);
    kassert_eq!(ip_addrs("add", NET, hosts.clone(), "veth2")?, 0);
    let r = (|| -> TestResult {
        let dev = required(c_str!("rxe1"))?;
        kassert!(
            wait_for(20_000, || !core_scan_cheaper(dev.device())),
            "rxe1's table did not grow past the core scan's bound"
        );
        drop(dev);
        race_removal()
    })();
    let _ = ip_addrs("del", NET, hosts, "veth2");
    r
}

fn race_removal() -> TestResult {
    let (gid, gid_type) = {
        let dev = required(c_str!("rxe1"))?;
        let attr = get_gid_attr(dev.device(), 1, 0).map_err(|_| Failed)?;
        (attr.gid(), attr.gid_type())
    };
    let tally = Arc::new(Tally::default(), GFP_KERNEL)?;
    for w in 0..WORKERS {
        let dev = required(c_str!("rxe1"))?;
        let t = tally.clone();
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            worker(dev, &t, gid, gid_type, w % 3);
        });
        kassert!(res.is_ok(), "cannot start worker {}", w);
    }
    let mut waited = 0;
    while tally.warm.load(Ordering::Acquire) + tally.done.load(Ordering::Acquire) < WORKERS {
        kassert!(waited < 60_000, "workers did not warm up");
        msleep(2);
        waited += 2;
    }
    // Blocks until every worker has let its device reference go, which each does once ibext's
    // `remove` has unpublished the state.
    kassert_eq!(link_delete(c_str!("rxe1")).map_err(|_| Failed)?, 0);
    waited = 0;
    while tally.done.load(Ordering::Acquire) < WORKERS {
        kassert!(waited < 60_000, "workers did not finish");
        msleep(2);
        waited += 2;
    }
    kernel::kunit::info(format_args!(
        "    # removal race: {} rounds by {} workers\n",
        tally.rounds.load(Ordering::Acquire),
        WORKERS
    ));
    kassert_eq!(tally.errors.load(Ordering::Acquire), 0);
    kassert_eq!(tally.saw_enodev.load(Ordering::Acquire), WORKERS);
    kassert!(DeviceRef::get(c_str!("rxe1")).is_none());
    kassert_eq!(ledger::counts(Kind::SrqPool).live(), 0);
    Ok(())
}

/// A put that leaves a pooled CQ idle is held right after it let go of the pool's lock, while
/// `rdma link delete rxe1` runs to the end: ibext's `remove` retires the pools (destroying the
/// now idle CQ) and drops the device state, which nothing else holds. The put then goes on. It
/// must not touch the state any more: before the fix it queued the aging work inside the freed
/// state (a KASAN use-after-free on the debug kernel). In every poll context.
fn put_idling_a_cq_races_removal() -> TestResult {
    let r = put_idling_checks();
    restore_links();
    r
}

fn put_idling_checks() -> TestResult {
    for ctx in 0..3u32 {
        let cq = {
            let dev = required(c_str!("rxe1"))?;
            // SAFETY: `dev` holds rxe1.
            let cq = unsafe { ibext_cq_pool_get(dev.device().as_raw(), 8, 0, ctx) };
            kassert!(
                !(cq as isize >= -4095 && (cq as isize) < 0),
                "get: {}",
                cq as isize
            );
            cq as usize
        };
        let states = ledger::counts(Kind::DeviceState).live();
        let parking = Parking::arm(Point::CqPutIdle, cq as *const core::ffi::c_void);
        let done = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
        let d = done.clone();
        let res = workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
            // SAFETY: The 8 entries taken above.
            unsafe { ibext_cq_pool_put(cq as *mut bindings::ib_cq, 8) };
            d.store(1, Ordering::Release);
        });
        kassert!(res.is_ok(), "cannot start the putter");
        kassert!(
            parking.wait_parked(60_000),
            "ctx {}: the put never parked",
            ctx
        );
        // Nothing holds rxe1 now but ibext: the deletion runs to its end, the state included.
        kassert_eq!(link_delete(c_str!("rxe1")).map_err(|_| Failed)?, 0);
        kassert_eq!(
            ledger::counts(Kind::DeviceState).live(),
            states - 1,
            "ctx {}",
            ctx
        );
        kassert!(parking.parked());
        kassert!(parking.release(), "ctx {}: the put was held too long", ctx);
        let finished =
            crate::tests::fixtures::guest::wait_for(60_000, || done.load(Ordering::Acquire) == 1);
        kassert!(finished, "ctx {}: the put did not return", ctx);
        kassert_eq!(link_add(c_str!("rxe1")).map_err(|_| Failed)?, 0);
    }
    Ok(())
}

kunit_suite!(
    ibext_lifetime,
    [
        calls_racing_removal,
        calls_racing_removal_without_a_fast_slot,
        put_idling_a_cq_races_removal
    ]
);
