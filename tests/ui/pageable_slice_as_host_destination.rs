// A pageable slice as the destination of an asynchronous device-to-host copy.
use wirespeed_cuda::{Device, DeviceBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let on_gpu = DeviceBuffer::<u32>::zeroed(&dev, 64)?;
    let mut out = vec![0u32; 64];
    stream.copy_to_host(&on_gpu, &mut out[..])?.wait()
}
