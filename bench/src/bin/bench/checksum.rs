//! A fast, order-sensitive 64-bit checksum, computed per block on all cores, of
//! host memory and of what reached the device (copied back outside the timed runs).

use crate::util::Result;
use std::ops::Range;
use wirespeed_cuda::{DeviceBuffer, PinnedBuffer, Stream};

/// The checksum is defined over blocks of this many bytes (the last may be
/// shorter), hashed independently and then folded in order.
pub const BLOCK: usize = 16 << 20;

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;

fn word(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// Streaming hasher: four independent lanes of 8-byte words (so it runs near
/// memory speed), any split of the input gives the same result.
#[derive(Clone)]
pub struct Hasher {
    lanes: [u64; 4],
    buf: [u8; 32],
    buf_len: usize,
    total: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Hasher { lanes: [P1, P2, P3, P1 ^ P2], buf: [0; 32], buf_len: 0, total: 0 }
    }
}

impl Hasher {
    #[inline(always)]
    fn round(lanes: &mut [u64; 4], c: &[u8]) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = (lane.rotate_left(31) ^ word(&c[i * 8..])).wrapping_mul(P1);
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.buf_len > 0 {
            let take = (32 - self.buf_len).min(data.len());
            self.buf[self.buf_len..self.buf_len + take].copy_from_slice(&data[..take]);
            self.buf_len += take;
            data = &data[take..];
            if self.buf_len < 32 {
                return;
            }
            let buf = self.buf;
            Self::round(&mut self.lanes, &buf);
            self.buf_len = 0;
        }
        let mut lanes = self.lanes;
        let mut chunks = data.chunks_exact(32);
        for c in &mut chunks {
            Self::round(&mut lanes, c);
        }
        self.lanes = lanes;
        let rest = chunks.remainder();
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buf_len = rest.len();
    }

    pub fn finish(&self) -> u64 {
        let mut h = self.total.wrapping_mul(P2);
        for (i, lane) in self.lanes.iter().enumerate() {
            h = (h ^ avalanche(lane.wrapping_add(i as u64))).wrapping_mul(P3).rotate_left(27);
        }
        for &b in &self.buf[..self.buf_len] {
            h = (h ^ u64::from(b)).wrapping_mul(P1);
        }
        avalanche(h)
    }
}

fn hash(data: &[u8]) -> u64 {
    let mut h = Hasher::default();
    h.update(data);
    h.finish()
}

/// Folds block hashes, in order, into the checksum of `total` bytes.
#[derive(Clone, Copy)]
pub struct Fold {
    h: u64,
    total: u64,
}

impl Default for Fold {
    fn default() -> Self {
        Fold { h: P3, total: 0 }
    }
}

impl Fold {
    pub fn push(&mut self, block_hash: u64, block_len: usize) {
        self.h = avalanche(self.h ^ block_hash).wrapping_add(P2);
        self.total += block_len as u64;
    }
    pub fn finish(self) -> u64 {
        avalanche(self.h ^ self.total.wrapping_mul(P1))
    }
}

/// The hashes of the [`BLOCK`]-sized blocks of `data`, on up to `threads` threads.
fn block_hashes(data: &[u8], threads: usize) -> Vec<u64> {
    let blocks: Vec<&[u8]> = data.chunks(BLOCK).collect();
    let threads = threads.clamp(1, blocks.len().max(1));
    if threads == 1 {
        return blocks.iter().map(|b| hash(b)).collect();
    }
    let mut out = vec![0u64; blocks.len()];
    let per = blocks.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (outs, ins) in out.chunks_mut(per).zip(blocks.chunks(per)) {
            s.spawn(move || {
                for (o, b) in outs.iter_mut().zip(ins) {
                    *o = hash(b);
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
    let mut h = Hasher::default();
    let mut in_block = 0usize;
    for part in parts {
        let mut p = *part;
        while !p.is_empty() {
            let take = (BLOCK - in_block).min(p.len());
            h.update(&p[..take]);
            in_block += take;
            p = &p[take..];
            if in_block == BLOCK {
                fold.push(h.finish(), BLOCK);
                h = Hasher::default();
                in_block = 0;
            }
        }
    }
    if in_block > 0 {
        fold.push(h.finish(), in_block);
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
        let mut h1 = Hasher::default();
        h1.update(&data[..100]);
        let mut h2 = Hasher::default();
        for ch in data[..100].chunks(7) {
            h2.update(ch);
        }
        assert_eq!(h1.finish(), h2.finish());
        let mut flipped = data.clone();
        flipped[20_000_000] ^= 1;
        assert_ne!(whole, of_host(&flipped, 4));
        let mut swapped = data.clone();
        swapped.swap(8, 16); // two words of one lane change places
        assert_ne!(data[8], data[16]);
        assert_ne!(whole, of_host(&swapped, 4));
        assert_ne!(of_host(&data[..BLOCK], 1), of_host(&data[..BLOCK + 1], 1));
    }
}
