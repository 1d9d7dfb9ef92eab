//! Whole file ([`Strategy::WholeFile`](crate::Strategy::WholeFile)): one
//! registration of the whole file (or of the range, when the file does not
//! fit), kept by the streamer so later passes cost no registration; the window
//! agent copies from it in pieces.

/// Copies from a cached whole-file registration are enqueued in pieces of this
/// size (as fast as one copy, and progress and chunking see them).
pub(super) const PIECE: u64 = 64 << 20;
/// Events in flight for whole-file pieces.
pub(super) const PIECE_IN_FLIGHT: usize = 4;
