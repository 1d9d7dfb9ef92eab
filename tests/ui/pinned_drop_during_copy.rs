// Dropping a pinned buffer while an asynchronous copy reads it.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let host = PinnedBuffer::<u8>::new(4096)?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 4096)?;
    let copy = stream.copy_to_device(&host, &mut on_gpu)?;
    drop(host);
    copy.wait()
}
