// SPDX-License-Identifier: GPL-2.0

//! `ibext_lifecycle`: per-device state follows device registration, exactly once each way.

use crate::tests::fixtures::guest::{
    debugfs_exists, link_add, link_delete, rdma, restore_links, DeviceRef,
};
use crate::{
    bindings,
    kunit::{kassert, kassert_eq, kunit_suite, TestResult},
    ledger::{self, Kind},
};
use kernel::{c_str, str::CStr};

/// Both rxe devices have state, reachable through the client data, under their own names.
fn state_exists_for_rxe0_and_rxe1() -> TestResult {
    for name in [c_str!("rxe0"), c_str!("rxe1")] {
        let dev = DeviceRef::get(name);
        kassert!(dev.is_some(), "device {} is not registered", name);
        let Some(dev) = dev else {
            return Err(crate::kunit::Failed);
        };
        let state = crate::device::device_state(dev.device());
        kassert!(state.is_some(), "no ibext state for {}", name);
        let Some(state) = state else {
            return Err(crate::kunit::Failed);
        };
        kassert!(state.name_matches(name));
        kassert!(core::ptr::eq(state.device(), dev.device()));
        kassert!(debugfs_exists(&[name, c_str!("state")]));
    }
    Ok(())
}

/// Pools spread over min(vectors, online CPUs); rxe has one vector per possible CPU, so in the
/// test guest (ACPI, -smp 4) that is every CPU.
fn comp_vectors_follow_online_cpus() -> TestResult {
    let dev = DeviceRef::get(c_str!("rxe0"));
    let Some(dev) = dev else {
        kassert!(false, "rxe0 is not registered");
        return Ok(());
    };
    let Some(state) = crate::device::device_state(dev.device()) else {
        kassert!(false, "no ibext state for rxe0");
        return Ok(());
    };
    // SAFETY: FFI call without preconditions.
    let cpus = unsafe { bindings::ibext_shim_num_online_cpus() };
    kassert_eq!(
        state.comp_vectors(),
        dev.device().num_comp_vectors().min(cpus)
    );
    kassert!(state.comp_vectors() >= 1);
    Ok(())
}

/// Every live device-state object belongs to a registered device, and there is one per device.
fn objects_balance() -> TestResult {
    let c = ledger::counts(Kind::DeviceState);
    kassert_eq!(c.live(), 2);
    kassert!(debugfs_exists(&[c_str!("objects")]));
    Ok(())
}

/// `rdma link delete` destroys the state exactly once; `rdma link add` creates it exactly once.
fn link_delete_and_readd() -> TestResult {
    let before = ledger::counts(Kind::DeviceState);
    let r = link_delete_and_readd_checks(before);
    restore_links();
    r
}

fn link_delete_and_readd_checks(before: ledger::Counts) -> TestResult {
    kassert_eq!(link_delete(c_str!("rxe0"))?, 0);
    let after_delete = ledger::counts(Kind::DeviceState);
    kassert_eq!(after_delete.made, before.made);
    kassert_eq!(after_delete.freed, before.freed + 1);
    kassert!(DeviceRef::get(c_str!("rxe0")).is_none());
    kassert!(!debugfs_exists(&[c_str!("rxe0")]));
    kassert!(debugfs_exists(&[c_str!("rxe1")]));

    kassert_eq!(link_add(c_str!("rxe0"))?, 0);
    let after_add = ledger::counts(Kind::DeviceState);
    kassert_eq!(after_add.made, before.made + 1);
    kassert_eq!(after_add.freed, before.freed + 1);
    kassert_eq!(after_add.live(), before.live());
    let dev = DeviceRef::get(c_str!("rxe0"));
    kassert!(dev
        .as_ref()
        .and_then(|d| crate::device::device_state(d.device()))
        .is_some());
    kassert!(debugfs_exists(&[c_str!("rxe0"), c_str!("state")]));
    Ok(())
}

/// A renamed device keeps its state, and its debugfs directory follows the new name.
fn rename_follows_device() -> TestResult {
    let set = |from: &'static CStr, to: &'static CStr| {
        rdma(&[c_str!("dev"), c_str!("set"), from, c_str!("name"), to])
    };
    let made = ledger::counts(Kind::DeviceState).made;
    kassert_eq!(set(c_str!("rxe1"), c_str!("rxe9"))?, 0);
    // Rename back even if a check fails, so later suites find rxe1.
    let renamed_ok = (|| -> TestResult {
        let dev = DeviceRef::get(c_str!("rxe9"));
        let state = dev
            .as_ref()
            .and_then(|d| crate::device::device_state(d.device()));
        kassert!(state.is_some_and(|s| s.name_matches(c_str!("rxe9"))));
        kassert!(debugfs_exists(&[c_str!("rxe9"), c_str!("state")]));
        kassert!(!debugfs_exists(&[c_str!("rxe1")]));
        Ok(())
    })();
    kassert_eq!(set(c_str!("rxe9"), c_str!("rxe1"))?, 0);
    renamed_ok?;
    kassert!(debugfs_exists(&[c_str!("rxe1"), c_str!("state")]));
    kassert_eq!(ledger::counts(Kind::DeviceState).made, made);
    Ok(())
}

kunit_suite!(
    ibext_lifecycle,
    [
        state_exists_for_rxe0_and_rxe1,
        comp_vectors_follow_online_cpus,
        objects_balance,
        link_delete_and_readd,
        rename_follows_device,
    ]
);
