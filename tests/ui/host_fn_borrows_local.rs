// A host function runs later, on another thread: it cannot borrow locals.
use wirespeed_cuda::{Device, Stream};

fn main() -> wirespeed_cuda::Result<()> {
    let stream = Stream::new(&Device::get(0)?)?;
    let log = std::sync::Mutex::new(Vec::new());
    stream.launch_host_fn(|| log.lock().unwrap().push(1))?;
    stream.synchronize()
}
