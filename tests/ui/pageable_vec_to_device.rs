// A pageable Vec as the source of an asynchronous copy.
use wirespeed_cuda::{Device, DeviceBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let data = vec![0u8; 4096];
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 4096)?;
    stream.copy_to_device(&data, &mut on_gpu)?.wait()
}
