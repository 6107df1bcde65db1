//! Item counts per process, as both engines assemble them: the stored states
//! come from `drover_item_counts` (kept by triggers in the transactions that
//! change items, migration 0007), the time-dependent split of pending into
//! ready and backing off from the small index of failed pending keys, and the
//! oldest ready item from the claim index. None of it reads the backlog, so
//! the overview, `/v1/processes` and `/metrics` cost the same with a million
//! pending keys as with ten.

use std::time::Duration;

use crate::store::types::ProcessCounts;

/// One process's stored counts, before the ready / backoff split.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CountsRow {
    pub(crate) process: String,
    pub(crate) pending: i64,
    pub(crate) running: i64,
    pub(crate) parked: i64,
    pub(crate) idle: i64,
    pub(crate) backoff: i64,
}

/// A stored count as a `u64` (a negative one, which the triggers never
/// produce, as zero).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl CountsRow {
    /// The domain counts: `pending` excludes the keys still backing off.
    pub(crate) fn into_counts(self, oldest_pending_age: Option<Duration>) -> ProcessCounts {
        let backoff = count(self.backoff);
        ProcessCounts {
            process: self.process,
            pending: count(self.pending).saturating_sub(backoff),
            backoff,
            running: count(self.running),
            parked: count(self.parked),
            idle: count(self.idle),
            oldest_pending_age,
        }
    }
}
