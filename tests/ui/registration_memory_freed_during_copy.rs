// Taking the memory back out of a registration while a copy still reads it.
use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let reg = HostRegistration::new(vec![0u8; 4096].into_boxed_slice(), RegisterFlags::default())?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 4096)?;
    let copy = stream.copy_to_device(&reg, &mut on_gpu)?;
    drop(reg.into_inner()?);
    copy.wait()
}
