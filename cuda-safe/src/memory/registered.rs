//! Host memory registered with CUDA: [`HostRegistration`], which owns the
//! [`HostMemory`] it registers, in the primary context or in a
//! [`RegistrationContext`].

use super::checks::{pages, to_range};
use super::pinned::PinnedSlice;
use super::traits::{HostSource, sealed};
use crate::context::RegistrationContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::raw;
use std::ffi::c_void;
use std::ops::{Range, RangeBounds};
use std::sync::Arc;

/// Host memory that can be registered: a stable address range that its owner
/// keeps mapped for as long as the owner lives.
///
/// # Safety
/// `as_ptr()..as_ptr() + len()` must be mapped and keep the same address and
/// contents' validity for the whole life of the value (moving the value must
/// not move the memory), and nothing may write it while a `HostRegistration`
/// owns the value, except through the registration's sinks when not read-only.
pub unsafe trait HostMemory: Send + Sync {
    /// Start of the range.
    fn as_ptr(&self) -> *const u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a boxed slice's heap memory does not move with the box, and the
// registration owning it is the only one who can reach it.
unsafe impl HostMemory for Box<[u8]> {
    fn as_ptr(&self) -> *const u8 {
        <[u8]>::as_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// Flags for [`HostRegistration::new`] and [`HostRegistration::new_in`]:
/// every flag off by default.
///
/// The struct may gain fields in a minor release, so outside this crate it is
/// built from `Default` (or `new`) and the builder methods, not with a struct
/// literal; its fields stay public for reading.
///
/// ```
/// use wirespeed_cuda::RegisterFlags;
/// let f = RegisterFlags::new().portable(true).mapped(false).read_only(true);
/// assert!(f.portable && !f.mapped && f.read_only);
/// assert_eq!(RegisterFlags::new(), RegisterFlags::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RegisterFlags {
    /// Registered for every device (several GPUs).
    pub portable: bool,
    /// Mapped into the device address space.
    pub mapped: bool,
    /// The device only reads it. Required for read-only and file mappings
    /// (`PROT_READ` + `MAP_SHARED`): without it CUDA answers `cudaErrorInvalidValue`.
    pub read_only: bool,
}

impl RegisterFlags {
    /// Every flag off (the default).
    pub const fn new() -> RegisterFlags {
        RegisterFlags { portable: false, mapped: false, read_only: false }
    }

    /// With [`RegisterFlags::portable`](RegisterFlags#structfield.portable) set to `on`.
    pub const fn portable(mut self, on: bool) -> Self {
        self.portable = on;
        self
    }

    /// With [`RegisterFlags::mapped`](RegisterFlags#structfield.mapped) set to `on`.
    pub const fn mapped(mut self, on: bool) -> Self {
        self.mapped = on;
        self
    }

    /// With [`RegisterFlags::read_only`](RegisterFlags#structfield.read_only) set to `on`.
    pub const fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// The raw `cudaHostRegister*` bits (the same bits as the driver's
    /// `CU_MEMHOSTREGISTER_*`).
    pub fn bits(self) -> u32 {
        let mut b = wirespeed_cuda_sys::cudaHostRegisterDefault;
        if self.portable {
            b |= wirespeed_cuda_sys::cudaHostRegisterPortable;
        }
        if self.mapped {
            b |= wirespeed_cuda_sys::cudaHostRegisterMapped;
        }
        if self.read_only {
            b |= wirespeed_cuda_sys::cudaHostRegisterReadOnly;
        }
        b
    }
}

/// Host memory `M` registered with CUDA (`cudaHostRegister`) for as long as
/// this value owns it: copies from it are asynchronous, as from pinned memory.
///
/// It *owns* the memory (ownership passing): leaking the registration leaks
/// the memory too, so a copy can never outlive what it reads. `Drop` waits for
/// every stream still reading it, unregisters, then drops `M`.
///
/// [`HostRegistration::new`] registers in the device's primary context (the
/// runtime's); [`HostRegistration::new_in`] in a [`RegistrationContext`],
/// whose unregister neither waits for nor stalls the primary context's copies.
/// Copies from either are issued the same way, by [`Stream`](crate::Stream)'s methods.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, Stream};
/// let dev = Device::get(0)?;
/// let data: Box<[u8]> = vec![1u8; 1 << 20].into_boxed_slice();
/// let reg = HostRegistration::new(data, RegisterFlags::default())?;
/// let mut d = DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
/// Stream::new(&dev)?.copy_to_device(&reg, &mut d)?.wait()?;
/// let data = reg.into_inner()?; // unregistered, yours again
/// # let _ = data; Ok(()) }
/// ```
pub struct HostRegistration<M: HostMemory> {
    mem: std::mem::ManuallyDrop<M>,
    ptr: *const u8,
    len: usize,
    flags: RegisterFlags,
    /// Without `portable`, the registration belongs to the device (context)
    /// current when it was made: unregistering makes that device current again.
    device: Option<Device>,
    /// The registration context it was made in (`None`: the primary context),
    /// kept alive until it is unregistered; leaked with the memory otherwise.
    context: Option<Arc<RegistrationContext>>,
    fence: Fence,
    /// Unregistering failed once already ([`HostRegistration::into_inner`]):
    /// `Drop` tries once more, not twice.
    failed: bool,
}

// SAFETY: M is Send + Sync; the pointer is into memory M owns.
unsafe impl<M: HostMemory> Send for HostRegistration<M> {}
// SAFETY: shared access only reads the memory.
unsafe impl<M: HostMemory> Sync for HostRegistration<M> {}

impl<M: HostMemory> std::fmt::Debug for HostRegistration<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("flags", &self.flags)
            .field("context", &self.context.as_ref().map(|c| c.id()))
            .finish()
    }
}

impl<M: HostMemory> HostRegistration<M> {
    /// Registers all of `mem`. On error `mem` is dropped; use
    /// [`HostRegistration::try_new`] to get it back.
    ///
    /// # Errors
    /// `cudaErrorInvalidValue` (e.g. a read-only mapping without `read_only`),
    /// `cudaErrorHostMemoryAlreadyRegistered` (memory registered or allocated
    /// pinned by other means), or [`Error::InvalidArgument`] when empty or when
    /// `mem` shares a page with a live `HostRegistration` (CUDA registers whole
    /// pages; the message names the shared pages: page-align the buffers, or
    /// register one buffer that covers both).
    pub fn new(mem: M, flags: RegisterFlags) -> Result<Self> {
        Self::try_new(mem, flags).map_err(|(e, _)| e)
    }

    /// Registers all of `mem`, handing it back with the error on failure.
    ///
    /// # Errors
    /// As [`HostRegistration::new`].
    pub fn try_new(mem: M, flags: RegisterFlags) -> std::result::Result<Self, (Error, M)> {
        let (ptr, len) = (mem.as_ptr(), mem.len());
        if len == 0 {
            return Err((Error::invalid("HostRegistration::new", "cannot register an empty range"), mem));
        }
        let device = if flags.portable {
            None
        } else {
            match Device::current() {
                Ok(d) => Some(d),
                Err(e) => return Err((e, mem)),
            }
        };
        if let Err(e) = pages::claim("HostRegistration::new", ptr, len) {
            return Err((e, mem));
        }
        // SAFETY: `HostMemory` guarantees the range is mapped while `mem`
        // lives; we keep `mem` until after unregistering.
        if let Err(e) = unsafe { raw::host_register(ptr.cast_mut().cast(), len, flags.bits()) } {
            raw::clear_last_error();
            pages::unclaim(ptr, len);
            return Err((e, mem));
        }
        Ok(HostRegistration {
            mem: std::mem::ManuallyDrop::new(mem),
            ptr,
            len,
            flags,
            device,
            context: None,
            fence: Fence::default(),
            failed: false,
        })
    }

    /// Registers all of `mem` in the registration context `ctx`
    /// (`cuMemHostRegister`, with `ctx` current on the calling thread for that
    /// call only), always `portable` (whatever `flags` says): the copies from it
    /// run in the primary context. `read_only` is needed for read-only and file
    /// mappings, as for [`HostRegistration::new`]. On error `mem` is dropped;
    /// use [`HostRegistration::try_new_in`] to get it back.
    ///
    /// The registration holds `ctx` until it is unregistered. Unregistering in
    /// a registration context does not wait for copies: this type waits for
    /// every copy that read the memory first, on every path (`Drop`,
    /// [`into_inner`](HostRegistration::into_inner), after errors), and a
    /// registration that is leaked (`mem::forget`) or that cannot be released
    /// is never unregistered: its memory and `ctx` leak with it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use std::sync::Arc;
    /// use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, RegistrationContext, Stream};
    /// let dev = Device::get(0)?;
    /// let ctx = Arc::new(RegistrationContext::new(&dev)?);
    /// let reg = HostRegistration::new_in(&ctx, vec![3u8; 4096].into_boxed_slice(), RegisterFlags::default())?;
    /// assert!(reg.flags().portable);
    /// let mut d = DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// Stream::new(&dev)?.copy_to_device(&reg, &mut d)?.wait()?;
    /// let data = reg.into_inner()?; // unregistered in `ctx`, yours again
    /// # let _ = data; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`HostRegistration::new`], from `cuMemHostRegister` as
    /// [`Error::Driver`]; [`Error::Driver`] from `cuCtxPushCurrent` or
    /// `cuCtxPopCurrent` (where popping fails after registering, the
    /// registration is undone first; should undoing fail too, the
    /// registration is kept and returned, since the memory stays registered).
    pub fn new_in(ctx: &Arc<RegistrationContext>, mem: M, flags: RegisterFlags) -> Result<Self> {
        Self::try_new_in(ctx, mem, flags).map_err(|(e, _)| e)
    }

    /// As [`HostRegistration::new_in`], handing `mem` back with the error on failure.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use std::sync::Arc;
    /// use wirespeed_cuda::{Device, HostRegistration, RegisterFlags, RegistrationContext};
    /// let ctx = Arc::new(RegistrationContext::new(&Device::get(0)?)?);
    /// let (e, empty) = HostRegistration::try_new_in(&ctx, Box::<[u8]>::default(), RegisterFlags::default()).unwrap_err();
    /// assert!(empty.is_empty() && e.to_string().contains("empty"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`HostRegistration::new_in`].
    pub fn try_new_in(
        ctx: &Arc<RegistrationContext>,
        mem: M,
        flags: RegisterFlags,
    ) -> std::result::Result<Self, (Error, M)> {
        let (ptr, len) = (mem.as_ptr(), mem.len());
        if len == 0 {
            return Err((Error::invalid("HostRegistration::new_in", "cannot register an empty range"), mem));
        }
        let flags = RegisterFlags { portable: true, ..flags };
        if let Err(e) = pages::claim("HostRegistration::new_in", ptr, len) {
            return Err((e, mem));
        }
        let p = ptr.cast_mut().cast::<c_void>();
        // SAFETY: `HostMemory` guarantees the range is mapped while `mem`
        // lives; we keep `mem` until after unregistering (or leak both).
        let registered = ctx.with_current(|| unsafe { raw::mem_host_register(p, len, flags.bits()) });
        let made = |mem| HostRegistration {
            mem: std::mem::ManuallyDrop::new(mem),
            ptr,
            len,
            flags,
            device: None,
            context: Some(Arc::clone(ctx)),
            fence: Fence::default(),
            failed: false,
        };
        match registered {
            Err(e) | Ok((Err(e), _)) => {
                pages::unclaim(ptr, len);
                Err((e, mem)) // not pushed, or not registered
            }
            Ok((Ok(()), Ok(()))) => Ok(made(mem)),
            Ok((Ok(()), Err(popped))) => {
                // Registered, but the context may still be current on this
                // thread. Undo the registration (no copy can have used it: no
                // registration was handed out) and report.
                // SAFETY: registered just above in `ctx`, never used.
                if let Ok((Ok(()), _)) = ctx.with_current(|| unsafe { raw::mem_host_unregister(p) }) {
                    pages::unclaim(ptr, len);
                    return Err((popped, mem));
                }
                // The memory stays registered: handed back, its owner could
                // free or unmap it, and memory mapped there later would read
                // as registered (a copy into it refused, or on a GPU, made
                // with the old pages). Kept, it is unregistered as any other.
                Ok(made(mem))
            }
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never: empty ranges are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The flags it was registered with (always `portable` in a registration context).
    pub fn flags(&self) -> RegisterFlags {
        self.flags
    }

    /// The registration context it was made in, or `None` for the primary context.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{HostRegistration, RegisterFlags};
    /// let reg = HostRegistration::new(vec![0u8; 64].into_boxed_slice(), RegisterFlags::default())?;
    /// assert!(reg.context().is_none());
    /// # Ok(()) }
    /// ```
    pub fn context(&self) -> Option<&Arc<RegistrationContext>> {
        self.context.as_ref()
    }

    /// The memory it owns (reading it from the host is always fine: the device
    /// only reads registered memory through this type).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The registered bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `HostMemory` guarantees the range is mapped and valid while
        // `mem` lives, and no one writes it while we own `mem`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// A view of byte `range` that copies can read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<PinnedSlice<'_, u8>> {
        let r = to_range(range, self.len, "HostRegistration::slice")?;
        Ok(PinnedSlice::new(self.ptr.wrapping_add(r.start), r.len(), &self.fence))
    }

    /// Like [`HostRegistration::slice`], but never fails: `range` is clamped to
    /// the registration (a range past the end gives a shorter or empty view).
    /// For owners that know their range is in bounds and must not panic.
    pub fn slice_clamped(&self, range: Range<usize>) -> PinnedSlice<'_, u8> {
        let end = range.end.min(self.len);
        let start = range.start.min(end);
        PinnedSlice::new(self.ptr.wrapping_add(start), end - start, &self.fence)
    }

    /// Waits for every stream reading it, unregisters, and returns the memory.
    ///
    /// # Errors
    /// The runtime's error. The registration is then dropped: its `Drop` tries
    /// once more and, if it still cannot confirm that no stream reads the
    /// memory (a lost context), leaks the memory rather than hand it back.
    pub fn into_inner(mut self) -> Result<M> {
        if let Err(e) = self.release() {
            self.failed = true;
            return Err(e);
        }
        // SAFETY: released: `mem` is taken out once and `self` is forgotten
        // so Drop does not touch it again.
        let mem = unsafe { std::mem::ManuallyDrop::take(&mut self.mem) };
        let context = self.context.take(); // unregistered: the context may go
        std::mem::forget(self);
        drop(context);
        Ok(mem)
    }

    /// Waits for every copy that reads the memory, then unregisters it. Every
    /// way the registration ends comes here, twice at most (`into_inner`,
    /// then `Drop` after an error; `Drop` alone, twice after an error), and
    /// only `Ok` frees the memory (and its pages, for later registrations).
    fn release(&mut self) -> Result<()> {
        let res = self.unregister();
        if res.is_ok() {
            pages::unclaim(self.ptr, self.len);
        }
        res
    }

    fn unregister(&mut self) -> Result<()> {
        self.fence.wait_all()?;
        if let Some(ctx) = &self.context {
            let p = self.ptr.cast_mut().cast::<c_void>();
            // SAFETY: `ptr` starts our registration in `ctx`. In a registration
            // context the driver does not wait for copies, so this is the only
            // wait, and it covers every copy that reads the memory: each copy
            // records itself in the fence when it is enqueued, before its
            // `Pending` exists (so a forgotten `Pending` is covered too), a
            // failed enqueue enqueued nothing, and no copy can start meanwhile
            // (`&mut self`; copies borrow the registration). `wait_all` has just
            // returned `Ok`: all of them have completed.
            let (unregistered, popped) = ctx.with_current(|| unsafe { raw::mem_host_unregister(p) })?;
            return unregistered.and(popped);
        }
        // Unregister even if the device cannot be made current (after a sticky
        // error, say): the call may still work. Only its outcome decides
        // whether the memory is free; if it failed, the first error is reported.
        let switched = self.device.map_or(Ok(()), |d| d.ensure_current());
        // SAFETY: we registered `ptr`; no stream reads it any more.
        match unsafe { raw::host_unregister(self.ptr.cast_mut().cast()) } {
            Ok(()) => Ok(()),
            Err(e) => Err(switched.err().unwrap_or(e)),
        }
    }
}

impl<M: HostMemory> Drop for HostRegistration<M> {
    /// Waits for the copies that read the memory and unregisters it, trying
    /// a second time after an error (one failed call, such as a context that
    /// could not be made current for a moment, must not leak the memory and
    /// keep its pages registered for good); leaks the memory only when both
    /// attempts fail (after a failed `into_inner`, this is the second).
    fn drop(&mut self) {
        if self.release().is_ok() || (!self.failed && self.release().is_ok()) {
            // SAFETY: dropped once, here, after unregistering.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.mem) };
        } else if let Some(ctx) = self.context.take() {
            // The registration context is leaked with the memory: destroying
            // it would unregister the range under a copy that may still read it.
            std::mem::forget(ctx);
        }
        // Otherwise the memory is leaked: a copy might still read it.
    }
}

impl<M: HostMemory> sealed::Sealed for HostRegistration<M> {}
impl<M: HostMemory> HostSource<u8> for HostRegistration<M> {
    fn host_src(&self, _: sealed::Token) -> (*const u8, usize, &Fence) {
        (self.ptr, self.len, &self.fence)
    }
}
