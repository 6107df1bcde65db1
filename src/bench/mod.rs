//! Workloads behind `drover bench` and `cargo bench`, so both print the same
//! figures from the same code.
//!
//! Every figure is printed as one machine-readable line,
//! `BENCH scenario=… engine=… keys=… workers=… <figure>=…`, by [`Figure`]'s
//! `Display` (or as one JSON object by [`Figure::to_json`]).
//!
//! Store scenarios ([`enqueue`], [`burn_down`], [`latency`], [`backlog`],
//! [`recovery`], and with the server `dashboard` and `hostile`) run on any engine and any database: each creates fresh process
//! names (`bench_<scenario>_<pid>_<random>`) and deletes their items and
//! history when it is done. [`queue_cycle`] measures the in-memory queue.

mod burn_down;
#[cfg(feature = "server")]
mod dashboard;
mod enqueue;
mod figure;
#[cfg(feature = "server")]
mod hostile;
mod latency;
mod queue;
mod recovery;
mod spread;
mod store;
mod transactional;
mod wal;

pub use burn_down::{BACKLOG_FRONT, backlog, burn_down, burn_down_limited};
#[cfg(feature = "server")]
pub use dashboard::dashboard;
pub use enqueue::enqueue;
pub use figure::Figure;
#[cfg(feature = "server")]
pub use hostile::hostile;
pub use latency::latency;
pub use queue::{QueueCycle, queue_cycle};
pub use recovery::recovery;
pub use spread::{Spread, burn_down_node, burn_down_spread};
pub use store::{BenchError, ENQUEUE_BATCH, StoreBench};
pub use transactional::enqueue_transactional;
