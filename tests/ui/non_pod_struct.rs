// A struct is plain data only by an explicit `unsafe impl Pod`.
use wirespeed_cuda::{Device, DeviceBuffer};

#[derive(Clone, Copy)]
struct Padded {
    a: u8,
    b: u64,
}

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let _v = DeviceBuffer::<Padded>::zeroed(&dev, 8)?;
    Ok(())
}
