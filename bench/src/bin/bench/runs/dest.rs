//! Where the file goes on the device, and the check of what arrived there.

use crate::checksum;
use crate::gpu::Gpu;
use crate::results::Intact;
use crate::session::Bench;
use crate::util::{Fatal, GIB, MIB, Result, fmt_bytes, round_down};
use wirespeed_cuda::{DeviceBuffer, Stream};

/// The chunk size of the baselines, and what a scratch buffer is a multiple of.
pub const CHUNK: u64 = 64 * MIB;

/// Where the file goes on the device: a buffer of the file's size when it fits
/// in free device memory, else a scratch buffer that the data wraps around in.
pub struct Dest {
    pub buf: DeviceBuffer<u8>,
    pub scratch: bool,
}

impl Dest {
    pub fn new(gpu: &Gpu, len: u64) -> Result<Dest> {
        let (free, _) = gpu.device.mem_info()?;
        let free = free as u64;
        let margin = 512 * MIB + free / 20;
        if len + margin <= free {
            return Ok(Dest { buf: DeviceBuffer::new(&gpu.device, len as usize)?, scratch: false });
        }
        let s = round_down((free / 2).min(4 * GIB), CHUNK);
        if s + margin / 2 > free {
            return Err(Fatal::Run(format!(
                "the GPU has only {} free: not enough for a scratch buffer",
                fmt_bytes(free)
            )));
        }
        Ok(Dest { buf: DeviceBuffer::new(&gpu.device, s as usize)?, scratch: true })
    }

    pub fn describe(&self) -> String {
        if self.scratch {
            format!(
                "a {} scratch buffer on the GPU (the file does not fit: it wraps around)",
                fmt_bytes(self.buf.len() as u64)
            )
        } else {
            format!("a {} device buffer (the whole file)", fmt_bytes(self.buf.len() as u64))
        }
    }

    /// Device offset of file offset `off` (relative to the range start).
    pub fn at(&self, off: u64) -> usize {
        if self.scratch { (off % self.buf.len() as u64) as usize } else { off as usize }
    }

    pub fn clear(&mut self, stream: &Stream) -> Result<()> {
        stream.memset(&mut self.buf, 0)?.wait()?;
        Ok(())
    }

    /// Compares what is on the device with what `data` (streamed from its start) should have left there.
    pub fn verify(&self, b: &mut Bench, data: &[u8], whole_sum: Option<u64>) -> Result<Intact> {
        let n = data.len();
        let s = self.buf.len();
        let (expected, dev_range) = if !self.scratch || n <= s {
            let e = match whole_sum {
                Some(sum) if n == data.len() => sum,
                _ => checksum::of_host(data, b.threads),
            };
            (e, 0..n)
        } else {
            // The last pass left data[n-r..n] at the start, data[n-s..n-r] after it.
            let r = n % s;
            (checksum::of_parts(&[&data[n - r..], &data[n - s..n - r]]), 0..s)
        };
        let got = b.readback.checksum(&self.buf, dev_range)?;
        Ok(Intact::compare(expected, got))
    }
}
