// SPDX-License-Identifier: GPL-2.0

//! `ibext_hotunplug`: `rdma link delete rxe0` while a ULP's traffic runs on pooled CQs.
//!
//! The ULP's QPs cover every poll context and every moderation mode.
//!
//! A test ULP registers its own `ib_client` after ibext, as a real ULP does. On rxe0 its `add`
//! takes pooled CQs in all three poll contexts and starts streaming loopback traffic; its
//! `remove` stops the traffic, destroys its QPs and puts the CQs back. Because clients are
//! removed in reverse order of registration, ib_core calls the ULP's `remove` before ibext's,
//! which then destroys the pooled CQs. The test deletes rxe0 from userspace under traffic,
//! checks that nothing hung, leaked or completed late, re-adds rxe0, and sees the ULP's
//! traffic run again on the new device.

use crate::tests::fixtures::{
    guest::{link_add, link_delete, pooled_cqs_on, restore_links, DeviceRef},
    stream::{now_ns, Stream},
};
use crate::{
    api::CqEntries,
    bindings,
    engine::PollCtx,
    ib::Device,
    kunit::{kassert, kassert_eq, kunit_suite, TestResult},
    ledger::{self, Kind},
    policy::moderation::Moderation,
};
use core::{
    ffi::c_void,
    sync::atomic::{AtomicPtr, AtomicU32, Ordering},
};
use kernel::{
    c_str, new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    types::Opaque,
};

/// One QP per poll context and moderation mode.
const QPS: usize = 9;
const DEPTH: usize = 8;

/// What the test ULP runs on rxe0.
struct Active {
    stream: Stream,
    cqs: KVec<CqEntries>,
}

/// The test ULP's state, shared with its client callbacks.
#[pin_data]
struct TestUlp {
    adds: AtomicU32,
    removes: AtomicU32,
    failures: AtomicU32,
    #[pin]
    active: Mutex<Option<Active>>,
    /// Streams the ULP stopped, kept to count completions that arrive after their owner is gone.
    #[pin]
    stopped: Mutex<KVec<Stream>>,
}

/// The running test's ULP; the client callbacks find it here (tests run one at a time).
static ULP: AtomicPtr<TestUlp> = AtomicPtr::new(core::ptr::null_mut());

fn ulp() -> Option<&'static TestUlp> {
    // SAFETY: Published by the test while its client is registered, and cleared only after
    // `ib_unregister_client` returned, so no callback runs with a stale pointer.
    unsafe { ULP.load(Ordering::Acquire).as_ref() }
}

fn start_on(dev: &Device) -> Result<Active> {
    let mut cqs = KVec::with_capacity(QPS, GFP_KERNEL)?;
    let mut raw = KVec::with_capacity(QPS, GFP_KERNEL)?;
    for i in 0..QPS {
        let cq = CqEntries::get(
            dev,
            3 * DEPTH as u32,
            i as i32,
            PollCtx::ALL[i % 3],
            Moderation::ALL[i / 3],
        )?;
        raw.push(cq.as_raw(), GFP_KERNEL)?;
        cqs.push(cq, GFP_KERNEL)?;
    }
    let stream = Stream::start(dev, &raw, DEPTH, None, 0)?;
    Ok(Active { stream, cqs })
}

/// # Safety
///
/// Called by ib_core only, as the test client's `add`.
unsafe extern "C" fn ulp_add(dev: *mut bindings::ib_device) -> kernel::ffi::c_int {
    // SAFETY: ib_core calls `add` with a registered device.
    let dev = unsafe { Device::from_raw(dev) };
    let Some(ulp) = ulp() else { return 0 };
    if dev.name().as_bytes() != b"rxe0" {
        return 0;
    }
    ulp.adds.fetch_add(1, Ordering::AcqRel);
    match start_on(dev) {
        Ok(a) => *ulp.active.lock() = Some(a),
        Err(_) => {
            ulp.failures.fetch_add(1, Ordering::AcqRel);
        }
    }
    0
}

/// # Safety
///
/// Called by ib_core only, as the test client's `remove`.
unsafe extern "C" fn ulp_remove(dev: *mut bindings::ib_device, _data: *mut c_void) {
    // SAFETY: The device is registered while its clients are removed.
    let dev = unsafe { Device::from_raw(dev) };
    let Some(ulp) = ulp() else { return };
    if dev.name().as_bytes() != b"rxe0" {
        return;
    }
    ulp.removes.fetch_add(1, Ordering::AcqRel);
    let Some(active) = ulp.active.lock().take() else {
        return;
    };
    // QPs first, then the CQs they used.
    match active.stream.stop() {
        Ok(stopped) => {
            if ulp.stopped.lock().push(stopped, GFP_KERNEL).is_err() {
                ulp.failures.fetch_add(1, Ordering::AcqRel);
            }
        }
        Err(_) => {
            ulp.failures.fetch_add(1, Ordering::AcqRel);
        }
    }
    drop(active.cqs);
}

/// Registers the test ULP's client for as long as it lives.
struct Registration(Pin<KBox<Opaque<bindings::ib_client>>>);

impl Registration {
    fn new() -> Result<Self> {
        let client = KBox::pin_init(
            Opaque::ffi_init(|p: *mut bindings::ib_client| {
                // SAFETY: `p` is valid for writes.
                unsafe {
                    p.write(bindings::ib_client {
                        name: c"ibext_test_ulp".as_ptr().cast(),
                        add: Some(ulp_add),
                        remove: Some(ulp_remove),
                        ..Default::default()
                    })
                }
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: The client is pinned and outlives its registration (unregistered in `drop`).
        kernel::error::to_result(unsafe { bindings::ib_register_client(client.get()) })?;
        Ok(Registration(client))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: Registered in `new`.
        unsafe { bindings::ib_unregister_client(self.0.get()) };
    }
}

/// Waits until the ULP's traffic on rxe0 completed `n` more sends.
fn traffic_flows(ulp: &TestUlp, n: u64) -> bool {
    let guard = ulp.active.lock();
    let Some(a) = guard.as_ref() else {
        return false;
    };
    let target = a.stream.run().sends_done() + n;
    a.stream.wait_sends(target, 30_000).is_ok()
}

fn link_delete_under_traffic() -> TestResult {
    const CYCLES: u32 = 3;
    let ulp = Arc::pin_init(
        pin_init!(TestUlp {
            adds: AtomicU32::new(0),
            removes: AtomicU32::new(0),
            failures: AtomicU32::new(0),
            active <- new_mutex!(None, "TestUlp::active"),
            stopped <- new_mutex!(KVec::new(), "TestUlp::stopped"),
        }),
        GFP_KERNEL,
    )?;
    ULP.store(
        core::ptr::from_ref::<TestUlp>(&ulp).cast_mut(),
        Ordering::Release,
    );
    let result = (|| -> TestResult {
        let reg = Registration::new()?;
        for cycle in 0..CYCLES {
            kassert_eq!(ulp.adds.load(Ordering::Acquire), cycle + 1);
            kassert!(
                traffic_flows(&ulp, 200),
                "cycle {}: no traffic on rxe0",
                cycle
            );

            let on_rxe1 = pooled_cqs_on(c_str!("rxe1"));
            let t0 = now_ns();
            kassert_eq!(link_delete(c_str!("rxe0"))?, 0);
            let ms = (now_ns() - t0) / 1_000_000;
            pr_info!(
                "hot-unplug cycle {}: rdma link delete under traffic took {} ms\n",
                cycle,
                ms
            );
            kassert_eq!(ulp.removes.load(Ordering::Acquire), cycle + 1);
            kassert_eq!(ulp.failures.load(Ordering::Acquire), 0);
            kassert!(DeviceRef::get(c_str!("rxe0")).is_none());
            // Every pooled CQ of rxe0 is gone with it.
            kassert_eq!(ledger::counts(Kind::PooledCq).live(), on_rxe1);
            for s in ulp.stopped.lock().iter() {
                kassert_eq!(s.run().errors(), 0);
            }

            kassert_eq!(link_add(c_str!("rxe0"))?, 0);
        }
        // The re-added device carries traffic again.
        kassert!(traffic_flows(&ulp, 200), "no traffic after the last re-add");
        drop(reg);
        kassert_eq!(ulp.removes.load(Ordering::Acquire), CYCLES + 1);
        kassert_eq!(ulp.failures.load(Ordering::Acquire), 0);
        let stopped = ulp.stopped.lock();
        kassert_eq!(stopped.len(), (CYCLES + 1) as usize);
        for s in stopped.iter() {
            kassert_eq!(s.run().late(), 0);
            kassert_eq!(s.run().errors(), 0);
            kassert!(s.run().sends_done() >= 200);
        }
        Ok(())
    })();
    ULP.store(core::ptr::null_mut(), Ordering::Release);
    // Leave rxe0 in place for the suites after this one, even when a check failed.
    restore_links();
    result
}

kunit_suite!(ibext_hotunplug, [link_delete_under_traffic]);
