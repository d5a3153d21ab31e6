// SPDX-License-Identifier: GPL-2.0

//! Test-only hooks that product code calls through `ib::fault_point`, compiled into the KUnit
//! flavour only.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use kernel::prelude::*;

/// Fault injection: the `n`-th fault point reached after this is set fails with `-ENOMEM`
/// (0: none).
pub(crate) static FAIL_AT: AtomicU32 = AtomicU32::new(0);

/// A step of making an object that can fail: counts down [`FAIL_AT`], failing at 1.
pub(crate) fn fault_point() -> Result {
    let n = FAIL_AT.load(Ordering::Relaxed);
    if n > 0 {
        FAIL_AT.store(n - 1, Ordering::Relaxed);
        if n == 1 {
            return Err(ENOMEM);
        }
    }
    Ok(())
}

/// Aging's clock, in the KUnit flavour: the real time plus this many milliseconds.
///
/// While it is `u64::MAX` (the default) the aging work does nothing when it runs: the other
/// suites count pooled CQs, and a pass 60 s after some put must not change the count under
/// them. `ibext_elastic` sets a shift to run the real work as if a period had passed, and
/// calls the pass itself for the rest; the benchmarks set 0.
pub(crate) static AGING_SHIFT_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Returns the time aging's work runs at, or `None` while the tests hold it (see
/// [`AGING_SHIFT_MS`]).
pub(crate) fn aging_now(now_ms: u64) -> Option<u64> {
    match AGING_SHIFT_MS.load(Ordering::Acquire) {
        u64::MAX => None,
        shift => Some(now_ms + shift),
    }
}

/// Aging switched off, as before it existed: puts queue no pass (the benchmarks' baseline).
pub(crate) static AGING_OFF: AtomicBool = AtomicBool::new(false);

/// Runs `f` with aging's clock one period ahead ([`AGING_SHIFT_MS`]), then holds aging again.
pub(crate) fn a_period_later(f: impl FnOnce()) {
    AGING_SHIFT_MS.store(crate::policy::cq_pool::AGE_MS, Ordering::Release);
    f();
    AGING_SHIFT_MS.store(u64::MAX, Ordering::Release);
}
