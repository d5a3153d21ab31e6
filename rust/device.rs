// SPDX-License-Identifier: GPL-2.0

//! Per-device state: everything ibext keeps for one registered `ib_device`.
//!
//! Made by the client's `add`, torn down by its `remove` in exact reverse order. Later pieces
//! (CQ pools, SRQ pools, the GID index) hang off this and are set up and torn down here.
//!
//! Lock order: `DeviceState::inner` is a leaf lock. It is never held across a debugfs removal,
//! because removal waits for readers of the device's files.

use crate::{
    cq_pool::CqPools,
    debugfs::{Dir, SeqFile, Show, ShowFile},
    gid_index::GidIndex,
    ib::Device,
    ledger::{Kind, Token},
    warn::warn_on_once,
};
use core::{
    fmt::Write,
    ptr::NonNull,
    sync::atomic::{AtomicUsize, Ordering},
};
use kernel::{
    c_str, new_mutex,
    prelude::*,
    str::CStr,
    sync::{Arc, Mutex},
};

/// Length of an RDMA device name buffer, `IB_DEVICE_NAME_MAX`.
const NAME_MAX: usize = crate::bindings::IB_DEVICE_NAME_MAX as usize;

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
        // SAFETY: `self.0[len]` is NUL (found above, or the last byte, which `new` never writes)
        // and no byte before it is.
        unsafe { CStr::from_bytes_with_nul_unchecked(&self.0[..=len]) }
    }
}

/// The fields of [`DeviceState`] that change after `add`.
struct DeviceInner {
    /// The device's name, as last told by ib_core.
    name: DevName,
    /// `/sys/kernel/debug/ibext/<dev>/`; taken out and dropped outside the lock on removal.
    dir: Option<Dir>,
}

/// ibext's state for one registered RDMA device.
///
/// # Invariants
///
/// `dev` is registered with ib_core from `add` until `remove`; the state is only reached through
/// the client data, which ib_core clears before calling `remove`.
#[pin_data]
pub(crate) struct DeviceState {
    dev: NonNull<crate::bindings::ib_device>,
    comp_vectors: u32,
    #[pin]
    inner: Mutex<DeviceInner>,
    #[pin]
    state_file: ShowFile<DeviceState>,
    #[pin]
    cq_pools: CqPools,
    #[pin]
    cq_pools_file: ShowFile<CqPools>,
    #[pin]
    gid_index: GidIndex,
    #[pin]
    gid_index_file: ShowFile<GidIndex>,
    /// SRQ pools ULPs made on the device and have not destroyed yet.
    srq_pools: AtomicUsize,
    _token: Token,
}

// SAFETY: `dev` is only used through `Device`, which is `Sync`; the rest is protected by `inner`
// or immutable.
unsafe impl Send for DeviceState {}
// SAFETY: As for `Send`.
unsafe impl Sync for DeviceState {}

impl DeviceState {
    /// Makes the state for `dev` (the client's `add`).
    pub(crate) fn add(dev: &Device) -> Result<Arc<Self>> {
        let name = DevName::new(dev.name());
        let comp_vectors = dev.usable_comp_vectors();
        let raw = NonNull::from(dev).cast();
        let gid_index = GidIndex::new(dev)?;
        let state = Arc::pin_init(
            pin_init!(Self {
                dev: raw,
                comp_vectors,
                inner <- new_mutex!(DeviceInner { name, dir: None }, "DeviceState::inner"),
                state_file <- ShowFile::new(),
                cq_pools <- CqPools::new(),
                cq_pools_file <- ShowFile::new(),
                gid_index <- gid_index,
                gid_index_file <- ShowFile::new(),
                srq_pools: AtomicUsize::new(0),
                _token: Token::new(Kind::DeviceState),
            }),
            GFP_KERNEL,
        )?;
        // Registers for GID change events and builds the mirror; undone by dropping `state`.
        state.gid_index.start()?;

        let dir = Dir::new_in_root(name.as_cstr());
        // SAFETY: The contents of an `Arc` never move, so `state_file` is pinned, and it lives as
        // long as `*state`. The directory holding the file is dropped in `remove`, while the
        // client data still holds a reference to `*state`.
        unsafe {
            Pin::new_unchecked(&state.state_file).create(c_str!("state"), &dir, &*state);
            Pin::new_unchecked(&state.cq_pools_file).create(
                c_str!("cq_pools"),
                &dir,
                &state.cq_pools,
            );
            Pin::new_unchecked(&state.gid_index_file).create(
                c_str!("gid_index"),
                &dir,
                &state.gid_index,
            );
        }
        state.inner.lock().dir = Some(dir);
        pr_debug!("attached to {}\n", name.as_cstr());
        Ok(state)
    }

    /// Tears the state down in the reverse order of [`DeviceState::add`] (the client's `remove`).
    pub(crate) fn remove(self: Arc<Self>, dev: &Device) {
        // Pooled CQs were made last (lazily, after `add`): they go first. ULPs registered after
        // ibext have already been removed from this device, so nothing uses them any more.
        self.cq_pools.destroy_all(dev);
        // No rescan runs or starts after this; lookups (none from ULPs, which are gone) would
        // still be answered, with misses falling back to ib_core.
        self.gid_index.stop();
        // Dropped outside the lock: removal waits for readers, which may be in `show`.
        let dir = self.inner.lock().dir.take();
        let pools = self.srq_pools.load(Ordering::Acquire);
        if warn_on_once!(
            pools != 0,
            "ibext: a ULP left SRQ pools on a device being removed"
        ) {
            // Their debugfs directories are inside this one, and their owners still hold them:
            // keep it rather than have them removed twice.
            pr_err!("{} SRQ pool(s) left on {}\n", pools, dev.name());
            core::mem::forget(dir);
        } else {
            drop(dir);
        }
        pr_debug!("detached from {}\n", dev.name());
        drop(self);
    }

    /// Follows a device rename (the client's `rename`).
    pub(crate) fn rename(&self, dev: &Device) {
        let name = DevName::new(dev.name());
        let mut inner = self.inner.lock();
        inner.name = name;
        if let Some(dir) = &inner.dir {
            dir.rename(name.as_cstr());
        }
    }

    /// Returns the device.
    pub(crate) fn device(&self) -> &Device {
        // SAFETY: `dev` is registered while the state is reachable (type invariant).
        unsafe { Device::from_raw(self.dev.as_ptr()) }
    }

    /// Returns the number of completion vectors the pools use for this device.
    pub(crate) fn comp_vectors(&self) -> u32 {
        self.comp_vectors
    }

    /// Returns the device's CQ pools.
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
            self.comp_vectors,
            dev.num_comp_vectors()
        )?;
        writeln!(m, "max_cqe {}", attrs.max_cqe)?;
        writeln!(m, "max_cq {}", attrs.max_cq)?;
        writeln!(m, "max_qp {}", attrs.max_qp)?;
        writeln!(m, "max_srq {}", attrs.max_srq)?;
        writeln!(m, "max_srq_wr {}", attrs.max_srq_wr)?;
        Ok(())
    }
}
