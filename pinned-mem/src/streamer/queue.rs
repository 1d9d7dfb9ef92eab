//! The worker's queue of transfers ([`JobQueue`]): the jobs
//! [`Streamer::start`](super::Streamer::start) sent, behind those the worker
//! took but has still to run (a chained pass gives back the ones it did not
//! run). The worker looks at what is queued behind a transfer to plan a
//! chained pass for the whole run of them (`chain.rs`).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::spans::Spans;
use super::transfer::Job;
use crate::mapping::MappedFile;

/// The worker's queue: jobs taken from the channel but not run yet first,
/// then the channel.
pub(super) struct JobQueue {
    rx: Receiver<Vec<Job>>,
    ahead: VecDeque<Job>,
}

impl JobQueue {
    /// The queue of the jobs `rx` brings.
    pub(super) fn new(rx: Receiver<Vec<Job>>) -> JobQueue {
        JobQueue { rx, ahead: VecDeque::new() }
    }

    /// The next job, without waiting; `None` when none is queued now.
    pub(super) fn try_next(&mut self) -> Option<Job> {
        if self.ahead.is_empty() {
            self.ahead.extend(self.rx.try_recv().ok().into_iter().flatten());
        }
        self.ahead.pop_front()
    }

    /// The next job, waiting for one; `None` once the channel is closed and
    /// nothing is left.
    pub(super) fn next(&mut self) -> Option<Job> {
        while self.ahead.is_empty() {
            self.ahead.extend(self.rx.recv().ok()?);
        }
        self.ahead.pop_front()
    }

    /// Waits at most `most` for a job to be queued, and takes the first one
    /// queued if `wanted` accepts it, leaving it queued if not.
    pub(super) fn take_if_within(&mut self, most: Duration, wanted: impl FnOnce(&Job) -> bool) -> Next {
        if self.ahead.is_empty() {
            match self.rx.recv_timeout(most) {
                Ok(jobs) => self.ahead.extend(jobs),
                Err(RecvTimeoutError::Timeout) => return Next::Nothing,
                Err(RecvTimeoutError::Disconnected) => return Next::Closed,
            }
        }
        match self.ahead.front() {
            Some(job) if wanted(job) => self.ahead.pop_front().map_or(Next::Nothing, |j| Next::Taken(Box::new(j))),
            Some(_) => Next::Other,
            None => Next::Nothing,
        }
    }

    /// Puts `jobs` back at the front, in their order: they run next.
    pub(super) fn put_back(&mut self, jobs: Vec<Job>) {
        for job in jobs.into_iter().rev() {
            self.ahead.push_front(job);
        }
    }

    /// Bytes of the jobs queued now that a chained pass reading `first` of
    /// `file` could take, one after the other: each of the same mapping, not
    /// empty, and sharing no byte with `first` or the ones before it
    /// (whatever they must follow: a chained pass waits for that).
    pub(super) fn queued_run(&mut self, file: &Arc<MappedFile>, first: &Range<u64>) -> u64 {
        while let Ok(jobs) = self.rx.try_recv() {
            self.ahead.extend(jobs);
        }
        run_bytes(self.ahead.iter().map(|j| (&j.file, &j.range)), file, first)
    }
}

/// What [`JobQueue::take_if_within`] found.
pub(super) enum Next {
    /// The job it wanted, taken.
    Taken(Box<Job>),
    /// Another job, left queued.
    Other,
    /// None in time.
    Nothing,
    /// None, and none will come: the streamer is being dropped.
    Closed,
}

/// Bytes of the leading ranges of `jobs` (file, range) of `file` that share
/// no byte with `first` or each other (see [`JobQueue::queued_run`]).
fn run_bytes<'a>(
    jobs: impl Iterator<Item = (&'a Arc<MappedFile>, &'a Range<u64>)>,
    file: &Arc<MappedFile>,
    first: &Range<u64>,
) -> u64 {
    let mut taken = Spans::default();
    taken.insert(first.clone(), ());
    let mut bytes = 0u64;
    for (f, r) in jobs {
        if !Arc::ptr_eq(f, file) || !taken.insert(r.clone(), ()) {
            break;
        }
        bytes = bytes.saturating_add(r.end - r.start);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_the_disjoint_ranges_of_one_file() {
        let dir = std::env::temp_dir().join(format!("wirespeed-queue-run-{}", std::process::id()));
        std::fs::write(&dir, [0u8; 4096]).unwrap();
        // SAFETY: the test's own file, not written while mapped.
        let (a, b) = unsafe { (MappedFile::open(&dir).unwrap(), MappedFile::open(&dir).unwrap()) };
        let jobs = [(&a, 100..200), (&a, 300..400), (&a, 400..450), (&a, 10..20), (&a, 150..600), (&a, 0..5)];
        let run =
            |jobs: &[(&Arc<MappedFile>, Range<u64>)], first| run_bytes(jobs.iter().map(|(f, r)| (*f, r)), &a, first);
        assert_eq!(run(&jobs, &(50..60)), 260, "gaps and ranges before the others are fine; an overlap ends the run");
        assert_eq!(run(&jobs, &(50..150)), 0, "the first overlaps the range the pass starts with");
        assert_eq!(run(&[(&b, 100..200)], &(0..10)), 0, "another mapping");
        assert_eq!(run(&[(&a, 100..100), (&a, 200..300)], &(0..10)), 0, "an empty range ends the run");
        drop((a, b));
        std::fs::remove_file(&dir).unwrap();
    }
}
