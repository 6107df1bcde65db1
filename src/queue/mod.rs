//! The in-memory keyed workqueue: client-go's `workqueue`, async, generic over the
//! key type.
//!
//! Use it when the keys of a control loop live in one process (events from a
//! watch turned into `namespace/name` keys, say). It guarantees what client-go's
//! does — a key is queued once however often it is added, never handed to two
//! workers at once, and an add during processing leads to exactly one more run —
//! and fixes its known complaints:
//!
//! - a plain [`Queue::add`] of a key that is waiting out a backoff does not run it
//!   early (client-go runs it at once and again when the timer fires);
//! - [`AddOpts`] gives each add a delay, a priority (higher first, FIFO within a
//!   priority) and an explicit `bypass_backoff`;
//! - delays are clamped (at most about six months), so no duration panics;
//! - [`Queue::shut_down_with_drain`] waits for in-flight keys without a goroutine
//!   per waiter.
//!
//! Retries go through a [`rate_limit::RateLimiter`]; the default is client-go's
//! (per-key exponential 5 ms → 1000 s, max-of a 10 qps / burst 100 bucket). Naming
//! a queue ([`QueueBuilder::name`]) turns on client-go's Prometheus metrics
//! ([`QueueMetrics`]).
//!
//! # Example: a worker pool
//!
//! ```
//! use drover::queue::Queue;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: Queue<String> = Queue::builder().name("example").build();
//! for name in ["default/web", "default/db", "default/web"] {
//!     queue.add(name.to_string()); // the second "default/web" is coalesced
//! }
//! queue.shut_down(); // no more adds; workers drain what is queued
//!
//! let mut seen = Vec::new();
//! while let Some(key) = queue.get().await {
//!     let ok = key != "default/db"; // pretend db failed once
//!     if ok {
//!         queue.forget(&key);
//!     }
//!     seen.push(key.clone());
//!     queue.done(&key);
//! }
//! assert_eq!(seen, ["default/web", "default/db"]);
//! # }
//! ```

mod lock;
mod options;
pub mod rate_limit;
mod state;
mod workqueue;

#[cfg(test)]
mod model_check;
#[cfg(test)]
mod tests;

pub use crate::metrics::QueueMetrics;
pub use options::AddOpts;
pub use workqueue::{Queue, QueueBuilder};
