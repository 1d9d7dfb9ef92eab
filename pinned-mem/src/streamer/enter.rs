//! One call at a time: [`Shared::enter`] takes the streamer for a call and
//! refuses one made from inside the streamer's own callbacks (it would wait
//! for itself).

use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;

use super::cache::State;
use super::ctx::inside_callback;
use super::{Shared, lock};
use crate::error::{Error, Result};

/// Clears the owner mark when a call ends, however it ends.
pub(super) struct Owner<'a>(&'a Mutex<Option<ThreadId>>, ThreadId);
impl Drop for Owner<'_> {
    fn drop(&mut self) {
        let mut o = lock(self.0);
        if *o == Some(self.1) {
            *o = None;
        }
    }
}

impl Shared {
    /// Takes the streamer for one call. A call from inside one of its own
    /// callbacks is refused (it would wait for itself): on the calling thread
    /// (chunk callbacks, the progress callback of an inline pass) the owner
    /// says so, on an agent thread the progress callback's mark does.
    pub(super) fn enter(&self, what: &'static str) -> Result<(Owner<'_>, MutexGuard<'_, State>)> {
        let me = std::thread::current().id();
        self.refuse_inside_callback(what)?;
        let st = lock(&self.state);
        *lock(&self.owner) = Some(me);
        Ok((Owner(&self.owner, me), st))
    }

    /// Refuses a call from inside one of the streamer's callbacks (see
    /// [`Shared::enter`]), without taking the streamer.
    pub(super) fn refuse_inside_callback(&self, what: &'static str) -> Result<()> {
        let me = std::thread::current().id();
        if *lock(&self.owner) == Some(me) || inside_callback(self.id()) {
            return Err(Error::invalid(what, "called from inside a callback of the same streamer"));
        }
        Ok(())
    }

    /// This streamer's identity for the callback marks (its address; never 0).
    pub(super) fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}
