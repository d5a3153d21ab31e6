// SPDX-License-Identifier: GPL-2.0

//! Pure policy: the decisions ibext makes, with no kernel types and no allocation.
//!
//! These files are compiled twice: into the module (`mod policy;` in `ibext_main.rs`) and into
//! the host crate in `host/`, where `cargo test` drives them with synthetic inputs. They may use
//! `core` only. The kernel side reaches ib_core; this side only decides.

pub(crate) mod cq_pool;
pub(crate) mod engine;
pub(crate) mod gid_index;
pub(crate) mod moderation;
pub(crate) mod profiles;
pub(crate) mod soft_dim;
pub(crate) mod srq_growth;
pub(crate) mod srq_pool;
