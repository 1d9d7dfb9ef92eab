// The option structs of wirespeed-pinned may grow: a struct literal outside
// the crate, whole or with `..Default::default()`, is refused. Build them with
// their constructors and builder methods (ui-pass/options_builders.rs).
use wirespeed_pinned::PinOptions;

fn main() {
    let _whole = PinOptions { mlock: true, portable: false, mapped: false };
    let _rest = PinOptions { portable: true, ..Default::default() };
}
