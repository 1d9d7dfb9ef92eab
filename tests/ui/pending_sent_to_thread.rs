// Sending a pending copy that borrows local buffers to a 'static thread.
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let dev = Device::get(0)?;
    let stream = Stream::new(&dev)?;
    let host = PinnedBuffer::<u8>::new(4096)?;
    let mut on_gpu = DeviceBuffer::<u8>::new(&dev, 4096)?;
    let copy = stream.copy_to_device(&host, &mut on_gpu)?;
    std::thread::spawn(move || copy.wait()).join().unwrap()
}
