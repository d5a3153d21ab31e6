// SPDX-License-Identifier: GPL-2.0

//! What the tests need from the guest around them: its userspace tools and its devices.

use crate::{bindings, ib::Device};
use core::ptr::NonNull;
use kernel::{c_str, ffi::c_char, prelude::*, str::CStr};

/// Runs `argv` (an absolute path first) in userspace and waits for it, as a user would from a
/// shell: `rdma link delete rxe0` really goes through netlink and the rxe driver.
///
/// Returns the command's exit status (0 for success).
pub(crate) fn run(argv: &[&CStr]) -> Result<i32> {
    run_with_fail_nth(argv, 0)
}

/// [`run`], with the command's `n`-th allocation that failslab counts made to fail (`n == 0`:
/// none). Only the debug kernel has failslab.
pub(crate) fn run_with_fail_nth(argv: &[&CStr], n: u32) -> Result<i32> {
    const MAX_ARGS: usize = 16;
    if argv.is_empty() || argv.len() >= MAX_ARGS {
        return Err(EINVAL);
    }
    let mut args = [core::ptr::null_mut::<c_char>(); MAX_ARGS];
    for (slot, arg) in args.iter_mut().zip(argv) {
        *slot = arg.as_char_ptr().cast_mut();
    }
    let mut envp = [
        c"PATH=/bin:/sbin:/usr/bin:/usr/sbin"
            .as_ptr()
            .cast::<c_char>()
            .cast_mut(),
        c"HOME=/".as_ptr().cast::<c_char>().cast_mut(),
        core::ptr::null_mut(),
    ];
    // SAFETY: `args` and `envp` are NULL-terminated arrays of NUL-terminated strings that
    // outlive the call, which waits for the process to exit (UMH_WAIT_PROC) and does not
    // write through them.
    let ret =
        unsafe { bindings::ibext_test_run_with_fail_nth(args.as_mut_ptr(), envp.as_mut_ptr(), n) };
    if ret < 0 {
        return Err(Error::from_errno(ret));
    }
    // A wait status: the exit code is in bits 8..16.
    Ok((ret >> 8) & 0xff)
}

/// A reference to a registered RDMA device, found by name; dropped with `ib_device_put`.
///
/// # Invariants
///
/// `self.0` holds a reference taken by `ib_device_get_by_name`.
pub(crate) struct DeviceRef(NonNull<bindings::ib_device>);

// SAFETY: The reference may be held and dropped on any thread (`ib_device_put` is atomic).
unsafe impl Send for DeviceRef {}

impl DeviceRef {
    /// Looks up a registered device by name.
    pub(crate) fn get(name: &CStr) -> Option<Self> {
        // SAFETY: `name` is NUL-terminated; any driver type matches.
        let dev = unsafe {
            bindings::ib_device_get_by_name(
                name.as_char_ptr(),
                bindings::rdma_driver_id_RDMA_DRIVER_UNKNOWN,
            )
        };
        // INVARIANT: a non-null result carries a reference.
        NonNull::new(dev).map(DeviceRef)
    }

    /// The device. It stays registered while the test holds it: tests do not unregister a
    /// device they hold.
    pub(crate) fn device(&self) -> &Device {
        // SAFETY: The reference keeps the device alive, and tests drop it before they remove
        // the device.
        unsafe { Device::from_raw(self.0.as_ptr()) }
    }
}

impl Drop for DeviceRef {
    fn drop(&mut self) {
        // SAFETY: We hold the reference taken in `get` (type invariant).
        unsafe { bindings::ib_device_put(self.0.as_ptr()) };
    }
}

/// Returns device `name`, or fails the running test if it is not registered.
pub(crate) fn required(name: &CStr) -> core::result::Result<DeviceRef, crate::kunit::Failed> {
    let dev = DeviceRef::get(name);
    crate::kunit::kassert!(dev.is_some(), "{} is not registered", name);
    dev.ok_or(crate::kunit::Failed)
}

/// The distinct CQs among `cqs` (pooled CQs are shared), in first-seen order.
pub(crate) fn distinct_cqs(
    cqs: impl IntoIterator<Item = *mut bindings::ib_cq>,
) -> Result<KVec<*mut bindings::ib_cq>> {
    let mut d = KVec::new();
    for cq in cqs {
        if !d.contains(&cq) {
            d.push(cq, GFP_KERNEL)?;
        }
    }
    Ok(d)
}

/// Sleeps for `ms` milliseconds.
pub(crate) fn msleep(ms: u32) {
    // SAFETY: FFI call; tests run in process context.
    unsafe { bindings::msleep(ms) };
}

/// Sleeps for 100 to 200 microseconds (`usleep_range`): a poll between steps of a benchmark,
/// where `msleep`'s tick (4 ms at HZ=250) would be most of what is measured.
pub(crate) fn short_sleep() {
    // SAFETY: FFI call; tests run in process context.
    unsafe { bindings::ibext_test_usleep(100, 200) };
}

/// Waits up to `ms` milliseconds for `cond`; returns whether it became true.
pub(crate) fn wait_for(ms: u32, mut cond: impl FnMut() -> bool) -> bool {
    let mut waited = 0;
    while !cond() {
        if waited >= ms {
            return false;
        }
        msleep(10);
        waited += 10;
    }
    true
}

/// Returns whether `/sys/kernel/debug/ibext/<path...>` exists.
pub(crate) fn debugfs_exists(path: &[&CStr]) -> bool {
    let mut parent: *mut bindings::dentry = core::ptr::null_mut();
    let mut found: *mut bindings::dentry = core::ptr::null_mut();
    for name in Iterator::chain(core::iter::once(&c_str!("ibext")), path) {
        // SAFETY: `name` is NUL-terminated; `parent` is null (the debugfs root) or a dentry we
        // hold a reference to.
        found = unsafe { bindings::debugfs_lookup(name.as_char_ptr(), parent) };
        if !parent.is_null() {
            // SAFETY: We hold the reference `debugfs_lookup` returned for `parent`.
            unsafe { bindings::dput(parent) };
        }
        if found.is_null() || kernel::error::from_err_ptr(found).is_err() {
            return false;
        }
        parent = found;
    }
    // SAFETY: We hold the reference to the last dentry found.
    unsafe { bindings::dput(found) };
    true
}

/// The `rdma link add` arguments that make each test device.
const LINKS: [(&CStr, &CStr); 2] = [
    (c_str!("rxe0"), c_str!("veth0")),
    (c_str!("rxe1"), c_str!("veth2")),
];

/// Runs `rdma <args>`.
pub(crate) fn rdma(args: &[&CStr]) -> Result<i32> {
    let mut argv: [&CStr; 12] = [c_str!("/bin/rdma"); 12];
    if args.len() >= argv.len() {
        return Err(EINVAL);
    }
    argv[1..=args.len()].copy_from_slice(args);
    run(&argv[..=args.len()])
}

/// `rdma link add <name> type rxe netdev <its veth>`.
pub(crate) fn link_add(name: &CStr) -> Result<i32> {
    link_add_with_fail_nth(name, 0)
}

/// [`link_add`] with the `n`-th counted allocation of the command failing (see
/// [`run_with_fail_nth`]).
pub(crate) fn link_add_with_fail_nth(name: &CStr, n: u32) -> Result<i32> {
    let (_, netdev) = LINKS
        .iter()
        .find(|(n, _)| n.as_bytes() == name.as_bytes())
        .ok_or(EINVAL)?;
    let args = [
        c_str!("/bin/rdma"),
        c_str!("link"),
        c_str!("add"),
        name,
        c_str!("type"),
        c_str!("rxe"),
        c_str!("netdev"),
        netdev,
    ];
    run_with_fail_nth(&args, n)
}

/// `rdma link delete <name>`.
pub(crate) fn link_delete(name: &CStr) -> Result<i32> {
    rdma(&[c_str!("link"), c_str!("delete"), name])
}

/// Re-adds any test device a failed test left deleted, so later suites find both.
pub(crate) fn restore_links() {
    for (name, _) in LINKS {
        if DeviceRef::get(name).is_none() {
            let _ = link_add(name);
        }
    }
}

/// Returns the pooled CQs ibext holds for device `name`, in every poll context.
pub(crate) fn pooled_cqs_on(name: &CStr) -> usize {
    let Some(dev) = DeviceRef::get(name) else {
        return 0;
    };
    crate::device::device_state(dev.device()).map_or(0, |s| {
        crate::engine::PollCtx::ALL
            .iter()
            .map(|ctx| s.cq_pools().nr_cqs(*ctx))
            .sum()
    })
}

/// The handle of a raw CQ, for the pool's lookups by CQ (`None` for null).
pub(crate) fn cqp(cq: *mut crate::bindings::ib_cq) -> Option<crate::ib::cq::CqPtr> {
    crate::ib::cq::CqPtr::from_raw(cq)
}

impl crate::api::PooledCq {
    /// Returns the CQ's raw pointer, for the tests' verbs calls.
    pub(crate) fn as_raw(&self) -> *mut crate::bindings::ib_cq {
        self.cq().as_raw()
    }
}

/// A xorshift32 generator for the tests' random workloads: reproducible from its seed, which
/// must not be 0.
pub(crate) struct XorShift(u32);

impl XorShift {
    /// A generator starting from `seed`.
    pub(crate) fn new(seed: u32) -> Self {
        XorShift(seed)
    }

    /// Returns the next value.
    pub(crate) fn next(&mut self) -> u32 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        self.0 = s;
        s
    }
}

/// Schedules a pass of the CQ engine at `arg`.
///
/// # Safety
///
/// `arg` is a live `CqEngine`.
unsafe extern "C" fn schedule_pass(arg: *mut core::ffi::c_void) {
    // SAFETY: The caller's guarantee.
    unsafe { &*arg.cast::<crate::engine::CqEngine>() }.schedule();
}

/// Where [`pass_on_worker`] runs a pass.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PassCpu {
    /// On another CPU than the test's (a pass the test will hold there).
    Other,
    /// On the test's own CPU (a pass beside one held on another CPU).
    Here,
}

/// On a worker bound to a CPU chosen by `on`: schedules a pass of `cq` with bottom halves
/// disabled, so that a softirq pass runs on that CPU when they are enabled again (a workqueue
/// pass is queued as usual); then sets `done`. The caller keeps `cq` alive until `done` is set.
///
/// The test task is pinned to its CPU from then on (until it ends). A pass held in softirq
/// spins on its CPU and stops that CPU's timers too, the test's `msleep` among them: if the
/// test slept on the CPU a worker later took (an unbound worker goes where it likes), the test
/// could not wake up until the hold timed out. So the worker is bound, and the pass held
/// (`PassCpu::Other`) never shares a CPU with the test. On a one-CPU guest both are the same.
pub(crate) fn pass_on_worker(
    cq: &crate::engine::CqEngine,
    done: &kernel::sync::Arc<core::sync::atomic::AtomicU32>,
    on: PassCpu,
) -> crate::kunit::TestResult {
    // SAFETY: FFI calls without preconditions.
    let here = unsafe { bindings::ibext_test_this_cpu() };
    let target = match on {
        // SAFETY: As above.
        PassCpu::Other => unsafe { bindings::ibext_test_other_cpu(here) },
        PassCpu::Here => here,
    };
    let at = core::ptr::from_ref(cq) as usize;
    let done = done.clone();
    // A bound workqueue runs the item on the CPU that queues it: queue it from `target`.
    // SAFETY: FFI call in process context.
    crate::kunit::kassert_eq!(unsafe { bindings::ibext_test_pin_self(target) }, 0);
    let r = kernel::workqueue::system().try_spawn(GFP_KERNEL, move || {
        // SAFETY: The caller keeps the CQ alive until `done` is set.
        unsafe { bindings::ibext_test_in_bh(Some(schedule_pass), at as *mut core::ffi::c_void) };
        done.store(1, core::sync::atomic::Ordering::Release);
    });
    // SAFETY: As above.
    let back = unsafe { bindings::ibext_test_pin_self(here) };
    crate::kunit::kassert!(r.is_ok(), "cannot start a worker");
    crate::kunit::kassert_eq!(back, 0);
    Ok(())
}
