// A read-only device view cannot be written.
use wirespeed_cuda::{Device, DeviceBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let on_gpu = DeviceBuffer::<u8>::new(&dev, 64)?;
    let mut view = on_gpu.slice(..)?;
    stream.memset(&mut view, 0)?.wait()
}
