//! The slot handles: a slot taken out of the ring moves through [`FreeSlot`],
//! [`FullSlot`] and [`InFlightSlot`], and goes back to the ring when dropped.

use std::ops::Range;
use std::sync::Arc;

use wirespeed_cuda::{DeviceSink, PinnedBuffer, PinnedSlice, Stream};

use super::inner::{RingInner, Slot};
use crate::error::{Error, Result};

/// A slot taken out of the ring, given back when dropped: to the in-flight
/// queue when its copies may still run, else to the free list. `slot` is
/// `None` once the slot moved on to the next handle.
struct Held {
    slot: Option<Slot>,
    ring: Arc<RingInner>,
    in_flight: bool,
}

impl Held {
    /// Moves the slot on to a new holder that gives it back `in_flight` or
    /// free, or `None` when it already moved on.
    fn pass(&mut self, in_flight: bool) -> Option<Held> {
        let slot = self.slot.take()?;
        Some(Held { slot: Some(slot), ring: Arc::clone(&self.ring), in_flight })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            if self.in_flight {
                self.ring.put_back_in_flight(slot, false);
            } else {
                self.ring.put_free(slot);
            }
        }
    }
}

/// A slot nobody uses: its last copies completed. The only way to write a slot.
/// Dropping it returns it to the ring's free list. Forgetting it loses the slot
/// and keeps the whole ring alive for the rest of the process (its slots, its
/// budget reservation, and the streams its slots' events were recorded on).
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
/// let full = ring.acquire()?.fill_with(|buf| { buf[..3].copy_from_slice(b"abc"); Ok(3) })?;
/// assert_eq!(full.data()?, b"abc");
/// # Ok(()) }
/// ```
pub struct FreeSlot {
    held: Held,
    completed: u64,
}

impl std::fmt::Debug for FreeSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreeSlot").field("index", &self.index()).finish()
    }
}

impl FreeSlot {
    pub(super) fn new(slot: Slot, ring: &Arc<RingInner>, completed: u64) -> FreeSlot {
        FreeSlot { held: Held { slot: Some(slot), ring: Arc::clone(ring), in_flight: false }, completed }
    }

    /// Which slot of the ring this is (0-based).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.index(), 0);
    /// # Ok(()) }
    /// ```
    pub fn index(&self) -> usize {
        self.held.slot.as_ref().map_or(usize::MAX, |s| s.index)
    }

    /// The slot's size in bytes.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.capacity(), 4096);
    /// # Ok(()) }
    /// ```
    pub fn capacity(&self) -> usize {
        self.held.ring.slot_bytes
    }

    /// Bytes of this slot's previous copy whose completion was observed in
    /// handing it out (0 when none): for progress accounting.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.completed_bytes(), 0);
    /// # Ok(()) }
    /// ```
    pub fn completed_bytes(&self) -> u64 {
        self.completed
    }

    /// The whole slot, writable (page-aligned: fit for `O_DIRECT` reads).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut s = ring.acquire()?;
    /// s.as_mut_slice()?.fill(7);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error if the buffer's fence had to wait (never after the ring's own wait).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        let n = self.held.ring.slot_bytes;
        match self.held.slot.as_mut() {
            Some(s) => Ok(&mut s.buf.as_mut_slice()?[s.off..s.off + n]),
            None => Err(Error::invalid("FreeSlot::as_mut_slice", "the slot was already used")),
        }
    }

    /// Marks bytes `data` of the slot as the content to copy.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut s = ring.acquire()?;
    /// s.as_mut_slice()?[..4].copy_from_slice(b"data");
    /// let full = s.fill(0..4)?;
    /// assert_eq!(full.len(), 4);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is not inside the slot.
    pub fn fill(mut self, data: Range<usize>) -> Result<FullSlot> {
        let bytes = self.held.ring.slot_bytes;
        if data.start > data.end || data.end > bytes {
            return Err(Error::invalid("FreeSlot::fill", format!("{data:?} is not inside a slot of {bytes} bytes")));
        }
        let held = self.held.pass(false).ok_or_else(|| Error::invalid("FreeSlot", "the slot was already used"))?;
        Ok(FullSlot { held, data })
    }

    /// Fills the slot with `f`, which returns how many bytes (from the start) it wrote.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let full = ring.acquire()?.fill_with(|b| { b.fill(1); Ok(b.len()) })?;
    /// assert_eq!(full.len(), 4096);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `f`'s error (the slot goes back to the ring), or a length past the slot.
    pub fn fill_with(mut self, f: impl FnOnce(&mut [u8]) -> Result<usize>) -> Result<FullSlot> {
        let n = f(self.as_mut_slice()?)?;
        self.fill(0..n)
    }

    /// Copies `src` (e.g. part of a mapping) into the slot.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-copy-from-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 8192])?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    ///
    /// let full = ring.acquire()?.copy_from(&file.as_bytes()[..4096])?;
    /// assert_eq!(full.data()?, &file.as_bytes()[..4096]);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `src` is larger than the slot.
    pub fn copy_from(self, src: &[u8]) -> Result<FullSlot> {
        self.fill_with(|buf| match buf.get_mut(..src.len()) {
            Some(dst) => {
                dst.copy_from_slice(src);
                Ok(src.len())
            }
            None => Err(Error::invalid(
                "FreeSlot::copy_from",
                format!("{} bytes do not fit a slot of {}", src.len(), buf.len()),
            )),
        })
    }

    /// Reads `len` bytes of `file` at `offset` into the slot (`pread`).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-read-from-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 8192])?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    ///
    /// let full = ring.acquire()?.read_from(&file, 0, 4096)?;
    /// assert_eq!(full.data()?, &file.as_bytes()[..4096]);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::FileChanged`] when the file ends before
    /// `offset + len`, or a length past the slot.
    pub fn read_from(self, file: &crate::MappedFile, offset: u64, len: usize) -> Result<FullSlot> {
        use std::os::unix::fs::FileExt;
        let end = offset.saturating_add(len as u64);
        self.fill_with(|buf| {
            let cap = buf.len();
            let dst = buf.get_mut(..len).ok_or_else(|| {
                Error::invalid("FreeSlot::read_from", format!("{len} bytes do not fit a slot of {cap}"))
            })?;
            file.file().read_exact_at(dst, offset).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::FileChanged {
                        path: file.path().to_path_buf(),
                        message: format!("it ended before byte {end}"),
                    }
                } else {
                    Error::io("pread", file.path(), e)
                }
            })?;
            Ok(len)
        })
    }
}

/// A filled slot: the host may read it; the device gets it through
/// [`FullSlot::copy_to_device`] or [`FullSlot::submit`], which consume it.
/// Dropping it unused returns it to the free list. Forgetting it loses the slot
/// and keeps the whole ring alive for the rest of the process (its slots, its
/// budget reservation, and the streams its slots' events were recorded on).
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
/// # use wirespeed_cuda::*;
/// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 3)?;
/// let full = ring.acquire()?.copy_from(b"abc")?;
/// let in_flight = full.copy_to_device(&stream, &mut dst)?;
/// let free_again = in_flight.wait()?;
/// assert_eq!(dst.to_vec()?, b"abc");
/// # drop(free_again); Ok(()) }
/// ```
pub struct FullSlot {
    held: Held,
    data: Range<usize>,
}

impl std::fmt::Debug for FullSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FullSlot").field("data", &self.data).finish()
    }
}

/// The filled bytes of a slot, as copy sources, inside [`FullSlot::submit`].
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
/// let dev = Device::get(0)?;
/// let stream = Stream::new(&dev)?;
/// let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
/// let full = ring.acquire()?.copy_from(b"abcd")?;
/// full.submit(&[&stream], |src| {
///     assert_eq!((src.len(), src.all()?.len()), (4, 4));
///     stream.copy_to_device(&src.slice(1..3)?, &mut dst)?.detach(); // "bc"
///     Ok(())
/// })?
/// .wait()?;
/// assert_eq!(dst.to_vec()?, b"bc");
/// # Ok(()) }
/// ```
pub struct SlotSource<'a> {
    buf: &'a PinnedBuffer<u8>,
    data: Range<usize>,
}

impl SlotSource<'_> {
    /// The filled length (see the example of [`SlotSource`]).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when nothing was filled.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Filled bytes `r` (relative to the filled data) as a copy source.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, r: Range<usize>) -> Result<PinnedSlice<'_, u8>> {
        if r.start > r.end || r.end > self.data.len() {
            return Err(Error::invalid("SlotSource::slice", format!("{r:?} outside {} filled bytes", self.data.len())));
        }
        Ok(self.buf.slice(self.data.start + r.start..self.data.start + r.end)?)
    }

    /// All the filled bytes as a copy source.
    ///
    /// # Errors
    /// As [`SlotSource::slice`] (never in practice).
    pub fn all(&self) -> Result<PinnedSlice<'_, u8>> {
        self.slice(0..self.data.len())
    }
}

impl FullSlot {
    /// The number of filled bytes.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.copy_from(b"ab")?.len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when nothing was filled.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert!(ring.acquire()?.fill(0..0)?.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The filled bytes, for the host to read.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.copy_from(b"ab")?.data()?, b"ab");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error if the buffer's fence had to wait (never in practice).
    pub fn data(&self) -> Result<&[u8]> {
        match &self.held.slot {
            Some(s) => Ok(&s.buf.as_slice()?[s.off + self.data.start..s.off + self.data.end]),
            None => Err(Error::invalid("FullSlot::data", "the slot was already submitted")),
        }
    }

    /// Copies the filled bytes to `dst` (same length) on `stream`, records the
    /// slot's event after it, and hands the slot over as in flight.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # use wirespeed_cuda::*;
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// drop(ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?);
    /// # ring.drain()?;
    /// # assert_eq!(dst.to_vec()?, b"ab");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error, or a length or device mismatch. The slot still goes back
    /// to the ring as in flight (free once whatever was enqueued completed).
    pub fn copy_to_device(self, stream: &Stream, dst: &mut (impl DeviceSink<u8> + ?Sized)) -> Result<InFlightSlot> {
        self.submit(&[stream], |src| {
            stream.copy_to_device(&src.all()?, dst)?.detach();
            Ok(())
        })
    }

    /// Lets `enqueue` give the filled bytes to copies on `streams` (to several
    /// devices, or split into parts), then records one of the slot's events on
    /// each of `streams` and hands the slot over as in flight. Copies must go
    /// only to `streams` for the ring to wait on them precisely (others are still
    /// safe: the slot's fence covers every copy).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_cuda::*;
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let dev = Device::get(0)?;
    /// let (s0, s1) = (Stream::new(&dev)?, Stream::new(&dev)?);
    /// let mut dst = DeviceBuffer::<u8>::new(&dev, 4)?;
    /// let (mut a, mut b) = dst.split_at_mut(2)?;
    /// let full = ring.acquire()?.copy_from(b"abcd")?;
    /// // Two halves on two streams (or the whole slot to several devices).
    /// let in_flight = full.submit(&[&s0, &s1], |src| {
    ///     s0.copy_to_device(&src.slice(0..2)?, &mut a)?.detach();
    ///     s1.copy_to_device(&src.slice(2..4)?, &mut b)?.detach();
    ///     Ok(())
    /// })?;
    /// in_flight.wait()?;
    /// assert_eq!(dst.to_vec()?, b"abcd");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `enqueue`'s error or CUDA's error recording the events; the slot still
    /// goes back to the ring as in flight.
    pub fn submit(
        mut self,
        streams: &[&Stream],
        enqueue: impl FnOnce(&SlotSource<'_>) -> Result<()>,
    ) -> Result<InFlightSlot> {
        // From here on the slot is in flight, held as such: if `enqueue`
        // panics, unwinding drops the holder, which gives the slot back to the
        // ring as in flight (its fence covers whatever was enqueued), instead
        // of losing it.
        let submitted = || Error::invalid("FullSlot::submit", "the slot was already submitted");
        let mut in_flight = InFlightSlot { held: self.held.pass(true).ok_or_else(submitted)? };
        let Some(slot) = in_flight.held.slot.as_mut() else { return Err(submitted()) };
        let data = slot.off + self.data.start..slot.off + self.data.end;
        let res = enqueue(&SlotSource { buf: &slot.buf, data });
        // Recorded even when `enqueue` failed part-way: whatever it enqueued is covered.
        let rec = slot.record(streams);
        // Progress to report once the copies complete: none if they failed.
        slot.unreported = if res.is_ok() { self.data.len() as u64 } else { 0 };
        res?;
        rec?;
        Ok(in_flight)
    }
}

/// A slot whose copies were submitted: no access to its memory. Dropping it
/// returns it to the ring's in-flight queue, from which it is handed out again
/// only after its events completed; [`InFlightSlot::wait`] does that now.
///
/// Forgetting it (`mem::forget`) loses the slot, never soundness: its memory is
/// never freed (the copy may still read it), and the whole ring stays alive for
/// the rest of the process: its slots, its budget reservation, and the streams
/// its slots' events were recorded on (each event keeps its stream: the handle,
/// and on a GPU its place in the context).
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
/// let dev = Device::get(0)?;
/// let stream = Stream::new(&dev)?;
/// let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
/// let in_flight = ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?;
/// drop(in_flight); // back to the ring as in flight
/// assert_eq!(ring.in_flight_slots(), 1);
/// let again = ring.acquire()?; // handed out once its copy completed
/// assert_eq!(again.completed_bytes(), 2);
/// # Ok(()) }
/// ```
pub struct InFlightSlot {
    held: Held,
}

impl std::fmt::Debug for InFlightSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightSlot").field("index", &self.held.slot.as_ref().map(|s| s.index)).finish()
    }
}

impl InFlightSlot {
    /// True when its copies completed (asks the events, does not wait).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # use wirespeed_cuda::*;
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// let f = ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?;
    /// while !f.is_complete()? {}
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error.
    pub fn is_complete(&self) -> Result<bool> {
        self.held.slot.as_ref().map_or(Ok(true), Slot::is_complete)
    }

    /// Waits for its copies (on its events, without spinning) and returns the
    /// slot free.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # use wirespeed_cuda::*;
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// let free = ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?.wait()?;
    /// assert_eq!(free.completed_bytes(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error; the slot then goes back to the in-flight queue.
    pub fn wait(mut self) -> Result<FreeSlot> {
        let Some(mut slot) = self.held.slot.take() else {
            return Err(Error::invalid("InFlightSlot::wait", "no slot"));
        };
        match slot.wait() {
            Ok(done) => Ok(FreeSlot::new(slot, &self.held.ring, done)),
            Err(e) => {
                self.held.ring.put_back_in_flight(slot, true);
                Err(e)
            }
        }
    }
}
