//! Which record each position of an epoch holds, and where it lies: the whole
//! epoch shuffled ([`FullOrder`]), or blocks of the file through a pool of two
//! halves in device memory ([`PoolOrder`]).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use wirespeed_cuda::locks::lock;

use super::order::{Permutation, Sharding, key};
use crate::error::{Error, Result};

/// Words that keep the keys of different uses of one seed apart.
const EPOCH: u64 = 1;
const BLOCKS: u64 = 2;
const GROUP: u64 = 3;
const SHORT: u64 = 4;

/// Every record of the epoch in one shuffled order: position `p` of the
/// padded order holds record `perm(p mod n)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FullOrder {
    perm: Permutation,
    cut: Sharding,
}

impl FullOrder {
    pub(crate) fn new(cut: Sharding, seed: u64, epoch: u64, shuffle: bool) -> FullOrder {
        let k = key(seed, &[EPOCH, epoch]);
        let perm = if shuffle { Permutation::new(cut.records(), k) } else { Permutation::identity(cut.records()) };
        FullOrder { perm, cut }
    }

    /// Batch `b`'s first position in the padded order, and the permutation,
    /// for the gather kernel that computes the batch's records itself.
    pub(crate) fn kernel_params(&self, b: u64) -> (u64, Permutation) {
        (self.cut.batch(b).start, self.perm)
    }

    /// The record at each position of this rank's batch `b`, into `out`.
    pub(crate) fn batch(&self, b: u64, out: &mut Vec<u64>) {
        out.clear();
        out.extend(self.cut.batch(b).map(|p| self.perm.at(self.cut.unpad(p))));
    }
}

/// A piece of a block: the part of one block of the file that falls in one
/// rank's share of the epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The records of the file it holds.
    pub records: Range<u64>,
}

impl Piece {
    fn len(&self) -> u64 {
        self.records.end - self.records.start
    }
}

/// How the pool is cut: records per block, and blocks per half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolShape {
    /// Records of a block (a slot of the pool holds one).
    pub block_records: u64,
    /// Slots of each of the two halves.
    pub slots: u64,
}

/// One epoch of one rank through the pool.
///
/// The file's blocks are put in a random order (the short last block, if
/// any, at a random place among them too, so that `drop_last` drops other
/// records each epoch, unless the group that holds it would then hold
/// fewer records than a batch), so that the epoch's order is the blocks'
/// records in that order; the rank's share of it (a contiguous range, as [`Sharding`]
/// cuts) is a run of *pieces* (whole blocks, and parts of blocks at its ends).
/// Group `g` is the run's pieces `g * slots .. (g + 1) * slots`, streamed into
/// half `g % 2` of the pool, one piece per slot; the group's records are
/// handed out in a random order of their own. Group `g + 2` streams into the
/// half of group `g` once every batch that reads group `g` was gathered, while
/// the batches of group `g + 1` are handed out.
#[derive(Debug)]
pub(crate) struct PoolOrder {
    cut: Sharding,
    shape: PoolShape,
    blocks: Permutation,
    full_blocks: u64,
    /// Where the short last block (if any) comes in the blocks' order: after
    /// this many whole blocks.
    short_at: u64,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    /// Start of each group in the rank's share, and the share's length at the end.
    group_starts: Vec<u64>,
    /// The permuted positions of the last groups batches drew from, by group
    /// parity ([`GroupTable`]).
    tables: Tables,
}

/// [`PoolOrder`]'s tables.
#[derive(Default)]
struct Tables(Mutex<[Option<GroupTable>; 2]>);

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tables")
    }
}

/// Where each position of a group goes in its permuted order, computed once
/// per group by several threads: the permutation costs tens of nanoseconds a
/// position, which for every record of every batch on the loader's thread
/// was the bound of the pool's batches. The next group's is made in the
/// background once its blocks start streaming ([`PoolOrder::prepare_table`]):
/// made by the group's first batch, it held that batch up for milliseconds.
struct GroupTable {
    group: u64,
    at: Table,
}

/// A group's table, made or still being made on a thread of its own.
enum Table {
    Ready(Arc<Vec<u32>>),
    Making(std::thread::JoinHandle<Vec<u32>>),
}

/// Threads that compute a group's table.
const TABLE_THREADS: usize = 8;

/// `perm.at(i)` for every `i` of `0..perm.len()` (which fits `u32`); a
/// part whose thread cannot be started is computed here.
fn table_of(perm: &Permutation) -> Vec<u32> {
    let n = perm.len() as usize;
    let mut at = vec![0u32; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, TABLE_THREADS);
    let chunk = n.div_ceil(threads).max(1 << 16);
    let mut left = Vec::new();
    std::thread::scope(|s| {
        let mut rest: &mut [u32] = &mut at;
        let mut first = 0;
        while !rest.is_empty() {
            let (part, tail) = rest.split_at_mut(chunk.min(rest.len()));
            rest = tail;
            let (start, end) = (first, first + part.len());
            first = end;
            if std::thread::Builder::new().spawn_scoped(s, move || fill(perm, start, part)).is_err() {
                left.push(start..end);
            }
        }
    });
    for r in left {
        fill(perm, r.start, &mut at[r]);
    }
    at
}

/// `part[j] = perm.at(first + j)`.
fn fill(perm: &Permutation, first: usize, part: &mut [u32]) {
    for (j, v) in part.iter_mut().enumerate() {
        *v = perm.at((first + j) as u64) as u32;
    }
}

impl PoolOrder {
    /// The epoch's order for the rank of `cut`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a batch would read more than two
    /// groups at once (the pool's halves are too small for the batch size).
    pub(crate) fn new(cut: Sharding, shape: PoolShape, seed: u64, epoch: u64, shuffle: bool) -> Result<PoolOrder> {
        let n = cut.records();
        let full_blocks = n / shape.block_records;
        let k = key(seed, &[BLOCKS, epoch]);
        let blocks = if shuffle { Permutation::new(full_blocks, k) } else { Permutation::identity(full_blocks) };
        // The short block goes anywhere where the group that holds it still
        // holds a batch; in a pool of one slot a half, it stays last.
        let t = shape.block_records;
        let movable = shape.slots.saturating_sub(1).saturating_mul(t) + (n - full_blocks * t) >= cut.batch_size();
        let short_at = if shuffle && movable { key(seed, &[SHORT, epoch]) % (full_blocks + 1) } else { full_blocks };
        let tables = Tables::default();
        let group_starts = Vec::new();
        let mut order =
            PoolOrder { cut, shape, blocks, full_blocks, short_at, shuffle, seed, epoch, group_starts, tables };
        order.group_starts = order.find_groups();
        order.check_batches_fit()?;
        Ok(order)
    }

    fn share(&self) -> Range<u64> {
        self.cut.positions()
    }

    /// The block that holds position `q` of the epoch's (unpadded) order,
    /// where `q` is in it, and the block's records: whole blocks in the
    /// permutation's order, with the short last block after `short_at` of them.
    fn locate(&self, q: u64) -> (u64, u64, u64) {
        let t = self.shape.block_records;
        let short = self.cut.records() - self.full_blocks * t;
        let before = self.short_at * t;
        if short == 0 || q < before {
            (self.blocks.at(q / t), q % t, t)
        } else if q < before + short {
            (self.full_blocks, q - before, short)
        } else {
            let r = q - short;
            (self.blocks.at(r / t), r % t, t)
        }
    }

    /// The piece that holds padded position `p`, and where `p` is in it.
    fn piece_at(&self, p: u64) -> (Piece, u64) {
        let t = self.shape.block_records;
        let q = self.cut.unpad(p);
        let (block, within, block_len) = self.locate(q);
        // The piece runs from the later of the block's start and the share's
        // start (or the wrap to the epoch's start), to the earlier of the
        // block's end and the share's end (or the wrap).
        let share = self.share();
        let wrap = p - q + self.cut.records(); // the padded position where the order starts over
        let first = p - within.min(p - share.start.max(p - q));
        let last = (p + (block_len - within)).min(share.end).min(wrap);
        let start_record = block * t + within - (p - first);
        (Piece { records: start_record..start_record + (last - first) }, p - first)
    }

    fn find_groups(&self) -> Vec<u64> {
        let share = self.share();
        let mut starts = Vec::new();
        let (mut p, mut pieces) = (share.start, 0u64);
        while p < share.end {
            if pieces % self.shape.slots == 0 {
                starts.push(p - share.start);
            }
            let (piece, at) = self.piece_at(p);
            p += piece.len() - at;
            pieces += 1;
        }
        starts.push(share.end - share.start);
        starts
    }

    fn check_batches_fit(&self) -> Result<()> {
        let b = self.cut.batch_size();
        let groups = self.groups();
        for g in 0..groups.saturating_sub(1) {
            let r = self.group_range(g);
            if r.end - r.start < b {
                return Err(Error::invalid(
                    "shuffle pool",
                    format!(
                        "a group of the pool holds {} records, fewer than a batch of {b}: give the pool more device \
                         memory or make batches smaller",
                        r.end - r.start
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Groups of this rank's epoch.
    pub(crate) fn groups(&self) -> u64 {
        self.group_starts.len() as u64 - 1
    }

    /// Positions of group `g` in the rank's share (0-based).
    pub(crate) fn group_range(&self, g: u64) -> Range<u64> {
        self.group_starts[g as usize]..self.group_starts[g as usize + 1]
    }

    /// The pieces of group `g`, in slot order.
    pub(crate) fn pieces(&self, g: u64, out: &mut Vec<Piece>) {
        out.clear();
        let share = self.share();
        let r = self.group_range(g);
        let mut p = share.start + r.start;
        while p < share.start + r.end {
            let (piece, at) = self.piece_at(p);
            p += piece.len() - at;
            out.push(Piece { records: piece.records.start + at..piece.records.end });
        }
    }

    fn group_perm(&self, g: u64, len: u64) -> Permutation {
        if !self.shuffle {
            return Permutation::identity(len);
        }
        Permutation::new(len, key(self.seed, &[GROUP, self.epoch, self.share().start + self.group_range(g).start]))
    }

    /// Group `g`'s table of permuted positions, made on first use (`None`
    /// for a group of more than `u32::MAX` records: positions are then
    /// permuted one by one).
    fn group_table(&self, g: u64, perm: &Permutation) -> Option<Arc<Vec<u32>>> {
        if perm.len() > u64::from(u32::MAX) {
            return None;
        }
        let mut tables = lock(&self.tables.0);
        let slot = &mut tables[(g % 2) as usize];
        let made = match slot.take() {
            Some(GroupTable { group, at: Table::Ready(at) }) if group == g => Some(at),
            // Made in the background: wait for it (a thread that failed is made again here).
            Some(GroupTable { group, at: Table::Making(h) }) if group == g => h.join().ok().map(Arc::new),
            _ => None,
        };
        let at = made.unwrap_or_else(|| Arc::new(table_of(perm)));
        *slot = Some(GroupTable { group: g, at: Table::Ready(Arc::clone(&at)) });
        Some(at)
    }

    /// Starts making group `g`'s table on a thread of its own, once no batch
    /// reads group `g - 2` (whose table it replaces): as `g`'s blocks start
    /// streaming. Where no thread can be started, the group's first batch
    /// makes it.
    pub(crate) fn prepare_table(&self, g: u64) {
        if g >= self.groups() {
            return;
        }
        let r = self.group_range(g);
        let perm = self.group_perm(g, r.end - r.start);
        if perm.len() > u64::from(u32::MAX) {
            return;
        }
        let mut tables = lock(&self.tables.0);
        let slot = &mut tables[(g % 2) as usize];
        if slot.as_ref().is_some_and(|t| t.group == g) {
            return;
        }
        if let Ok(h) = std::thread::Builder::new().name("wirespeed-table".into()).spawn(move || table_of(&perm)) {
            *slot = Some(GroupTable { group: g, at: Table::Making(h) });
        }
    }

    /// The groups that batch `b` reads (one, or two at a boundary).
    pub(crate) fn batch_groups(&self, b: u64) -> Range<u64> {
        let r = self.cut.batch(b);
        if r.is_empty() {
            return 0..0;
        }
        let base = self.share().start;
        let first = self.group_of(r.start - base);
        let last = self.group_of(r.end - 1 - base);
        first..last + 1
    }

    fn group_of(&self, i: u64) -> u64 {
        (self.group_starts.partition_point(|&s| s <= i) - 1) as u64
    }

    /// For each record of batch `b`: its slot in the pool (half `g % 2`,
    /// `slots` slots each) and its index in the slot's piece; and the record.
    pub(crate) fn batch(&self, b: u64, pieces: &mut Vec<Piece>, out: &mut Vec<Drawn>) {
        out.clear();
        let r = self.cut.batch(b);
        let base = self.share().start;
        let mut cached = u64::MAX;
        let mut perm = Permutation::identity(0);
        let mut table = None;
        let mut starts: Vec<u64> = Vec::new();
        for p in r {
            let i = p - base;
            let g = self.group_of(i);
            let gr = self.group_range(g);
            if g != cached {
                self.pieces(g, pieces);
                perm = self.group_perm(g, gr.end - gr.start);
                table = self.group_table(g, &perm);
                starts.clear();
                let mut acc = 0;
                for piece in pieces.iter() {
                    starts.push(acc);
                    acc += piece.len();
                }
                cached = g;
            }
            let j = match &table {
                Some(t) => u64::from(t[(i - gr.start) as usize]),
                None => perm.at(i - gr.start),
            };
            let s = starts.partition_point(|&x| x <= j) - 1;
            let within = j - starts[s];
            let slot = (g % 2) * self.shape.slots + s as u64;
            out.push(Drawn { slot, index: within, record: pieces[s].records.start + within });
        }
    }
}

/// Where one record of a batch lies in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Drawn {
    /// The slot (0 .. 2 * slots).
    pub slot: u64,
    /// Its index among the records of the slot's piece.
    pub index: u64,
    /// The record of the file.
    pub record: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_table_is_the_permutation_computed_in_parts() {
        for n in [1u64, 5, (1 << 16) + 3, 300_001] {
            let perm = Permutation::new(n, 42);
            let t = table_of(&perm);
            assert_eq!(t.len() as u64, n);
            assert!(t.iter().enumerate().all(|(i, &v)| u64::from(v) == perm.at(i as u64)), "{n}");
        }
    }

    fn every_record(n: u64, t: u64, slots: u64, bs: u64, world: u64, drop_last: bool, shuffle: bool) {
        let shape = PoolShape { block_records: t, slots };
        let mut count = vec![0u32; n as usize];
        let (mut pieces, mut drawn) = (Vec::new(), Vec::new());
        for rank in 0..world {
            let cut = Sharding::new(n, bs, rank, world, drop_last).unwrap();
            let order = PoolOrder::new(cut, shape, 9, 3, shuffle).unwrap();
            // The pieces of the groups are the share, block-aligned, each within one block.
            let mut total = 0;
            for g in 0..order.groups() {
                order.pieces(g, &mut pieces);
                assert!(pieces.len() as u64 <= slots);
                for p in &pieces {
                    assert!(p.len() >= 1 && p.len() <= t);
                    assert_eq!(p.records.start / t, (p.records.end - 1) / t, "{p:?} crosses a block");
                    total += p.len();
                }
            }
            assert_eq!(total, cut.per_rank());
            for b in 0..cut.batches() {
                let gs = order.batch_groups(b);
                assert!(gs.end - gs.start <= 2);
                order.batch(b, &mut pieces, &mut drawn);
                assert_eq!(drawn.len() as u64, cut.batch(b).end - cut.batch(b).start);
                for d in &drawn {
                    let g = gs.clone().find(|g| g % 2 == d.slot / slots).unwrap();
                    order.pieces(g, &mut pieces);
                    let piece = &pieces[(d.slot % slots) as usize];
                    assert_eq!(piece.records.start + d.index, d.record);
                    count[d.record as usize] += 1;
                }
            }
        }
        if drop_last {
            assert!(count.iter().all(|&c| c <= 1));
        } else {
            assert!(count.iter().all(|&c| c >= 1), "n {n} t {t} slots {slots} bs {bs} world {world}: {count:?}");
            assert_eq!(count.iter().map(|&c| u64::from(c)).sum::<u64>(), n.div_ceil(world) * world);
        }
    }

    #[test]
    fn every_record_once_per_epoch_over_every_rank() {
        for shuffle in [true, false] {
            every_record(100, 10, 2, 7, 1, false, shuffle);
            every_record(103, 10, 3, 7, 1, false, shuffle);
            every_record(103, 10, 3, 7, 3, false, shuffle);
            every_record(103, 10, 3, 7, 3, true, shuffle);
            every_record(1000, 64, 4, 100, 4, false, shuffle);
            every_record(57, 8, 4, 5, 7, false, shuffle);
            every_record(9, 4, 2, 2, 4, false, shuffle);
        }
    }

    #[test]
    fn the_short_last_block_moves_so_that_drop_last_drops_other_records() {
        // 103 records in blocks of 10: the last block holds 3. Three ranks with
        // drop_last drop one record an epoch, and batches of 7 drop more.
        let shape = PoolShape { block_records: 10, slots: 3 };
        let mut ever = [false; 103];
        let (mut pieces, mut drawn) = (Vec::new(), Vec::new());
        let mut places = std::collections::BTreeSet::new();
        for epoch in 0..40 {
            for rank in 0..3 {
                let cut = Sharding::new(103, 7, rank, 3, true).unwrap();
                let order = PoolOrder::new(cut, shape, 9, epoch, true).unwrap();
                places.insert(order.short_at);
                for b in 0..cut.batches() {
                    order.batch(b, &mut pieces, &mut drawn);
                    drawn.iter().for_each(|d| ever[d.record as usize] = true);
                }
            }
        }
        assert!(places.len() > 3, "the short block came at {places:?}");
        assert!(ever.iter().all(|&e| e), "never delivered: {:?}", (0..103).filter(|&r| !ever[r]).collect::<Vec<_>>());
        // Without shuffling, the blocks keep the file's order, the short one last.
        let cut = Sharding::new(103, 7, 0, 1, false).unwrap();
        let order = PoolOrder::new(cut, shape, 9, 0, false).unwrap();
        order.batch(14, &mut pieces, &mut drawn);
        assert_eq!(drawn.iter().map(|d| d.record).collect::<Vec<_>>(), (98..103).collect::<Vec<_>>());
    }

    #[test]
    fn seed_u64_max_shuffles_like_any_other() {
        let cut = Sharding::new(1000, 100, 0, 1, false).unwrap();
        let shape = PoolShape { block_records: 100, slots: 4 };
        let order = PoolOrder::new(cut, shape, u64::MAX, 0, true).unwrap();
        let (mut pieces, mut drawn) = (Vec::new(), Vec::new());
        order.batch(0, &mut pieces, &mut drawn);
        let mut records: Vec<u64> = drawn.iter().map(|d| d.record).collect();
        let before = records.clone();
        records.sort();
        assert_ne!(before, records, "a group's records came in file order");
    }

    #[test]
    fn a_batch_larger_than_a_group_is_refused() {
        let cut = Sharding::new(1000, 100, 0, 1, false).unwrap();
        let e = PoolOrder::new(cut, PoolShape { block_records: 10, slots: 5 }, 1, 0, true).unwrap_err();
        assert!(e.to_string().contains("fewer than a batch"), "{e}");
    }

    #[test]
    fn a_batch_draws_from_many_blocks_and_epochs_differ() {
        let cut = Sharding::new(100_000, 1000, 0, 1, false).unwrap();
        let shape = PoolShape { block_records: 1000, slots: 16 };
        let (a, b) = (PoolOrder::new(cut, shape, 5, 0, true).unwrap(), PoolOrder::new(cut, shape, 5, 1, true).unwrap());
        let (mut pieces, mut da, mut db) = (Vec::new(), Vec::new(), Vec::new());
        a.batch(3, &mut pieces, &mut da);
        b.batch(3, &mut pieces, &mut db);
        let mut blocks: Vec<u64> = da.iter().map(|d| d.record / 1000).collect();
        blocks.sort();
        blocks.dedup();
        assert!(blocks.len() >= 12, "{} blocks", blocks.len());
        assert_ne!(da, db);
    }
}
