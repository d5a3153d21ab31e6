// SPDX-License-Identifier: GPL-2.0

//! The seams through which the KUnit flavour's tests reach into the product code, all in this
//! one file: [`fault_point`] (make a step of building an object fail with `-ENOMEM`),
//! [`park_point`] and [`reached`] (hold a caller at a named point, or note that it got there,
//! to force one interleaving of a race), [`pass_held`] (hold a pooled CQ's passes back so that
//! completions pile up in it), the softirq repoll watch ([`softirq_pass_begins`],
//! [`softirq_repoll_asked`]), and aging's clock ([`aging_now`], [`aging_off`]).
//!
//! In the KUnit flavour (`--cfg ibext_kunit`) they are `tests::hooks`'s; in the product module
//! each is an empty `#[inline(always)]` function and [`Point`] an enum nothing matches on, so
//! they compile to nothing. Product files name a seam only through this module.

/// A step of making an object that can fail; in the KUnit flavour a test can make it fail with
/// `-ENOMEM` (`tests::hooks::FAIL_AT`). Always `Ok` in the product module.
#[cfg(ibext_kunit)]
pub(crate) use crate::tests::hooks::fault_point;

/// A step of making an object that can fail; always `Ok` in the product module.
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn fault_point() -> kernel::error::Result {
    Ok(())
}

/// A point where, in the KUnit flavour, a test can hold the caller to force one interleaving of
/// a race (`tests::hooks::park_point`); nothing in the product module.
#[cfg(ibext_kunit)]
pub(crate) use crate::tests::hooks::{
    park_point, reached, softirq_pass_begins, softirq_repoll_asked, Point,
};

/// The points of [`park_point`]; none in the product module.
#[cfg(not(ibext_kunit))]
#[derive(Clone, Copy)]
pub(crate) enum Point {
    /// See the KUnit flavour's `tests::hooks::Point`.
    CqPutIdle,
    /// As above.
    PassTail,
    /// As above.
    RecvDone,
    /// As above.
    PollerStopped,
    /// As above.
    SrqHandlersWait,
    /// As above.
    SrqMaintain,
}

/// Nothing in the product module.
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn park_point(_p: Point, _obj: *const core::ffi::c_void) {}

/// Nothing in the product module.
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn reached(_p: Point) {}

/// Nothing in the product module (the KUnit flavour watches softirq repolls,
/// `tests::hooks::RepollWatch`).
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn softirq_repoll_asked(_obj: *const core::ffi::c_void) {}

/// Nothing in the product module.
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn softirq_pass_begins(_obj: *const core::ffi::c_void) {}

/// Returns the time aging (of idle pooled CQs, of SRQ growth steps) is measured at: `now_ms`,
/// or in the KUnit flavour the tests' shifted clock, `None` while they hold aging
/// (`tests::hooks::AGING_SHIFT_MS`).
#[cfg(ibext_kunit)]
pub(crate) use crate::tests::hooks::aging_now;

/// Returns the time aging is measured at: `now_ms`, in the product module.
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn aging_now(now_ms: u64) -> Option<u64> {
    Some(now_ms)
}

/// Whether the benchmarks switched aging off (`tests::hooks::AGING_OFF`); never in the
/// product module.
#[inline(always)]
pub(crate) fn aging_off() -> bool {
    #[cfg(ibext_kunit)]
    return crate::tests::hooks::AGING_OFF.load(core::sync::atomic::Ordering::Relaxed);
    #[cfg(not(ibext_kunit))]
    false
}

/// How long a legacy ULP's re-arm is deferred, given the profile's `usec` (0: at once): `usec`,
/// or in the KUnit flavour the tests' override (`tests::hooks::LEGACY_DEFER_US`), which holds
/// a deferred pass until the test runs it.
#[inline(always)]
pub(crate) fn legacy_defer_us(usec: u32) -> u32 {
    #[cfg(ibext_kunit)]
    return crate::tests::hooks::legacy_defer_us(usec);
    #[cfg(not(ibext_kunit))]
    usec
}

/// Whether a test holds back the passes of the pooled CQ at `obj` (`tests::hooks::HoldPasses`);
/// a held CQ remembers that a pass was wanted, and the test runs it when it lets go.
#[cfg(ibext_kunit)]
pub(crate) use crate::tests::hooks::pass_held;

/// Never, in the product module.
#[cfg(not(ibext_kunit))]
#[inline(always)]
pub(crate) fn pass_held(_obj: *const core::ffi::c_void) -> bool {
    false
}
