// A device slice kept after its buffer is gone.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let mut host = PinnedBuffer::<u8>::new(16)?;
    let part;
    {
        let on_gpu = DeviceBuffer::<u8>::zeroed(&dev, 64)?;
        part = on_gpu.slice(0..16)?;
    }
    stream.copy_to_host(&part, &mut host)?.wait()
}
