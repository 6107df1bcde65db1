//! Maps sqlx/SQLite errors to [`StoreError`].

use crate::store::StoreError;

/// SQLite's primary result codes that mean "another connection holds the lock".
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;

/// Maps a driver error: lock contention that outlasted the busy timeout becomes
/// [`StoreError::Busy`], the rest [`StoreError::Database`].
pub(super) fn map(e: sqlx::Error) -> StoreError {
    if locked(&e) || matches!(e, sqlx::Error::PoolTimedOut) {
        StoreError::Busy(e.into())
    } else {
        StoreError::Database(e.into())
    }
}

/// Whether SQLite refused for a lock another connection holds.
pub(super) fn locked(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| matches!(c & 0xff, SQLITE_BUSY | SQLITE_LOCKED)),
        _ => false,
    }
}

/// `.db()?` on driver results.
pub(super) trait Db<T> {
    /// Maps the error with [`map`].
    fn db(self) -> Result<T, StoreError>;
}

impl<T> Db<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(map)
    }
}
