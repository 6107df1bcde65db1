//! The control loop users program against: a [`Controller`] claims keys of one
//! process from the [`store`](crate::store) and runs a [`Reconciler`] on each.
//!
//! It runs both loop shapes drover descends from:
//!
//! - [`Source::Queue`] — the Kubeflow persistence agent: events enqueue keys; a
//!   reconciler saves each; transient errors retry with backoff, permanent ones
//!   park the key until its next change;
//! - [`Source::Query`] — the Monogon shepherd: a query over the user's own tables
//!   picks candidates; each is locked for one worker; failures back off in the
//!   database.
//!
//! Each controller holds a session (heartbeat every TTL/3, retried until the
//! deadline), reclaims expired sessions' leases, wakes on enqueues (in-process,
//! and `LISTEN/NOTIFY` on PostgreSQL), isolates panics, and shuts down gracefully.
//! Errors are classified by wrapping ([`permanent`], [`transient`]); unmarked
//! errors are transient.
//!
//! Each run is a `tracing` span on the [`RUN_TARGET`] target, `{process}
//! process` after the OpenTelemetry messaging conventions; with the `otel`
//! feature and a `tracing-opentelemetry` layer that records it, the span links
//! to the trace contexts of the enqueues the run absorbed, and a retry's span
//! to the attempt that failed. Nothing records it by default, and a disabled
//! span costs one check per run. A run whose outcome took [`SLOW_WRITE`] or
//! more to write, or more than one try, gets a child span for the write
//! (`{process} settle`), through OpenTelemetry's global tracer provider.

mod completer;
mod config;
mod controller;
mod error;
mod finished;
mod lapse;
mod maintenance;
mod reconciler;
mod run;
mod session;
mod source;
mod trace;
mod write_span;

pub use crate::metrics::RunnerFamilies;
pub use config::{ConfigError, ControllerBuilder};
pub use controller::{Controller, RunError};
pub use error::{
    BoxError, ErrorClass, Permanent, Transient, classify, error_chain, outcome_of, permanent,
    transient,
};
pub use lapse::{MIN_SAFETY_MARGIN, MIN_TTL, STOP_GRACE, safety_margin};
pub use maintenance::{Pruned, Pruner, Resyncer};
pub use reconciler::{Action, Reconciler, Task};
pub use source::Source;
pub use trace::RUN_TARGET;
pub use write_span::SLOW_WRITE;
