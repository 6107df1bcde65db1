//! The worker part of the store over drover's HTTP API: a [`Client`] is a
//! [`WorkerBackend`](crate::store::WorkerBackend), so the same
//! [`Controller`](crate::runner::Controller) that runs on a database runs
//! against a `drover serve` — for machines that should not hold database
//! credentials, or programs far from the database.
//!
//! The wire format is [`api`](crate::api), the one the server answers with.
//! Claims long-poll (the server wakes them on enqueues), completions go in
//! batches (one request and one transaction for many runs), and every answer
//! is mapped back to the store's words: a 409 is `SessionExpired` or
//! `LeaseLost`, and a request whose answer never came (a timeout, a connection
//! lost after sending, a 503 `commit_unknown`, a gateway's own 5xx page) is
//! reported as possibly applied
//! ([`StoreError::is_commit_unknown`](crate::store::StoreError::is_commit_unknown)),
//! so the controller gives a session up rather than lose a claim's leases.
//!
//! ```no_run
//! use drover::client::Client;
//! use drover::runner::{Action, Controller, Task};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7420")?.token("worker-secret");
//! let controller = Controller::builder(client, "persist", |task: Task| async move {
//!     println!("saving {}", task.key());
//!     Ok::<_, std::io::Error>(Action::Done)
//! })
//! .parallelism(64)
//! .build()?;
//! controller.run(CancellationToken::new()).await?;
//! # Ok(()) }
//! ```

mod admin;
mod backend;
mod http;

pub use http::Client;
