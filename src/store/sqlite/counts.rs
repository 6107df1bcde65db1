//! Item counts on SQLite: the trigger-kept counts per stored state, the
//! backoff count from the index of failed pending keys, and the oldest ready
//! item found by skipping through the claim index one priority at a time.

use std::time::Duration;

use super::engine::SqliteStore;
use super::error::Db as _;
use crate::store::StoreError;
use crate::store::params::ProcessPage;
use crate::store::rules::counts::CountsRow;
use crate::store::rules::pages;
use crate::store::types::{Page, ProcessCounts};

/// The stored counts of one page of known processes (named after `?2`, at
/// most `?3` of them: a range of the process key), and their keys backing
/// off at `?1`.
pub(super) const COUNTS: &str = "
SELECT p.process,
    COALESCE((SELECT n FROM drover_item_counts c
              WHERE c.process = p.process AND c.state = 'pending'), 0) AS pending,
    COALESCE((SELECT n FROM drover_item_counts c
              WHERE c.process = p.process AND c.state = 'running'), 0) AS running,
    COALESCE((SELECT n FROM drover_item_counts c
              WHERE c.process = p.process AND c.state = 'parked'), 0) AS parked,
    COALESCE((SELECT n FROM drover_item_counts c
              WHERE c.process = p.process AND c.state = 'idle'), 0) AS idle,
    (SELECT count(*) FROM drover_items b WHERE b.process = p.process
         AND b.state = 'pending' AND b.backoff_until IS NOT NULL
         AND b.backoff_until > ?1) AS backoff
FROM drover_processes p WHERE p.process > ?2 ORDER BY p.process LIMIT ?3";

/// The earliest ready time at or before `?2` among process `?1`'s pending
/// keys: the first entry of each priority in the claim index, priorities
/// visited from the highest down (a handful of seeks, not a scan).
pub(super) const OLDEST: &str = "
WITH RECURSIVE priorities(p) AS (
    SELECT max(priority) FROM drover_items WHERE process = ?1 AND state = 'pending'
    UNION ALL
    SELECT (SELECT max(priority) FROM drover_items
            WHERE process = ?1 AND state = 'pending' AND priority < priorities.p)
    FROM priorities WHERE priorities.p IS NOT NULL)
SELECT min(first) FROM (
    SELECT (SELECT min(ready_at) FROM drover_items
            WHERE process = ?1 AND state = 'pending' AND priority = priorities.p) AS first
    FROM priorities WHERE priorities.p IS NOT NULL)
WHERE first <= ?2";

/// Counts per process of one page without reading the backlog.
pub(super) async fn process_counts(
    store: &SqliteStore,
    page: ProcessPage,
) -> Result<Page<ProcessCounts>, StoreError> {
    let now = store.now_ms(&store.pool).await?;
    let rows: Vec<CountsRow> = sqlx::query_as(COUNTS)
        .bind(now)
        .bind(page.after.unwrap_or_default())
        .bind(pages::read_limit(page.limit))
        .fetch_all(&store.pool)
        .await
        .db()?;
    let rows = pages::cut(rows, page.limit, |r| r.process.clone());
    let mut out = Vec::with_capacity(rows.items.len());
    for row in rows.items {
        let oldest: Option<i64> = sqlx::query_scalar(OLDEST)
            .bind(&row.process)
            .bind(now)
            .fetch_one(&store.pool)
            .await
            .db()?;
        let age = oldest.map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0)));
        out.push(row.into_counts(age));
    }
    Ok(Page {
        items: out,
        next: rows.next,
    })
}
