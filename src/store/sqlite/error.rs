//! Maps sqlx/SQLite errors to [`StoreError`].

use crate::store::StoreError;

/// SQLite's primary result codes that mean "another connection holds the lock".
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
/// SQLite's primary result code for a full disk (or a file at its size limit).
const SQLITE_FULL: i64 = 13;

/// Maps a driver error: lock contention that outlasted the busy timeout becomes
/// [`StoreError::Busy`], a full disk [`StoreError::Full`], the rest
/// [`StoreError::Database`].
pub(super) fn map(e: sqlx::Error) -> StoreError {
    match primary_code(&e) {
        _ if matches!(e, sqlx::Error::PoolTimedOut) => StoreError::Busy(e.into()),
        Some(SQLITE_BUSY | SQLITE_LOCKED) => StoreError::Busy(e.into()),
        Some(SQLITE_FULL) => StoreError::Full(e.into()),
        _ => StoreError::Database(e.into()),
    }
}

/// Whether SQLite refused for a lock another connection holds.
pub(super) fn locked(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(SQLITE_BUSY | SQLITE_LOCKED))
}

/// The primary result code (the low byte of the extended one) SQLite refused
/// a statement with.
fn primary_code(e: &sqlx::Error) -> Option<i64> {
    match e {
        sqlx::Error::Database(db) => db.code()?.parse::<i64>().ok().map(|c| c & 0xff),
        _ => None,
    }
}

impl crate::store::exec::EngineDatabase for sqlx::Sqlite {
    fn store_error(e: sqlx::Error) -> StoreError {
        map(e)
    }

    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
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
    use sqlx::Connection as _;

    use super::*;

    #[tokio::test]
    async fn a_full_database_is_reported_as_full_and_worth_retrying() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("an in-memory database opens");
        for sql in ["PRAGMA max_page_count = 8", "CREATE TABLE t (x BLOB)"] {
            sqlx::query(sql).execute(&mut conn).await.expect(sql);
        }
        let e = sqlx::query("INSERT INTO t VALUES (zeroblob(1000000))")
            .execute(&mut conn)
            .await
            .expect_err("over the size limit");
        let e = map(e);
        assert!(matches!(e, StoreError::Full(_)), "{e:?}");
        assert!(e.is_transient());
        assert!(e.to_string().contains("free space, then retry"), "{e}");
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&mut conn)
            .await
            .expect("count");
        assert_eq!(written, 0, "nothing was written");
    }
}
