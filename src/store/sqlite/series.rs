//! The charts' series on SQLite: runs per minute from the runs table (its
//! `ended_at` index), depth samples written from the counts.

use super::counts::process_counts;
use super::engine::SqliteStore;
use super::error::Db as _;
use super::inspect::check_process;
use super::rows::{duration_ms, to_ms, to_time};
use crate::store::StoreError;
use crate::store::exec::Exec as _;
use crate::store::params::{DepthSample, ProcessSeries};
use crate::store::rules::pages;
use crate::store::rules::series::{SampleRow, assemble, window_start};
use crate::store::types::Series;

/// Runs of `?1` that ended since `?2`, per minute from `?2` and outcome:
/// through the `ended_at` index (`+process` keeps SQLite from walking every
/// run of the process through the key index instead).
pub(super) const RUNS: &str = "
SELECT (ended_at - ?2) / 60000 AS minute, outcome, count(*) FROM drover_runs
WHERE ended_at >= ?2 AND +process = ?1 AND actor IS NULL
GROUP BY minute, outcome ORDER BY minute, outcome";

/// A process's samples since `?2`.
const SAMPLES: &str = "
SELECT at, pending, backoff, running, parked FROM drover_depth_samples
WHERE process = ?1 AND at >= ?2 ORDER BY at";

/// One process's sample at `?2`, unless it has one since `?3`.
const SAMPLE: &str = "
INSERT INTO drover_depth_samples (process, at, pending, backoff, running, parked)
SELECT ?1, ?2, ?4, ?5, ?6, ?7
WHERE NOT EXISTS (SELECT 1 FROM drover_depth_samples WHERE process = ?1 AND at > ?3)";

/// How many processes one write transaction samples: the write lock is let
/// go between them, so claims and completions go on while a database of many
/// processes is sampled (one transaction for all of them held it about a
/// second per 20,000 processes, every minute).
const SAMPLED_AT_ONCE: usize = 200;

/// The samples of the processes in `?1` (a JSON array) older than `?2`, each
/// process's found through the table's key: one statement for all of them
/// read every sample of every process.
pub(super) const FORGET_SAMPLES: &str = "
DELETE FROM drover_depth_samples
WHERE process IN (SELECT value FROM json_each(?1)) AND at < ?2";

pub(super) async fn process_series(
    store: &SqliteStore,
    params: ProcessSeries,
) -> Result<Series, StoreError> {
    check_process(store, &params.process).await?;
    let now = store.now_ms(&store.pool).await?;
    let start = to_ms(window_start(to_time(now), params.window));
    let runs: Vec<(i64, String, i64)> = sqlx::query_as(RUNS)
        .bind(&params.process)
        .bind(start)
        .fetch_all(&store.pool)
        .await
        .db()?;
    let samples: Vec<SampleRow<i64>> = sqlx::query_as(SAMPLES)
        .bind(&params.process)
        .bind(start)
        .fetch_all(&store.pool)
        .await
        .db()?;
    assemble(to_time(start), to_time(now), runs, samples)
}

pub(super) async fn depth_sample(
    store: &SqliteStore,
    params: DepthSample,
) -> Result<u64, StoreError> {
    // Every process is sampled; its counts are read a page at a time.
    let counts = pages::every_process(|page| process_counts(store, page)).await?;
    let mut written = 0;
    for chunk in counts.chunks(SAMPLED_AT_ONCE) {
        let (mut tx, now) = store.write().await?;
        for c in chunk {
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            written += sqlx::query(SAMPLE)
                .bind(&c.process)
                .bind(now)
                .bind(now - duration_ms(params.min_gap))
                .bind(n(c.pending))
                .bind(n(c.backoff))
                .bind(n(c.running))
                .bind(n(c.parked))
                .exec(&mut *tx)
                .await?;
        }
        let processes: Vec<&str> = chunk.iter().map(|c| c.process.as_str()).collect();
        sqlx::query(FORGET_SAMPLES)
            .bind(serde_json::Value::from(processes).to_string())
            .bind(now - duration_ms(params.keep))
            .exec(&mut *tx)
            .await?;
        tx.commit().await.db()?;
    }
    Ok(written)
}
