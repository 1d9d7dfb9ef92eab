// Copying between buffers of different element types.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let host = PinnedBuffer::<u32>::new(64)?;
    let mut on_gpu = DeviceBuffer::<f32>::new(&dev, 64)?;
    stream.copy_to_device(&host, &mut on_gpu)?.wait()
}
