// SPDX-License-Identifier: GPL-2.0

//! Error codes that 6.12's `kernel::error::code` lacks (mainline has both).

use kernel::prelude::*;

/// `-EOPNOTSUPP`, which `kernel::error::code` lacks on 6.12.
pub(crate) fn eopnotsupp() -> Error {
    Error::from_errno(-(kernel::bindings::EOPNOTSUPP as i32))
}

/// `-EDEADLK`, which `kernel::error::code` lacks on 6.12.
pub(crate) fn edeadlk() -> Error {
    Error::from_errno(-(kernel::bindings::EDEADLK as i32))
}
