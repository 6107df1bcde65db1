//! Workloads behind `drover bench` and `cargo bench`, so both print the same
//! figures from the same code.
//!
//! Every figure is printed as one machine-readable line,
//! `BENCH name=… key=value …`, by [`Figure`]'s `Display`.

mod figure;
mod queue;

pub use figure::Figure;
pub use queue::{QueueCycle, queue_cycle};
