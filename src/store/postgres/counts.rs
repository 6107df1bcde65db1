//! Item counts on PostgreSQL: the folded counts per stored state plus the
//! deltas appended since (migration 0007's statement-level triggers), the
//! backoff count from the index of failed pending keys, and the oldest ready
//! item found by skipping through the claim index one priority at a time.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::engine::PostgresStore;
use super::error::Db as _;
use crate::store::StoreError;
use crate::store::params::ProcessPage;
use crate::store::rules::counts::CountsRow;
use crate::store::rules::pages;
use crate::store::types::{Page, ProcessCounts};

/// Folds the appended deltas into the counts: one statement, so a reader sees
/// them either as deltas or folded, never both, and two folds never fold the
/// same delta (the second waits for the first's row locks, then skips what
/// it deleted).
const FOLD: &str = "
WITH d AS (DELETE FROM drover_item_count_deltas RETURNING process, state, delta)
INSERT INTO drover_item_counts AS c (process, state, n)
SELECT process, state, sum(delta) FROM d GROUP BY process, state
ON CONFLICT (process, state) DO UPDATE SET n = c.n + excluded.n";

/// The stored counts of one page of known processes (named after `$2`, at
/// most `$3` of them: a range of the process key), and their keys backing
/// off at `$1`; only the page's counts and deltas are read.
const COUNTS: &str = "
WITH page AS (
    SELECT process FROM drover_processes WHERE process > $2 ORDER BY process LIMIT $3),
c AS (
    SELECT process, state, sum(n)::bigint AS n FROM (
        SELECT process, state, n FROM drover_item_counts
            WHERE process IN (SELECT process FROM page)
        UNION ALL SELECT process, state, delta FROM drover_item_count_deltas
            WHERE process IN (SELECT process FROM page)) u
    GROUP BY process, state)
SELECT p.process,
    COALESCE((SELECT n FROM c WHERE c.process = p.process AND c.state = 'pending'), 0) AS pending,
    COALESCE((SELECT n FROM c WHERE c.process = p.process AND c.state = 'running'), 0) AS running,
    COALESCE((SELECT n FROM c WHERE c.process = p.process AND c.state = 'parked'), 0) AS parked,
    COALESCE((SELECT n FROM c WHERE c.process = p.process AND c.state = 'idle'), 0) AS idle,
    (SELECT count(*) FROM drover_items b WHERE b.process = p.process
         AND b.state = 'pending' AND b.backoff_until IS NOT NULL
         AND b.backoff_until > $1) AS backoff
FROM page p ORDER BY p.process";

/// The earliest ready time at or before `$2` among process `$1`'s pending
/// keys: the first entry of each priority in the claim index, priorities
/// visited from the highest down (a handful of seeks, not a scan).
const OLDEST: &str = "
WITH RECURSIVE priorities(p) AS (
    SELECT max(priority) FROM drover_items WHERE process = $1 AND state = 'pending'
    UNION ALL
    SELECT (SELECT max(priority) FROM drover_items
            WHERE process = $1 AND state = 'pending' AND priority < priorities.p)
    FROM priorities WHERE priorities.p IS NOT NULL)
SELECT min(first) FROM (
    SELECT (SELECT min(ready_at) FROM drover_items
            WHERE process = $1 AND state = 'pending' AND priority = priorities.p) AS first
    FROM priorities WHERE priorities.p IS NOT NULL) f
WHERE first <= $2";

/// Folds the count deltas in; called with every count and by every reclaim
/// pass, which each live node runs every few seconds, so the deltas stay a
/// few rows per statement since the last pass.
pub(super) async fn fold(store: &PostgresStore) -> Result<(), StoreError> {
    let mut tx = store.read().await?;
    sqlx::query(FOLD).execute(&mut tx).await.db()?;
    tx.commit().await.db()
}

/// How often, at most, a store folds the deltas in behind its limited
/// claims: a limited claim's running count sums the deltas appended since the
/// last fold, and the reclaim passes that fold them too run only twice per
/// TTL (thousands of rows under load, 0.14 ms of a 0.9 ms claim at 16 runs at
/// once).
const FOLD_AFTER_LIMITED_CLAIMS: Duration = Duration::from_millis(250);

/// Folds the deltas in the background when a limited claim read them
/// ([`Folds::after_limited_claim`]): a store starts at most one such fold per
/// [`FOLD_AFTER_LIMITED_CLAIMS`]. Two folds at once (another node's, a
/// reclaim pass's) are safe: the second waits for the first's row locks, then
/// skips what it deleted.
#[derive(Debug, Default)]
pub(super) struct Folds {
    /// The last fold's start; `None` before the first.
    last: Mutex<Option<Instant>>,
}

impl Folds {
    /// Called after a claim of a process with a concurrency limit: starts a
    /// fold in the background unless one started less than
    /// [`FOLD_AFTER_LIMITED_CLAIMS`] ago, so the next claim's count reads a
    /// short tail of deltas. Off the claim's path: the claim has committed.
    pub(super) fn after_limited_claim(store: &PostgresStore) {
        {
            let mut last = store
                .folds
                .last
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < FOLD_AFTER_LIMITED_CLAIMS) {
                return;
            }
            *last = Some(Instant::now());
        }
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(e) = fold(&store).await {
                tracing::debug!(error = %e, "folding the item counts after a limited claim failed; the next reclaim pass folds them");
            }
        });
    }
}

/// Counts per process of one page without reading the backlog.
pub(super) async fn process_counts(
    store: &PostgresStore,
    page: ProcessPage,
) -> Result<Page<ProcessCounts>, StoreError> {
    fold(store).await?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let rows: Vec<CountsRow> = sqlx::query_as(COUNTS)
        .bind(now)
        .bind(page.after.unwrap_or_default())
        .bind(pages::read_limit(page.limit))
        .fetch_all(&mut tx)
        .await
        .db()?;
    let rows = pages::cut(rows, page.limit, |r| r.process.clone());
    let mut out = Vec::with_capacity(rows.items.len());
    for row in rows.items {
        let oldest: Option<DateTime<Utc>> = sqlx::query_scalar(OLDEST)
            .bind(&row.process)
            .bind(now)
            .fetch_one(&mut tx)
            .await
            .db()?;
        let age = oldest.map(|at| (now - at).to_std().unwrap_or(Duration::ZERO));
        out.push(row.into_counts(age));
    }
    tx.commit().await.db()?;
    Ok(Page {
        items: out,
        next: rows.next,
    })
}
