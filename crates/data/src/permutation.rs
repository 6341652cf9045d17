//! The order of examples within an epoch: a seeded bijection on `0..len`, computed per position.
//!
//! A balanced Feistel network permutes the smallest even-width power of two that covers `len`;
//! positions that land outside `0..len` are walked along their cycle until they land inside
//! ("cycle walking", Black and Rogaway 2002), which keeps the map a bijection on `0..len`. Nothing
//! is materialized, so a billion-example epoch costs no memory and any position is O(1)
//! (expected fewer than four network evaluations).

use crate::rng::{hash_words, mix64};

/// Domain tag for the per-epoch round keys.
const DOMAIN_EPOCH: u64 = 0x6570_6f63_685f_7065; // "epoch_pe"

/// Feistel rounds. Four rounds already make a pseudo-random permutation (Luby-Rackoff); six
/// leave margin for the weak round function on small domains.
const ROUNDS: usize = 6;

/// The permutation of one epoch of a finite source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPermutation {
    len: u64,
    /// Bits in each half of the Feistel block.
    half_bits: u32,
    round_keys: [u64; ROUNDS],
}

impl EpochPermutation {
    /// The permutation of `0..len` for `(seed, epoch)`. Different epochs get unrelated orders.
    pub fn new(seed: u64, epoch: u64, len: u64) -> Self {
        // Width of the block: enough bits for len - 1, rounded up to an even number (min 2).
        let needed_bits = u64::BITS - len.saturating_sub(1).leading_zeros();
        let half_bits = needed_bits.div_ceil(2).max(1);
        let round_keys = std::array::from_fn(|round| hash_words(&[DOMAIN_EPOCH, seed, epoch, round as u64]));
        Self { len, half_bits, round_keys }
    }

    /// The number of positions.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the permutation is over an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `position` goes, or `None` if `position >= len`.
    pub fn apply(&self, position: u64) -> Option<u64> {
        if position >= self.len {
            return None;
        }
        // The walk ends: `position` is in range and lies on a finite cycle of the block cipher.
        let mut x = position;
        loop {
            x = self.feistel(x);
            if x < self.len {
                return Some(x);
            }
        }
    }

    fn feistel(&self, block: u64) -> u64 {
        let mask = if self.half_bits == 32 { u64::from(u32::MAX) } else { (1 << self.half_bits) - 1 };
        let mut left = block >> self.half_bits;
        let mut right = block & mask;
        for key in self.round_keys {
            let mixed = left ^ (mix64(right ^ key) & mask);
            left = right;
            right = mixed;
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(seed: u64, epoch: u64, len: u64) -> Vec<u64> {
        let permutation = EpochPermutation::new(seed, epoch, len);
        (0..len).map(|i| permutation.apply(i).expect("in range")).collect()
    }

    #[test]
    fn is_a_bijection_for_many_sizes() {
        for len in (1..=70).chain([127, 128, 129, 1000, 4097]) {
            let mut seen = image(42, 3, len);
            seen.sort_unstable();
            assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len}");
        }
    }

    #[test]
    fn out_of_range_positions_have_no_image() {
        let permutation = EpochPermutation::new(1, 0, 10);
        assert_eq!(permutation.apply(10), None);
        assert_eq!(permutation.apply(u64::MAX), None);
        assert_eq!(EpochPermutation::new(1, 0, 0).apply(0), None);
    }

    #[test]
    fn depends_on_seed_and_epoch_but_nothing_else() {
        let base = image(5, 0, 500);
        assert_eq!(base, image(5, 0, 500));
        assert_ne!(base, image(6, 0, 500));
        assert_ne!(base, image(5, 1, 500));
        // It actually shuffles: few fixed points in a 500-long permutation.
        let fixed = base.iter().enumerate().filter(|&(i, &x)| i as u64 == x).count();
        assert!(fixed < 10, "{fixed} fixed points");
    }

    #[test]
    fn huge_domains_stay_in_range() {
        for len in [u64::MAX, (1 << 63) + 1, 1 << 40] {
            let permutation = EpochPermutation::new(9, 9, len);
            for position in [0, 1, len / 2, len - 1] {
                let x = permutation.apply(position).expect("in range");
                assert!(x < len);
            }
        }
    }
}
