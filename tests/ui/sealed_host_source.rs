// HostSource is sealed: user types cannot declare themselves pinned memory.
use wirespeed_cuda::{Fence, HostSource};

struct Pretend(Vec<u8>, Fence);

impl HostSource<u8> for Pretend {
    fn host_src(&self) -> (*const u8, usize, &Fence) {
        (self.0.as_ptr(), self.0.len(), &self.1)
    }
}

fn main() {}
