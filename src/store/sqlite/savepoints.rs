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

/// Runs `sql` (a request's statements, from [`savepoint!`] to [`release!`])
/// once for each of `group`'s requests, bound by `bind`, one after the other
/// in one transaction on the writer. Each is answered the first row its
/// statements read, or [`Answer::Alone`] when they failed: its writes are
/// then rolled back to its savepoint, and it runs again on its own. Nothing
/// is answered unless the transaction commits.
pub(super) async fn each_in_its_savepoint<R, T>(
    store: &SqliteStore,
    group: &[R],
    sql: &'static str,
    bind: for<'q> fn(&SqliteStore, &'q R, SqliteQuery<'q>) -> SqliteQuery<'q>,
) -> Result<Vec<Answer<T>>, StoreError>
where
    T: for<'r> sqlx::FromRow<'r, SqliteRow>,
{
    debug_assert!(sql.starts_with(savepoint!()) && sql.ends_with(release!()));
    let mut tx = store.begin().await?;
    let mut answers = Vec::with_capacity(group.len());
    for request in group {
        match padded(bind(store, request, sqlx::query(sql)))
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
