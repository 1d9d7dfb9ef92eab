//! The measured runs, each in the file named for what it runs; [`mod@file`] runs
//! the file's, in order.

pub mod baselines;
pub mod dest;
pub mod disk;
pub mod file;
pub mod kvikio;
pub mod library;
pub mod line_rate;
pub mod overhead;
pub mod overlap;
pub mod rows;
pub mod shapes;
