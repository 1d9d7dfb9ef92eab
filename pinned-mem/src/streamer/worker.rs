//! The streamer's worker thread: it runs the transfers [`Streamer::start`]
//! queued ([`Job`]s, from a [`JobQueue`]), in order, each alone through
//! `Shared::fill` or, where they can be, as one chained pass (`chain.rs`),
//! and tells each handle how it ended.
//!
//! [`Streamer::start`]: super::Streamer::start

use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use wirespeed_cuda::Stream;
use wirespeed_cuda::locks::lock;

use super::chain::{chain_len, run_chain};
use super::ctx::panic_message;
use super::queue::JobQueue;
use super::shared::Shared;
use super::transfer::Job;
use crate::error::{Error, Result};

/// The streamer's worker thread and the queue it takes jobs from.
pub(super) struct Worker {
    /// Jobs sent together arrive together: the worker sees all of them queued.
    jobs: Sender<Vec<Job>>,
    thread: JoinHandle<()>,
}

impl Worker {
    /// Starts the worker thread of `shared` (`file` names the first job's file
    /// in the error, if the thread cannot start).
    pub(super) fn spawn(shared: Arc<Shared>, file: &Path) -> Result<Worker> {
        let (jobs, queue) = channel();
        let thread = std::thread::Builder::new()
            .name("wirespeed-streamer".into())
            .spawn(move || work(shared, queue))
            .map_err(|e| Error::io("spawning the streamer's worker thread for", file, e))?;
        Ok(Worker { jobs, thread })
    }

    /// Queues `jobs`, all at once (dropped, releasing their destinations, if
    /// the worker has ended).
    pub(super) fn send(&self, jobs: Vec<Job>) -> Result<()> {
        self.jobs
            .send(jobs)
            .map_err(|_| Error::WorkerPanicked { message: "the streamer's worker thread has ended".into() })
    }

    /// Closes the queue and waits for the worker to run what is in it. From
    /// the worker thread itself (a progress callback that dropped the last
    /// handle to the streamer), it does not wait: the worker ends by itself.
    pub(super) fn finish(self) {
        let Worker { jobs, thread } = self;
        drop(jobs);
        if thread.thread().id() != std::thread::current().id() {
            let _ = thread.join();
        }
    }
}

/// The worker thread of `shared`: runs the queued jobs, in order, until the
/// queue closes.
fn work(shared: Arc<Shared>, rx: Receiver<Vec<Job>>) {
    // (Locked only by this thread: here between passes, by a chained pass's feed during it.)
    let queue = Mutex::new(JobQueue::new(rx));
    loop {
        let Some(job) = lock(&queue).next() else { break }; // closed and empty
        let state = job.state.clone();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match chain_len(&shared, &job, &queue) {
            Some(len) => run_chain(&shared, job, &queue, len),
            None => run_job(&shared, job),
        }));
        match ran {
            // Jobs a chained pass took from the queue but did not run come first.
            Ok(jobs) => lock(&queue).put_back(jobs),
            Err(p) => state.finish(Err(Error::WorkerPanicked { message: panic_message(p.as_ref()) })),
        }
    }
}

/// Runs `job` alone; no job is left to run after it.
fn run_job(shared: &Shared, job: Job) -> Vec<Job> {
    let Job { file, range, dst, stream, after, state } = job;
    let enqueued = |streams: &[Stream]| state.enqueued(streams.get(stream));
    let res = shared.fill("Streamer::start", &file, range, vec![(stream, dst)], after.as_ref(), Some(&enqueued));
    drop(after);
    state.finish(res);
    Vec::new()
}
