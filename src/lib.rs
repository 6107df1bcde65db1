//! drover runs control loops reliably: a fleet of workers keeps a set of objects
//! converged, never works on the same object twice at once, never loses a change,
//! and backs off from what keeps failing.
//!
//! The crate is built in layers, each a module named for what it is:
//!
//! - [`queue`]: the in-memory keyed workqueue (a port of client-go's workqueue to
//!   async Rust). Start here if your keys live in one process.
//! - [`backoff`]: the exponential backoff formula every retry in drover uses.
//! - [`store`]: the durable store (SQLite or PostgreSQL): sessions, fenced
//!   leases, coalescing, durable backoff and history. Start here for a fleet.
//! - [`runner`]: the control loop users program against: a [`runner::Controller`]
//!   running a [`runner::Reconciler`] over a store's keys.
//! - [`metrics`]: the process-wide Prometheus registry.
//! - [`server`]: `drover serve` — the HTTP/JSON API (OpenAPI), `/metrics` and the
//!   dashboard, so producers and workers in any language can use drover.
//! - [`bench`](mod@bench): the workloads behind `drover bench` and `cargo bench`.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod bench;
pub mod metrics;
pub mod queue;
pub mod runner;
pub mod server;
pub mod store;
