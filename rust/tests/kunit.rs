// SPDX-License-Identifier: GPL-2.0

//! KUnit suites declared from Rust on 6.12.
//!
//! 6.12 has neither `#[kunit_tests]` nor `kunit_unsafe_test_suite!` (both came in 6.15), so
//! [`kunit_suite!`] builds the same C objects: a `static` array of `kunit_case` ending in an
//! all-zero case, a `static kunit_suite`, and a pointer to it in `.kunit_test_suites`, which
//! the KUnit module notifier runs when the module goes live.
//!
//! Unlike upstream's `kunit_assert!`, a failed [`kassert!`] does not abort the test thread:
//! it reports the failure (with file:line) and returns `Err(Failed)` from the test function,
//! so destructors run and a failing test releases what it holds (QPs, CQs, device
//! references) instead of leaking it into the next test.

use core::fmt;
use kernel::bindings;

/// A test failed; the failure has already been reported to KUnit.
#[derive(Debug)]
pub(crate) struct Failed;

/// The result of a test function.
pub(crate) type TestResult = core::result::Result<(), Failed>;

/// Reports a failure of the running test at `file:line` with `msg`, in KUnit's format.
///
/// Outside a KUnit task (a helper kthread, say) the report goes to the log only; such callers
/// return their result to the test thread, which asserts on it.
pub(crate) fn report_failure(file: &str, line: u32, msg: fmt::Arguments<'_>) {
    // SAFETY: FFI call without preconditions.
    let test = unsafe { bindings::kunit_get_current_test() };
    // `kernel::kunit::err` prints without the module prefix, so these lines stay KTAP
    // diagnostics of the running case.
    kernel::kunit::err(format_args!(
        "    # ASSERTION FAILED at {}:{}\n",
        file, line
    ));
    kernel::kunit::err(format_args!("    # {}\n", msg));
    if test.is_null() {
        kernel::kunit::err(format_args!(
            "    # (not in a KUnit task: reported to the log only)\n"
        ));
        return;
    }
    // SAFETY: `test` is the running test of this task, valid until the case returns. KUnit
    // reads `status` after the case function returns, on the same task (this is
    // `kunit_set_failure()`, a static inline on 6.12).
    unsafe {
        core::ptr::write_volatile(
            core::ptr::addr_of_mut!((*test).status),
            bindings::kunit_status_KUNIT_FAILURE,
        )
    };
}

/// Reports that row `id` of `Documentation/ibext-bad-input.rst` holds; the harness checks
/// that every row of the table is reported.
pub(crate) fn bad_input_ok(id: &str) {
    kernel::kunit::info(format_args!("    # bad-input {}: ok\n", id));
}

/// Runs `f`, which must make the kernel itself WARN (ib_core's `WARN_ON_ONCE` on a caller bug
/// the test commits on purpose), between markers the harness reads: inside them a kernel
/// warning is expected, and its absence is a failure; any other report still fails the run.
pub(crate) fn expect_kernel_warning(what: &str, f: impl FnOnce()) {
    kernel::pr_info!("ibext-test: expected kernel warning begins: {}\n", what);
    f();
    kernel::pr_info!("ibext-test: expected kernel warning ends: {}\n", what);
}

/// Marks the running test skipped with `reason` (KUnit's `kunit_mark_skipped`, a macro on
/// 6.12); the test function then returns `Ok(())`.
pub(crate) fn skip(reason: &str) {
    // SAFETY: FFI call without preconditions.
    let test = unsafe { bindings::kunit_get_current_test() };
    if test.is_null() {
        return;
    }
    // SAFETY: `test` is the running test of this task; KUnit reads `status` and
    // `status_comment` after the case returns, on this task.
    unsafe {
        let comment = &mut (*test).status_comment;
        let n = reason.len().min(comment.len() - 1);
        for (dst, src) in comment.iter_mut().zip(reason.as_bytes()[..n].iter()) {
            *dst = *src;
        }
        comment[n] = 0;
        core::ptr::write_volatile(
            core::ptr::addr_of_mut!((*test).status),
            bindings::kunit_status_KUNIT_SKIPPED,
        );
    }
}

impl From<kernel::error::Error> for Failed {
    /// Lets a test use `?` on a kernel `Result`: the error fails the test at the `?`.
    #[track_caller]
    fn from(e: kernel::error::Error) -> Self {
        let loc = core::panic::Location::caller();
        report_failure(
            loc.file(),
            loc.line(),
            format_args!("unexpected error {:?}", e),
        );
        Failed
    }
}

impl From<kernel::alloc::AllocError> for Failed {
    /// Lets a test use `?` on an allocation: running out of memory fails the test at the `?`.
    #[track_caller]
    fn from(_: kernel::alloc::AllocError) -> Self {
        let loc = core::panic::Location::caller();
        report_failure(loc.file(), loc.line(), format_args!("allocation failed"));
        Failed
    }
}

/// Fails the running test and returns from it if `$cond` is false.
macro_rules! kassert {
    ($cond:expr $(,)?) => {
        $crate::kunit::kassert!($cond, "{}", stringify!($cond))
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $crate::kunit::report_failure(
                file!(),
                line!(),
                format_args!("Expected {} to be true: {}", stringify!($cond), format_args!($($fmt)+)),
            );
            return Err($crate::kunit::Failed);
        }
    };
}
pub(crate) use kassert;

/// Fails the running test and returns from it if `$left != $right`, showing both values.
macro_rules! kassert_eq {
    ($left:expr, $right:expr $(,)?) => {
        $crate::kunit::kassert_eq!($left, $right, "{}", "")
    };
    ($left:expr, $right:expr, $($fmt:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if *left != *right {
            $crate::kunit::report_failure(
                file!(),
                line!(),
                format_args!(
                    "Expected {} == {}, but {:?} != {:?} {}",
                    stringify!($left),
                    stringify!($right),
                    left,
                    right,
                    format_args!($($fmt)+)
                ),
            );
            return Err($crate::kunit::Failed);
        }
    }};
}
pub(crate) use kassert_eq;

/// Returns a `kunit_case` running `run` under `name`.
pub(crate) const fn case(
    name: &'static kernel::str::CStr,
    run: extern "C" fn(*mut bindings::kunit),
) -> bindings::kunit_case {
    // SAFETY: `kunit_case` is a C struct of pointers, integers and enums whose zero values are
    // valid (KUnit's own terminator is all zeros).
    let mut c: bindings::kunit_case = unsafe { core::mem::zeroed() };
    c.run_case = Some(run);
    c.name = name.as_char_ptr();
    c
}

/// Returns the all-zero `kunit_case` that ends a case array.
pub(crate) const fn case_end() -> bindings::kunit_case {
    // SAFETY: As in `case`: all-zero is valid, and is the terminator KUnit looks for.
    unsafe { core::mem::zeroed() }
}

/// Returns `name` as the fixed-size, NUL-padded array `kunit_suite::name` holds.
pub(crate) const fn suite_name(name: &str) -> [kernel::ffi::c_char; 256] {
    let bytes = name.as_bytes();
    assert!(bytes.len() < 256, "KUnit suite name too long");
    let mut out = [0; 256];
    let mut i = 0;
    while i < bytes.len() {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

/// Runs a test function as a KUnit case body.
pub(crate) fn run_case(f: fn() -> TestResult) {
    // The failure, if any, was reported where it happened.
    let _ = f();
}

/// Declares a KUnit suite `$suite` whose cases are the functions `$case`, each of type
/// `fn() -> TestResult`, run in the order given.
///
/// A trailing `slow` gives the suite KUnit's `speed=slow` attribute: `make check` filters such
/// suites out (`kunit.filter=speed>slow`); the benchmarks are declared this way.
///
/// # Examples
///
/// ```ignore
/// fn adds() -> TestResult {
///     kassert_eq!(1 + 1, 2);
///     Ok(())
/// }
/// kunit_suite!(ibext_example, [adds]);
/// ```
macro_rules! kunit_suite {
    ($suite:ident, [$($case:ident),+ $(,)?], slow) => {
        $crate::kunit::kunit_suite!(@suite $suite, [$($case),+], ::kernel::bindings::kunit_speed_KUNIT_SPEED_SLOW);
    };
    ($suite:ident, [$($case:ident),+ $(,)?]) => {
        $crate::kunit::kunit_suite!(@suite $suite, [$($case),+], ::kernel::bindings::kunit_speed_KUNIT_SPEED_UNSET);
    };
    (@suite $suite:ident, [$($case:ident),+], $speed:expr) => {
        const _: () = {
            $(
                // A module per case gives each trampoline a distinct path; modules and
                // functions live in different namespaces, so it may share the case's name.
                #[allow(non_snake_case)]
                mod $case {
                    pub(super) extern "C" fn run(_test: *mut ::kernel::bindings::kunit) {
                        $crate::kunit::run_case(super::$case);
                    }
                }
            )+

            const NR_CASES: usize = 0 $(+ { let _ = stringify!($case); 1 })+;

            static mut CASES: [::kernel::bindings::kunit_case; NR_CASES + 1] = [
                $($crate::kunit::case(::kernel::c_str!(stringify!($case)), $case::run),)+
                $crate::kunit::case_end(),
            ];

            static mut SUITE: ::kernel::bindings::kunit_suite = {
                // SAFETY: All-zero is a valid `kunit_suite` (no hooks, no attributes); the name
                // and the cases are filled in below.
                let mut s: ::kernel::bindings::kunit_suite = unsafe { ::core::mem::zeroed() };
                s.name = $crate::kunit::suite_name(stringify!($suite));
                s.attr.speed = $speed;
                s.test_cases = ::core::ptr::addr_of_mut!(CASES).cast();
                s
            };

            // The KUnit module notifier finds suites through this section.
            #[used]
            #[link_section = ".kunit_test_suites"]
            static mut SUITE_ENTRY: *const ::kernel::bindings::kunit_suite =
                ::core::ptr::addr_of_mut!(SUITE);
        };
    };
}
pub(crate) use kunit_suite;
