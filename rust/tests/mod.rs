// SPDX-License-Identifier: GPL-2.0

//! KUnit suites, compiled into the KUnit flavour of the module only (`--cfg ibext_kunit`).
//!
//! They run when that module is inserted, inside a QEMU guest that has rxe0 (on veth0) and
//! rxe1 (on veth2): real devices, real ib_core. See `Documentation/ibext-testing.rst`.

mod bench;
mod cq_pool;
mod dim;
mod dim_arm;
mod elastic;
mod faults;
mod fixtures;
mod gid;
pub(crate) mod hooks;
mod hotunplug;
pub(crate) mod kunit;
mod lifecycle;
mod lifetime;
mod races;
mod srq;
mod yielding;
