//! Streams of the ring agents' own ([`StreamConfig::copy_streams`]
//! `RingApart` or `PerThread`): kept between transfers, ordered after the
//! streamer's streams when a transfer starts, and the streamer's streams
//! ordered after them once its agents are done.
//!
//! [`StreamConfig::copy_streams`]: super::StreamConfig::copy_streams

use wirespeed_cuda::{Device, Event, EventOptions, Stream};

use super::ctx::Ctx;
use crate::error::Result;

/// Streams (one per device) and events of one ring agent, kept between
/// transfers: creating them is a fixed cost every pass would pay.
pub(super) struct AgentStreamSet {
    pub(super) streams: Vec<Stream>,
    /// Recorded on `streams` once the agent is done; the streamer's streams wait on them.
    joined: Vec<Event>,
}

/// The ring agents' stream sets, and the events that order them after the
/// streamer's streams at the start of a transfer.
#[derive(Default)]
pub(super) struct AgentStreams {
    pub(super) agents: Vec<AgentStreamSet>,
    /// Recorded on the streamer's streams at the start; every agent stream waits on them.
    forked: Vec<Event>,
}

impl AgentStreams {
    /// Makes `threads` stream sets ready and orders them after everything
    /// given to the streamer's `streams` so far (a caller's `after` event,
    /// earlier transfers), on the device, with no host wait.
    pub(super) fn fork(&mut self, devices: &[Device], streams: &[Stream], threads: usize) -> Result<()> {
        let event = |d: &Device| Event::new(d, EventOptions::new());
        if self.forked.is_empty() {
            self.forked = devices.iter().map(event).collect::<wirespeed_cuda::Result<_>>()?;
        }
        while self.agents.len() < threads {
            let streams = devices.iter().map(Stream::new).collect::<wirespeed_cuda::Result<_>>()?;
            let joined = devices.iter().map(event).collect::<wirespeed_cuda::Result<_>>()?;
            self.agents.push(AgentStreamSet { streams, joined });
        }
        for (i, (main, ev)) in streams.iter().zip(&self.forked).enumerate() {
            main.record(ev)?;
            for set in &self.agents[..threads] {
                if let Some(s) = set.streams.get(i) {
                    s.wait_event(ev)?;
                }
            }
        }
        Ok(())
    }
}

/// Orders the streamer's `streams` after every copy the agents of `lanes`
/// enqueued. If that fails, the agents' streams are synchronized instead,
/// so that nothing waiting on the streamer's streams misses a copy.
pub(super) fn join_agents(ctx: &Ctx<'_>, lanes: &[AgentStreamSet], streams: &[Stream]) {
    for set in lanes {
        for ((own, ev), main) in set.streams.iter().zip(&set.joined).zip(streams) {
            if let Err(e) = own.record(ev).and_then(|()| main.wait_event(ev)) {
                ctx.fail(e.into());
                if let Err(e) = own.synchronize() {
                    ctx.fail(e.into());
                }
            }
        }
    }
}
