//! Errors: every fallible call of this crate returns [`Result`]; nothing panics.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use crate::util::Bytes;

/// The result of every fallible call of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
///
/// ```
/// let e = wirespeed_pinned::Error::BudgetExceeded { requested: 3 << 30, available: 1 << 30, limit: 2 << 30 };
/// assert!(e.to_string().contains("pin budget"));
/// assert_eq!(e.cuda_call(), None);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA runtime call failed (the inner error names the call, see [`Error::cuda_call`]).
    Cuda(wirespeed_cuda::Error),
    /// A system call on a file failed.
    Io {
        /// What was being done (`"open"`, `"mmap"`, `"pread"`, ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The path is not a regular file (a directory, a device, a pipe...).
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The file is empty: there is nothing to map.
    EmptyFile {
        /// The path.
        path: PathBuf,
    },
    /// The file changed under us (size or identity), e.g. truncated while mapped.
    FileChanged {
        /// The path.
        path: PathBuf,
        /// What changed.
        message: String,
    },
    /// A byte range that is empty or does not lie inside the file.
    BadRange {
        /// The range asked for.
        range: Range<u64>,
        /// The file's length.
        len: u64,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The pages of the range are already registered by another range of the
    /// same mapping that does not contain it (CUDA refuses a page registered
    /// twice). Ranges contained in a live registration share it instead.
    Overlap {
        /// The byte range asked for.
        requested: Range<u64>,
        /// The pages (file offsets) of the registration it collides with.
        existing: Range<u64>,
        /// Why they could not share.
        reason: &'static str,
    },
    /// Pinning this much would exceed the [`PinBudget`](crate::PinBudget).
    BudgetExceeded {
        /// Bytes asked for (rounded out to pages).
        requested: u64,
        /// Bytes still available in the budget.
        available: u64,
        /// The budget's limit.
        limit: u64,
    },
    /// `mlock` would exceed `RLIMIT_MEMLOCK` (and the process lacks `CAP_IPC_LOCK`).
    MemlockLimit {
        /// The soft `RLIMIT_MEMLOCK` in bytes.
        limit: u64,
        /// Bytes asked for (rounded out to pages).
        requested: u64,
        /// Bytes this process had locked already.
        locked: u64,
    },
    /// The file system refused `O_DIRECT` (tmpfs, some network or FUSE file systems).
    DirectUnsupported {
        /// The file.
        path: PathBuf,
        /// The operating system's error (usually `EINVAL`).
        source: std::io::Error,
    },
    /// An argument was wrong (a zero size, a length mismatch, ...).
    InvalidArgument {
        /// The operation that refused it.
        what: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A worker thread panicked (e.g. inside a progress callback).
    WorkerPanicked {
        /// The panic message, when it was a string.
        message: String,
    },
    /// A transfer started with [`Streamer::start`](crate::Streamer::start)
    /// failed: what [`Transfer::then_on`](crate::Transfer::then_on) answers
    /// once it knows (the transfer's own error comes from
    /// [`Transfer::wait`](crate::Transfer::wait)).
    TransferFailed {
        /// The transfer's error, as text.
        message: String,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { op, path: path.into(), source }
    }

    pub(crate) fn invalid(what: &'static str, message: impl Into<String>) -> Error {
        Error::InvalidArgument { what, message: message.into() }
    }

    /// The CUDA runtime or driver function that failed (`"cudaHostRegister"`,
    /// `"cuMemHostRegister"`), for CUDA errors.
    ///
    /// ```
    /// let e = wirespeed_pinned::Error::from(wirespeed_cuda::Error::Cuda {
    ///     call: "cudaHostRegister", code: 2, name: "cudaErrorMemoryAllocation".into(), message: String::new(),
    /// });
    /// assert_eq!(e.cuda_call(), Some("cudaHostRegister"));
    /// ```
    pub fn cuda_call(&self) -> Option<&str> {
        match self {
            Error::Cuda(e @ (wirespeed_cuda::Error::Cuda { .. } | wirespeed_cuda::Error::Driver { .. })) => {
                Some(e.call())
            }
            _ => None,
        }
    }

    /// The CUDA error, when this is one.
    ///
    /// ```
    /// let e = wirespeed_pinned::Error::from(wirespeed_cuda::Error::Cuda {
    ///     call: "cudaMemcpyAsync", code: 700, name: "cudaErrorIllegalAddress".into(), message: String::new(),
    /// });
    /// assert!(e.as_cuda().is_some());
    /// let budget = wirespeed_pinned::Error::BudgetExceeded { requested: 2, available: 1, limit: 1 };
    /// assert!(budget.as_cuda().is_none());
    /// ```
    pub fn as_cuda(&self) -> Option<&wirespeed_cuda::Error> {
        match self {
            Error::Cuda(e) => Some(e),
            _ => None,
        }
    }

    /// True when the CUDA context is lost and nothing on the device will work
    /// again in this process (see [`wirespeed_cuda::Error::is_sticky`]).
    ///
    /// ```
    /// let e = wirespeed_pinned::Error::from(wirespeed_cuda::Error::Cuda {
    ///     call: "cudaMemcpyAsync", code: 700, name: "cudaErrorIllegalAddress".into(), message: String::new(),
    /// });
    /// assert!(e.is_sticky()); // an illegal address loses the context
    /// ```
    pub fn is_sticky(&self) -> bool {
        self.as_cuda().is_some_and(wirespeed_cuda::Error::is_sticky)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cuda(e) => write!(f, "{e}"),
            Error::Io { op, path, source } => write!(f, "{op} {}: {source}", path.display()),
            Error::NotAFile { path, kind } => {
                write!(f, "{} is a {kind}, not a regular file: only regular files can be mapped", path.display())
            }
            Error::EmptyFile { path } => write!(f, "{} is empty: there is nothing to map", path.display()),
            Error::FileChanged { path, message } => write!(f, "{} changed while in use: {message}", path.display()),
            Error::BadRange { range, len, reason } => {
                write!(f, "byte range {}..{} of a {len}-byte file: {reason}", range.start, range.end)
            }
            Error::Overlap { requested, existing, reason } => write!(
                f,
                "byte range {}..{} shares pages with a live registration of pages {}..{} of the same mapping: {reason} \
                 (CUDA refuses a page registered twice: release the other range, ask for a range inside it, or use disjoint pages)",
                requested.start, requested.end, existing.start, existing.end
            ),
            Error::BudgetExceeded { requested, available, limit } => write!(
                f,
                "pinning {} would exceed the pin budget ({} available of {}): pin smaller windows or fewer slots, \
                 release pinned ranges, or raise the budget",
                Bytes(*requested),
                Bytes(*available),
                Bytes(*limit)
            ),
            Error::MemlockLimit { limit, requested, locked } => write!(
                f,
                "mlock of {} would exceed RLIMIT_MEMLOCK ({}, of which {} already locked by this process). Remedies: \
                 raise the limit (`ulimit -l unlimited`, or a `memlock` line in /etc/security/limits.conf, or \
                 LimitMEMLOCK= for a systemd service); run with CAP_IPC_LOCK; pin smaller windows (a smaller PinBudget); \
                 or turn mlock off (cudaHostRegister pins the pages by itself)",
                Bytes(*requested),
                Bytes(*limit),
                Bytes(*locked)
            ),
            Error::DirectUnsupported { path, source } => write!(
                f,
                "the file system of {} refuses O_DIRECT ({source}): use another strategy (windows, ring or hybrid) \
                 or put the file on a disk file system",
                path.display()
            ),
            Error::InvalidArgument { what, message } => write!(f, "{what}: {message}"),
            Error::WorkerPanicked { message } => write!(f, "a worker thread panicked: {message}"),
            Error::TransferFailed { message } => write!(f, "the transfer failed: {message}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cuda(e) => Some(e),
            Error::Io { source, .. } | Error::DirectUnsupported { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<wirespeed_cuda::Error> for Error {
    fn from(e: wirespeed_cuda::Error) -> Self {
        Error::Cuda(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_message_names_limit_request_and_remedies() {
        let e = Error::MemlockLimit { limit: 64 << 10, requested: 8 << 20, locked: 0 };
        let s = e.to_string();
        assert!(s.contains("64 KiB"), "{s}");
        assert!(s.contains("8 MiB"), "{s}");
        assert!(s.contains("ulimit -l"), "{s}");
        assert!(s.contains("CAP_IPC_LOCK"), "{s}");
        assert!(s.contains("smaller windows"), "{s}");
    }

    #[test]
    fn cuda_call_is_named() {
        let e: Error = wirespeed_cuda::Error::Cuda {
            call: "cudaMemcpyAsync",
            code: 700,
            name: "cudaErrorIllegalAddress".into(),
            message: String::new(),
        }
        .into();
        assert_eq!(e.cuda_call(), Some("cudaMemcpyAsync"));
        assert!(e.is_sticky());
        assert!(e.to_string().contains("cudaMemcpyAsync"));
    }
}
