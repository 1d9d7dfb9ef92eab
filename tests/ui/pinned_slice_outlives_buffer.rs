// A pinned slice kept after its buffer is gone.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 16)?;
    let part;
    {
        let host = PinnedBuffer::<u8>::new(64)?;
        part = host.slice(0..16)?;
    }
    stream.copy_to_device(&part, &mut on_gpu)?.wait()
}
