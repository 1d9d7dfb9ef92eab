// Pod is an unsafe trait: claiming it needs `unsafe impl`.
use cuda_safe::Pod;

#[derive(Clone, Copy)]
struct Padded {
    a: u8,
    b: u64,
}

impl Pod for Padded {}

fn main() {}
