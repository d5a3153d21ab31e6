// SPDX-License-Identifier: GPL-2.0

//! `WARN_ON_ONCE` for Rust: caller bugs get a warning with a backtrace and a safe return.
//!
//! 6.12 has no Rust binding for `WARN()`, so the warning itself is raised by the C shim.

/// Raises a kernel warning (with backtrace) once per call site if `$cond` is true, and evaluates
/// to `$cond`, like C's `WARN_ON_ONCE`.
///
/// `$msg` is a string literal naming the caller bug.
macro_rules! warn_on_once {
    ($cond:expr, $msg:literal $(,)?) => {{
        static WARNED: ::core::sync::atomic::AtomicBool =
            ::core::sync::atomic::AtomicBool::new(false);
        let cond: bool = $cond;
        if cond && !WARNED.swap(true, ::core::sync::atomic::Ordering::Relaxed) {
            // SAFETY: All three arguments are NUL-terminated literals with static lifetime.
            unsafe {
                $crate::bindings::ibext_shim_warn(
                    concat!(file!(), "\0").as_ptr(),
                    line!() as ::kernel::ffi::c_int,
                    concat!($msg, "\0").as_ptr(),
                )
            };
        }
        cond
    }};
}
pub(crate) use warn_on_once;
