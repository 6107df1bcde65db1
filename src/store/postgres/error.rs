//! Maps sqlx/PostgreSQL errors to [`StoreError`].

use std::time::Duration;

use crate::store::{DriverError, StoreError};

/// lock_not_available: a lock wait given up after the transaction's
/// `lock_timeout` (or refused by `NOWAIT`).
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// SQLSTATEs meaning "this transaction lost a race; running it again may succeed":
/// serialization_failure, deadlock_detected, lock_not_available.
const RETRYABLE: [&str; 3] = ["40001", "40P01", LOCK_NOT_AVAILABLE];

/// Whether `e` is a lock wait the database gave up ([`LOCK_NOT_AVAILABLE`],
/// mapped to `Busy`), the transaction rolled back.
pub(super) fn lock_timed_out(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Busy(DriverError(sqlx::Error::Database(db)))
            if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE)
    )
}

/// SQLSTATEs meaning "this server cannot take the write now": admin_shutdown,
/// crash_shutdown, cannot_connect_now, and read_only_sql_transaction (a
/// standby, or a primary that was demoted). Class 08, connection exceptions,
/// is matched by prefix. Each refuses the statement, so nothing was written.
const GONE: [&str; 4] = ["57P01", "57P02", "57P03", "25006"];

/// The SQLSTATE of a full disk (disk_full).
const DISK_FULL: &str = "53100";

/// `idle_in_transaction_session_timeout`: the server ended a transaction
/// that sat idle past its bound (and its connection with it).
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "25P03";

/// Maps a driver error: lost races and pool exhaustion become
/// [`StoreError::Busy`], broken connections and servers that cannot write
/// (read-only, shutting down) [`StoreError::Unavailable`], a full
/// disk [`StoreError::Full`], a transaction ended for idling
/// [`StoreError::IdleTimeout`], the rest [`StoreError::Database`].
pub(super) fn map(e: sqlx::Error) -> StoreError {
    let code = match &e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    match (&e, code.as_deref()) {
        (_, Some(c)) if RETRYABLE.contains(&c) => StoreError::Busy(e.into()),
        (_, Some(c)) if c.starts_with("08") || GONE.contains(&c) => {
            StoreError::Unavailable(e.into())
        }
        (_, Some(DISK_FULL)) => StoreError::Full(e.into()),
        (_, Some(IDLE_IN_TRANSACTION_TIMEOUT)) => StoreError::IdleTimeout(e.into()),
        (sqlx::Error::PoolTimedOut, _) => StoreError::Busy(e.into()),
        (sqlx::Error::Io(_) | sqlx::Error::Tls(_), _) => StoreError::Unavailable(e.into()),
        _ => StoreError::Database(e.into()),
    }
}

/// Maps an error from the statement that commits (`COMMIT`, or an autocommit
/// write): a broken connection or a shutdown there leaves the outcome
/// unknown; a write refused as read-only committed nothing.
pub(super) fn map_commit(e: sqlx::Error) -> StoreError {
    match map(e) {
        StoreError::Unavailable(e) if !read_only(&e.0) => StoreError::CommitUnknown(e),
        other => other,
    }
}

/// Whether the server refused a write as read-only (25006).
fn read_only(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("25006"))
}

/// How long a commit may go unanswered before its outcome counts as unknown.
/// A primary that lost its synchronous standby (promoted elsewhere while the
/// old primary lives on, read-only for new transactions but not for one
/// already open) never answers a commit: its transaction waits for ever for
/// a standby that is gone. A worker's completer waiting on one such commit
/// held every later outcome behind it, and its keys stayed running under a
/// live session (seen in `tests/failover.rs`'s read-only rounds).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an abandoned commit keeps its connection checked out before the
/// connection is let go (and closed: the timeout's error retired it).
const ABANDONED_COMMIT: Duration = Duration::from_secs(600);

/// Commits, mapping with [`map_commit`]. A commit unanswered for
/// [`COMMIT_TIMEOUT`] is [`StoreError::CommitUnknown`], a broken link, which
/// retires the store's connections (see `failover`). Its connection stays
/// checked out until the commit answers (or [`ABANDONED_COMMIT`] passes),
/// so no one is handed a connection that still waits for it.
pub(super) async fn commit(tx: super::engine::Tx) -> Result<(), StoreError> {
    let mut pending = Box::pin(tx.commit());
    match tokio::time::timeout(COMMIT_TIMEOUT, &mut pending).await {
        Ok(done) => done.map_err(map_commit),
        Err(_) => {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(ABANDONED_COMMIT, pending).await;
            });
            Err(unanswered(format!(
                "the commit was not answered within {COMMIT_TIMEOUT:?} (a primary that lost \
                 its synchronous standby waits for ever)"
            )))
        }
    }
}

/// The error of a request the server did not answer in time: its outcome is
/// unknown (a commit may have been sent), and the link counts as broken, so
/// it retires the store's connections (see `failover`).
pub(super) fn unanswered(why: String) -> StoreError {
    StoreError::CommitUnknown(DriverError(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        why,
    ))))
}

impl crate::store::exec::EngineDatabase for sqlx::Postgres {
    fn store_error(e: sqlx::Error) -> StoreError {
        map(e)
    }

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    #[test]
    fn a_broken_connection_is_retryable_before_commit_and_unknown_at_commit() {
        assert!(matches!(map(io()), StoreError::Unavailable(_)));
        assert!(matches!(map_commit(io()), StoreError::CommitUnknown(_)));
        assert!(matches!(
            map(sqlx::Error::PoolTimedOut),
            StoreError::Busy(_)
        ));
        assert!(matches!(
            map(sqlx::Error::RowNotFound),
            StoreError::Database(_)
        ));
    }
}
