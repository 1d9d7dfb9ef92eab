// Two writable views of one device buffer at once.
use wirespeed_cuda::{Device, DeviceBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 64)?;
    let mut low = on_gpu.slice_mut(0..32)?;
    let mut high = on_gpu.slice_mut(32..64)?;
    stream.memset(&mut low, 0)?.detach();
    stream.memset(&mut high, 1)?.detach();
    Ok(())
}
