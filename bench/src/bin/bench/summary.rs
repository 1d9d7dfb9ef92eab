//! Everything a run produced, as the report, the targets and the files are
//! made from it.

use crate::args::Options;
use crate::gpu::Gpu;
use crate::results::Row;
use crate::runs::overhead::Overhead;
use crate::runs::overlap::Overlap;
use crate::runs::rows;
use crate::script;

pub const EMULATED: &str = "EMULATED — numbers are not GPU measurements";

/// The file streamed, as printed.
pub struct FileInfo {
    pub path: String,
    pub bytes: u64,
    pub demo: bool,
    pub checksum: u64,
    pub budget: u64,
    pub destination: String,
    pub notes: Vec<String>,
    /// How fast this host's CPUs read and copy the page-cached file.
    pub mem: Option<crate::data::MemRates>,
}

/// Everything the outputs are made from.
pub struct Summary<'a> {
    pub gpu: &'a Gpu,
    pub opts: &'a Options,
    pub threads: usize,
    pub reps: usize,
    /// Repetitions of the target rows (auto, ring-cache).
    pub target_reps: usize,
    pub line_rate: f64,
    pub line: &'a Row,
    pub file: Option<FileInfo>,
    pub rows: &'a [Row],
    pub pytorch_rows: &'a [Row],
    pub overhead: Option<&'a Overhead>,
    /// The overlap run (streaming while the caller's stream works), where it ran.
    pub overlap: Option<&'a Overlap>,
    pub torch: Option<&'a rows::Torch>,
    /// What KvikIO's script printed and wrote, where it ran.
    pub kvikio: Option<&'a script::Output>,
}
