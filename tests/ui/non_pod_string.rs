// A type with a heap pointer is not plain data: no device buffer of String.
use wirespeed_cuda::{Device, DeviceBuffer};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let _names = DeviceBuffer::<String>::new(&dev, 8)?;
    Ok(())
}
