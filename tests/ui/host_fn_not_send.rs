// A host function runs on a runtime thread: it must be Send.
use wirespeed_cuda::{Device, Stream};
use std::rc::Rc;

fn main() -> wirespeed_cuda::Result<()> {
    let stream = Stream::new(&Device::get(0)?)?;
    let counter = Rc::new(std::cell::Cell::new(0));
    let c = counter.clone();
    stream.launch_host_fn(move || c.set(c.get() + 1))?;
    stream.synchronize()
}
