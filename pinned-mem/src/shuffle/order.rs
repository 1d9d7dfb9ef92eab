//! Which records each batch holds: a permutation of an epoch that costs a few
//! words of state, whatever the number of records, and its split by rank.

use std::ops::Range;

use crate::error::{Error, Result};

/// SplitMix64's finalizer: a bijective mix of 64 bits.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A key derived from a seed and the words that name one use of it.
pub(crate) fn key(seed: u64, words: &[u64]) -> u64 {
    words.iter().fold(mix(seed), |k, &w| mix(k ^ mix(w)))
}

/// Rounds of the Feistel network: four, with SplitMix64's finalizer keyed by
/// the round as the round function (what a pseudo-random permutation needs;
/// the gather kernel and the emulator compute the same).
const ROUNDS: u64 = 4;
/// Keeps the rounds' keys apart.
const ROUND_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// A pseudo-random permutation of `0..n`, computed one element at a time: a
/// Feistel network over the smallest power of two that holds `n`, walked
/// until it lands below `n` (fewer than two steps on average). Its state is
/// two words, so 25 million records cost nothing to shuffle.
///
/// ```
/// use wirespeed_pinned::Permutation;
/// let p = Permutation::new(10, 42);
/// let mut seen: Vec<u64> = (0..10).map(|i| p.at(i)).collect();
/// seen.sort();
/// assert_eq!(seen, (0..10).collect::<Vec<_>>());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    key: u64,
    lo_bits: u32,
    hi_bits: u32,
}

impl Permutation {
    /// The permutation of `0..n` that `key` selects.
    pub fn new(n: u64, key: u64) -> Permutation {
        // At least 2 bits (a domain of 4), split into two halves that differ by at most one bit.
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        Permutation { n, key, lo_bits: bits / 2, hi_bits: bits - bits / 2 }
    }

    /// The identity of `0..n`: every element stays where it is (no shuffle).
    pub fn identity(n: u64) -> Permutation {
        Permutation { n, key: 0, lo_bits: 0, hi_bits: 0 }
    }

    /// The key and the two halves' widths (`hi << 8 | lo`; 0: the identity),
    /// as the gather kernel takes them.
    pub(crate) fn kernel_params(&self) -> (u64, u64) {
        (self.key, u64::from(self.hi_bits) << 8 | u64::from(self.lo_bits))
    }

    /// The number of elements.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True when it permutes nothing.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The element at position `i` (`i < len()`); positions past the end map to themselves.
    pub fn at(&self, i: u64) -> u64 {
        if i >= self.n || self.lo_bits + self.hi_bits == 0 {
            return i;
        }
        let mut x = i;
        loop {
            x = self.round_trip(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn round_trip(&self, x: u64) -> u64 {
        let (mut a, mut b) = (self.hi_bits, self.lo_bits); // widths of hi and lo
        let (mut hi, mut lo) = (x >> b, x & mask(b));
        for round in 0..ROUNDS {
            let f = mix(self.key ^ (round + 1).wrapping_mul(ROUND_STEP) ^ lo) & mask(a);
            (hi, lo) = (lo, hi ^ f);
            (a, b) = (b, a);
        }
        (hi << b) | lo
    }
}

fn mask(bits: u32) -> u64 {
    if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 }
}

/// How an epoch is cut between ranks and into batches, as PyTorch's
/// `DistributedSampler` and `DataLoader` cut it.
///
/// The epoch's records, in their shuffled order, are padded (the first ones
/// repeated, so that every rank gets as many) or cut (`drop_last`: the extra
/// ones dropped) to a multiple of the world size; rank `r` gets the `r`-th of
/// `world` equal, contiguous parts. Its part is cut into batches of
/// `batch_size` records, the last one shorter unless `drop_last` drops it.
///
/// ```
/// use wirespeed_pinned::Sharding;
/// let s = Sharding::new(10, 4, 1, 3, false)?; // 10 records, batches of 4, rank 1 of 3
/// assert_eq!(s.per_rank(), 4);              // 10 padded to 12
/// assert_eq!(s.positions(), 4..8);
/// assert_eq!(s.batches(), 1);
/// let d = Sharding::new(10, 4, 1, 3, true)?; // drop_last: 9 records, then whole batches
/// assert_eq!((d.per_rank(), d.batches()), (3, 0));
/// # Ok::<(), wirespeed_pinned::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    records: u64,
    batch: u64,
    rank: u64,
    world: u64,
    drop_last: bool,
}

impl Sharding {
    /// Checks and keeps the cut.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `batch_size` or `world` is 0, when
    /// `rank >= world`, or when there are no records.
    pub fn new(records: u64, batch_size: u64, rank: u64, world: u64, drop_last: bool) -> Result<Sharding> {
        if batch_size == 0 {
            return Err(Error::invalid("batches", "the batch size is 0: pass 1 or more records per batch"));
        }
        if world == 0 || rank >= world {
            return Err(Error::invalid(
                "batches",
                format!("rank {rank} of a world of {world}: the rank must be below the world size (0..{world})"),
            ));
        }
        if records == 0 {
            return Err(Error::invalid("batches", "there are no records to draw batches from"));
        }
        Ok(Sharding { records, batch: batch_size, rank, world, drop_last })
    }

    /// Records of one epoch, over every rank, after padding or cutting (at
    /// most `u64::MAX`: positions past it are not counted).
    pub fn total(&self) -> u64 {
        self.per_rank().saturating_mul(self.world)
    }

    /// Records of one rank in one epoch (whole batches and the last, shorter one).
    pub fn per_rank(&self) -> u64 {
        if self.drop_last { self.records / self.world } else { self.records.div_ceil(self.world) }
    }

    /// This rank's positions in the epoch's padded order (clipped to
    /// `u64::MAX`, past which no position is counted).
    pub fn positions(&self) -> Range<u64> {
        let n = self.per_rank();
        let start = self.rank.saturating_mul(n);
        start..start.saturating_add(n)
    }

    /// Batches of this rank in one epoch.
    pub fn batches(&self) -> u64 {
        let n = self.per_rank();
        if self.drop_last { n / self.batch } else { n.div_ceil(self.batch) }
    }

    /// Records of each batch (the last one may have fewer).
    pub fn batch_size(&self) -> u64 {
        self.batch
    }

    /// The positions in the epoch's padded order of this rank's batch `b`
    /// (empty past the last batch).
    pub fn batch(&self, b: u64) -> Range<u64> {
        if b >= self.batches() {
            return 0..0;
        }
        let Range { start, end } = self.positions();
        let lo = start.saturating_add(b.saturating_mul(self.batch)).min(end);
        lo..lo.saturating_add(self.batch).min(end)
    }

    /// The record count of the epoch before padding.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The rank and the world size.
    pub fn rank(&self) -> (u64, u64) {
        (self.rank, self.world)
    }

    /// Whether the last short batch and the records that do not divide by the
    /// world size are dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Position `p` of the padded order as a position of the unpadded one (the
    /// padding repeats the epoch from its start).
    pub fn unpad(&self, p: u64) -> u64 {
        p % self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections_of_every_small_size() {
        for n in 0..300u64 {
            for k in 0..3 {
                let p = Permutation::new(n, key(7, &[n, k]));
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let x = p.at(i);
                    assert!(x < n && !seen[x as usize], "n {n}: {i} -> {x} twice or out of range");
                    seen[x as usize] = true;
                }
            }
        }
    }

    #[test]
    fn permutations_of_large_domains_stay_in_range_and_differ_by_key() {
        let n = 25_000_000u64;
        let (a, b) = (Permutation::new(n, key(1, &[0])), Permutation::new(n, key(1, &[1])));
        let mut same = 0;
        for i in (0..n).step_by(9973) {
            assert!(a.at(i) < n && b.at(i) < n);
            same += u64::from(a.at(i) == b.at(i));
        }
        assert!(same < 5, "{same} equal positions of {}", n / 9973);
        // A large permutation's first elements are spread, not ascending.
        let first: Vec<u64> = (0..16).map(|i| a.at(i)).collect();
        assert!(first.windows(2).filter(|w| w[1] > w[0]).count() < 15, "{first:?}");
    }

    #[test]
    fn sharding_covers_every_record_once_padded_or_cut() {
        for (n, world, bs) in [(10u64, 3u64, 4u64), (12, 3, 5), (7, 8, 2), (1, 1, 1), (100, 7, 9)] {
            for drop_last in [false, true] {
                let mut count = vec![0u32; n as usize];
                let mut total = 0;
                for rank in 0..world {
                    let s = Sharding::new(n, bs, rank, world, drop_last).unwrap();
                    let mut covered = s.positions().start;
                    for b in 0..s.batches() {
                        let r = s.batch(b);
                        assert_eq!(r.start, covered);
                        assert!(r.end - r.start <= bs && (!drop_last || r.end - r.start == bs));
                        covered = r.end;
                        for p in r {
                            count[s.unpad(p) as usize] += 1;
                            total += 1;
                        }
                    }
                    assert!(drop_last || covered == s.positions().end);
                }
                if drop_last {
                    assert!(count.iter().all(|&c| c <= 1), "{n} {world} {bs}: {count:?}");
                } else {
                    assert!(count.iter().all(|&c| c >= 1), "{n} {world} {bs}: {count:?}");
                    assert_eq!(total, Sharding::new(n, bs, 0, world, false).unwrap().total());
                }
            }
        }
    }

    #[test]
    fn bad_cuts_are_typed_errors() {
        assert!(Sharding::new(10, 0, 0, 1, false).is_err());
        assert!(Sharding::new(10, 1, 1, 1, false).is_err());
        assert!(Sharding::new(10, 1, 0, 0, false).is_err());
        assert!(Sharding::new(0, 1, 0, 1, false).is_err());
        assert!(Sharding::new(u64::MAX, 1 << 40, (1 << 40) - 1, 1 << 40, false).is_ok());
    }
}
