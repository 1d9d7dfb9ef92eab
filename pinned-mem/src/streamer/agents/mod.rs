//! The agents: the threads of a pass that claim parts of its range
//! ([`Claims`](super::claims::Claims)), make their bytes pinned and enqueue
//! their copies through the sink. One file per strategy's agent:
//!
//! * `whole.rs`: pieces of the whole-file registration the streamer keeps
//!   ([`Strategy::WholeFile`](crate::Strategy::WholeFile));
//! * `windows.rs`: sliding windows registered in place, in the registration
//!   context ([`Strategy::Windows`](crate::Strategy::Windows), and the front
//!   of [`Strategy::Hybrid`](crate::Strategy::Hybrid));
//! * `ring.rs`: the pinned ring's producer threads
//!   ([`Strategy::Ring`](crate::Strategy::Ring), and the back of the hybrid);
//! * `direct.rs`: `O_DIRECT` reads into the ring's slots, for cold files
//!   ([`Strategy::Direct`](crate::Strategy::Direct)); `cold.rs`: how
//!   `Auto` reads a cold file, with `O_DIRECT` or buffered with readahead,
//!   chosen per file;
//! * `reserve.rs`: the reserve ring thread that joins `Auto`'s hybrid once
//!   the copy engine shows room.
//!
//! Beside them, `crew.rs` holds what every agent works with, and
//! `in_flight.rs` the queue of pinned pieces whose copies are in flight,
//! which the whole-file and window agents share. The run (`run.rs`) decides
//! which agents a strategy runs and starts them.

pub(super) mod cold;
pub(super) mod crew;
pub(super) mod direct;
pub(super) mod in_flight;
pub(super) mod reserve;
pub(super) mod ring;
pub(super) mod whole;
pub(super) mod windows;
