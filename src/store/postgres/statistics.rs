//! Fresh planner statistics after bulk enqueues.
//!
//! A burst of enqueues into an idle process (a million keys after an outage)
//! leaves PostgreSQL believing the process has almost no rows until
//! autovacuum's next `ANALYZE`, up to a minute later. With that belief the
//! planner served the claim from the `(process, key)` unique index plus a sort,
//! reading every pending row on each claim (700 ms per claim of 1,000 keys with
//! a million pending, against 25 ms). So the store counts the rows its own
//! enqueues insert and, past [`THRESHOLD`], runs `ANALYZE drover_items` in the
//! background (a sample of 30,000 rows, off the enqueue's path; one at a time).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use sqlx::{Executor as _, PgPool};

/// Rows enqueued since the last analysis that trigger the next.
const THRESHOLD: u64 = 50_000;

/// Shared by a store's clones: rows inserted since the last `ANALYZE`, and
/// whether one is running.
#[derive(Debug, Default)]
pub(super) struct Statistics {
    inserted: AtomicU64,
    running: AtomicBool,
}

impl Statistics {
    /// Counts `rows` new items; starts an `ANALYZE` when enough have come in.
    pub(super) fn inserted(self: &Arc<Self>, pool: &PgPool, rows: u64) {
        if self.inserted.fetch_add(rows, Relaxed) + rows < THRESHOLD {
            return;
        }
        if self.running.swap(true, Relaxed) {
            return;
        }
        self.inserted.store(0, Relaxed);
        let (this, pool) = (Arc::clone(self), pool.clone());
        tokio::spawn(async move {
            // A simple query (no prepared statement), so it runs as it is
            // through a transaction-pooling PgBouncer too.
            if let Err(e) = pool.execute("ANALYZE drover_items").await {
                tracing::debug!(error = %e, "ANALYZE after a bulk enqueue failed; autovacuum will do it");
            }
            this.running.store(false, Relaxed);
        });
    }
}
