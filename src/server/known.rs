//! The processes a server lets workers create, capped (DESIGN.md rule 13).
//!
//! A process exists once something is enqueued to it, and each one costs
//! rows (its settings, its depth samples), labels on `/metrics`, and a line
//! on every list. A worker token could otherwise make any number: 2,000
//! enqueues to new names took `/metrics` from 93 KB to 74 MB. So an enqueue
//! to a process the database does not hold yet is refused with 422
//! `too_many_processes` once it holds the server's `max_processes`
//! (default 100); enqueues to the processes it holds always go through.
//! Operators (admin tokens) may still create processes through their
//! settings. Several servers over one database each check the count they
//! read, so a race may overshoot by a few.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::error::ApiError;
use crate::store::{ProcessPage, Store, StoreEngine as _};

/// How often a miss may read the database's processes again: a stream of
/// enqueues to new names over the cap costs one read per interval, not one
/// each.
const REFRESH: Duration = Duration::from_secs(1);

/// The process names this server has seen in the database or let in.
#[derive(Debug, Default)]
pub(crate) struct KnownProcesses {
    inner: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// The first `max` names the database held at the last read, and the
    /// names seen since: at most `max` more than the cap and the names
    /// enqueued to, never every process of a database that holds many.
    names: HashSet<String>,
    /// Whether the last read found `max` processes or more: then a name
    /// not among `names` may still be held, and is looked up by name.
    full: bool,
    read_at: Option<Instant>,
}

impl KnownProcesses {
    /// Lets an enqueue to `process` through if the database holds it, or
    /// holds fewer than `max` processes (the process is then counted as
    /// held); 422 `too_many_processes` otherwise.
    pub(crate) async fn admit(
        &self,
        store: &Store,
        process: &str,
        max: usize,
    ) -> Result<(), ApiError> {
        if self.holds(store, process, max).await? {
            return Ok(());
        }
        let mut known = self.lock();
        // `holds` let the lock go: another enqueue may have let the name in
        // since, and a name let in is never refused for the cap it fills.
        if known.names.contains(process) {
            return Ok(());
        }
        if known.full || known.names.len() >= max {
            return Err(ApiError::TooManyProcesses(max));
        }
        known.names.insert(process.to_owned());
        Ok(())
    }

    /// Whether the database holds `process` (or this server let an enqueue
    /// to it in), as last read: a miss reads the database's first `max`
    /// processes again, at most once per [`REFRESH`], and, when it holds
    /// that many or more, looks the name up by itself. A read takes a page
    /// of the cap, not every process: a database that `drover enqueue` or a
    /// library filled past the cap (100,000 processes are 6 MB of settings
    /// a read) costs a page each interval, and a name past it one read by
    /// name. A waiting claim asks too, to tell a process that exists from a
    /// name nobody enqueued to (see `waiting.rs`).
    pub(crate) async fn holds(
        &self,
        store: &Store,
        process: &str,
        max: usize,
    ) -> Result<bool, ApiError> {
        let stale = {
            let known = self.lock();
            if known.names.contains(process) {
                return Ok(true);
            }
            known.read_at.is_none_or(|at| at.elapsed() >= REFRESH)
        };
        if stale {
            let page = ProcessPage::first(u32::try_from(max).unwrap_or(u32::MAX));
            let listed = store.process_settings(page).await?;
            let mut known = self.lock();
            known.full = listed.next.is_some() || listed.items.len() >= max;
            known.names = listed.items.into_iter().map(|p| p.process).collect();
            known.read_at = Some(Instant::now());
        }
        let full = {
            let known = self.lock();
            if known.names.contains(process) {
                return Ok(true);
            }
            known.full
        };
        if full && store.process_get(process).await?.is_some() {
            self.lock().names.insert(process.to_owned());
            return Ok(true);
        }
        Ok(false)
    }

    fn lock(&self) -> MutexGuard<'_, Known> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
