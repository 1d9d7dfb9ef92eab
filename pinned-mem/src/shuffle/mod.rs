//! Shuffled batches of records from files of any size: which records each
//! batch holds ([`Permutation`], [`Sharding`]) and the files as records
//! ([`Records`]).

mod order;
#[allow(dead_code)] // used by the engine, which comes next
mod plan;
mod records;

pub use order::{Permutation, Sharding};
pub use records::Records;
