// SPDX-License-Identifier: GPL-2.0

//! Per-device state: everything ibext keeps for one registered `ib_device`.
//!
//! Made by the client's `add`; its `remove` unpublishes it (see `client.rs`) and retires it. The
//! state itself lives as long as its users, not as long as ibext's client:
//!
//! - the client data holds one reference, from `add` until `remove`;
//! - every SRQ pool holds one until it is destroyed;
//! - pooled CQs still in use at `remove` make the state hold a reference to itself until the
//!   last of them is put back (`cq_keep`); the put that brings the last one to zero destroys
//!   the CQs and drops it (see `cq_pool.rs`, "Lifetime").
//!
//! The state holds a device reference for its whole life. That is what ib_core's
//! unregistration waits for after removing every client
//! (`disable_device`: `ib_device_put` then `wait_for_completion(&unreg_completion)`), so a ULP
//! driven by rdma_cm, removed after ibext, still finds its CQs working when it drains its QPs.
//!
//! Lock order: `DeviceState::inner` and `DeviceState::cq_keep` are leaf locks. `inner` is never
//! held across a debugfs removal, because removal waits for readers of the device's files.

use crate::{
    backport::{
        debugfs::{Dir, SeqFile, Show, ShowFile},
        sync::RcuGuard,
    },
    cq_pool::{CqPools, Home},
    gid_index::GidIndex,
    ib::{
        client::{Client, ClientData, Registration},
        cq::CqPtr,
        Device, DeviceRef,
    },
    ledger::{Kind, Token},
};
use core::{
    ffi::c_void,
    fmt::Write,
    sync::atomic::{AtomicUsize, Ordering},
};
use kernel::{
    c_str, new_mutex, new_spinlock,
    prelude::*,
    str::CStr,
    sync::{Arc, ArcBorrow, Mutex, SpinLock},
};

/// Length of an RDMA device name buffer, `IB_DEVICE_NAME_MAX`.
const NAME_MAX: usize = crate::ib::DEVICE_NAME_MAX;

/// A copy of a device name, NUL-terminated.
#[derive(Clone, Copy)]
struct DevName([u8; NAME_MAX]);

impl DevName {
    fn new(name: &CStr) -> Self {
        let mut buf = [0u8; NAME_MAX];
        let bytes = name.as_bytes();
        let len = bytes.len().min(NAME_MAX - 1);
        buf[..len].copy_from_slice(&bytes[..len]);
        DevName(buf)
    }

    fn as_cstr(&self) -> &CStr {
        let len = self.0.iter().position(|&b| b == 0).unwrap_or(NAME_MAX - 1);
        // `self.0[len]` is NUL (found above, or the last byte, which `new` never writes), so
        // the check cannot fail.
        CStr::from_bytes_with_nul(&self.0[..=len]).unwrap_or(c_str!(""))
    }
}

/// The fields of [`DeviceState`] that change after `add`.
struct DeviceInner {
    /// The device's name, as last told by ib_core.
    name: DevName,
    /// `/sys/kernel/debug/ibext/<dev>/`, until `remove` lets go of it (SRQ pools still alive
    /// keep it through their own directories inside it).
    dir: Option<Dir>,
    /// The state's files in `dir`; they hold the state, so `remove` drops them.
    files: Option<DevFiles>,
}

/// The debugfs files of a device's state.
struct DevFiles {
    _state: ShowFile<DeviceState, DeviceState>,
    _cq_pools: ShowFile<DeviceState, CqPools>,
    _gid_index: ShowFile<DeviceState, GidIndex>,
}

impl DevFiles {
    /// Makes `state`, `cq_pools` and `gid_index` in `dir`.
    fn new(dir: &Dir, state: &Arc<DeviceState>) -> Result<Self> {
        Ok(DevFiles {
            _state: ShowFile::new(dir, c_str!("state"), state.clone(), |s| s)?,
            _cq_pools: ShowFile::new(dir, c_str!("cq_pools"), state.clone(), |s| &s.cq_pools)?,
            _gid_index: ShowFile::new(dir, c_str!("gid_index"), state.clone(), |s| &s.gid_index)?,
        })
    }
}

/// ibext's state for one registered RDMA device.
///
/// # Invariants
///
/// `dev` is live while the state is (the state holds its reference): after `remove`, the
/// state's remaining users (SRQ pools, `cq_keep`) keep it, and with it the device. The state is
/// reached by lookups only through the client data, which `remove` clears first.
#[pin_data]
pub(crate) struct DeviceState {
    /// Held for the state's whole life: a user of the state (a pooled CQ in use, an SRQ
    /// pool) keeps the device's unregistration from finishing (`disable_device` waits).
    dev: DeviceRef,
    #[pin]
    inner: Mutex<DeviceInner>,
    #[pin]
    cq_pools: CqPools,
    #[pin]
    gid_index: GidIndex,
    /// SRQ pools ULPs made on the device and have not destroyed yet.
    srq_pools: AtomicUsize,
    /// The state's reference to itself while pooled CQs are in use after `remove`; through
    /// `dev` it keeps the device's unregistration waiting until the last of them is put back.
    #[pin]
    cq_keep: SpinLock<Option<Arc<DeviceState>>>,
    _token: Token,
}

impl DeviceState {
    /// Destroys the pooled CQs left after retirement and returns what kept the state alive, for
    /// the caller to drop once it no longer uses `self`.
    fn release_cqs(&self) -> Option<Arc<DeviceState>> {
        self.cq_pools.release();
        // The CQs are gone: once the caller drops this, the device may finish unregistering.
        self.cq_keep.lock().take()
    }

    /// Gives back `nr_cqe` entries of the pooled CQ `cq` (see `ibext_cq_pool_put`), before or
    /// after `remove`. Returns what the caller must drop after its last use of `self` (the
    /// state's reference to itself, when this was the last busy CQ after `remove`).
    pub(crate) fn cq_put(&self, cq: CqPtr, nr_cqe: u32) -> Option<Arc<Self>> {
        if self.cq_pools.put(cq, nr_cqe) {
            self.release_cqs()
        } else {
            None
        }
    }

    /// Returns the identity pooled CQs carry back to their state (`PooledCq::owner`).
    pub(crate) fn as_owner(&self) -> *const c_void {
        core::ptr::from_ref(self).cast()
    }

    /// Returns the device.
    pub(crate) fn device(&self) -> &Device {
        &self.dev
    }

    /// Returns the number of completion vectors the CQ and SRQ pools spread over now:
    /// `min(num_comp_vectors, num_online_cpus())`, at least 1.
    ///
    /// The one source of the count for both kinds of pool, computed at each use rather than
    /// kept: `num_online_cpus()` is one atomic read (`include/linux/cpumask.h`, 6.12), and a
    /// value kept since `add` goes stale when CPUs go offline or come online. A get therefore
    /// never picks a vector at or beyond the count of that moment (the round-robin included,
    /// `policy::cq_pool::vector_for_hint`); CQs and SRQs made on vectors beyond it keep working
    /// for the QPs that use them.
    pub(crate) fn comp_vectors(&self) -> u32 {
        self.dev.usable_comp_vectors()
    }

    /// Takes `nr_cqe` entries on a pooled CQ (see `ibext_cq_pool_get_attr`).
    pub(crate) fn cq_pool_get(
        &self,
        nr_cqe: u32,
        hint: i32,
        ctx: crate::engine::PollCtx,
        moderation: crate::policy::moderation::Moderation,
    ) -> Result<CqPtr> {
        let home = Home {
            dev: self.device(),
            vectors: self.comp_vectors(),
            owner: self.as_owner(),
        };
        self.cq_pools.get(&home, nr_cqe, hint, ctx, moderation)
    }

    /// Returns the device's CQ pools.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn cq_pools(&self) -> &CqPools {
        &self.cq_pools
    }

    /// Counts an SRQ pool made on the device.
    pub(crate) fn srq_pool_made(&self) {
        self.srq_pools.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts an SRQ pool destroyed.
    pub(crate) fn srq_pool_gone(&self) {
        self.srq_pools.fetch_sub(1, Ordering::AcqRel);
    }

    /// Makes a directory `name` in the device's debugfs directory, if it has one.
    pub(crate) fn new_subdir(&self, name: &CStr) -> Option<Dir> {
        let inner = self.inner.lock();
        inner.dir.as_ref().map(|d| Dir::new(name, Some(d)))
    }

    /// Returns the device's GID index.
    pub(crate) fn gid_index(&self) -> &GidIndex {
        &self.gid_index
    }

    /// Returns whether `name` is the device's name as ibext last saw it.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn name_matches(&self, name: &CStr) -> bool {
        self.inner.lock().name.as_cstr().as_bytes() == name.as_bytes()
    }
}

/// ibext's `ib_client`, whose data is a [`DeviceState`] per device.
static CLIENT: Client<DeviceState> = Client::new();

/// Registers ibext's client; `add` runs for every device already present before this returns.
pub(crate) fn register_client() -> Result<Registration<DeviceState>> {
    CLIENT.register()
}

/// Returns ibext's state for `dev`, borrowed for the read-side critical section `rcu`; `None`
/// if ibext is not attached to `dev` or its `remove` has started (`ib::client::Client::get_in`).
#[inline(always)]
pub(crate) fn device_state_in<'g>(
    dev: &Device,
    rcu: &'g RcuGuard,
) -> Option<ArcBorrow<'g, DeviceState>> {
    CLIENT.get_in(dev, rcu)
}

/// Returns a reference to ibext's state for `dev`, or `None` if ibext is not attached to it
/// (or is being removed from it).
pub(crate) fn device_state(dev: &Device) -> Option<Arc<DeviceState>> {
    CLIENT.get(dev)
}

impl ClientData for DeviceState {
    const NAME: &'static core::ffi::CStr = c"ibext";

    fn client() -> &'static Client<Self> {
        &CLIENT
    }

    /// Makes the state for `dev` (the client's `add`).
    fn add(dev: &Device) -> Result<Arc<Self>> {
        let name = DevName::new(dev.name());
        let dev_ref = DeviceRef::try_get(dev).ok_or(ENODEV)?;
        let gid_index = GidIndex::new(dev)?;
        let state = Arc::pin_init(
            try_pin_init!(Self {
                dev: dev_ref,
                inner <- new_mutex!(
                    DeviceInner {
                        name,
                        dir: None,
                        files: None,
                    },
                    "DeviceState::inner"
                ),
                cq_pools <- CqPools::new(),
                gid_index <- gid_index,
                srq_pools: AtomicUsize::new(0),
                cq_keep <- new_spinlock!(None, "DeviceState::cq_keep"),
                _token: Token::new(Kind::DeviceState),
            }),
            GFP_KERNEL,
        )?;
        // Registers for GID change events and builds the mirror; undone by dropping `state`.
        // A scan that fails is retried later; lookups fall back to ib_core meanwhile.
        state.gid_index.start();

        let dir = Dir::new_in_root(name.as_cstr());
        // A file that cannot be made is not an error (as for debugfs itself).
        let files = DevFiles::new(&dir, &state).ok();
        {
            let mut inner = state.inner.lock();
            inner.dir = Some(dir);
            inner.files = files;
        }
        pr_debug!("attached to {}\n", name.as_cstr());
        Ok(state)
    }

    /// Retires the state (the client's `remove`), after the client data was cleared: new API
    /// calls get `ENODEV`; what ULPs still hold keeps working until they let go.
    fn remove(this: Arc<Self>, dev: &Device) {
        // Idle pooled CQs go now; busy ones stay live until their last put.
        let busy = this.cq_pools.retire_begin(dev);
        if busy != 0 {
            *this.cq_keep.lock() = Some(this.clone());
        }
        let keep = if this.cq_pools.retire_end() {
            this.release_cqs()
        } else {
            None
        };
        // No rescan runs or starts after this; the index is unreachable (unpublished).
        this.gid_index.stop();
        // Dropped outside the lock: removal waits for readers, which may be in `show`. SRQ
        // pools still alive keep the directory (their own are inside it) until they go.
        let pools = this.srq_pools.load(Ordering::Acquire);
        if pools != 0 {
            pr_info!(
                "{}: {} SRQ pool(s) still in use at removal: kept until destroyed\n",
                dev.name(),
                pools
            );
        }
        let (files, dir) = {
            let mut inner = this.inner.lock();
            (inner.files.take(), inner.dir.take())
        };
        drop(files);
        drop(dir);
        pr_debug!("detached from {}\n", dev.name());
        drop(keep);
        drop(this);
    }

    /// Follows a device rename (the client's `rename`).
    fn rename(&self, dev: &Device) {
        let name = DevName::new(dev.name());
        let mut inner = self.inner.lock();
        inner.name = name;
        if let Some(dir) = &inner.dir {
            dir.rename(name.as_cstr());
        }
    }
}

impl Show for DeviceState {
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        let name = self.inner.lock().name;
        let dev = self.device();
        let attrs = dev.attrs();
        writeln!(m, "device {}", name.as_cstr())?;
        writeln!(m, "ports {}", dev.phys_port_cnt())?;
        writeln!(
            m,
            "comp_vectors {} (device {})",
            self.comp_vectors(),
            dev.num_comp_vectors()
        )?;
        writeln!(m, "cq_aged_out {}", self.cq_pools.aged())?;
        writeln!(m, "max_cqe {}", attrs.max_cqe)?;
        writeln!(m, "max_cq {}", attrs.max_cq)?;
        writeln!(m, "max_qp {}", attrs.max_qp)?;
        writeln!(m, "max_srq {}", attrs.max_srq)?;
        writeln!(m, "max_srq_wr {}", attrs.max_srq_wr)?;
        Ok(())
    }
}
