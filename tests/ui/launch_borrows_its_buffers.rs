// Reading a batch on the host while a kernel launch writes it, and freeing
// the records it reads.
use wirespeed_cuda::{Device, DeviceBuffer, KernelArgs, LaunchConfig, Library, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let gather = Library::load_ptx(".version 7.0\n.target sm_70\n.entry wirespeed_gather() { ret; }")?
        .kernel("wirespeed_gather")?;
    let records = DeviceBuffer::<u8>::new(&dev, 4096)?;
    let offsets = DeviceBuffer::<u64>::new(&dev, 4)?;
    let mut batch = DeviceBuffer::<u8>::new(&dev, 4 * 16)?;
    let args = KernelArgs::new().write(&mut batch).read(&records).read(&offsets).value(4u64).value(16u64);
    // SAFETY: wirespeed_gather's parameters and spans.
    let launch = unsafe { stream.launch(&gather, LaunchConfig::linear(1, 256), args) }?;
    let seen = batch.to_vec()?;
    drop(records);
    launch.wait()?;
    println!("{}", seen[0]);
    Ok(())
}
