//! The direct agent's reads ([`Strategy::Direct`](crate::Strategy::Direct)),
//! for cold files: a ring agent (`ring.rs`) whose slots are filled with
//! `O_DIRECT` reads of the aligned pages around its part, straight from the
//! disk, bypassing the page cache.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::ring::{FreeSlot, FullSlot};
use crate::strategy::DIRECT_ALIGN;
use crate::util::{align_down, align_up};

/// Reads bytes `r` of `file` from `f` (its `O_DIRECT` descriptor): the
/// aligned pages around them, into the slot, then marks the wanted bytes.
///
/// # Errors
/// [`Error::DirectUnsupported`] where the file system refuses `O_DIRECT`
/// reads; [`Error::FileChanged`] for a file that ended early; [`Error::Io`];
/// [`Error::InvalidArgument`] for a slot that is not aligned or too small.
pub(super) fn direct_read(mut slot: FreeSlot, f: &File, file: &MappedFile, r: Range<u64>) -> Result<FullSlot> {
    let a0 = align_down(r.start, DIRECT_ALIGN);
    let need = (r.end - a0) as usize;
    let want = align_up(need as u64, DIRECT_ALIGN) as usize;
    let buf = slot.as_mut_slice()?;
    if !(buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN as usize) || want > buf.len() {
        return Err(Error::invalid("direct read", "the slot is not aligned or too small for O_DIRECT"));
    }
    let mut got = 0usize;
    while got < need {
        match f.read_at(&mut buf[got..want], a0 + got as u64) {
            Ok(0) => {
                return Err(Error::FileChanged {
                    path: file.path().to_path_buf(),
                    message: format!("it ended before byte {}", r.end),
                });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(Error::DirectUnsupported { path: file.path().to_path_buf(), source: e });
            }
            Err(e) => return Err(Error::io("pread(O_DIRECT)", file.path(), e)),
        }
        if !got.is_multiple_of(DIRECT_ALIGN as usize) && got < need {
            // A short read in the middle of the file: continue from an aligned offset.
            got = align_down(got as u64, DIRECT_ALIGN) as usize;
        }
    }
    slot.fill((r.start - a0) as usize..need)
}
