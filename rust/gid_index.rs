// SPDX-License-Identifier: GPL-2.0

//! The cached GID index: a hashed mirror of every port's GID table, with each hit confirmed
//! against ib_core's own table.
//!
//! Upstream `rdma_find_gid` and `rdma_find_gid_by_port` scan the whole table with `memcmp` under
//! the table's rwlock, for every lookup; rxe's tables have 1024 entries and `rxe_chk_dgid` does
//! it for every received packet. Here each port has a *snapshot*: an open-addressing hash over
//! the port's valid entries ([`crate::policy::gid_index`]), each slot holding its entry's key
//! and table index, and a bitmap of valid indices.
//! A snapshot is built by a rescan and never changed; a newer one replaces it.
//!
//! # Staying right
//!
//! The index only proposes table indices. Each is confirmed with `rdma_get_gid_attr(dev, port,
//! index)`, which takes a reference, and compared (GID, type, and netdev if asked for) before it
//! is returned. A miss is trusted only if the snapshot is current: ib_core dispatches
//! `IB_EVENT_GID_CHANGE` after every change of a port's table, and the event handler counts it in
//! the port's `requested` generation and queues the rescan; a rescan that started after the
//! `n`-th event publishes its snapshot and then sets `done` to `n`. A lookup that misses while
//! `requested != done`, or that met a candidate which did not confirm, asks ib_core
//! (`rdma_find_gid_by_port`) instead. A change ib_core has made but not yet announced is not
//! seen, as a lookup just before the change would not see it.
//!
//! # Concurrency and lifetime
//!
//! Lookups take no lock of ibext's: they read the port's snapshot pointer inside
//! `rcu_read_lock()` and call ib_core, which takes its table's rwlock for each confirmation, so
//! they may run in atomic context. Rescans are serialized by `GidIndex::rescan`, a mutex taken
//! only in process context (the rescan work and the initial scan); a replaced snapshot is freed
//! after `synchronize_rcu()`.
//!
//! The event handler is registered in [`GidIndex::start`] (the client's `add`) and unregistered
//! in [`GidIndex::stop`] (its `remove`), which then cancels the rescan work; the last snapshots
//! are freed when the device state is dropped, after every lookup holding it has returned.
//!
//! Lock order: `GidIndex::rescan` → ib_core's GID table locks (taken inside
//! `rdma_get_gid_attr`). ib_core calls the event handler with its table mutex held; the handler
//! takes no lock of ibext's.

use crate::{
    backport::{
        debugfs::{SeqFile, Show},
        percpu::PerCpuCounters,
        sync::{RcuBox, RcuGuard},
    },
    ib::{
        event::{new_event_work, Event, EventWork, EventWorker},
        gid::{get_gid_attr, upstream_find_gid, GidAttr, NdevPtr},
        Device,
    },
    ledger::{Kind, Token},
    policy::gid_index::{self as policy, Entry, GidKey, Slot},
    stats::{stat_enum, Values},
};
use core::{
    fmt::Write,
    sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
};
use kernel::{new_mutex, prelude::*, sync::Mutex};

stat_enum! {
    /// The per-CPU counters of a [`GidIndex`], by index.
    pub(crate) enum Counter {
        /// Lookups answered by a confirmed entry of the mirror.
        Hits => "hits",
        /// Lookups answered "no such GID" by a current mirror.
        ConfirmedMisses => "confirmed_misses",
        /// Lookups handed to ib_core's own search: stale candidate or rescan pending.
        Fallbacks => "fallbacks",
        /// Candidates that did not confirm (the table changed after the snapshot).
        Stale => "stale",
        /// Rescans that published a snapshot.
        Rescans => "rescans",
        /// Rescans that could not allocate; the old snapshot stays and lookups fall back.
        RescanFailures => "rescan_failures",
        /// Lookups on ports that are not mirrored (IB, iWARP), answered by ib_core.
        Unindexed => "unindexed",
    }
}

/// Slots of [`CORE_SCANS`].
const CORE_SCAN_SLOTS: usize = 64;

/// The devices on which ib_core's own scan answers lookups (every port holds at most
/// `policy::CORE_SCAN_MAX` valid entries, where the scan costs less than a hashed, confirmed
/// lookup): slot `index % CORE_SCAN_SLOTS` holds the device's address, or 0.
///
/// Read without the device's state, without RCU and without ordering: the answer is right
/// whichever path it sends a lookup down, since ib_core's scan is the reference and the hashed
/// path confirms every hit. A stale slot (a device whose table just grew, one being removed,
/// another device at a freed device's address, two devices sharing a slot) only costs time.
/// Written by the device's rescans ([`GidIndex::rescan_pending`], under its `rescan` mutex)
/// and cleared by [`GidIndex::stop`].
static CORE_SCANS: [AtomicUsize; CORE_SCAN_SLOTS] =
    [const { AtomicUsize::new(0) }; CORE_SCAN_SLOTS];

/// Whether lookups on `dev` go to ib_core's own scan (see [`CORE_SCANS`]).
#[inline]
pub(crate) fn core_scan_cheaper(dev: &Device) -> bool {
    CORE_SCANS[dev.index() as usize % CORE_SCAN_SLOTS].load(Ordering::Relaxed)
        == dev.as_raw() as usize
}

/// One port's snapshot: the hash over its valid entries, and the bitmap of valid indices.
///
/// # Invariants
///
/// `slots` was filled by [`policy::build`]; nothing changes after publication.
struct Snapshot {
    /// The port's event count (`Port::requested`) when the scan began.
    gen: u64,
    slots: KVec<Slot>,
    valid: KVec<u64>,
    _token: Token,
}

impl Snapshot {
    /// Reads port `port` of `dev` (a table of `tbl_len` entries) into a new snapshot.
    fn scan(dev: &Device, port: u32, tbl_len: u32, gen: u64) -> Result<KBox<Self>> {
        let mut valid = KVec::with_capacity(policy::bitmap_words(tbl_len as usize), GFP_KERNEL)?;
        for _ in 0..policy::bitmap_words(tbl_len as usize) {
            valid.push(0, GFP_KERNEL)?;
        }
        let mut entries = KVec::new();
        for index in 0..tbl_len {
            let Ok(attr) = get_gid_attr(dev, port, index) else {
                continue;
            };
            let key = GidKey {
                gid: attr.gid(),
                gid_type: attr.gid_type(),
            };
            drop(attr);
            entries.push(Entry { key, index }, GFP_KERNEL)?;
            policy::bitmap_set(&mut valid, index as usize);
        }
        let n = policy::slots_for(entries.len());
        let mut slots = KVec::with_capacity(n, GFP_KERNEL)?;
        for _ in 0..n {
            slots.push(Slot::EMPTY, GFP_KERNEL)?;
        }
        policy::build(&entries, &mut slots).map_err(|_| EINVAL)?;
        // INVARIANT: `slots` was built just above.
        Ok(KBox::new(
            Snapshot {
                gen,
                slots,
                valid,
                _token: Token::new(Kind::GidSnapshot),
            },
            GFP_KERNEL,
        )?)
    }
}

/// One port of the device.
struct Port {
    num: u32,
    tbl_len: u32,
    /// The port is mirrored: a RoCE port, whose changes ib_core announces. Tests may clear it
    /// to force the path of IB and iWARP ports.
    indexed: AtomicBool,
    /// The current snapshot, or none before the first scan; replaced only under
    /// `GidIndex::rescan`, freed after a grace period.
    snapshot: RcuBox<Snapshot>,
    /// GID change events seen for this port (plus one for the initial scan).
    requested: AtomicU64,
    /// The value of `requested` the current snapshot reflects.
    done: AtomicU64,
    /// Table indices that became valid or invalid between consecutive snapshots.
    flips: AtomicU64,
}

impl Port {
    /// Whether the snapshot reflects every announced change; a port that is not mirrored has
    /// nothing to catch up with.
    fn current(&self) -> bool {
        !self.indexed.load(Ordering::Acquire)
            || self.done.load(Ordering::Acquire) == self.requested.load(Ordering::Acquire)
    }
}

/// What the per-device GID index keeps: its ports and counters.
#[pin_data]
pub(crate) struct Index {
    ports: KVec<Port>,
    counters: PerCpuCounters<{ Counter::COUNT }>,
    #[pin]
    rescan: Mutex<()>,
}

/// The per-device GID index: [`Index`] with the GID change handler and the rescan work that
/// keep it current.
pub(crate) type GidIndex = EventWork<Index>;

impl EventWorker for Index {
    fn event(this: &GidIndex, ev: &Event) {
        if let Some(port) = ev.gid_change_port() {
            this.changed(port);
        }
    }

    fn work(this: &GidIndex) {
        this.rescan_pending();
    }
}

impl GidIndex {
    /// Makes the index of `dev`, empty; [`GidIndex::start`] fills it once it is pinned.
    pub(crate) fn new(dev: &Device) -> Result<impl PinInit<Self, Error>> {
        let mut ports = KVec::new();
        for num in dev.port_range() {
            ports.push(
                Port {
                    num,
                    tbl_len: dev.gid_tbl_len(num),
                    indexed: AtomicBool::new(dev.port_is_roce(num)),
                    snapshot: RcuBox::new(),
                    requested: AtomicU64::new(0),
                    done: AtomicU64::new(0),
                    flips: AtomicU64::new(0),
                },
                GFP_KERNEL,
            )?;
        }
        let counters = PerCpuCounters::new()?;
        new_event_work!(
            dev,
            "ibext_gid_rescan",
            pin_init!(Index {
                ports,
                counters,
                rescan <- new_mutex!((), "GidIndex::rescan"),
            })
        )
    }

    fn inc(&self, c: Counter) {
        self.data().counters.inc(c as usize);
    }

    /// Returns the sum of counter `c` over every CPU.
    pub(crate) fn count(&self, c: Counter) -> u64 {
        self.data().counters.sum(c as usize)
    }

    /// Registers for GID change events and builds every port's snapshot (the client's `add`).
    ///
    /// A scan that cannot allocate does not fail the device: its port has no snapshot, lookups
    /// there fall back to ib_core, and each such lookup asks for the rescan again.
    pub(crate) fn start(&self) {
        for p in self.data().ports.iter() {
            p.requested.fetch_add(1, Ordering::AcqRel);
        }
        self.register();
        self.rescan_pending();
    }

    /// Tests only: mirrors port `num` or not (the path of IB and iWARP ports, which are not).
    #[cfg(ibext_kunit)]
    pub(crate) fn test_set_indexed(&self, num: u32, indexed: bool) {
        for p in self.data().ports.iter().filter(|p| p.num == num) {
            p.indexed.store(indexed, Ordering::Release);
        }
        if indexed {
            // Changes made while it was not mirrored went unscanned: rescan it.
            self.changed(num);
        }
    }

    /// Stops following the device's GID changes (the client's `remove`). Lookups still work
    /// until the state is dropped: a miss then falls back to ib_core.
    pub(crate) fn stop(&self) {
        self.unregister();
        // Events no longer queue the work; a lookup that falls back may still queue it until
        // the state is unpublished, and dropping the index cancels it for good.
        self.cancel();
        // A rescan queued by such a lookup may publish the shortcut again: harmless, the slot
        // only ever sends a lookup to ib_core's scan.
        self.set_core_scan(false);
    }

    /// Called by the event handler: port `num`'s table changed.
    fn changed(&self, num: u32) {
        for p in self.data().ports.iter().filter(|p| p.num == num) {
            p.requested.fetch_add(1, Ordering::AcqRel);
        }
        self.queue();
    }

    /// Rescans every port whose snapshot is behind its events. Returns the number of ports that
    /// could not be rescanned (out of memory); their old snapshot stays, and lookups that miss
    /// there fall back to ib_core until a later rescan succeeds.
    fn rescan_pending(&self) -> usize {
        let _guard = self.data().rescan.lock();
        let mut failed = 0;
        for p in self.data().ports.iter() {
            let want = p.requested.load(Ordering::Acquire);
            if want == p.done.load(Ordering::Acquire) || !p.indexed.load(Ordering::Acquire) {
                continue;
            }
            match Snapshot::scan(self.device(), p.num, p.tbl_len, want) {
                Ok(snap) => {
                    let flips = {
                        let rcu = RcuGuard::new();
                        let before = p.snapshot.get(&rcu).map(|s| s.valid.as_slice());
                        policy::bitmap_changes(before.unwrap_or(&[]), &snap.valid)
                    };
                    p.flips.fetch_add(flips as u64, Ordering::Relaxed);
                    let old = p.snapshot.swap(snap);
                    self.update_core_scan();
                    p.done.store(want, Ordering::Release);
                    self.inc(Counter::Rescans);
                    // Waits for every lookup that may have read the old snapshot, then frees it.
                    drop(old);
                }
                Err(_) => {
                    self.inc(Counter::RescanFailures);
                    failed += 1;
                }
            }
        }
        failed
    }

    /// Publishes whether lookups on this device go to ib_core's own scan ([`CORE_SCANS`]),
    /// from the ports' current snapshots. Called under `rescan` after a snapshot is published
    /// and before its port is marked current, so that a caller who waited for the index to be
    /// current sees the choice made for what it waited for.
    fn update_core_scan(&self) {
        let rcu = RcuGuard::new();
        let cheaper = policy::core_scan_cheaper(self.data().ports.iter().map(|p| {
            match p.snapshot.get(&rcu) {
                Some(s) if p.indexed.load(Ordering::Acquire) => policy::bitmap_weight(&s.valid),
                // Not mirrored (IB, iWARP) or not scanned yet: the index's own path, which
                // asks ib_core and counts it.
                _ => usize::MAX,
            }
        }));
        drop(rcu);
        self.set_core_scan(cheaper);
    }

    /// Publishes whether lookups on this device go to ib_core's own scan ([`CORE_SCANS`]).
    fn set_core_scan(&self, on: bool) {
        let dev = self.device();
        let slot = &CORE_SCANS[dev.index() as usize % CORE_SCAN_SLOTS];
        let me = dev.as_raw() as usize;
        if on {
            // May take the slot of another device, which then only loses the shortcut.
            slot.store(me, Ordering::Relaxed);
        } else {
            let _ = slot.compare_exchange(me, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Finds `key` on port `p`, as `rdma_find_gid_by_port` does, inside the caller's RCU
    /// read-side critical section (nothing here sleeps: `rdma_get_gid_attr` and ib_core's
    /// search take the table's rwlock with interrupts off).
    #[inline(always)]
    fn find_on_port(
        &self,
        rcu: &RcuGuard,
        p: &Port,
        key: &GidKey,
        ndev: NdevPtr,
    ) -> Result<GidAttr> {
        if !p.indexed.load(Ordering::Acquire) {
            self.inc(Counter::Unindexed);
            return upstream_find_gid(self.device(), &key.gid, key.gid_type, Some(p.num), ndev);
        }
        let mut stale = false;
        let mut snap_gen = 0;
        // Read before the snapshot: the miss below is trusted only against a snapshot at least
        // this new (`policy::miss_is_confirmed`).
        let requested = p.requested.load(Ordering::Acquire);
        match p.snapshot.get(rcu) {
            None => stale = true,
            Some(snap) => {
                snap_gen = snap.gen;
                for index in policy::lookup(&snap.slots, key) {
                    match get_gid_attr(self.device(), p.num, index) {
                        Ok(attr) if attr.matches(&key.gid, key.gid_type, ndev) => {
                            self.inc(Counter::Hits);
                            return Ok(attr);
                        }
                        // The same GID and type on another netdev: not stale, just not asked
                        // for.
                        Ok(attr) if attr.gid() == key.gid && attr.gid_type() == key.gid_type => {}
                        _ => {
                            self.inc(Counter::Stale);
                            stale = true;
                        }
                    }
                }
            }
        }
        if !policy::miss_is_confirmed(true, stale, snap_gen, requested) {
            self.inc(Counter::Fallbacks);
            // No snapshot yet counts as generation 0, which `start` has already passed.
            if snap_gen < requested {
                // A rescan that could not allocate is retried by lookups that need it (queueing
                // work is allowed in atomic context, and a no-op while it is queued).
                self.queue();
            }
            return upstream_find_gid(self.device(), &key.gid, key.gid_type, Some(p.num), ndev);
        }
        self.inc(Counter::ConfirmedMisses);
        Err(ENOENT)
    }

    /// Finds `key` on `port`, or on every port in order (`None`), as `rdma_find_gid_by_port` and
    /// `rdma_find_gid` do, inside the caller's RCU read-side critical section.
    #[inline(always)]
    pub(crate) fn find(
        &self,
        rcu: &RcuGuard,
        key: &GidKey,
        port: Option<u32>,
        ndev: NdevPtr,
    ) -> Result<GidAttr> {
        for p in self
            .data()
            .ports
            .iter()
            .filter(|p| port.map_or(true, |n| n == p.num))
        {
            match self.find_on_port(rcu, p, key, ndev) {
                Err(e) if e == ENOENT => continue,
                res => return res,
            }
        }
        Err(ENOENT)
    }

    /// Returns whether every port's snapshot reflects every GID change announced so far.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn current(&self) -> bool {
        self.data().ports.iter().all(Port::current)
    }

    /// Calls `f` with port `num`'s snapshot bitmap of valid indices, if it has a snapshot.
    #[cfg_attr(not(ibext_kunit), expect(dead_code, reason = "used by the tests only"))]
    pub(crate) fn with_valid<R>(&self, num: u32, f: impl FnOnce(&[u64]) -> R) -> Option<R> {
        let p = self.data().ports.iter().find(|p| p.num == num)?;
        let rcu = RcuGuard::new();
        p.snapshot.get(&rcu).map(|s| f(&s.valid))
    }
}

impl Show for GidIndex {
    fn show(&self, m: &mut SeqFile) -> core::fmt::Result {
        {
            for p in self.data().ports.iter() {
                let (entries, slots) = {
                    let rcu = RcuGuard::new();
                    p.snapshot
                        .get(&rcu)
                        .map_or((0, 0), |s| (policy::bitmap_weight(&s.valid), s.slots.len()))
                };
                writeln!(
                    m,
                    "port {} table {} entries {} slots {} events {} rescanned_to {} flips {}",
                    p.num,
                    p.tbl_len,
                    entries,
                    slots,
                    p.requested.load(Ordering::Relaxed),
                    p.done.load(Ordering::Relaxed),
                    p.flips.load(Ordering::Relaxed)
                )?;
            }
        }
        writeln!(
            m,
            "core_scan {}",
            u8::from(core_scan_cheaper(self.device()))
        )?;
        let st: Values<Counter, { Counter::COUNT }> = Values::read(|c| self.count(c));
        st.write(m)?;
        writeln!(m)
    }
}
