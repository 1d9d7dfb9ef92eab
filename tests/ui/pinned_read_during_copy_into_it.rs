// Reading a pinned buffer while an asynchronous copy writes into it.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let on_gpu = DeviceBuffer::<u32>::zeroed(&dev, 256)?;
    let mut host = PinnedBuffer::<u32>::new(256)?;
    let copy = stream.copy_to_host(&on_gpu, &mut host)?;
    println!("{}", host.as_slice()?[0]);
    copy.wait()
}
