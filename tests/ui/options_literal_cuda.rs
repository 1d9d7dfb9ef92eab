// The option structs of wirespeed-cuda may grow: a struct literal outside the
// crate is refused. Build them with their constructors and builder methods
// (ui-pass/options_builders.rs).
use wirespeed_cuda::{EventOptions, LaunchConfig, PinnedFlags, RegisterFlags, StreamOptions};

fn main() {
    let _ = EventOptions { timing: true, blocking_sync: false };
    let _ = StreamOptions { non_blocking: true, ..Default::default() };
    let _ = PinnedFlags { portable: true, mapped: false, write_combined: false };
    let _ = RegisterFlags { read_only: true, ..Default::default() };
    let _ = LaunchConfig { grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0 };
}
