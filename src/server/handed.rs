//! When this server handed each lease out, for `workqueue_work_duration_seconds`.
//!
//! A worker sends its lease back with the run's `started_at`; taken as sent,
//! a caller with a worker token could put any figure (years) into a
//! histogram every operator reads. The server keeps the start of each lease
//! its claims handed out and times the run from that; a lease it did not
//! hand out (claimed through another node, or before a restart) is timed
//! from the start its worker sent only if that is within a day and not in
//! the future (`timed_from` in `routes/leases.rs`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};

use crate::store::{FencingToken, Lease, SessionId};

/// The most leases whose start is kept; past it the memory starts over (the
/// runs under the leases forgotten are then not timed). A lease whose run
/// never ends here (its session expired, or closed with it) stays until
/// then.
const KEPT: usize = 100_000;

/// The starts of the leases this server handed out and has not seen end.
#[derive(Debug, Default)]
pub(crate) struct HandedOut {
    started: Mutex<HashMap<(SessionId, FencingToken), DateTime<Utc>>>,
}

impl HandedOut {
    /// Records the start of a lease a claim of this server handed out.
    pub(crate) fn handed(&self, lease: &Lease) {
        let mut started = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        if started.len() >= KEPT {
            started.clear();
        }
        started.insert((lease.session, lease.token), lease.started_at);
    }

    /// Forgets the lease's start, and returns it if this server handed the
    /// lease out: its run ended (an outcome, or given back).
    pub(crate) fn ended(&self, lease: &Lease) -> Option<DateTime<Utc>> {
        self.started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(lease.session, lease.token))
    }
}
