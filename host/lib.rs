// SPDX-License-Identifier: GPL-2.0

//! Host build of ibext's pure policy code.
//!
//! The files under `rust/policy/` are the same ones the module compiles; this crate only
//! gives `cargo test` a root to compile them from. Tests live in `tests/`.

#[path = "../rust/policy/mod.rs"]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "crate-visible policy is used by the module and the tests only"
    )
)]
mod policy;

#[cfg(test)]
#[path = "unit/mod.rs"]
mod unit;
