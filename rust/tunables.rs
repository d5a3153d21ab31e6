// SPDX-License-Identifier: GPL-2.0

//! ibext's module parameters, declared by the C shim (the `module!` macro of 6.12 declares
//! none): `ibext.age_ms`.

use crate::{bindings, policy::cq_pool::AGE_MS};

// The shim's default is the policy's.
const _: () = assert!(bindings::IBEXT_AGE_MS_DEFAULT as u64 == AGE_MS);

/// Returns `ibext.age_ms`: how long a pooled CQ stays idle, and an SRQ stays grown without a
/// limit event, before ibext gives it (or a step of it) back; [`AGE_MS`] unless set,
/// always within 1 s to 1 h (the parameter's setter refuses anything else).
pub(crate) fn age_ms() -> u64 {
    // SAFETY: FFI call without preconditions (a READ_ONCE of the parameter).
    u64::from(unsafe { bindings::ibext_shim_age_ms() })
}
