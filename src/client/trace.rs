//! The trace links a worker over HTTP gets with its claims (DESIGN.md rule
//! 14): asked for only when the client traces its runs
//! ([`Client::trace_links`](super::Client::trace_links)), kept by lease token
//! until the run's span reads them
//! ([`WorkerBackend::lease_trace`](crate::store::WorkerBackend::lease_trace)),
//! so a run over HTTP links to the enqueues it absorbed as one on the
//! database does, without a request of its own.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::store::TraceLinks;

/// The claimed runs' trace links by lease token, each read once.
#[derive(Debug, Default)]
pub(super) struct ClaimedLinks(Mutex<HashMap<i64, TraceLinks>>);

impl ClaimedLinks {
    /// Keeps the links a claim brought for the lease `token`.
    pub(super) fn keep(&self, token: i64, links: TraceLinks) {
        self.0.lock().insert(token, links);
    }

    /// The links of the lease `token`, forgotten as they are read (empty
    /// when the claim brought none).
    pub(super) fn take(&self, token: i64) -> TraceLinks {
        self.0.lock().remove(&token).unwrap_or_default()
    }

    /// Forgets every lease's links: a new session holds none of the old
    /// one's leases.
    pub(super) fn clear(&self) {
        self.0.lock().clear();
    }
}
