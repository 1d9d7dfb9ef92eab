//! Where the pieces of a transfer go on the device: destinations of the
//! range's length (one per device), a scratch buffer written around, or chunk
//! buffers handed to the caller. A piece is bytes `[off, off + len)` of the
//! file, readable as pinned copy sources through a [`Slicer`]; a sink
//! enqueues its copies on the streams it is given: the streamer's (one per
//! device), or, for a sink with lanes, each agent's own.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{DetachedSliceMut, Device, DeviceBuffer, DeviceSlice, Lanes, PinnedBuffer, PinnedSlice, Stream};

use super::stream_set::StreamSet;
use crate::budget::{PinBudget, Reservation};
use crate::error::{Error, Result};
use crate::range::PinnedRange;
use crate::ring::SlotSource;

/// Pinned bytes of a piece, relative to the piece's first byte.
pub(super) trait Slicer {
    /// Bytes `r` of the piece, pinned.
    fn slice(&self, r: Range<usize>) -> Result<PinnedSlice<'_, u8>>;
}

/// Part of a pinned range, from `base` (relative to the range's start).
pub(super) struct RangePart<'a> {
    pub(super) range: &'a PinnedRange,
    pub(super) base: usize,
}

impl Slicer for RangePart<'_> {
    fn slice(&self, r: Range<usize>) -> Result<PinnedSlice<'_, u8>> {
        self.range.slice(self.base + r.start..self.base + r.end)
    }
}

impl Slicer for SlotSource<'_> {
    fn slice(&self, r: Range<usize>) -> Result<PinnedSlice<'_, u8>> {
        SlotSource::slice(self, r)
    }
}

/// Where a transfer's pieces go: the agents put each piece they pinned
/// through the sink, which enqueues its copies to the destinations.
pub(super) trait Sink: Send + Sync {
    /// Sent to the calling thread when `put` completes something (chunks).
    type Msg: Send;
    /// True when `put` never sends a message: a lone agent may then run on the
    /// calling thread, with nobody reading the channel.
    const SILENT: bool;
    /// The streams a piece goes to.
    fn streams_for(&self, off: u64, len: u64) -> StreamSet;
    /// Enqueues the piece's copies.
    fn put(
        &mut self,
        streams: &[Stream],
        src: &dyn Slicer,
        off: u64,
        len: usize,
        out: &mut Vec<Self::Msg>,
    ) -> Result<()>;
    /// `Some(false)` when a check made while putting failed.
    fn verified(&self) -> Option<bool> {
        None
    }
    /// The pass is about to start its agents with `strategy`, windows in
    /// `windows`, counting what its agents do in `stats`.
    fn begin(
        &mut self,
        _strategy: crate::Strategy,
        _windows: &crate::WindowContext,
        _stats: &std::sync::Arc<super::stats::PassStats>,
    ) {
    }
    /// True when pieces may be put by several agents at once, each through a
    /// lane of its own on streams of its own ([`Sink::put_lane`]).
    const LANES: bool = false;
    /// Opens `n` lanes: [`Sink::put_lane`] may be called until [`Sink::close_lanes`].
    fn open_lanes(&mut self, _n: usize) {}
    /// [`Sink::put`] through lane `lane`, on `streams` (that agent's, one per
    /// device), from any thread: lanes are not ordered against each other, so
    /// the agents must put disjoint pieces (their claims are).
    fn put_lane(&self, _lane: usize, _streams: &[Stream], _src: &dyn Slicer, _off: u64, _len: usize) -> Result<()> {
        Err(Error::invalid("sink", "this sink has no lanes"))
    }
    /// Closes the lanes, once `streams` (the streamer's) are ordered after
    /// every lane's copies: what the lanes recorded goes back to the
    /// destinations, and the transfer is told its copies are enqueued.
    fn close_lanes(&mut self, _streams: &[Stream]) -> Result<()> {
        Ok(())
    }
}

/// Copies back through a small pinned buffer and compares with the file.
pub(super) struct Verifier {
    bounce: PinnedBuffer<u8>,
    _reservation: Reservation,
}

impl Verifier {
    pub(super) fn new(budget: &PinBudget, bytes: usize) -> Result<Verifier> {
        let reservation = budget.reserve(bytes as u64)?;
        Ok(Verifier { bounce: PinnedBuffer::new(bytes)?, _reservation: reservation })
    }

    /// True when `dev` (of `expected`'s length) equals `expected`.
    pub(super) fn check(&mut self, stream: &Stream, dev: &DeviceSlice<'_, u8>, expected: &[u8]) -> Result<bool> {
        if dev.len() != expected.len() {
            return Err(Error::invalid("verify", format!("{} bytes to compare with {}", dev.len(), expected.len())));
        }
        let step = self.bounce.len().max(1);
        let mut done = 0;
        while done < expected.len() {
            let n = step.min(expected.len() - done);
            let src = dev.slice(done..done + n)?;
            let mut dst = self.bounce.slice_mut(0..n)?;
            stream.copy_to_host(&src, &mut dst)?.wait()?;
            if self.bounce.as_slice()?[..n] != expected[done..done + n] {
                return Ok(false);
            }
            done += n;
        }
        Ok(true)
    }
}

/// Called once every copy of a transfer is enqueued, with the streamer's
/// streams (a [`Transfer`](crate::Transfer) records its event then).
pub(super) type Enqueued<'a> = dyn Fn(&[Stream]) -> Result<()> + Sync + 'a;

/// Destinations of the range's length: byte `off` of the file goes to
/// `off - start` of each.
pub(super) struct DevicesSink<'a> {
    pub(super) start: u64,
    /// (stream index, destination), outside lanes.
    pub(super) dsts: Vec<(usize, DetachedSliceMut<u8>)>,
    /// (stream index, destination) while lanes are open.
    pub(super) laned: Vec<(usize, Lanes<u8>)>,
    /// Bytes not put yet: when none is left, every copy is enqueued.
    pub(super) left: AtomicU64,
    pub(super) enqueued: Option<&'a Enqueued<'a>>,
}

impl<'a> DevicesSink<'a> {
    pub(super) fn new(
        start: u64,
        dsts: Vec<(usize, DetachedSliceMut<u8>)>,
        len: u64,
        enqueued: Option<&'a Enqueued<'a>>,
    ) -> Self {
        DevicesSink { start, dsts, laned: Vec::new(), left: AtomicU64::new(len), enqueued }
    }
}

impl Sink for DevicesSink<'_> {
    type Msg = ();
    const SILENT: bool = true;
    const LANES: bool = true;
    fn streams_for(&self, _off: u64, _len: u64) -> StreamSet {
        self.dsts.iter().map(|(i, _)| *i).chain(self.laned.iter().map(|(i, _)| *i)).collect()
    }
    fn put(&mut self, streams: &[Stream], src: &dyn Slicer, off: u64, len: usize, _out: &mut Vec<()>) -> Result<()> {
        let at = (off - self.start) as usize;
        let piece = src.slice(0..len)?;
        for (i, dst) in &mut self.dsts {
            let stream = streams.get(*i).ok_or_else(|| Error::invalid("sink", "no stream"))?;
            let mut d = dst.slice_mut(at..at + len)?;
            stream.copy_to_device(&piece, &mut d)?.detach();
        }
        let left = self.left.get_mut();
        *left = left.saturating_sub(len as u64);
        if *left == 0
            && self.laned.is_empty()
            && let Some(f) = self.enqueued.take()
        {
            f(streams)?;
        }
        Ok(())
    }
    fn open_lanes(&mut self, n: usize) {
        self.laned.extend(self.dsts.drain(..).map(|(i, d)| (i, d.into_lanes(n))));
    }
    fn put_lane(&self, lane: usize, streams: &[Stream], src: &dyn Slicer, off: u64, len: usize) -> Result<()> {
        let at = (off - self.start) as usize;
        let piece = src.slice(0..len)?;
        for (i, dst) in &self.laned {
            let stream = streams.get(*i).ok_or_else(|| Error::invalid("sink", "no stream"))?;
            let mut lane = dst.lane(lane)?;
            stream.copy_to_device(&piece, &mut lane.slice_mut(at..at + len)?)?.detach();
        }
        // (Never fails: the closure always answers.)
        let _ = self.left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| Some(l.saturating_sub(len as u64)));
        Ok(())
    }
    fn close_lanes(&mut self, streams: &[Stream]) -> Result<()> {
        self.dsts.extend(self.laned.drain(..).map(|(i, l)| (i, l.join())));
        if *self.left.get_mut() == 0
            && let Some(f) = self.enqueued.take()
        {
            f(streams)?;
        }
        Ok(())
    }
}

/// A scratch buffer written around: byte `off` goes to `(off - start) % len`.
pub(super) struct ScratchSink<'a> {
    pub(super) start: u64,
    pub(super) stream: usize,
    pub(super) dst: DetachedSliceMut<u8>,
    /// With verification: the file's bytes and the checker; each part is read back.
    pub(super) verify: Option<(&'a [u8], Verifier)>,
    pub(super) ok: bool,
}

impl Sink for ScratchSink<'_> {
    type Msg = ();
    const SILENT: bool = true;
    fn streams_for(&self, _off: u64, _len: u64) -> StreamSet {
        StreamSet::one(self.stream)
    }
    fn put(&mut self, streams: &[Stream], src: &dyn Slicer, off: u64, len: usize, _out: &mut Vec<()>) -> Result<()> {
        let stream = streams.get(self.stream).ok_or_else(|| Error::invalid("sink", "no stream"))?;
        let size = self.dst.len() as u64;
        let mut done = 0usize;
        while done < len {
            let pos = ((off + done as u64 - self.start) % size) as usize;
            let n = (len - done).min(self.dst.len() - pos);
            {
                let piece = src.slice(done..done + n)?;
                let mut d = self.dst.slice_mut(pos..pos + n)?;
                stream.copy_to_device(&piece, &mut d)?.detach();
            }
            if let Some((file, v)) = &mut self.verify {
                let at = (off + done as u64) as usize;
                let expected = file.get(at..at + n).ok_or_else(|| Error::invalid("verify", "outside the file"))?;
                if !v.check(stream, &self.dst.slice(pos..pos + n)?, expected)? {
                    self.ok = false;
                }
            }
            done += n;
        }
        Ok(())
    }
    fn verified(&self) -> Option<bool> {
        self.verify.as_ref().map(|_| self.ok)
    }
}

/// A chunk completed on the device: its copies are enqueued on `stream`.
pub(super) struct Chunk {
    pub(super) off: u64,
    pub(super) len: usize,
    pub(super) stream: usize,
    pub(super) buf: DeviceBuffer<u8>,
}

/// Device chunk buffers, per stream, reused across chunks.
pub(super) type ChunkPool = Mutex<Vec<Vec<DeviceBuffer<u8>>>>;

/// Chunks of `chunk` bytes from `start` (the last one shorter), chunk `k` on
/// stream `k % streams`, assembled from pieces in any order and handed on once
/// complete.
pub(super) struct ChunkSink<'a> {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) chunk: u64,
    pub(super) devices: Vec<Device>,
    pub(super) pool: &'a ChunkPool,
    pub(super) partial: HashMap<u64, (DeviceBuffer<u8>, u64)>,
}

impl ChunkSink<'_> {
    /// The indices of the chunks bytes `[off, off + len)` fall in.
    fn chunks(&self, off: u64, len: u64) -> Range<u64> {
        let first = (off - self.start) / self.chunk;
        let last = (off + len - 1 - self.start) / self.chunk;
        first..last + 1
    }

    /// The buffer of chunk `k` (on stream `si`) and the bytes it holds so
    /// far: the partly filled one, else one from the pool, else a new one.
    fn buffer(&mut self, k: u64, si: usize) -> Result<(DeviceBuffer<u8>, u64)> {
        if let Some(p) = self.partial.remove(&k) {
            return Ok(p);
        }
        if let Some(b) = lock(self.pool).get_mut(si).and_then(Vec::pop) {
            return Ok((b, 0));
        }
        let size = self.chunk.min(self.end - self.start) as usize;
        Ok((DeviceBuffer::<u8>::new(&self.devices[si], size)?, 0))
    }
}

/// Enqueues on `stream` the copy of bytes `part` of `src` into `buf` at `at`.
fn copy_piece(
    stream: &Stream,
    src: &dyn Slicer,
    part: Range<usize>,
    buf: &mut DeviceBuffer<u8>,
    at: usize,
) -> Result<()> {
    let piece = src.slice(part.clone())?;
    let mut d = buf.slice_mut(at..at + part.len())?;
    stream.copy_to_device(&piece, &mut d)?.detach();
    Ok(())
}

impl Sink for ChunkSink<'_> {
    type Msg = Chunk;
    const SILENT: bool = false;
    fn streams_for(&self, off: u64, len: u64) -> StreamSet {
        let n = self.devices.len() as u64;
        if len == 0 {
            return StreamSet::EMPTY;
        }
        self.chunks(off, len).take(n as usize).map(|k| (k % n) as usize).collect()
    }
    fn put(&mut self, streams: &[Stream], src: &dyn Slicer, off: u64, len: usize, out: &mut Vec<Chunk>) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let n = self.devices.len() as u64;
        for k in self.chunks(off, len as u64) {
            let cs = self.start + k * self.chunk;
            let ce = (cs + self.chunk).min(self.end);
            let (a, b) = (off.max(cs), (off + len as u64).min(ce));
            let si = (k % n) as usize;
            let stream = streams.get(si).ok_or_else(|| Error::invalid("sink", "no stream"))?;
            let (mut buf, mut filled) = self.buffer(k, si)?;
            let part = (a - off) as usize..(b - off) as usize;
            if let Err(e) = copy_piece(stream, src, part, &mut buf, (a - cs) as usize) {
                self.partial.insert(k, (buf, filled));
                return Err(e);
            }
            filled += b - a;
            if filled == ce - cs {
                out.push(Chunk { off: cs, len: (ce - cs) as usize, stream: si, buf });
            } else {
                self.partial.insert(k, (buf, filled));
            }
        }
        Ok(())
    }
}
