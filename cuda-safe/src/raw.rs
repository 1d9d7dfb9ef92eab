//! The result layer: each CUDA runtime call this crate makes, and the few
//! driver calls of a registration context, wrapped to return [`Result`]. This
//! module, `memory.rs` and `sync.rs` (a spin lock) hold the crate's `unsafe`
//! code; the rest is written against these functions.
//!
//! Functions whose arguments are plain values are safe. Functions taking host
//! or device addresses are `unsafe`: the caller vouches for the memory.

use crate::error::{Error, Result};
use std::ffi::{c_int, c_uint, c_void};
use wirespeed_cuda_sys::driver::{CUcontext, CUdevice, CUresult};
use wirespeed_cuda_sys::{
    Api, DriverApi, LibraryApi, LoadError, cudaDeviceAttr, cudaError, cudaError_t, cudaEvent_t, cudaKernel_t,
    cudaLibrary_t, cudaMemcpyKind, cudaMemoryType, cudaStream_t, dim3,
};

/// Where an asynchronous call goes: a stream, with the function table its
/// owner fetched once (the per-copy path then skips [`api`]).
#[derive(Clone, Copy)]
pub(crate) struct Queue {
    pub(crate) api: &'static Api,
    pub(crate) stream: cudaStream_t,
}

/// The loaded runtime's function table.
pub(crate) fn api() -> Result<&'static Api> {
    // A host function's closure calling CUDA lets its stream go on first.
    crate::hostfn::release();
    Ok(wirespeed_cuda_sys::runtime()?.api())
}

#[inline]
pub(crate) fn check(call: &'static str, code: cudaError_t) -> Result<()> {
    if code == cudaError::cudaSuccess { Ok(()) } else { Err(Error::cuda(call, code)) }
}

pub(crate) fn device_count() -> Result<i32> {
    let api = api()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid place for the count.
    check("cudaGetDeviceCount", unsafe { (api.cudaGetDeviceCount)(&mut n) })?;
    Ok(n)
}

pub(crate) fn driver_version() -> Result<i32> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid place for the version.
    check("cudaDriverGetVersion", unsafe { (api.cudaDriverGetVersion)(&mut v) })?;
    Ok(v)
}

/// The calling thread's current device, as the runtime has it.
pub(crate) fn current_device() -> Result<i32> {
    let api = api()?;
    let mut d: c_int = 0;
    // SAFETY: `d` is a valid place for the ordinal.
    check("cudaGetDevice", unsafe { (api.cudaGetDevice)(&mut d) })?;
    Ok(d)
}

pub(crate) fn set_device(ordinal: i32) -> Result<()> {
    let api = api()?;
    // SAFETY: plain value argument; CUDA validates the ordinal.
    check("cudaSetDevice", unsafe { (api.cudaSetDevice)(ordinal) })
}

pub(crate) fn device_attribute(attr: cudaDeviceAttr, ordinal: i32) -> Result<i32> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid place for the value.
    check("cudaDeviceGetAttribute", unsafe { (api.cudaDeviceGetAttribute)(&mut v, attr, ordinal) })?;
    Ok(v)
}

pub(crate) fn device_name(ordinal: i32) -> Result<String> {
    let api = api()?;
    let mut buf = Box::new(wirespeed_cuda_sys::DevicePropBuffer::new());
    // SAFETY: the buffer is as large and aligned as the cudaDeviceProp of either
    // supported major version (cuda-sys asserts it); the loader resolved the
    // symbol matching the loaded version.
    check("cudaGetDeviceProperties", unsafe { (api.cudaGetDeviceProperties)(buf.0.as_mut_ptr().cast(), ordinal) })?;
    Ok(buf.name())
}

pub(crate) fn mem_info() -> Result<(usize, usize)> {
    let api = api()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid places for both values.
    check("cudaMemGetInfo", unsafe { (api.cudaMemGetInfo)(&mut free, &mut total) })?;
    Ok((free, total))
}

pub(crate) fn device_synchronize() -> Result<()> {
    let api = api()?;
    // SAFETY: no arguments.
    check("cudaDeviceSynchronize", unsafe { (api.cudaDeviceSynchronize)() })
}

pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    let api = api()?;
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: valid places for both values.
    check("cudaDeviceGetStreamPriorityRange", unsafe {
        (api.cudaDeviceGetStreamPriorityRange)(&mut least, &mut greatest)
    })?;
    Ok((least, greatest))
}

pub(crate) fn malloc(bytes: usize) -> Result<*mut c_void> {
    let api = api()?;
    let mut p = std::ptr::null_mut();
    // SAFETY: `p` is a valid place for the pointer.
    check("cudaMalloc", unsafe { (api.cudaMalloc)(&mut p, bytes) })?;
    Ok(p)
}

/// # Safety
/// `p` is null or a live `cudaMalloc` pointer that nothing uses any more.
pub(crate) unsafe fn free(p: *mut c_void) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaFree", unsafe { (api.cudaFree)(p) })
}

pub(crate) fn host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    let api = api()?;
    let mut p = std::ptr::null_mut();
    // SAFETY: `p` is a valid place for the pointer.
    check("cudaHostAlloc", unsafe { (api.cudaHostAlloc)(&mut p, bytes, flags as c_uint) })?;
    Ok(p)
}

/// # Safety
/// `p` is a live `cudaHostAlloc` pointer that nothing uses any more.
pub(crate) unsafe fn free_host(p: *mut c_void) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaFreeHost", unsafe { (api.cudaFreeHost)(p) })
}

/// # Safety
/// `[p, p + bytes)` is mapped memory that stays mapped until it is unregistered.
pub(crate) unsafe fn host_register(p: *mut c_void, bytes: usize, flags: u32) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaHostRegister", unsafe { (api.cudaHostRegister)(p, bytes, flags as c_uint) })
}

/// # Safety
/// `p` starts a registration that no in-flight operation uses.
pub(crate) unsafe fn host_unregister(p: *mut c_void) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaHostUnregister", unsafe { (api.cudaHostUnregister)(p) })
}

pub(crate) fn host_get_flags(p: *const c_void) -> Result<u32> {
    let api = api()?;
    let mut f: c_uint = 0;
    // SAFETY: the runtime only looks the address up; `f` is a valid place.
    check("cudaHostGetFlags", unsafe { (api.cudaHostGetFlags)(&mut f, p.cast_mut()) })?;
    Ok(f)
}

pub(crate) fn host_get_device_pointer(p: *const c_void) -> Result<*mut c_void> {
    let api = api()?;
    let mut d = std::ptr::null_mut();
    // SAFETY: the runtime only looks the address up; `d` is a valid place.
    check("cudaHostGetDevicePointer", unsafe { (api.cudaHostGetDevicePointer)(&mut d, p.cast_mut(), 0) })?;
    Ok(d)
}

/// What the runtime knows of an address: `(memory type, device)`, the device
/// negative where the runtime names none.
pub(crate) fn pointer_attributes(p: *const c_void) -> Result<(cudaMemoryType, i32)> {
    let api = api()?;
    let mut a = wirespeed_cuda_sys::cudaPointerAttributes::default();
    // SAFETY: `a` is the larger (CUDA 13) layout, valid for either version; the
    // runtime only looks the address up.
    check("cudaPointerGetAttributes", unsafe { (api.cudaPointerGetAttributes)(&mut a, p) })?;
    Ok((a.type_, a.device))
}

/// # Safety
/// `dst` and `src` are valid for `bytes` bytes as `kind` says, and no other
/// access to `dst` races with the copy.
pub(crate) unsafe fn memcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: cudaMemcpyKind) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaMemcpy", unsafe { (api.cudaMemcpy)(dst, src, bytes, kind) })
}

/// # Safety
/// As [`memcpy`], for the whole time until the stream reaches the copy. `q`
/// comes from a live stream (see [`Queue`]).
#[inline]
pub(crate) unsafe fn memcpy_async(
    q: Queue,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: cudaMemcpyKind,
) -> Result<()> {
    let Queue { api, stream } = q;
    crate::hostfn::release();
    // SAFETY: the caller's contract.
    check("cudaMemcpyAsync", unsafe { (api.cudaMemcpyAsync)(dst, src, bytes, kind, stream) })
}

/// # Safety
/// `dst` is device memory valid for `bytes` that no stream uses.
pub(crate) unsafe fn memset(dst: *mut c_void, value: u8, bytes: usize) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaMemset", unsafe { (api.cudaMemset)(dst, c_int::from(value), bytes) })
}

/// # Safety
/// `dst` is device memory valid for `bytes` until the stream reaches the memset.
pub(crate) unsafe fn memset_async(q: Queue, dst: *mut c_void, value: u8, bytes: usize) -> Result<()> {
    let Queue { api, stream } = q;
    crate::hostfn::release();
    // SAFETY: the caller's contract.
    check("cudaMemsetAsync", unsafe { (api.cudaMemsetAsync)(dst, c_int::from(value), bytes, stream) })
}

pub(crate) fn stream_create(flags: u32, priority: i32) -> Result<cudaStream_t> {
    let api = api()?;
    let mut s = std::ptr::null_mut();
    // SAFETY: `s` is a valid place for the handle.
    check("cudaStreamCreateWithPriority", unsafe {
        (api.cudaStreamCreateWithPriority)(&mut s, flags as c_uint, priority)
    })?;
    Ok(s)
}

/// # Safety
/// `s` is a live stream handle that is not used again.
pub(crate) unsafe fn stream_destroy(s: cudaStream_t) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaStreamDestroy", unsafe { (api.cudaStreamDestroy)(s) })
}

/// # Safety
/// `s` is a live stream handle (or null, the legacy stream).
pub(crate) unsafe fn stream_synchronize(s: cudaStream_t) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaStreamSynchronize", unsafe { (api.cudaStreamSynchronize)(s) })
}

/// `Ok(true)` when idle.
///
/// # Safety
/// `s` is a live stream handle.
pub(crate) unsafe fn stream_query(s: cudaStream_t) -> Result<bool> {
    let api = api()?;
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cudaStreamQuery)(s) };
    if code == cudaError::cudaErrorNotReady {
        return Ok(false);
    }
    check("cudaStreamQuery", code).map(|()| true)
}

/// # Safety
/// `s` and `e` are live handles.
pub(crate) unsafe fn stream_wait_event(s: cudaStream_t, e: cudaEvent_t) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaStreamWaitEvent", unsafe { (api.cudaStreamWaitEvent)(s, e, 0) })
}

/// # Safety
/// `s` is a live stream; `f(data)` is sound to call once, on any thread.
pub(crate) unsafe fn launch_host_func(
    s: cudaStream_t,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaLaunchHostFunc", unsafe { (api.cudaLaunchHostFunc)(s, Some(f), data) })
}

pub(crate) fn event_create(flags: u32) -> Result<cudaEvent_t> {
    let api = api()?;
    let mut e = std::ptr::null_mut();
    // SAFETY: `e` is a valid place for the handle.
    check("cudaEventCreateWithFlags", unsafe { (api.cudaEventCreateWithFlags)(&mut e, flags as c_uint) })?;
    Ok(e)
}

/// # Safety
/// `e` is a live event handle that is not used again.
pub(crate) unsafe fn event_destroy(e: cudaEvent_t) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaEventDestroy", unsafe { (api.cudaEventDestroy)(e) })
}

/// # Safety
/// `e` and `s` are live handles of the same device.
pub(crate) unsafe fn event_record(e: cudaEvent_t, s: cudaStream_t) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaEventRecord", unsafe { (api.cudaEventRecord)(e, s) })
}

/// `Ok(true)` when complete.
///
/// # Safety
/// `e` is a live event handle.
pub(crate) unsafe fn event_query(e: cudaEvent_t) -> Result<bool> {
    let api = api()?;
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cudaEventQuery)(e) };
    if code == cudaError::cudaErrorNotReady {
        return Ok(false);
    }
    check("cudaEventQuery", code).map(|()| true)
}

/// # Safety
/// `e` is a live event handle.
pub(crate) unsafe fn event_synchronize(e: cudaEvent_t) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's contract.
    check("cudaEventSynchronize", unsafe { (api.cudaEventSynchronize)(e) })
}

/// # Safety
/// Both are live event handles.
pub(crate) unsafe fn event_elapsed(start: cudaEvent_t, end: cudaEvent_t) -> Result<f32> {
    let api = api()?;
    let mut ms = 0f32;
    // SAFETY: the caller's contract; `ms` is a valid place.
    check("cudaEventElapsedTime", unsafe { (api.cudaEventElapsedTime)(&mut ms, start, end) })?;
    Ok(ms)
}

/// Clears this thread's last error (after an error the crate already reported).
pub(crate) fn clear_last_error() {
    if let Ok(api) = api() {
        // SAFETY: no arguments.
        unsafe { (api.cudaGetLastError)() };
    }
}

// ---------------------------------------------------------------- kernels

/// The runtime's library functions, looked up once (see [`LibraryApi`]).
fn library_api() -> Result<&'static LibraryApi> {
    static LIBRARY: std::sync::OnceLock<std::result::Result<LibraryApi, LoadError>> = std::sync::OnceLock::new();
    crate::hostfn::release();
    let rt = wirespeed_cuda_sys::runtime()?;
    LIBRARY.get_or_init(|| rt.library_api()).as_ref().map_err(|e| Error::Load(e.clone()))
}

/// Loads the NUL-terminated PTX text `ptx` as a library for every device.
pub(crate) fn library_load_data(ptx: &std::ffi::CStr) -> Result<cudaLibrary_t> {
    let lib = library_api()?;
    use std::ptr::null_mut as none;
    let mut l = none();
    // SAFETY: `l` is a valid place for the handle; `ptx` is NUL-terminated
    // text, which the runtime reads during the call only; no options (null
    // arrays with counts 0).
    check("cudaLibraryLoadData", unsafe {
        (lib.cudaLibraryLoadData)(&mut l, ptx.as_ptr().cast(), none(), none(), 0, none(), none(), 0)
    })?;
    Ok(l)
}

/// # Safety
/// `library` is a live library handle (not unloaded before this returns).
pub(crate) unsafe fn library_get_kernel(library: cudaLibrary_t, name: &std::ffi::CStr) -> Result<cudaKernel_t> {
    let lib = library_api()?;
    let mut k = std::ptr::null_mut();
    // SAFETY: the caller's contract; `k` is a valid place; `name` is NUL-terminated.
    check("cudaLibraryGetKernel", unsafe { (lib.cudaLibraryGetKernel)(&mut k, library, name.as_ptr()) })?;
    Ok(k)
}

/// # Safety
/// `library` is a live library handle that is not used again, by this
/// thread or any other, and no launch of its kernels is queued or running.
pub(crate) unsafe fn library_unload(library: cudaLibrary_t) -> Result<()> {
    let lib = library_api()?;
    // SAFETY: the caller's contract.
    check("cudaLibraryUnload", unsafe { (lib.cudaLibraryUnload)(library) })
}

/// A kernel's grid, block and dynamic shared memory.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) grid: dim3,
    pub(crate) block: dim3,
    pub(crate) shared_bytes: usize,
}

/// # Safety
/// `q` comes from a live stream (see [`Queue`]); `kernel` is a live kernel
/// handle of a library loaded until the launch completes; `params` holds one
/// pointer per parameter of the kernel, in order, each to a value of that
/// parameter's size (the runtime copies them during the call); and what the
/// device code reads and writes is memory that stays valid, and that nothing
/// else writes (or, for what it writes, reads), until the stream reaches the
/// kernel's end.
pub(crate) unsafe fn launch_kernel(
    q: Queue,
    kernel: cudaKernel_t,
    shape: Shape,
    params: &mut [*mut c_void],
) -> Result<()> {
    let Queue { api, stream } = q;
    crate::hostfn::release();
    let Shape { grid, block, shared_bytes } = shape;
    // SAFETY: the caller's contract. A `cudaKernel_t` is accepted in place of
    // the function symbol (CUDA 12 and later).
    check("cudaLaunchKernel", unsafe {
        (api.cudaLaunchKernel)(kernel.cast_const().cast(), grid, block, params.as_mut_ptr(), shared_bytes, stream)
    })
}

// ---------------------------------------------------------------- the driver API

/// The driver's function table (see [`wirespeed_cuda_sys::driver`]).
pub(crate) fn driver() -> Result<&'static DriverApi> {
    crate::hostfn::release();
    Ok(wirespeed_cuda_sys::driver()?.api())
}

#[inline]
fn check_driver(call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(Error::driver(call, code)) }
}

/// `cuInit(0)`: idempotent, needed before any other driver call.
pub(crate) fn driver_init() -> Result<()> {
    let d = driver()?;
    // SAFETY: plain value argument (flags must be 0).
    check_driver("cuInit", unsafe { (d.cuInit)(0) })
}

pub(crate) fn driver_device(ordinal: i32) -> Result<CUdevice> {
    let d = driver()?;
    let mut dev: CUdevice = 0;
    // SAFETY: `dev` is a valid place for the handle; the driver checks the ordinal.
    check_driver("cuDeviceGet", unsafe { (d.cuDeviceGet)(&mut dev, ordinal) })?;
    Ok(dev)
}

/// Creates a context on `dev`; the driver pushes it on the calling thread's
/// stack (it is current when this returns).
pub(crate) fn ctx_create(dev: CUdevice) -> Result<CUcontext> {
    let d = driver()?;
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: `c` is a valid place for the handle; flags 0 (CU_CTX_SCHED_AUTO).
    check_driver("cuCtxCreate", unsafe { (d.cuCtxCreate_v2)(&mut c, 0, dev) })?;
    Ok(c)
}

/// # Safety
/// `c` is a live context that nothing uses any more, on any thread.
pub(crate) unsafe fn ctx_destroy(c: CUcontext) -> Result<()> {
    let d = driver()?;
    // SAFETY: the caller's contract.
    check_driver("cuCtxDestroy", unsafe { (d.cuCtxDestroy_v2)(c) })
}

/// # Safety
/// `c` is a live context, and stays live until it is popped again.
pub(crate) unsafe fn ctx_push(c: CUcontext) -> Result<()> {
    let d = driver()?;
    // SAFETY: the caller's contract.
    check_driver("cuCtxPushCurrent", unsafe { (d.cuCtxPushCurrent_v2)(c) })
}

/// Pops the calling thread's current context and returns it.
pub(crate) fn ctx_pop() -> Result<CUcontext> {
    let d = driver()?;
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: `c` is a valid place for the handle.
    check_driver("cuCtxPopCurrent", unsafe { (d.cuCtxPopCurrent_v2)(&mut c) })?;
    Ok(c)
}

/// The calling thread's current context (null when none).
pub(crate) fn ctx_current() -> Result<CUcontext> {
    let d = driver()?;
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: `c` is a valid place for the handle.
    check_driver("cuCtxGetCurrent", unsafe { (d.cuCtxGetCurrent)(&mut c) })?;
    Ok(c)
}

/// Registers in the calling thread's current context.
///
/// # Safety
/// As [`host_register`].
pub(crate) unsafe fn mem_host_register(p: *mut c_void, bytes: usize, flags: u32) -> Result<()> {
    let d = driver()?;
    // SAFETY: the caller's contract.
    check_driver("cuMemHostRegister", unsafe { (d.cuMemHostRegister_v2)(p, bytes, flags as c_uint) })
}

/// Unregisters in the calling thread's current context. In a second context
/// (a [`RegistrationContext`](crate::RegistrationContext)'s), unlike
/// `cudaHostUnregister` in the primary context, the driver does not wait for
/// copies.
///
/// # Safety
/// `p` starts a registration of the current context that no queued or running
/// operation uses: every copy that reads it has completed.
pub(crate) unsafe fn mem_host_unregister(p: *mut c_void) -> Result<()> {
    let d = driver()?;
    // SAFETY: the caller's contract.
    check_driver("cuMemHostUnregister", unsafe { (d.cuMemHostUnregister)(p) })
}
