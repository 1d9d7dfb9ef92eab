//! The only raw CUDA calls of the bench: what cuda-safe deliberately does not
//! offer (copies from pageable memory into part of a buffer, asynchronous
//! copies from pageable memory, as PyTorch's `i.cuda()` and
//! `i.cuda(non_blocking=True)` do) and the raw baseline of the overhead
//! microbenchmark. Each function waits for its copies before it returns, so the
//! borrows it takes cover the whole time CUDA may touch the memory.

use crate::util::{Fatal, Result};
use std::time::Instant;
use wirespeed_bench::cpu;
use wirespeed_cuda::sys::{Api, cudaError, cudaError_t, cudaMemcpyKind};
use wirespeed_cuda::{DeviceBuffer, PinnedBuffer, Stream};

fn api() -> Result<&'static Api> {
    Ok(wirespeed_cuda::sys::runtime()?.api())
}

fn check(call: &str, code: cudaError_t) -> Result<()> {
    if code == cudaError::cudaSuccess {
        return Ok(());
    }
    let (name, message) = match wirespeed_cuda::sys::runtime() {
        Ok(rt) => (rt.error_name(code), rt.error_string(code)),
        Err(_) => (format!("cudaError({})", code.0), String::new()),
    };
    Err(Fatal::Run(format!("{call} failed: {name} ({}): {message}", code.0)))
}

fn in_bounds(dst: &DeviceBuffer<u8>, at: usize, n: usize) -> Result<()> {
    if at.checked_add(n).is_none_or(|end| end > dst.len()) {
        return Err(Fatal::Run(format!("copy of {n} bytes at {at} does not fit a device buffer of {}", dst.len())));
    }
    Ok(())
}

/// Copies each `(offset in dst, pageable source)` with a synchronous
/// `cudaMemcpy` (PyTorch's `i.cuda()`), calling `each(bytes)` after each, and
/// waits for the device before returning.
pub fn copy_pageable<'a>(
    dst: &mut DeviceBuffer<u8>,
    copies: impl IntoIterator<Item = (usize, &'a [u8])>,
    mut each: impl FnMut(usize),
) -> Result<()> {
    let api = api()?;
    let dev = dst.device();
    dev.synchronize()?; // no stream may still use `dst`
    let mut result = Ok(());
    for (at, src) in copies {
        if let Err(e) = in_bounds(dst, at, src.len()) {
            result = Err(e);
            break;
        }
        let d = dst.as_raw_ptr().wrapping_add(at);
        // SAFETY: `d..d + src.len()` lies inside the live allocation `dst` owns
        // (checked above) and `dst` is borrowed exclusively, with no stream
        // using it (device synchronized above); `src` is valid for reads of its
        // length, and a pageable cudaMemcpy has finished reading it on return.
        let code = unsafe {
            (api.cudaMemcpy)(d.cast(), src.as_ptr().cast(), src.len(), cudaMemcpyKind::cudaMemcpyHostToDevice)
        };
        if let Err(e) = check("cudaMemcpy", code) {
            result = Err(e);
            break;
        }
        each(src.len());
    }
    // The DMA of the last copy may still run: wait before `dst` is released.
    let synced = dev.synchronize();
    result?;
    Ok(synced?)
}

/// Copies each `(offset in dst, pageable source)` with `cudaMemcpyAsync` on
/// `stream` (PyTorch's `i.cuda(non_blocking=True)`), then waits for the stream.
pub fn copy_pageable_async<'a>(
    stream: &Stream,
    dst: &mut DeviceBuffer<u8>,
    copies: impl IntoIterator<Item = (usize, &'a [u8])>,
) -> Result<()> {
    let api = api()?;
    dst.device().synchronize()?;
    let raw = stream.as_raw();
    let mut result = Ok(());
    for (at, src) in copies {
        if let Err(e) = in_bounds(dst, at, src.len()) {
            result = Err(e);
            break;
        }
        let d = dst.as_raw_ptr().wrapping_add(at);
        // SAFETY: as in `copy_pageable`; the copy may run after the call
        // returns, but `src` and `dst` stay borrowed until the stream is
        // synchronized below, before this function returns (also on error).
        let code = unsafe {
            (api.cudaMemcpyAsync)(d.cast(), src.as_ptr().cast(), src.len(), cudaMemcpyKind::cudaMemcpyHostToDevice, raw)
        };
        if let Err(e) = check("cudaMemcpyAsync", code) {
            result = Err(e);
            break;
        }
    }
    let synced = stream.synchronize();
    result?;
    Ok(synced?)
}

/// `count` raw `cudaMemcpyAsync` calls copying all of `src` into `dst` on
/// `stream`, each preceded by `cudaSetDevice` when `set_device` (what the safe
/// layer does to make objects usable from any thread). Returns the calling
/// thread's CPU seconds and the wall seconds of the enqueue loop alone; waits
/// for the stream before returning.
pub fn raw_copies(
    stream: &Stream,
    src: &PinnedBuffer<u8>,
    dst: &mut DeviceBuffer<u8>,
    count: usize,
    set_device: bool,
) -> Result<(f64, f64)> {
    let api = api()?;
    if src.len() != dst.len() {
        return Err(Fatal::Run("raw_copies: source and destination lengths differ".into()));
    }
    stream.device().synchronize()?; // no fenced work may use `dst` meanwhile
    stream.device().make_current()?;
    let (d, s, n, raw) = (dst.as_raw_ptr(), src.as_ptr(), src.len(), stream.as_raw());
    let ordinal = stream.device().ordinal() as i32;
    let mut result = Ok(());
    let (c0, t0) = (cpu::thread_seconds(), Instant::now());
    for _ in 0..count {
        if set_device {
            // SAFETY: a plain value argument; the runtime checks the ordinal.
            let code = unsafe { (api.cudaSetDevice)(ordinal) };
            if code != cudaError::cudaSuccess {
                result = check("cudaSetDevice", code);
                break;
            }
        }
        // SAFETY: `s` is pinned memory valid for `n` bytes and `d` device memory
        // of the stream's (current) device valid for `n` bytes; both stay
        // borrowed, unwritten by the host and unused by other streams until the
        // stream is synchronized below.
        let code = unsafe { (api.cudaMemcpyAsync)(d.cast(), s.cast(), n, cudaMemcpyKind::cudaMemcpyHostToDevice, raw) };
        if code != cudaError::cudaSuccess {
            result = check("cudaMemcpyAsync", code);
            break;
        }
    }
    let (cpu, wall) = (cpu::thread_seconds() - c0, t0.elapsed().as_secs_f64());
    let synced = stream.synchronize();
    result?;
    synced?;
    Ok((cpu, wall))
}
