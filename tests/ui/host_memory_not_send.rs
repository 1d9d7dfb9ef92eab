// Registered memory is read by the runtime and may move between threads:
// HostMemory requires Send + Sync, so an Rc-owned buffer cannot be registered.
use wirespeed_cuda::HostMemory;
use std::rc::Rc;

struct Shared(Rc<Box<[u8]>>);

unsafe impl HostMemory for Shared {
    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn main() {}
