//! Read-side operations on PostgreSQL: items and counts.

use chrono::{DateTime, Utc};

use super::engine::PostgresStore;
use super::error::Db as _;
use super::rows::{ItemRow, item_columns};
use super::runs;
use crate::store::StoreError;
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{ItemGet, ItemList};
use crate::store::rules::decode::{backing_off, stored_state};
use crate::store::rules::rows::PagedRow;
use crate::store::rules::triage::{Arg, Dialect, PageSteps, SectionQuery};
use crate::store::types::{Item, ItemDetail, ItemState};

/// Fails with `UnknownProcess` unless the process was ever enqueued to or
/// configured.
pub(super) async fn check_process(store: &PostgresStore, process: &str) -> Result<(), StoreError> {
    validate_process(process)?;
    let mut tx = store.read().await?;
    let known: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM drover_processes WHERE process = $1")
            .bind(process)
            .fetch_optional(&mut tx)
            .await
            .db()?;
    tx.commit().await.db()?;
    known
        .map(|_| ())
        .ok_or_else(|| StoreError::UnknownProcess(process.to_owned()))
}

/// [`item_list`] without a state.
const LIST_ALL: &str = concat!(
    "SELECT ",
    item_columns!(),
    " FROM drover_items WHERE process = $1 AND key > $2 ORDER BY key LIMIT $3"
);

/// [`item_list`] of the running keys.
const LIST_RUNNING: &str = concat!(
    "SELECT ",
    item_columns!(),
    " FROM drover_items WHERE process = $1 AND state = 'running' AND key > $2
     ORDER BY key LIMIT $3"
);

/// [`item_list`] of the parked keys.
const LIST_PARKED: &str = concat!(
    "SELECT ",
    item_columns!(),
    " FROM drover_items WHERE process = $1 AND state = 'parked' AND key > $2
     ORDER BY key LIMIT $3"
);

/// [`item_list`] of the pending, backing-off or idle keys: the stored state
/// (`$4`), whether backing off (`$5`, `NULL` for idle) as of now (`$6`).
const LIST_IN_STATE: &str = concat!(
    "SELECT ",
    item_columns!(),
    " FROM drover_items WHERE process = $1 AND state = $4 AND key > $2
         AND ($5::boolean IS NULL OR (backoff_until IS NOT NULL AND backoff_until > $6) = $5)
     ORDER BY key LIMIT $3"
);

/// Lists one process's items in key order. Each state is stated literally, so
/// the planner can prove a partial index applies: parked keys are read in key
/// order from their own index, running keys from the lease index, which holds
/// the running rows alone (as many as the fleet's runs), then sorted (migration
/// 0014); pending and idle keys, the bulk, through the `(process, key)` unique
/// index.
pub(super) async fn item_list(
    store: &PostgresStore,
    params: &ItemList,
) -> Result<Vec<Item>, StoreError> {
    check_process(store, &params.process).await?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let after = params.after_key.as_deref().unwrap_or("");
    let (sql, in_state) = match params.state {
        None => (LIST_ALL, None),
        Some(ItemState::Running) => (LIST_RUNNING, None),
        Some(ItemState::Parked) => (LIST_PARKED, None),
        Some(state) => (LIST_IN_STATE, Some(state)),
    };
    let mut query = sqlx::query_as(sql)
        .bind(&params.process)
        .bind(after)
        .bind(i64::from(params.limit));
    if let Some(state) = in_state {
        query = query
            .bind(stored_state(state))
            .bind(backing_off(state))
            .bind(now);
    }
    let rows: Vec<ItemRow> = query.fetch_all(&mut tx).await.db()?;
    tx.commit().await.db()?;
    rows.into_iter().map(|r| r.into_item(now)).collect()
}

pub(super) async fn item_get(
    store: &PostgresStore,
    params: &ItemGet,
) -> Result<Option<ItemDetail>, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let row: Option<ItemRow> = sqlx::query_as(concat!(
        "SELECT ",
        item_columns!(),
        " FROM drover_items WHERE process = $1 AND key = $2"
    ))
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&mut tx)
    .await
    .db()?;
    tx.commit().await.db()?;
    let Some(row) = row else { return Ok(None) };
    let runs = runs::list(store, &params.runs()).await?;
    Ok(Some(ItemDetail {
        item: row.into_item(now)?,
        runs,
    }))
}

/// The triage listing's SQL on PostgreSQL: each section states its condition
/// literally, so the planner reads running keys from the lease index and parked
/// keys from theirs unprompted (migration 0014).
pub(super) const TRIAGE: Dialect = Dialect {
    mark: '$',
    running_from: "drover_items",
    columns: item_columns!(),
};

impl PageSteps for PostgresStore {
    async fn known(&self, process: &str) -> Result<(), StoreError> {
        check_process(self, process).await
    }

    async fn section_rows(&self, query: SectionQuery) -> Result<Vec<(i64, Item)>, StoreError> {
        let mut tx = self.read().await?;
        let now = self.now(&mut tx).await?;
        let mut q = sqlx::query_as::<_, PagedRow<DateTime<Utc>>>(sqlx::AssertSqlSafe(query.sql));
        for arg in query.args {
            q = match arg {
                Arg::Process(s) | Arg::Key(s) => q.bind(s),
                Arg::Now => q.bind(now),
                Arg::At(t) => q.bind(t),
                Arg::Int(n) => q.bind(n),
                Arg::Limit(n) => q.bind(i64::from(n)),
            };
        }
        let rows = q.fetch_all(&mut tx).await.db()?;
        tx.commit().await.db()?;
        rows.into_iter().map(|r| r.into_paged(now)).collect()
    }
}
