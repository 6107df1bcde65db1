//! The server: drover over HTTP, so producers and workers in any language can
//! enqueue, claim, heartbeat and complete, and operators can watch.
//!
//! - [`Server`] serves one [`Store`](crate::store::Store): the JSON API under
//!   `/v1` (described at `/openapi.json`, [`document`]), `/metrics`, `/healthz`,
//!   `/readyz` and a server-rendered dashboard at `/`.
//! - [`Tokens`] and [`Role`]: bearer-token authentication; viewer reads, worker
//!   also enqueues and works, admin also retries, parks and deletes.
//! - [`ApiError`]: every failure as one status and one JSON [`ErrorBody`](crate::api::ErrorBody). A
//!   client error (4xx) is decided before anything is written, so it never
//!   changes state.
//! - [`CrossOrigin`]: why a browser's state-changing request for another
//!   site's page was refused (403 `cross_origin`, on every route, before
//!   authentication), so the credentials a browser keeps cannot be borrowed.
//!
//! A worker over HTTP runs the same loop as one on the database: `POST
//! /v1/sessions` (with a TTL), `POST /v1/sessions/{id}/claim` with `wait_ms` to
//! long-poll, `POST /v1/leases/complete` with the lease and an outcome (a lost
//! lease is a 409), `POST /v1/sessions/{id}/heartbeat` every ttl/3, and
//! `DELETE /v1/sessions/{id}` at the end.
//!
//! ```no_run
//! use drover::server::{Server, ServerOptions};
//! use drover::store::Store;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::connect("sqlite://drover.db").await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7420").await?;
//! let shutdown = CancellationToken::new(); // cancel it to stop gracefully
//! Server::new(store, ServerOptions::default()).serve(listener, shutdown).await?;
//! # Ok(()) }
//! ```

mod app;
mod auth;
mod connections;
mod dashboard;
mod error;
mod extract;
mod handed;
mod host;
mod known;
mod openapi;
mod operations;
mod options;
mod origin;
mod owner;
mod redact;
mod role;
mod routes;
mod spans;
mod state;
mod trace_url;
mod waiting;

pub use app::Server;
pub use auth::{Tokens, TokensError};
pub use error::ApiError;
pub use error::CrossOrigin;
pub use openapi::{document, document_without_tokens};
pub use options::ServerOptions;
pub use role::Role;
pub use spans::HTTP_TARGET;
pub use trace_url::{TraceUrl, TraceUrlError};
