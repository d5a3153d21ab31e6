// SPDX-License-Identifier: GPL-2.0

//! Host tests of the policy code, with a small deterministic PRNG for randomized sequences.

mod cq_pool;
mod engine;
mod gid_index;
mod moderation;
mod soft_dim;
mod srq_growth;
mod srq_pool;

/// xorshift64*: deterministic, seedable, no dependencies.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
