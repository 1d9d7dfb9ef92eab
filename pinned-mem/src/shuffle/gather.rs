//! The gather kernel (`kernels/gather.cu`), loaded once per process, behind
//! a safe call that checks every address the kernel will touch.

use wirespeed_cuda::{
    Device, DeviceBuffer, DeviceSlice, DeviceSliceMut, Kernel, KernelArgs, LaunchConfig, Library, PinnedBuffer,
    PinnedSlice, Stream,
};

use super::order::Permutation;
use crate::error::{Error, Result};

/// The kernel's PTX, built by `scripts/gen-ptx.py` (CUDA 12.0's ISA, so that
/// every supported driver loads it).
pub(crate) const GATHER_PTX: &str = include_str!("../../kernels/gather.ptx");
/// Threads of a block (the kernels' launch bound) and the most blocks of a launch.
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 4096;

/// The gather kernels of one kind of source: by offsets the host wrote, and
/// by a permutation computed on the device; and how many records a block of
/// them copies at once (each record is copied by a team of `256 / 32 /
/// records_per_block` warps, `WARPS` in gather.cu for host memory, one warp
/// for device memory).
#[derive(Clone)]
pub(crate) struct Pair {
    by_offsets: Kernel,
    by_permutation: Kernel,
    records_per_block: u64,
}

impl Pair {
    /// Blocks of a launch gathering `n` records: one team per record, up to
    /// `MAX_BLOCKS` (the kernel loops over the rest).
    fn blocks(&self, n: u64) -> u32 {
        n.div_ceil(self.records_per_block).min(MAX_BLOCKS) as u32
    }
}

/// The gather kernels, for host sources and for device sources. The loader
/// keeps them: dropping the last handle unloads the library once its
/// launches have completed.
#[derive(Clone)]
pub(crate) struct Kernels {
    host: Pair,
    device: Pair,
}

impl Kernels {
    fn of(&self, src: &Source<'_>) -> &Pair {
        match src {
            Source::Device(_) => &self.device,
            Source::Host(_) => &self.host,
        }
    }
}

/// Loads the gather kernels.
pub(crate) fn kernels() -> Result<Kernels> {
    let lib = Library::load_ptx(GATHER_PTX)?;
    Ok(Kernels {
        host: Pair {
            by_offsets: lib.kernel("wirespeed_gather")?,
            by_permutation: lib.kernel("wirespeed_gather_perm")?,
            records_per_block: 2,
        },
        device: Pair {
            by_offsets: lib.kernel("wirespeed_gather_dev")?,
            by_permutation: lib.kernel("wirespeed_gather_perm_dev")?,
            records_per_block: 8,
        },
    })
}

/// Launches each of the four kernels once on `stream`, gathering nothing,
/// and waits for them. The driver loads a kernel's code at its first launch
/// (lazy loading, CUDA's default since 12.2), and that launch waits for the
/// device's other work: at the first batch of a loader, the caller's queued
/// work. Made here, when the loader is.
pub(crate) fn warm_up(kernels: &Kernels, stream: &Stream, device: &Device) -> Result<()> {
    let mut dst = DeviceBuffer::<u8>::new(device, 16)?;
    let src = DeviceBuffer::<u8>::new(device, 16)?;
    let host = PinnedBuffer::<u8>::new(16)?;
    let offsets = PinnedBuffer::<u64>::new(1)?;
    for (pair, on_host) in [(&kernels.device, false), (&kernels.host, true)] {
        for by_offsets in [true, false] {
            let mut out = dst.slice_mut(..)?;
            let (from_host, from_device, at) = (host.slice(..)?, src.slice(..)?, offsets.slice(..)?);
            let args = KernelArgs::new().write(&mut out);
            let args = if on_host { args.read_host(&from_host) } else { args.read(&from_device) };
            let (kernel, args) = if by_offsets {
                (&pair.by_offsets, args.read_host(&at).value(0u64).value(1u64))
            } else {
                (&pair.by_permutation, args.value(0u64).value(1u64).value(0u64).value(1u64).value(0u64).value(0u64))
            };
            // SAFETY: the parameters are those of `gather` (by offsets:
            // dst, src, offsets, n, rec) and `gather_permuted` (dst, src, n,
            // rec, first, count, key, bits), each 8 bytes, in that order;
            // with `n` = 0 the kernel touches no memory at all.
            unsafe { stream.launch(kernel, LaunchConfig::linear(1, THREADS), args) }?.detach();
        }
    }
    stream.synchronize()?;
    Ok(())
}

/// Where a batch's records are read: device memory, or host memory the
/// device reads in place (pinned or registered).
pub(crate) enum Source<'a> {
    Device(DeviceSlice<'a, u8>),
    Host(PinnedSlice<'a, u8>),
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Source::Device(s) => s.len(),
            Source::Host(s) => s.len(),
        }
    }
}

/// Enqueues on `stream` the gather of `n` records of `rec` bytes into `dst`
/// (packed): record `k` is the `rec` bytes of `src` at `offsets[k]`, where
/// `offsets` is pinned memory the kernel reads in place and `host_offsets`
/// is what it holds: that is checked here, so the kernel touches nothing
/// outside `src`, `offsets` and `dst`.
pub(crate) fn gather<'a>(
    stream: &'a Stream,
    kernels: &Kernels,
    dst: &'a mut DeviceSliceMut<'_, u8>,
    src: &'a Source<'_>,
    offsets: (&'a PinnedSlice<'_, u64>, &[u64]),
    rec: u64,
) -> Result<()> {
    let (offsets, host_offsets) = offsets;
    let n = host_offsets.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let bytes = n.checked_mul(rec).ok_or_else(|| Error::invalid("gather", "the batch's size overflows"))?;
    if dst.len() as u64 != bytes || offsets.len() != host_offsets.len() {
        return Err(Error::invalid(
            "gather",
            format!("a destination of {} bytes for {n} records of {rec} bytes", dst.len()),
        ));
    }
    let limit = src.len() as u64;
    if let Some(bad) = host_offsets.iter().find(|&&o| o.checked_add(rec).is_none_or(|end| end > limit)) {
        return Err(Error::invalid(
            "gather",
            format!("a record at offset {bad} of {rec} bytes runs past the source's {limit} bytes"),
        ));
    }
    let args = KernelArgs::new().write(dst);
    let args = match src {
        Source::Device(s) => args.read(s),
        Source::Host(s) => args.read_host(s),
    };
    let args = args.read_host(offsets).value(n).value(rec);
    let pair = kernels.of(src);
    // SAFETY: wirespeed_gather(_dev)(dst, src, offsets, n, rec) takes these five
    // 8-byte parameters in this order; it writes the `n * rec` bytes of `dst`
    // (checked to be its length) and reads `offsets[..n]` and, for each k,
    // the `rec` bytes of `src` at `offsets[k]` (checked above to lie inside
    // `src`), and the aligned 16-byte words holding them, which lie in the
    // same pages, hence in the same allocation or registration.
    unsafe { stream.launch(&pair.by_offsets, LaunchConfig::linear(pair.blocks(n), THREADS), args) }?.detach();
    Ok(())
}

/// Enqueues on `stream` the gather of batch `positions` of a full shuffle
/// into `dst` (packed): record `k` is record `perm((positions.start + k) mod
/// count)` of `src`, the `count` packed records of `rec` bytes, the
/// permutation computed by the kernel. Every record lies inside `src`, whose
/// length is checked here.
pub(crate) fn gather_permuted(
    stream: &Stream,
    kernels: &Kernels,
    dst: &mut DeviceSliceMut<'_, u8>,
    src: &Source<'_>,
    positions: std::ops::Range<u64>,
    perm: &Permutation,
    rec: u64,
) -> Result<()> {
    let n = positions.end - positions.start;
    let count = perm.len();
    if n == 0 {
        return Ok(());
    }
    let bytes = n.checked_mul(rec).ok_or_else(|| Error::invalid("gather", "the batch's size overflows"))?;
    let all = count.checked_mul(rec).ok_or_else(|| Error::invalid("gather", "the records' size overflows"))?;
    if dst.len() as u64 != bytes || count == 0 || (src.len() as u64) < all {
        return Err(Error::invalid(
            "gather",
            format!("{n} records of {rec} bytes into {} bytes, from {count} records in {} bytes", dst.len(), src.len()),
        ));
    }
    let (key, bits) = perm.kernel_params();
    let args = KernelArgs::new().write(dst);
    let args = match src {
        Source::Device(s) => args.read(s),
        Source::Host(s) => args.read_host(s),
    };
    let args = args.value(n).value(rec).value(positions.start).value(count).value(key).value(bits);
    let pair = kernels.of(src);
    // SAFETY: wirespeed_gather_perm(_dev)(dst, src, n, rec, first, count,
    // key, bits) take these eight 8-byte parameters in this order; it writes the
    // `n * rec` bytes of `dst` (its length, checked) and reads, for each k,
    // the record `perm(..) < count` of `src`, which holds `count * rec` bytes
    // (checked), and the aligned 16-byte words holding it, in the same pages.
    unsafe { stream.launch(&pair.by_permutation, LaunchConfig::linear(pair.blocks(n), THREADS), args) }?.detach();
    Ok(())
}
