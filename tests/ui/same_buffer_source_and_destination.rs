// One device buffer as both source and destination of a copy.
use wirespeed_cuda::{Device, DeviceBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 64)?;
    stream.copy_device_to_device(&on_gpu, &mut on_gpu)?.wait()
}
