// References are not plain data: no pinned buffer of &u8.
use wirespeed_cuda::PinnedBuffer;

fn main() -> wirespeed_cuda::Result<()> {
    let _refs = PinnedBuffer::<&'static u8>::new(8)?;
    Ok(())
}
