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
//!
//! # Example: a control loop on an embedded database
//!
//! ```
//! use drover::{Action, Controller, Store, Task};
//! use drover::store::{ItemEnqueue, StoreEngine as _};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("drover.db").display());
//! let store = Store::connect(&url).await?; // or postgres://… for a fleet
//! store.item_enqueue(ItemEnqueue::new("persist", ["ns/a", "ns/b", "ns/a"])).await?;
//!
//! let (done, mut seen) = tokio::sync::mpsc::unbounded_channel();
//! let controller = Controller::builder(store, "persist", move |task: Task| {
//!     let done = done.clone();
//!     async move {
//!         done.send(task.key().to_owned())?; // reconcile the object here
//!         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Action::Done)
//!     }
//! })
//! .build()?;
//! let shutdown = CancellationToken::new();
//! let running = tokio::spawn(controller.run(shutdown.clone()));
//!
//! let mut keys = vec![seen.recv().await.unwrap(), seen.recv().await.unwrap()];
//! keys.sort();
//! assert_eq!(keys, ["ns/a", "ns/b"]); // "ns/a" was enqueued twice, run once
//! shutdown.cancel(); // graceful: in-flight runs finish, the session closes
//! running.await??;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod api;
pub mod backoff;
pub mod bench;
pub mod client;
pub mod metrics;
pub mod queue;
pub mod runner;
pub mod server;
pub mod store;

pub use queue::Queue;
pub use runner::{Action, Controller, Reconciler, Task};
pub use store::{Store, StoreEngine};
