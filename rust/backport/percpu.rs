// SPDX-License-Identifier: GPL-2.0

//! Per-CPU counters: [`PerCpuCounters`]. 6.12's `kernel::` has no per-CPU variables (mainline
//! grows a `kernel::percpu` later); these are `alloc_percpu(u64)` through the C shim.

use crate::bindings;
use core::ptr::NonNull;
use kernel::prelude::*;

/// `N` per-CPU `u64` counters, for statistics that many CPUs write at once (lookups run on
/// every CPU and must not share a cache line to count).
///
/// # Invariants
///
/// `self.0` points to `N` per-CPU counters from `ibext_shim_counters_alloc`, freed on drop.
pub(crate) struct PerCpuCounters<const N: usize>(NonNull<u64>);

// SAFETY: Each CPU increments its own copy with preemption disabled (`this_cpu_inc`), and the
// sum reads every copy; both are safe from any CPU.
unsafe impl<const N: usize> Send for PerCpuCounters<N> {}
// SAFETY: As for `Send`.
unsafe impl<const N: usize> Sync for PerCpuCounters<N> {}

impl<const N: usize> PerCpuCounters<N> {
    /// Allocates the counters, all zero.
    pub(crate) fn new() -> Result<Self> {
        let n = u32::try_from(N).map_err(|_| EINVAL)?;
        // SAFETY: FFI call; the result is checked.
        let c = unsafe { bindings::ibext_shim_counters_alloc(n) };
        // INVARIANT: non-null results come from `ibext_shim_counters_alloc`.
        NonNull::new(c).map(PerCpuCounters).ok_or(ENOMEM)
    }

    /// Adds one to counter `i` on this CPU; an `i` out of range is ignored.
    pub(crate) fn inc(&self, i: usize) {
        if i < N {
            // SAFETY: `N` per-CPU counters are allocated (type invariant) and `i < N`.
            unsafe { bindings::ibext_shim_counter_inc(self.0.as_ptr(), i as u32) };
        }
    }

    /// Returns counter `i` summed over every CPU (0 for an `i` out of range).
    pub(crate) fn sum(&self, i: usize) -> u64 {
        if i >= N {
            return 0;
        }
        // SAFETY: As in `inc`.
        unsafe { bindings::ibext_shim_counter_sum(self.0.as_ptr(), i as u32) }
    }
}

impl<const N: usize> Drop for PerCpuCounters<N> {
    fn drop(&mut self) {
        // SAFETY: Allocated in `new` (type invariant) and no longer used.
        unsafe { bindings::ibext_shim_counters_free(self.0.as_ptr()) };
    }
}
