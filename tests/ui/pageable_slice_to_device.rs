// A pageable slice as the source of an asynchronous copy.
use wirespeed_cuda::{Device, DeviceBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let data = [1u32; 64];
    let mut on_gpu = DeviceBuffer::<u32>::new(&dev, 64)?;
    stream.copy_to_device(&data[..], &mut on_gpu)?.wait()
}
