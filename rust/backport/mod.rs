// SPDX-License-Identifier: GPL-2.0

//! Kernel helpers that 6.12's `kernel::` crate lacks, each in a file named after the upstream
//! module that has (or will have) its counterpart, so that each can be swapped for `kernel::`'s
//! when ibext moves to a kernel that has it. Nothing here knows about RDMA or imports the rest
//! of the crate; the rest of the crate uses these as it would use `kernel::`.
//!
//! - `bug.rs`: `warn_on_once!` (mainline: `kernel::bug`'s `warn_on!`, 6.15);
//! - `error.rs`: `EOPNOTSUPP` and `EDEADLK` (mainline: `kernel::error::code`);
//! - `debugfs.rs`: directories and files rendered by Rust (mainline: `kernel::debugfs`, 6.17);
//! - `percpu.rs`: per-CPU counters (mainline: `kernel::percpu`, later);
//! - `sync.rs`: the RCU read-side guard (mainline: `kernel::sync::rcu::Guard`), a value
//!   published through RCU, and static lockdep classes (`kernel::sync::LockClassKey`);
//! - `workqueue.rs`: delayed work embedded in the object it works on, and `init_work!`
//!   (mainline: `kernel::workqueue`'s `DelayedWork`, 6.16).

pub(crate) mod bug;
pub(crate) mod debugfs;
pub(crate) mod error;
pub(crate) mod percpu;
pub(crate) mod sync;
pub(crate) mod workqueue;
