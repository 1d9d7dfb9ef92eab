//! Progress on stderr: one updating line on a terminal, else one line per
//! finished repetition (and one every [`QUIET_EVERY`] during a long one). The
//! permanent lines are kept for `--out`'s log.txt.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Off a terminal, a long repetition (writing a large demo file, a cold read)
/// prints where it is at most this often.
pub const QUIET_EVERY: Duration = Duration::from_secs(10);

struct State {
    label: String,
    rep: usize,
    reps: usize,
    start: Instant,
    last_draw: Option<Instant>,
    drawn: bool,
    /// Every permanent line so far (for log.txt).
    log: Vec<String>,
}

/// Shared by the bench and the library's progress callback.
pub struct Progress {
    tty: bool,
    state: Mutex<State>,
}

/// The library's progress callback type.
pub type Callback = Arc<dyn Fn(u64, u64) + Send + Sync>;

impl Progress {
    pub fn new() -> Arc<Progress> {
        Arc::new(Progress {
            tty: std::io::stderr().is_terminal(),
            state: Mutex::new(State {
                label: String::new(),
                rep: 0,
                reps: 0,
                start: Instant::now(),
                last_draw: None,
                drawn: false,
                log: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A run starts: `label`, repetition `rep` (1-based) of `reps`.
    pub fn begin(&self, label: &str, rep: usize, reps: usize) {
        let mut s = self.lock();
        s.label = label.to_string();
        s.rep = rep;
        s.reps = reps;
        s.start = Instant::now();
        s.last_draw = None;
        if self.tty {
            Self::draw(&mut s, &format!("{label}  rep {rep}/{reps}  starting"));
        }
    }

    /// `done` of `total` bytes have gone (redrawn at most ten times a second).
    pub fn update(&self, done: u64, total: u64) {
        let mut s = self.lock();
        let now = Instant::now();
        if !self.tty {
            // Off a terminal: a line only when a repetition runs long.
            let since = s.last_draw.unwrap_or(s.start);
            if now - since < QUIET_EVERY || done >= total {
                return;
            }
        } else if s.last_draw.is_some_and(|t| now - t < Duration::from_millis(100)) && done < total {
            return;
        }
        s.last_draw = Some(now);
        let secs = (now - s.start).as_secs_f64().max(1e-9);
        let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
        let line = format!(
            "{}  rep {}/{}  {pct:5.1}%  {:6.2} GB/s so far, {:.0} s",
            s.label,
            s.rep,
            s.reps,
            done as f64 / secs / 1e9,
            secs
        );
        if self.tty {
            Self::draw(&mut s, &line);
        } else {
            let _ = writeln!(std::io::stderr(), "  {line}");
            s.log.push(format!("  {line}"));
        }
    }

    fn draw(s: &mut State, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        s.drawn = true;
    }

    fn clear(&self, s: &mut State) {
        if self.tty && s.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            s.drawn = false;
        }
    }

    /// A repetition (of `reps`) finished: a line each when stderr is not a
    /// terminal (none for a single repetition: the run's own line follows).
    pub fn rep_done(&self, line: &str, reps: usize) {
        let mut s = self.lock();
        if reps > 1 {
            s.log.push(format!("  {line}"));
        }
        if !self.tty {
            if reps > 1 {
                let _ = writeln!(std::io::stderr(), "  {line}");
            }
        } else {
            Self::draw(&mut s, line);
        }
    }

    /// A permanent message (clears the updating line first).
    pub fn note(&self, msg: &str) {
        let mut s = self.lock();
        self.clear(&mut s);
        let _ = writeln!(std::io::stderr(), "{msg}");
        s.log.push(msg.to_string());
    }

    /// Every permanent line printed so far, one per line.
    pub fn log(&self) -> String {
        let s = self.lock();
        let mut out = s.log.join("\n");
        out.push('\n');
        out
    }

    /// The callback handed to the library.
    pub fn callback(self: &Arc<Self>) -> Callback {
        let me = Arc::clone(self);
        Arc::new(move |done, total| me.update(done, total))
    }
}
