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
//! - [`client`](mod@client): the runner's backend over a drover server's HTTP API,
//!   and [`api`], the wire types it shares with the server.
//! - [`server`]: `drover serve` — the HTTP/JSON API (OpenAPI), `/metrics` and the
//!   dashboard, so producers and workers in any language can use drover.
//! - [`bench`](mod@bench): the workloads behind `drover bench` and `cargo bench`.
//!
//! # Cargo features
//!
//! Each layer that pulls heavy dependencies is a feature; all are on by
//! default, so `cargo run --release -- serve` and `cargo test` need none named.
//! With `default-features = false`, [`queue`], [`backoff`] and [`metrics`] build
//! alone, on tokio and prometheus-client, with no database, HTTP or terminal
//! crate.
//!
//! | feature | adds | implies |
//! | --- | --- | --- |
//! | `sqlite` | [`store`] and [`runner`] with the embedded engine ([`store::SqliteStore`]) | sqlx (SQLite) |
//! | `postgres` | [`store`] and [`runner`] with the fleet engine ([`store::PostgresStore`]) | sqlx (PostgreSQL) |
//! | `client` | [`client`](mod@client): the runner's backend over a drover server, and the wire types in [`api`] | reqwest; no engine |
//! | `server` | [`server`]: `drover serve`'s API, `/metrics` and dashboard, and [`api`] | axum, maud; needs `sqlite` or `postgres` as well |
//! | `otel` | run spans linked to the enqueues they absorbed, and an enqueue's context taken from the current `tracing` span (DESIGN.md rule 14) | opentelemetry, tracing-opentelemetry |
//! | `bench` | [`bench`](mod@bench): the workloads behind `drover bench` and `cargo bench` | `sqlite`, `postgres`, `client` |
//! | `cli` | the `drover` binary, with the OTLP exporter (HTTP/protobuf) | every feature above, opentelemetry-otlp |
//! | `otlp-grpc` | the binary's OTLP export over gRPC too, picked by `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` | `cli`, tonic |
//!
//! A `client`-only build has [`Store`] and the whole [`runner`], so a worker far
//! from the database compiles no SQL driver; there [`Store::connect`] refuses
//! every URL and controllers run on a [`client::Client`].
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

#[cfg(all(feature = "server", not(any(feature = "sqlite", feature = "postgres"))))]
compile_error!("the `server` feature serves a database: enable `sqlite` or `postgres` too");

#[cfg(feature = "_api")]
pub mod api;
pub mod backoff;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "client")]
pub mod client;
pub mod metrics;
pub mod queue;
#[cfg(feature = "_store")]
pub mod runner;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "_store")]
pub mod store;

pub use queue::Queue;
#[cfg(feature = "_store")]
pub use runner::{Action, Controller, Reconciler, Task};
#[cfg(feature = "_store")]
pub use store::{Store, StoreEngine};
