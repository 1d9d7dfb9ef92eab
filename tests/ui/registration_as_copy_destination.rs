// Registered memory is a copy source only: the device never writes it.
use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let mut reg = HostRegistration::new(vec![0u8; 64].into_boxed_slice(), RegisterFlags::default())?;
    let on_gpu = DeviceBuffer::<u8>::zeroed(&dev, 64)?;
    stream.copy_to_host(&on_gpu, &mut reg)?.wait()
}
