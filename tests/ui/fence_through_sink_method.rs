// The source and sink traits' methods hand out a buffer's fence; only
// cuda-safe can call them (they take a token no other crate can make). If safe
// code could reach `&mut Fence`, `mem::take` on it would erase the record of a
// copy in flight, and `as_slice` would then read memory the DMA still writes.
use wirespeed_cuda::{Device, DeviceBuffer, DeviceSink, HostSink, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let s = Stream::new(&dev)?;
    let d = DeviceBuffer::<u8>::zeroed(&dev, 4096)?;
    let mut p = PinnedBuffer::<u8>::new(4096)?;
    s.copy_to_host(&d, &mut p)?.detach();
    let _ = std::mem::take(p.host_dst().2);
    let mut d2 = DeviceBuffer::<u8>::new(&dev, 4096)?;
    let _ = std::mem::take(d2.device_dst().2);
    // Nor can the token be named or made here.
    let _ = std::mem::take(p.host_dst(wirespeed_cuda::memory::traits::sealed::Token(())).2);
    Ok(())
}
