//! The data checksum, computed per block on all cores, of host memory and of
//! what reached the device (copied back outside the timed runs): XXH3-64 of
//! each [`BLOCK`]-sized block, and XXH3-64 of those block hashes, in order,
//! and the total length. It depends on the bytes and their order only, not on
//! how the data is split into parts or threads.

use crate::util::Result;
use std::ops::Range;
use wirespeed_cuda::{DeviceBuffer, PinnedBuffer, Stream};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// The checksum is defined over blocks of this many bytes (the last may be
/// shorter), hashed independently and then folded in order.
pub const BLOCK: usize = 16 << 20;

/// Folds block hashes, in order, into the checksum of `total` bytes.
#[derive(Clone, Default)]
pub struct Fold {
    h: Xxh3,
    total: u64,
}

impl Fold {
    pub fn push(&mut self, block_hash: u64, block_len: usize) {
        self.h.update(&block_hash.to_le_bytes());
        self.total += block_len as u64;
    }
    pub fn finish(mut self) -> u64 {
        self.h.update(&self.total.to_le_bytes());
        self.h.digest()
    }
}

/// The hashes of the [`BLOCK`]-sized blocks of `data`, on up to `threads` threads.
fn block_hashes(data: &[u8], threads: usize) -> Vec<u64> {
    let blocks: Vec<&[u8]> = data.chunks(BLOCK).collect();
    let threads = threads.clamp(1, blocks.len().max(1));
    if threads == 1 {
        return blocks.iter().map(|b| xxh3_64(b)).collect();
    }
    let mut out = vec![0u64; blocks.len()];
    let per = blocks.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (outs, ins) in out.chunks_mut(per).zip(blocks.chunks(per)) {
            s.spawn(move || {
                for (o, b) in outs.iter_mut().zip(ins) {
                    *o = xxh3_64(b);
                }
            });
        }
    });
    out
}

/// Adds `data` (whose length must be a multiple of [`BLOCK`] unless it is the last part).
pub fn fold_in(fold: &mut Fold, data: &[u8], threads: usize) {
    for (h, b) in block_hashes(data, threads).into_iter().zip(data.chunks(BLOCK)) {
        fold.push(h, b.len());
    }
}

/// The checksum of host memory, on up to `threads` threads.
pub fn of_host(data: &[u8], threads: usize) -> u64 {
    let mut f = Fold::default();
    fold_in(&mut f, data, threads);
    f.finish()
}

/// The checksum of the concatenation of `parts` (the same value as [`of_host`]
/// of the concatenation), one thread.
pub fn of_parts(parts: &[&[u8]]) -> u64 {
    let mut fold = Fold::default();
    let mut h = Xxh3::new();
    let mut in_block = 0usize;
    for part in parts {
        let mut p = *part;
        while !p.is_empty() {
            let take = (BLOCK - in_block).min(p.len());
            h.update(&p[..take]);
            in_block += take;
            p = &p[take..];
            if in_block == BLOCK {
                fold.push(h.digest(), BLOCK);
                h.reset();
                in_block = 0;
            }
        }
    }
    if in_block > 0 {
        fold.push(h.digest(), in_block);
    }
    fold.finish()
}

/// Reads device memory back through a pinned bounce buffer and checksums it.
pub struct Readback {
    stream: Stream,
    bounce: PinnedBuffer<u8>,
    threads: usize,
}

impl Readback {
    /// A bounce buffer of `bytes` (rounded to whole blocks, at least one).
    pub fn new(stream: &Stream, bytes: usize, threads: usize) -> Result<Readback> {
        let n = bytes.div_ceil(BLOCK).max(1) * BLOCK;
        Ok(Readback { stream: stream.clone(), bounce: PinnedBuffer::new(n)?, threads })
    }

    /// The checksum of `buf[range]`.
    pub fn checksum(&mut self, buf: &DeviceBuffer<u8>, range: Range<usize>) -> Result<u64> {
        let mut fold = Fold::default();
        let step = self.bounce.len();
        let mut at = range.start;
        while at < range.end {
            let n = step.min(range.end - at);
            let src = buf.slice(at..at + n)?;
            let mut dst = self.bounce.slice_mut(..n)?;
            self.stream.copy_to_host(&src, &mut dst)?.wait()?;
            fold_in(&mut fold, &self.bounce.as_slice()?[..n], self.threads);
            at += n;
        }
        Ok(fold.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_invariant_and_sensitive() {
        let data: Vec<u8> = (0..(2 * BLOCK + 12345)).map(|i| (i * 7 + i / 300) as u8).collect();
        let whole = of_host(&data, 4);
        assert_eq!(whole, of_host(&data, 1));
        let (a, b) = data.split_at(BLOCK + 77);
        let (b, c) = b.split_at(5);
        assert_eq!(whole, of_parts(&[a, b, c]));
        assert_eq!(of_host(&data[..100], 1), of_parts(&[&data[..7], &data[7..100]]));
        let mut flipped = data.clone();
        flipped[20_000_000] ^= 1;
        assert_ne!(whole, of_host(&flipped, 4));
        let mut swapped = data.clone();
        swapped.swap(8, 16); // two bytes change places
        assert_ne!(data[8], data[16]);
        assert_ne!(whole, of_host(&swapped, 4));
        assert_ne!(of_host(&data[..BLOCK], 1), of_host(&data[..BLOCK + 1], 1));
    }
}
