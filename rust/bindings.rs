// SPDX-License-Identifier: GPL-2.0

//! Private bindings: RDMA core, irq_poll, DIM, debugfs and ibext's C shim.
//!
//! `bindings_generated.rs` is produced at build time by the Kbuild bindgen pass over
//! `bindings_helper.h`, with the kernel's own C flags; it is never committed. The kernel's
//! `kernel::bindings` on 6.12 has no RDMA types, hence this second, private set.
//!
//! The C types that ibext passes between ib_core and `kernel::` abstractions (work items,
//! workqueues, lockdep keys, dentries, seq_files, netdevs) are not generated here: Kbuild
//! blocklists them (`ibext_bindgen_shared`) and they are imported from `kernel::bindings`, so
//! each is one Rust type. The other types here are distinct from those of `kernel::bindings`
//! even where the C type is the same (`struct device`, say); ibext never mixes the two for one
//! object.

// Generated code: which of these lints fire depends on the headers and the bindgen version, so
// `expect` would itself warn. This is the one place the crate uses `allow`, as the kernel's own
// `rust/bindings/lib.rs` does.
#![allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    improper_ctypes,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    unknown_lints,
    unnecessary_transmutes
)]

use kernel::ffi;

/// Shared with `kernel::bindings`; the Kbuild's `ibext_bindgen_shared` blocklists them here.
pub(crate) use kernel::bindings::{
    delayed_work, dentry, lock_class_key, net_device, seq_file, work_struct, workqueue_struct,
};

type __kernel_size_t = usize;
type __kernel_ssize_t = isize;
type __kernel_ptrdiff_t = isize;

include!("bindings_generated.rs");
