//! The checks of a transfer's arguments before anything is pinned: the
//! range against the file, the destination against the range, and a need
//! against the budget.

use std::ops::Range;

use wirespeed_cuda::{DeviceSliceMut, Pod};

use crate::budget::PinBudget;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;

/// The length of `range`, once it is a range of `file`.
///
/// # Errors
/// [`Error::BadRange`] for a reversed range or one past the file's end.
pub(super) fn check_range(file: &MappedFile, range: &Range<u64>) -> Result<u64> {
    if range.start > range.end || range.end > file.len() {
        return Err(Error::BadRange {
            range: range.clone(),
            len: file.len(),
            reason: if range.start > range.end {
                "the range is reversed"
            } else {
                "the range runs past the end of the file"
            },
        });
    }
    Ok(range.end - range.start)
}

/// Refuses `need` bytes that the budget does not have available now.
///
/// # Errors
/// [`Error::BudgetExceeded`].
pub(super) fn check_budget(budget: &PinBudget, need: u64) -> Result<()> {
    let available = budget.available();
    if need > available {
        return Err(Error::BudgetExceeded { requested: need, available, limit: budget.limit() });
    }
    Ok(())
}

/// `dst` as bytes, when it holds exactly `len` bytes (whole values of `T`).
///
/// # Errors
/// [`Error::InvalidArgument`] (for `what`) otherwise, or for a zero-sized `T`.
pub(super) fn bytes_of_range<'d, T: Pod>(
    what: &'static str,
    dst: DeviceSliceMut<'d, T>,
    len: u64,
) -> Result<DeviceSliceMut<'d, u8>> {
    let size = size_of::<T>() as u64;
    if size == 0 {
        return Err(Error::invalid(what, "the destination's element type has no size"));
    }
    if !len.is_multiple_of(size) {
        return Err(Error::invalid(
            what,
            format!("the range holds {len} bytes, not a whole number of {size}-byte values of the destination's type"),
        ));
    }
    let dst = dst.into_bytes();
    if dst.len() as u64 != len {
        return Err(Error::invalid(what, format!("destination holds {} bytes, the range {len}", dst.len())));
    }
    Ok(dst)
}
