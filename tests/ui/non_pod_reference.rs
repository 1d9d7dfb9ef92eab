// References are not plain data: no pinned buffer of &u8.
use cuda_safe::PinnedBuffer;

fn main() -> cuda_safe::Result<()> {
    let _refs = PinnedBuffer::<&'static u8>::new(8)?;
    Ok(())
}
