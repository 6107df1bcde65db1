//! Several callers' requests in one write transaction, each in a savepoint
//! of its own: how a group of claims or of completion batches
//! ([`grouped`](crate::store::grouped)) runs on SQLite's one writer.

use sqlx::sqlite::SqliteRow;

use super::engine::SqliteStore;
use super::error::Db as _;
use super::writer::{SqliteQuery, padded};
use crate::store::StoreError;
use crate::store::grouped::Answer;

/// Opens a request's savepoint: the statements of a request in a group
/// start with it and end with [`release!`].
macro_rules! savepoint {
    () => {
        "SAVEPOINT drover_group;\n"
    };
}
pub(super) use savepoint;

/// Ends a request's savepoint, keeping what it wrote.
macro_rules! release {
    () => {
        "RELEASE drover_group"
    };
}
pub(super) use release;

#[cfg(test)]
thread_local! {
    /// How many groups of one ran their request's own transaction on this
    /// thread, for the tests: a current-thread runtime runs the groups' task
    /// on the test's own thread.
    pub(super) static ONES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs each of `group`'s requests, bound by `bind`, one after the other in
/// one transaction on the writer: `in_group` (a request's statements, from
/// [`savepoint!`] to [`release!`]) once per request. Each is answered the
/// first row its statements read, or [`Answer::Alone`] when they failed: its
/// writes are then rolled back to its savepoint, and it runs again on its
/// own. Nothing is answered unless the transaction commits.
///
/// A group of one runs `alone` instead, the same statements in a transaction
/// of their own (from `BEGIN` to `COMMIT`, one trip to the writer's thread
/// where the savepoint's way takes three: `BEGIN`, the statements, `COMMIT`),
/// and its error is its own: what several controllers at a low load, each
/// request waiting for the one before but none joining it, would otherwise
/// pay on every claim.
pub(super) async fn each_in_its_savepoint<R, T>(
    store: &SqliteStore,
    group: &[R],
    (alone, in_group): (&'static str, &'static str),
    bind: for<'q> fn(&SqliteStore, &'q R, SqliteQuery<'q>) -> SqliteQuery<'q>,
) -> Result<Vec<Answer<T>>, StoreError>
where
    T: for<'r> sqlx::FromRow<'r, SqliteRow>,
{
    debug_assert!(in_group.starts_with(savepoint!()) && in_group.ends_with(release!()));
    if let [request] = group {
        #[cfg(test)]
        ONES.with(|ones| ones.set(ones.get() + 1));
        return Ok(vec![Answer::Done(
            on_its_own(store, request, alone, bind).await?,
        )]);
    }
    let mut tx = store.begin().await?;
    let mut answers = Vec::with_capacity(group.len());
    for request in group {
        match padded(bind(store, request, sqlx::query(in_group)))
            .fetch_all(&mut *tx)
            .await
        {
            Ok(rows) => {
                let row = rows.first().ok_or(sqlx::Error::RowNotFound).db()?;
                answers.push(Answer::Done(T::from_row(row).db()?));
            }
            Err(e) => {
                tracing::debug!(error = %e, "a request in a group failed; it runs again on its own");
                sqlx::query(concat!("ROLLBACK TO drover_group; ", release!()))
                    .execute(&mut *tx)
                    .await
                    .db()?;
                answers.push(Answer::Alone);
            }
        }
    }
    tx.commit().await.db()?;
    Ok(answers)
}

/// Runs `sql` (a request's statements from `BEGIN` to `COMMIT`) for
/// `request`, bound by `bind`, in a transaction of its own on the writer:
/// one trip to its thread. Answers the first row the statements read.
pub(super) async fn on_its_own<R, T>(
    store: &SqliteStore,
    request: &R,
    sql: &'static str,
    bind: for<'q> fn(&SqliteStore, &'q R, SqliteQuery<'q>) -> SqliteQuery<'q>,
) -> Result<T, StoreError>
where
    T: for<'r> sqlx::FromRow<'r, SqliteRow>,
{
    store
        .lock()
        .await?
        .commit_with_row(sql, |query| bind(store, request, query))
        .await
        .db()
}
