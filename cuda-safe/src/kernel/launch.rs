//! [`LaunchConfig`] and [`Stream::launch`]: a kernel launch, fenced as a copy is.

use super::library::Kernel;
use crate::error::{Error, Result};
use crate::fence::{Access, FenceUse};
use crate::memory::KernelArgs;
use crate::raw::{self, Shape};
use crate::stream::{Pending, Stream};
use wirespeed_cuda_sys::dim3;

/// The shape of a launch: the grid of blocks, the threads of a block, and
/// the bytes of dynamic shared memory per block.
///
/// ```
/// use wirespeed_cuda::LaunchConfig;
/// let c = LaunchConfig::linear(132, 256);
/// assert_eq!((c.grid, c.block, c.shared_bytes), ([132, 1, 1], [256, 1, 1], 0));
/// let tiles = LaunchConfig::new([16, 16, 1], [32, 8, 1]).shared_bytes(4096);
/// assert_eq!((tiles.grid, tiles.block, tiles.shared_bytes), ([16, 16, 1], [32, 8, 1], 4096));
/// let wider = LaunchConfig::linear(132, 256).grid([132, 2, 1]).block([128, 2, 1]);
/// assert_eq!((wider.grid, wider.block), ([132, 2, 1], [128, 2, 1]));
/// ```
///
/// The struct may gain fields in a minor release (launch attributes), so
/// outside this crate it is built from [`LaunchConfig::linear`] or
/// [`LaunchConfig::new`] and the builder methods, not with a struct literal;
/// its fields stay public for reading. It has no `Default`: no shape suits
/// every kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LaunchConfig {
    /// Blocks in x, y and z; each at least 1.
    pub grid: [u32; 3],
    /// Threads per block in x, y and z; each at least 1 (their product at
    /// most what the kernel and the device allow: 1024 on current devices).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// `blocks` blocks of `threads` threads, in x only, without dynamic
    /// shared memory.
    pub const fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig { grid: [blocks, 1, 1], block: [threads, 1, 1], shared_bytes: 0 }
    }

    /// A `grid` of blocks of `block` threads (x, y and z), without dynamic
    /// shared memory.
    pub const fn new(grid: [u32; 3], block: [u32; 3]) -> LaunchConfig {
        LaunchConfig { grid, block, shared_bytes: 0 }
    }

    /// With [`LaunchConfig::grid`](LaunchConfig#structfield.grid) set to `grid`.
    pub const fn grid(mut self, grid: [u32; 3]) -> Self {
        self.grid = grid;
        self
    }

    /// With [`LaunchConfig::block`](LaunchConfig#structfield.block) set to `block`.
    pub const fn block(mut self, block: [u32; 3]) -> Self {
        self.block = block;
        self
    }

    /// With [`LaunchConfig::shared_bytes`](LaunchConfig#structfield.shared_bytes)
    /// set to `bytes`.
    pub const fn shared_bytes(mut self, bytes: u32) -> Self {
        self.shared_bytes = bytes;
        self
    }

    /// Refuses a zero dimension, which CUDA would refuse too.
    fn check(&self) -> Result<()> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(Error::invalid(
                "Stream::launch",
                format!("grid {:?} and block {:?} need every dimension at least 1", self.grid, self.block),
            ));
        }
        Ok(())
    }

    fn shape(&self) -> Shape {
        let d = |[x, y, z]: [u32; 3]| dim3 { x, y, z };
        Shape { grid: d(self.grid), block: d(self.block), shared_bytes: self.shared_bytes as usize }
    }
}

impl Stream {
    /// Enqueues `kernel` on this stream with the parameters `args`,
    /// asynchronously. The returned [`Pending`] borrows the memory in `args`
    /// (and the stream) until waited, as a copy's does.
    ///
    /// The launch is fenced as a copy is: it is ordered after the other
    /// streams' writes of the memory it reads and after every other
    /// stream's use of the memory it writes, and it is recorded in the fence
    /// of each, so that host access and `Drop` of every buffer wait for it,
    /// and in its library, which is unloaded only after it completes.
    /// Dropping or forgetting the `Pending` (or the kernel, the library, or
    /// the stream) is sound.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, KernelArgs, LaunchConfig, Library, PinnedBuffer, Stream};
    /// // wirespeed_gather(dst, src, offsets, n, rec): record k of dst is the
    /// // `rec` bytes at src + offsets[k]. (A stub here: the emulated runtime
    /// // runs its own copy of the gather; on a GPU, load the real PTX.)
    /// let ptx = ".version 7.0\n.target sm_70\n.address_size 64\n\
    ///            .visible .entry wirespeed_gather(.param .u64 a, .param .u64 b, .param .u64 c, .param .u64 d, .param .u64 e)\n\
    ///            { ret; }\n";
    /// let gather = Library::load_ptx(ptx)?.kernel("wirespeed_gather")?;
    /// let dev = Device::get(0)?;
    /// let stream = Stream::new(&dev)?;
    /// let mut pool = DeviceBuffer::<u8>::new(&dev, 300)?;
    /// pool.copy_from_slice(&(0..300).map(|i| i as u8).collect::<Vec<_>>())?;
    /// let mut offsets = DeviceBuffer::<u64>::new(&dev, 2)?;
    /// offsets.copy_from_slice(&[200, 10])?;
    /// let mut batch = DeviceBuffer::<u8>::zeroed(&dev, 2 * 3)?;
    /// let args = KernelArgs::new().write(&mut batch).read(&pool).read(&offsets).value(2u64).value(3u64);
    /// // SAFETY: the parameters are wirespeed_gather's, and it reads only
    /// // `pool` (records of 3 bytes at offsets within it) and `offsets`, and
    /// // writes only `batch` (2 records of 3 bytes).
    /// unsafe { stream.launch(&gather, LaunchConfig::linear(1, 256), args) }?.detach();
    /// let mut back = PinnedBuffer::<u8>::new(6)?;
    /// stream.copy_to_host(&batch, &mut back)?.wait()?;
    /// assert_eq!(back.as_slice()?, [200, 201, 202, 10, 11, 12]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// Nothing can check what device code does, so the caller vouches that:
    ///
    /// * the parameters of `args` match the kernel's signature, in number,
    ///   order and type (each takes one 8-byte slot; pointers are passed as
    ///   64-bit addresses);
    /// * the kernel reads only memory given to `args` as a read
    ///   ([`KernelArgs::read`], [`KernelArgs::read_host`]) or a write
    ///   ([`KernelArgs::write`]), within the spans given, and writes only
    ///   memory given as a write, within its span. (Memory reached otherwise,
    ///   through an address passed as a value, say, is outside this crate's
    ///   fences: the caller orders it.)
    ///
    /// Given that, the launch is as sound as a copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero dimension in `config`, memory of
    /// another device than the stream's, or a mistake found while building
    /// `args`; `cudaHostGetDevicePointer`'s error for host memory not mapped
    /// for the device; `cudaLaunchKernel`'s error (`cudaErrorInvalidValue` or `cudaErrorInvalidConfiguration`
    /// for a shape the kernel or the device refuses). Nothing is enqueued
    /// then. A fault of the device code (an address out of bounds) is a
    /// sticky error that a later wait reports.
    pub unsafe fn launch<'a>(
        &'a self,
        kernel: &Kernel,
        config: LaunchConfig,
        mut args: KernelArgs<'a>,
    ) -> Result<Pending<'a>> {
        const CALL: &str = "Stream::launch";
        config.check()?;
        args.check(CALL, self.device())?;
        self.device().ensure_current()?;
        args.resolve_host()?;
        let library = FenceUse { fence: &kernel.library.launches, span: 0..0, access: Access::Keep };
        let uses: Vec<FenceUse<'_>> = args.fence_uses().chain([library]).collect();
        let mut params = args.param_pointers();
        let shape = config.shape();
        let raw_kernel = kernel.as_raw();
        self.enqueue_many(&uses, |q| {
            // SAFETY: `q` is this stream's; the kernel's library is loaded
            // until the launch completes (recorded in it, as `Keep`, while
            // `kernel` holds it); `params` points into `args`' slots, one
            // per parameter, alive and unchanged for the call (the caller
            // vouches that they match the signature); and the memory the
            // kernel touches is what `args` borrows for `'a`, within the
            // spans given (the caller's contract), each ordered and recorded
            // in its fence by `enqueue_many`: alive and unraced until the
            // launch completes, whatever happens to the `Pending`.
            unsafe { raw::launch_kernel(q, raw_kernel, shape, &mut params) }
        })
    }
}
