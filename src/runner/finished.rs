//! Keys whose run ended since the current candidate query began, for query
//! sources.
//!
//! A candidate query reads the user's tables at one moment; locking its keys
//! comes later. A key whose run ended in between (its reconcile already changed
//! the tables, its outcome then removed the lease) would be locked again from
//! the stale answer and run twice. This controller's own runs are recorded
//! here, so such keys are skipped — or released at once when the run ended
//! between the check and the lock. (Runs on other nodes can still race a query;
//! the reconciler must find the second run a no-op, as in any level-triggered
//! loop.)

use std::collections::HashSet;
use std::sync::Mutex;

/// The keys ended since [`Finished::begin`].
#[derive(Debug, Default)]
pub(crate) struct Finished(Mutex<HashSet<String>>);

impl Finished {
    /// Called before each candidate query: older endings no longer matter,
    /// the query will see their effects.
    pub(crate) fn begin(&self) {
        self.set().clear();
    }

    /// Records that `key`'s reconcile returned.
    pub(crate) fn record(&self, key: &str) {
        self.set().insert(key.to_owned());
    }

    /// Whether `key`'s run ended since the query began.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.set().contains(key)
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // A panic while holding this lock cannot leave the set inconsistent.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
