// Pod is an unsafe trait: claiming it needs `unsafe impl`.
use wirespeed_cuda::Pod;

#[derive(Clone, Copy)]
struct Padded {
    a: u8,
    b: u64,
}

impl Pod for Padded {}

fn main() {}
