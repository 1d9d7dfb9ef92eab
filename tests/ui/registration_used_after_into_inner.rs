// Using a registration after into_inner gave its memory back.
use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let reg = HostRegistration::new(vec![0u8; 4096].into_boxed_slice(), RegisterFlags::default())?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 4096)?;
    let memory = reg.into_inner()?;
    stream.copy_to_device(&reg, &mut on_gpu)?.wait()?;
    drop(memory);
    Ok(())
}
