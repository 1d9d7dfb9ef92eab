// Writing a pinned buffer while an asynchronous copy reads it.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let mut host = PinnedBuffer::<f32>::new(1024)?;
    let mut on_gpu = DeviceBuffer::<f32>::new(&dev, 1024)?;
    let copy = stream.copy_to_device(&host, &mut on_gpu)?;
    host.as_mut_slice()?.fill(1.0);
    copy.wait()
}
