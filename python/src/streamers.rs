//! The streamers and mapped files `read_file` uses, kept for the process so
//! that repeated calls reuse their pinned ring, registrations and mappings;
//! and `_prepare`, which makes them ready before a first pass.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::Device;
use wirespeed_cuda::locks::lock;
use wirespeed_pinned::{MappedFile, PinBudget, Strategy, StreamConfig, Streamer};

use crate::error::err;

/// The streamers, one per (device, budget, strategy, reading ahead), kept
/// for the process so that repeated calls reuse their pinned ring and
/// registrations.
type StreamerKey = (usize, u64, Strategy, bool);

/// How long a kept streamer's ring pass reads ahead for the next piece
/// (`StreamConfig::read_ahead`): a loop of `read_into` calls over sequential
/// pieces queues the next one within the Python layer's tens of
/// microseconds, or the loop body's time.
pub(crate) const READ_AHEAD: Duration = Duration::from_millis(5);
static STREAMERS: Mutex<Option<HashMap<StreamerKey, Arc<Streamer>>>> = Mutex::new(None);

/// Files opened, by path, with what identified them when opened.
type FileKey = (u64, u64, u64, i64, i64);
type Files = HashMap<PathBuf, (FileKey, Arc<MappedFile>)>;
static FILES: Mutex<Option<Files>> = Mutex::new(None);

/// The strategy a Python caller names.
pub(crate) fn parse_strategy(s: &str) -> PyResult<Strategy> {
    const MIB: usize = 1 << 20;
    Ok(match s {
        "auto" => Strategy::Auto,
        "whole-file" | "whole" => Strategy::WholeFile,
        "windows" => Strategy::Windows { window: 64 * MIB, in_flight: 4 },
        "ring" => Strategy::Ring { slots: 8, slot: 4 * MIB, threads: 4 },
        "hybrid" => Strategy::Hybrid { window: 64 * MIB, slot: 4 * MIB, threads: 4 },
        "direct" => Strategy::Direct { slots: 8, slot: 4 * MIB, threads: 4 },
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown strategy {s:?}: use auto, whole-file, windows, ring, hybrid or direct"
            )));
        }
    })
}

/// The kept streamer of `device` with this budget and strategy, reading
/// ahead ([`READ_AHEAD`]) unless `ahead` is false, made on first use.
pub(crate) fn streamer(device: usize, budget: u64, strategy: Strategy, ahead: bool) -> PyResult<Arc<Streamer>> {
    let mut g = lock(&STREAMERS);
    let map = g.get_or_insert_with(HashMap::new);
    let key = (device, budget, strategy, ahead);
    if let Some(s) = map.get(&key) {
        return Ok(s.clone());
    }
    let dev = Device::get(device).map_err(err)?;
    let wait = if ahead { READ_AHEAD } else { Duration::ZERO };
    let config = StreamConfig::new(strategy, PinBudget::new(budget)).with_read_ahead(wait);
    let s = Arc::new(Streamer::new(&[dev], config).map_err(err)?);
    map.insert(key, s.clone());
    Ok(s)
}

/// The kept mapping of `path`, opened anew when the file changed since.
pub(crate) fn mapped(path: &Path) -> PyResult<Arc<MappedFile>> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
    let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
    let mut g = lock(&FILES);
    let map = g.get_or_insert_with(HashMap::new);
    if let Some((k, f)) = map.get(path)
        && *k == key
    {
        return Ok(f.clone());
    }
    // SAFETY: the package documents that a file being read must not be
    // written or truncated meanwhile (the library's contract); a file that
    // changed since it was opened is opened anew.
    let f = unsafe { MappedFile::open(path) }.map_err(err)?;
    map.insert(path.to_path_buf(), (key, f.clone()));
    Ok(f)
}

/// Makes ready now what the first transfers of `span` bytes of `path` would
/// make with the kept streamer of (`device`, `budget`, `strategy`): the
/// streamer, the file's mapping, and the streamer's pinned ring and
/// registration context for the plan of `span` bytes
/// (`Streamer::prepare`; for the file's plan where spans fit the budget and
/// the file does not, since a span read alone streams through that plan's
/// ring), so that a first pass runs as later ones do.
/// Answers whether those transfers run from the whole file registered and
/// kept (a whole-file plan, the file within the budget): the first of them
/// registers it, which the caller may do ahead with a read of a page.
/// Waits (without the GIL) while the streamer runs a pass, as every call that
/// takes the streamer does.
#[pyfunction]
pub(crate) fn _prepare(
    py: Python<'_>,
    path: PathBuf,
    span: u64,
    device: usize,
    budget: u64,
    strategy: &str,
) -> PyResult<bool> {
    let strategy = parse_strategy(strategy)?;
    let file = mapped(&path)?;
    let s = streamer(device, budget, strategy, true)?;
    let plan = py.detach(|| s.prepare(span)).map_err(err)?;
    let whole = Strategy::WholeFile.pinned_bytes(file.len());
    let room = s.config().budget.available().saturating_add(s.kept_pinned_bytes());
    let fits = whole.is_some_and(|w| w <= room);
    if plan == Strategy::WholeFile && !fits {
        // Spans that fit, of a file that does not: one read alone streams
        // through the ring of the file's own plan, made now.
        py.detach(|| s.prepare(file.len())).map_err(err)?;
    }
    Ok(plan == Strategy::WholeFile && fits)
}

/// Host bytes the kept streamers pin now, drawn from their budgets.
pub(crate) fn pinned_bytes() -> u64 {
    lock(&STREAMERS).as_ref().map_or(0, |m| m.values().map(|s| s.config().budget.used()).sum())
}

/// Everything kept, taken out (to be dropped without the GIL).
pub(crate) fn take() -> impl Send {
    (lock(&STREAMERS).take(), lock(&FILES).take())
}
