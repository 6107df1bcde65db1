//! The charts' series on PostgreSQL: runs per minute from the runs table (its
//! `ended_at` BRIN index), depth samples written from the counts.

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};

use super::counts::process_counts;
use super::engine::PostgresStore;
use super::error::{Db as _, commit};
use super::inspect::check_process;
use crate::store::StoreError;
use crate::store::params::{DepthSample, ProcessSeries};
use crate::store::rules::pages;
use crate::store::rules::series::{SampleRow, assemble, window_start};
use crate::store::types::Series;

/// Runs of `$1` that ended since `$2`, per minute from `$2` and outcome:
/// each run is put in its minute by `date_bin` (timestamp arithmetic, and a
/// hash of the few minute × outcome groups) and only the groups' minutes are
/// turned into numbers, not each run's (`EXTRACT` gives a `numeric`, which
/// made the per-run work cost more than the read on a busy hour).
const RUNS: &str = "
SELECT (EXTRACT(EPOCH FROM bin - $2) / 60)::bigint AS minute, outcome, n FROM (
    SELECT date_bin('1 minute', ended_at, $2) AS bin, outcome, count(*) AS n
    FROM drover_runs
    WHERE ended_at >= $2 AND process = $1 AND actor IS NULL
    GROUP BY bin, outcome) t
ORDER BY minute, outcome";

/// A process's samples since `$2`.
const SAMPLES: &str = "
SELECT at, pending, backoff, running, parked FROM drover_depth_samples
WHERE process = $1 AND at >= $2 ORDER BY at";

/// One process's sample at `$2`, unless it has one since `$3`.
const SAMPLE: &str = "
INSERT INTO drover_depth_samples (process, at, pending, backoff, running, parked)
SELECT $1, $2, $4, $5, $6, $7
WHERE NOT EXISTS (SELECT 1 FROM drover_depth_samples WHERE process = $1 AND at > $3)
ON CONFLICT DO NOTHING";

pub(super) async fn process_series(
    store: &PostgresStore,
    params: ProcessSeries,
) -> Result<Series, StoreError> {
    check_process(store, &params.process).await?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let start = window_start(now, params.window);
    let runs: Vec<(i64, String, i64)> = sqlx::query_as(RUNS)
        .bind(&params.process)
        .bind(start)
        .fetch_all(&mut tx)
        .await
        .db()?;
    let samples: Vec<SampleRow<DateTime<Utc>>> = sqlx::query_as(SAMPLES)
        .bind(&params.process)
        .bind(start)
        .fetch_all(&mut tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    assemble(start, now, runs, samples)
}

pub(super) async fn depth_sample(
    store: &PostgresStore,
    params: DepthSample,
) -> Result<u64, StoreError> {
    // Every process is sampled; its counts are read a page at a time.
    let counts = pages::every_process(|page| process_counts(store, page)).await?;
    let (mut tx, now) = store.write().await?;
    let gap = chrono::Duration::from_std(params.min_gap).unwrap_or(chrono::Duration::MAX);
    let keep = chrono::Duration::from_std(params.keep).unwrap_or(chrono::Duration::MAX);
    let mut written = 0;
    for c in &counts {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        written += sqlx::query(SAMPLE)
            .bind(&c.process)
            .bind(now)
            .bind(now.checked_sub_signed(gap).unwrap_or(now))
            .bind(n(c.pending))
            .bind(n(c.backoff))
            .bind(n(c.running))
            .bind(n(c.parked))
            .exec(&mut tx)
            .await?;
    }
    sqlx::query("DELETE FROM drover_depth_samples WHERE at < $1")
        .bind(
            now.checked_sub_signed(keep)
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        )
        .exec(&mut tx)
        .await?;
    commit(tx).await?;
    Ok(written)
}
