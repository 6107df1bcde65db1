//! [`Clock`]: a shift added to the database clock, so tests can jump past TTLs and
//! backoffs without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// An offset, in milliseconds, that a store adds to the database's `now` in every
/// statement. It is zero in production; tests advance it instead of sleeping.
///
/// Clones share the offset. The offset only moves forward through
/// [`advance`](Self::advance), so the store's view of time never runs backwards.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// Moves this store's view of the database clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(ms))
            })
            .ok();
    }

    /// The current offset in milliseconds.
    #[must_use]
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::SeqCst)
    }
}
