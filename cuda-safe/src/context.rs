//! A second driver context on a device, to register host memory in.
//!
//! In the device's primary context, `cudaHostUnregister` waits for *every*
//! copy in the context, and registering or unregistering blocks other
//! threads' copies while it runs: a pipeline that registers and unregisters
//! as it goes stalls its own copies. In a second context made with
//! `cuCtxCreate`, registering (`PORTABLE`) and unregistering neither wait for
//! nor block the primary context's copies, and copies issued through the
//! runtime read such memory as they read any registered memory.
//!
//! The price: the driver no longer waits for anyone. Memory may be unregistered
//! only after every copy that reads it has completed. [`HostRegistration`]
//! already waits for its fence (every copy from it records there) before it
//! unregisters, on every path, so its registrations made in a
//! [`RegistrationContext`] keep that rule. NVIDIA does not document this
//! behaviour of the driver: keep the primary-context path
//! ([`HostRegistration::new`]) as the fallback.
//!
//! [`HostRegistration`]: crate::HostRegistration
//! [`HostRegistration::new`]: crate::HostRegistration::new

use crate::device::Device;
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::raw;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use wirespeed_cuda_sys::driver::CUcontext;

/// A second CUDA context on a device, made with the driver API, in which
/// [`HostRegistration::new_in`](crate::HostRegistration::new_in) registers
/// host memory. It is never current on any thread except for the duration of
/// one register or unregister call (pushed, then popped), so the runtime keeps
/// using the primary context everywhere, and the copies from such memory are
/// issued by the ordinary [`Stream`](crate::Stream) methods, unchanged.
///
/// Share it as `Arc<RegistrationContext>`: each registration made in it holds
/// the `Arc` until it is unregistered (a forgotten registration keeps it
/// forever), so the context, which owns the registrations, is destroyed only
/// after all of them are gone.
///
/// Creating one fails where a device takes one context per process
/// (exclusive-process compute mode) or under an MPS client; fall back to the
/// primary context then:
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use std::sync::Arc;
/// use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, RegistrationContext, Stream};
/// let dev = Device::get(0)?;
/// let data: Box<[u8]> = vec![7u8; 1 << 20].into_boxed_slice();
/// let reg = match RegistrationContext::new(&dev) {
///     Ok(ctx) => HostRegistration::new_in(&Arc::new(ctx), data, RegisterFlags::default())?,
///     Err(e) => {
///         eprintln!("{e}"); // says why, and to fall back
///         HostRegistration::new(data, RegisterFlags::default())?
///     }
/// };
/// let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
/// Stream::new(&dev)?.copy_to_device(&reg, &mut on_gpu)?.detach(); // a copy in the primary context
/// drop(reg); // waits for that copy, then unregisters (in the second context: without stalling others)
/// assert_eq!(on_gpu.to_vec()?[0], 7);
/// # Ok(()) }
/// ```
pub struct RegistrationContext {
    raw: CUcontext,
    device: Device,
    id: u64,
}

// SAFETY: a driver context handle may be used from any host thread, and made
// current on several threads at once; this type only pushes it around single
// calls, and destroys it once, in Drop, when no one can use it any more.
unsafe impl Send for RegistrationContext {}
// SAFETY: as above: every use through `&self` is a push/call/pop on the
// calling thread's own context stack.
unsafe impl Sync for RegistrationContext {}

impl std::fmt::Debug for RegistrationContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationContext")
            .field("raw", &self.raw)
            .field("device", &self.device)
            .field("id", &self.id)
            .finish()
    }
}

impl RegistrationContext {
    /// A new context on `device` (`cuCtxCreate`), made current only long
    /// enough to create it: the calling thread's current context is the same
    /// before and after.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let ctx = wirespeed_cuda::RegistrationContext::new(&dev)?;
    /// assert_eq!(ctx.device(), dev);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Load`] when the driver API cannot be reached (its
    /// [`hint`](Error::hint) says to fall back to the primary context);
    /// [`Error::Driver`] from `cuInit`, `cuDeviceGet` or `cuCtxCreate` (e.g.
    /// `CUDA_ERROR_DEVICE_UNAVAILABLE` in exclusive-process compute mode, with
    /// the same hint), or from `cuCtxPopCurrent` (the context is then destroyed).
    pub fn new(device: &Device) -> Result<RegistrationContext> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        raw::driver_init()?;
        let dev = raw::driver_device(device.ordinal() as i32)?;
        let c = raw::ctx_create(dev)?;
        // cuCtxCreate made the new context current on this thread: pop it, so
        // that the runtime here keeps using the primary context.
        let popped = raw::ctx_pop();
        if !matches!(popped, Ok(p) if p == c) {
            // SAFETY: just created and never handed out; cuCtxDestroy also pops
            // it if it is still current on this thread.
            let _ = unsafe { raw::ctx_destroy(c) };
            return Err(match popped {
                Err(e) => e,
                Ok(_) => Error::invalid(
                    "RegistrationContext::new",
                    "after cuCtxCreate, the calling thread's current context was not the new one",
                ),
            });
        }
        Ok(RegistrationContext { raw: c, device: *device, id: NEXT_ID.fetch_add(1, Ordering::Relaxed) })
    }

    /// The process's registration context on `device`: the one
    /// [`RegistrationContext::shared`] made earlier if any holder still has
    /// it, else a new one. Making a context is a driver call that costs far
    /// more than a registration, and registering is serialized for the whole
    /// device however many contexts there are, so every user in a process
    /// can share one per device. The context is destroyed when its last
    /// holder (an `Arc` or a registration made in it) is gone, and the next
    /// call makes a new one. A failure is not remembered: the next call tries
    /// again.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use std::sync::Arc;
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let a = wirespeed_cuda::RegistrationContext::shared(&dev)?;
    /// let b = wirespeed_cuda::RegistrationContext::shared(&dev)?;
    /// assert!(Arc::ptr_eq(&a, &b)); // one context while either holds it
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`RegistrationContext::new`].
    pub fn shared(device: &Device) -> Result<Arc<RegistrationContext>> {
        /// The contexts handed out, by device ordinal; held weakly, so that
        /// this cache keeps none alive.
        static SHARED: Mutex<Vec<(usize, Weak<RegistrationContext>)>> = Mutex::new(Vec::new());
        // Made under the lock: threads asking at once get one context.
        let mut all = lock(&SHARED);
        all.retain(|(_, w)| w.strong_count() > 0);
        let live = all.iter().filter(|(d, _)| *d == device.ordinal()).find_map(|(_, w)| w.upgrade());
        if let Some(c) = live {
            return Ok(c);
        }
        let c = Arc::new(RegistrationContext::new(device)?);
        all.push((device.ordinal(), Arc::downgrade(&c)));
        Ok(c)
    }

    /// The device it belongs to.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// assert_eq!(wirespeed_cuda::RegistrationContext::new(&dev)?.device().ordinal(), 0);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// A number that tells this context apart from every other one made in
    /// this process.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, RegistrationContext};
    /// let dev = Device::get(0)?;
    /// assert_ne!(RegistrationContext::new(&dev)?.id(), RegistrationContext::new(&dev)?.id());
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The driver's handle, for calls this crate does not wrap. Whatever is
    /// done in the context through it is not tracked by this crate; pop what
    /// you push before calling the runtime on that thread.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let ctx = wirespeed_cuda::RegistrationContext::new(&wirespeed_cuda::Device::get(0)?)?;
    /// assert!(!ctx.as_raw().is_null());
    /// # Ok(()) }
    /// ```
    pub fn as_raw(&self) -> CUcontext {
        self.raw
    }

    /// Runs `f` with this context current on the calling thread: pushes it,
    /// runs `f`, pops it. `Err` when it could not be pushed (`f` did not run).
    /// Otherwise `f`'s result, and whether popping worked (and gave back this
    /// context): `f` ran either way. A pop that fails while this context is
    /// still current is tried once more: left current, the context would
    /// make every later runtime call of the thread fail.
    pub(crate) fn with_current<R>(&self, f: impl FnOnce() -> R) -> Result<(R, Result<()>)> {
        // SAFETY: the context is live while `self` is, which outlives this call.
        unsafe { raw::ctx_push(self.raw) }?;
        let r = f();
        let popped = match raw::ctx_pop() {
            Ok(p) if p == self.raw => Ok(()),
            Ok(_) => Err(Error::invalid(
                "RegistrationContext",
                "the context popped was not the one pushed (a context was pushed and not popped meanwhile)",
            )),
            Err(e) if raw::ctx_current().is_ok_and(|c| c == self.raw) => match raw::ctx_pop() {
                Ok(p) if p == self.raw => Ok(()),
                _ => Err(e),
            },
            Err(e) => Err(e),
        };
        Ok((r, popped))
    }
}

impl Drop for RegistrationContext {
    fn drop(&mut self) {
        // SAFETY: the last owner: every registration made in the context held
        // an Arc of it until it was unregistered (a leaked one leaks its Arc, so
        // we never get here), and pushes last only for one call made through
        // `&self`. Nothing uses the context any more, on any thread.
        let _ = unsafe { raw::ctx_destroy(self.raw) };
    }
}
