// SPDX-License-Identifier: GPL-2.0

//! One idiom for every statistic ibext keeps.
//!
//! Each object kind has an enum of its statistics that implements [`Stat`] (index, name, every
//! value in order). The storage is chosen for the writers: [`Counters`] for statistics of one
//! object that few contexts write (a pooled CQ's poller adds a whole pass with a load and a
//! store, see [`Counters::add_owned`]; its event handler and DIM work use read-modify-write), and
//! `ib::gid::PerCpuCounters` where many CPUs write at once (GID lookups, SRQ receives). Both
//! are read into [`Values`], the one snapshot that debugfs ([`Values::write`]), the tests and
//! the benchmarks ([`Values::get`]) share.

use core::{
    fmt,
    marker::PhantomData,
    sync::atomic::{AtomicU64, Ordering},
};

/// The statistics of one object kind.
pub(crate) trait Stat: Copy + 'static {
    /// Every statistic, in index order (`ALL[i].index() == i`).
    const ALL: &'static [Self];

    /// The statistic's index in its storage.
    fn index(self) -> usize;

    /// The statistic's name in debugfs.
    fn name(self) -> &'static str;
}

/// `N` counters of one object, indexed by `S`.
pub(crate) struct Counters<S: Stat, const N: usize> {
    c: [AtomicU64; N],
    _s: PhantomData<S>,
}

impl<S: Stat, const N: usize> Counters<S, N> {
    /// All zero.
    pub(crate) fn new() -> Self {
        Counters {
            c: core::array::from_fn(|_| AtomicU64::new(0)),
            _s: PhantomData,
        }
    }

    /// Adds `n` to `s` by its only writer (a load and a store, no read-modify-write: readers
    /// see whole values). Callers name the writer that owns `s`.
    pub(crate) fn add_owned(&self, s: S, n: u64) {
        if let Some(c) = self.c.get(s.index()) {
            if n != 0 {
                c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            }
        }
    }

    /// Adds `n` to `s`, which several contexts may write at once.
    pub(crate) fn add(&self, s: S, n: u64) {
        if let Some(c) = self.c.get(s.index()) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Raises `s` to at least `v`.
    pub(crate) fn max(&self, s: S, v: u64) {
        if let Some(c) = self.c.get(s.index()) {
            c.fetch_max(v, Ordering::Relaxed);
        }
    }

    /// Reads every counter.
    pub(crate) fn values(&self) -> Values<S, N> {
        let mut v = [0u64; N];
        for (out, c) in v.iter_mut().zip(self.c.iter()) {
            *out = c.load(Ordering::Relaxed);
        }
        Values::new(v)
    }
}

/// The values of an object's statistics, read at one time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Values<S: Stat, const N: usize> {
    v: [u64; N],
    _s: PhantomData<S>,
}

impl<S: Stat, const N: usize> Default for Values<S, N> {
    fn default() -> Self {
        Self::new([0; N])
    }
}

impl<S: Stat, const N: usize> Values<S, N> {
    /// Wraps values in index order.
    pub(crate) fn new(v: [u64; N]) -> Self {
        Values { v, _s: PhantomData }
    }

    /// Reads every statistic with `f` (per-CPU counters summed, say).
    pub(crate) fn read(f: impl Fn(S) -> u64) -> Self {
        let mut v = [0u64; N];
        for s in S::ALL {
            if let Some(out) = v.get_mut(s.index()) {
                *out = f(*s);
            }
        }
        Self::new(v)
    }

    /// Returns `s`.
    pub(crate) fn get(&self, s: S) -> u64 {
        self.v.get(s.index()).copied().unwrap_or(0)
    }

    /// Writes `name value` for every statistic, in order, separated by spaces.
    pub(crate) fn write(&self, m: &mut impl fmt::Write) -> fmt::Result {
        for (i, s) in S::ALL.iter().enumerate() {
            if i > 0 {
                m.write_str(" ")?;
            }
            write!(m, "{} {}", s.name(), self.get(*s))?;
        }
        Ok(())
    }
}

/// Declares the statistics enum of an object kind and its [`Stat`] implementation from one
/// list: each variant with its debugfs name, in index order; `COUNT` is the number of them.
macro_rules! stat_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $var:ident => $str:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name {
            $( $(#[$vmeta])* $var, )*
        }

        impl $name {
            /// The number of statistics.
            $vis const COUNT: usize = [$($str),*].len();
        }

        impl $crate::stats::Stat for $name {
            const ALL: &'static [Self] = &[$($name::$var),*];

            fn index(self) -> usize {
                self as usize
            }

            fn name(self) -> &'static str {
                match self {
                    $( $name::$var => $str, )*
                }
            }
        }
    };
}
pub(crate) use stat_enum;
