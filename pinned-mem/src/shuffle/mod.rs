//! Shuffled batches of records from files of any size: the files as records
//! ([`Records`]), which records each batch holds ([`Permutation`],
//! [`Sharding`]), and the [`Loader`] that gathers them on the GPU.

mod config;
mod gather;
mod loader;
mod order;
mod plan;
mod pool;
mod records;
mod ring;

pub use config::{DEFAULT_BLOCK_BYTES, DEFAULT_PIN_BUDGET, DEFAULT_RING_THREADS, LoaderConfig, Way};
pub use loader::{BatchInfo, Checkpoint, Loader, LoaderState};
pub use order::{Permutation, Sharding};
pub use records::Records;
