// SPDX-License-Identifier: GPL-2.0

//! Test-only hooks that product code calls through `ib::fault_point`, compiled into the KUnit
//! flavour only.

use core::sync::atomic::{AtomicU32, Ordering};
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
