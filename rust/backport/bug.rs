// SPDX-License-Identifier: GPL-2.0

//! `WARN_ON_ONCE` for Rust: caller bugs get a warning with a backtrace and a safe return.
//!
//! 6.12 has no Rust binding for `WARN()`, so the warning itself is raised by the C shim.
//!
//! The KUnit flavour can run a closure with caller-bug warnings *expected* ([`expect_warnings`]):
//! the tests of the misuse paths then count the warnings instead of raising them, since any
//! real `WARNING:` on the console fails the run. The product build has no such switch.

#[cfg(ibext_kunit)]
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

#[cfg(ibext_kunit)]
static EXPECTING: AtomicBool = AtomicBool::new(false);
#[cfg(ibext_kunit)]
static SEEN: AtomicU32 = AtomicU32::new(0);

/// Returns whether a test expects caller-bug warnings right now (never, in the product build).
#[inline]
pub(crate) fn expecting() -> bool {
    #[cfg(ibext_kunit)]
    {
        EXPECTING.load(Ordering::Acquire)
    }
    #[cfg(not(ibext_kunit))]
    {
        false
    }
}

/// Counts a caller-bug warning a test expected, in place of `WARN()`.
#[cfg(ibext_kunit)]
pub(crate) fn record_expected(msg: &str) {
    SEEN.fetch_add(1, Ordering::AcqRel);
    kernel::pr_info!("expected caller-bug warning: {}\n", msg);
}

/// Unreachable: [`expecting`] is always false in the product build.
#[cfg(not(ibext_kunit))]
pub(crate) fn record_expected(_msg: &str) {}

/// Runs `f` with caller-bug warnings expected and returns how many `f` raised.
///
/// Tests run one at a time, so a global switch is enough.
#[cfg(ibext_kunit)]
pub(crate) fn expect_warnings(f: impl FnOnce()) -> u32 {
    let before = SEEN.load(Ordering::Acquire);
    EXPECTING.store(true, Ordering::Release);
    f();
    EXPECTING.store(false, Ordering::Release);
    SEEN.load(Ordering::Acquire) - before
}

/// Raises a kernel warning (with backtrace) once per call site if `$cond` is true, and evaluates
/// to `$cond`, like C's `WARN_ON_ONCE`.
///
/// `$msg` is a string literal naming the caller bug.
macro_rules! warn_on_once {
    ($cond:expr, $msg:literal $(,)?) => {{
        static WARNED: ::core::sync::atomic::AtomicBool =
            ::core::sync::atomic::AtomicBool::new(false);
        let cond: bool = $cond;
        if cond {
            if $crate::backport::bug::expecting() {
                $crate::backport::bug::record_expected($msg);
            } else if !WARNED.swap(true, ::core::sync::atomic::Ordering::Relaxed) {
                // SAFETY: All three arguments are NUL-terminated literals with static lifetime.
                unsafe {
                    $crate::bindings::ibext_shim_warn(
                        concat!(file!(), "\0").as_ptr(),
                        line!() as ::kernel::ffi::c_int,
                        concat!($msg, "\0").as_ptr(),
                    )
                };
            }
        }
        cond
    }};
}
pub(crate) use warn_on_once;
