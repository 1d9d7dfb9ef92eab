// A type with a heap pointer is not plain data: no device buffer of String.
use cuda_safe::{Device, DeviceBuffer};

fn main() -> cuda_safe::Result<()> {
    let dev = Device::get(0)?;
    let _names = DeviceBuffer::<String>::new(&dev, 8)?;
    Ok(())
}
