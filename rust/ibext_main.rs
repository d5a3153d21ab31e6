// SPDX-License-Identifier: GPL-2.0

//! ibext: shared-resource machinery for RDMA upper-layer protocols.
//!
//! ibext registers with ib_core as a client, keeps per-device state for every registered RDMA
//! device, and offers ULPs (through `include/rdma/ibext.h` and the crate's Rust API) the shared
//! resources they need to scale. See `Documentation/ibext.rst`.
//!
//! This file holds only `mod` lines, the module object and its lifetime.

// `pin_init!` of the completion engine's 17 fields expands deeper than the default limit.
#![recursion_limit = "256"]

mod api;
mod backport;
mod bindings;
mod capi;
mod cq_pool;
mod device;
mod engine;
mod gid_index;
mod ib;
mod ledger;
mod legacy_dim;
mod policy;
mod recv_srq;
mod seams;
mod srq_pool;
mod stats;
mod tunables;

#[cfg(ibext_kunit)]
mod tests;

#[cfg(ibext_kunit)]
use tests::kunit;

use backport::{
    bug::warn_on_once,
    debugfs::{RootDir, SeqFile, Show, ShowFile},
};
use core::fmt::Write;
use device::DeviceState;
use ib::client::Registration;
use kernel::{c_str, prelude::*, sync::Arc};

module! {
    type: Ibext,
    name: "ibext",
    author: "ibext developers",
    description: "Shared CQ/SRQ pools, DIM and GID lookup for RDMA ULPs",
    license: "GPL",
}

/// Renders `/sys/kernel/debug/ibext/objects`: made, freed and live objects of every kind.
struct LedgerView;

impl Show for LedgerView {
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        for kind in ledger::Kind::ALL {
            let c = ledger::counts(kind);
            writeln!(
                m,
                "{} made {} freed {} live {}",
                kind.name(),
                c.made,
                c.freed,
                c.live()
            )?;
        }
        Ok(())
    }
}

/// The module object. Fields drop in order: the client first (every device's state, with its
/// pooled CQs, is torn down), then the completion workqueues, then the debugfs root, then the
/// files the root showed.
struct Ibext {
    client: Option<Registration<DeviceState>>,
    _wqs: engine::Workqueues,
    _root: RootDir,
    _objects: ShowFile<LedgerView, LedgerView>,
    _legacy_dim: ShowFile<legacy_dim::TotalsView, legacy_dim::TotalsView>,
}

impl kernel::Module for Ibext {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let root = RootDir::new();
        let view = Arc::new(LedgerView, GFP_KERNEL)?;
        let objects = ShowFile::new(root.dir(), c_str!("objects"), view, |v| v)?;
        let totals = Arc::new(legacy_dim::TotalsView, GFP_KERNEL)?;
        let legacy_dim = ShowFile::new(root.dir(), c_str!("legacy_dim"), totals, |v| v)?;
        let wqs = engine::Workqueues::new()?;
        let client = device::register_client()?;
        pr_info!("loaded\n");
        Ok(Ibext {
            client: Some(client),
            _wqs: wqs,
            _root: root,
            _objects: objects,
            _legacy_dim: legacy_dim,
        })
    }
}

impl Drop for Ibext {
    fn drop(&mut self) {
        // Unregistering calls `remove` for every device, which frees its state.
        drop(self.client.take());
        for kind in ledger::Kind::ALL {
            let c = ledger::counts(kind);
            if c.live() != 0 {
                pr_err!("{} {} objects leaked at unload\n", c.live(), kind.name());
            }
        }
        warn_on_once!(ledger::live_total() != 0, "objects leaked at module unload");
        pr_info!("unloaded\n");
    }
}
