//! The history on SQLite: one row per run, written when it ends, and one per
//! operator action; reading it a page at a time; pruning it by each process's
//! retention.

use crate::store::exec::Exec as _;
use serde_json::Value;

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::inspect::check_process;
use super::rows::{RunRow, run_columns};
use crate::store::StoreError;
use crate::store::params::{PruneTurn, RunList};
use crate::store::rules::retention::{PruneSteps, Rules, runs_window};
use crate::store::rules::rows::runs;
use crate::store::types::{Run, RunOutcome};

/// Ends the runs of the running rows whose ids are in `?3` (a JSON array) with
/// outcome `?2` at `?1`, everything else read from the rows themselves: the
/// lease, the attempt (nothing changes a running row's failures, so
/// `failures + 1` is the lease's attempt), when the key became pending and
/// when the run started. Must run before the rows change.
const LOG_FROM_ROWS: &str = log_from_rows_sql!("?2", "?3");

/// [`LOG_FROM_ROWS`] with its outcome and its JSON array of ids given as SQL
/// (a literal or a parameter), for a query that runs it beside other
/// statements; the end time is `?1`.
macro_rules! log_from_rows_sql {
    ($outcome:literal, $ids:literal) => {
        concat!(
            "INSERT INTO drover_runs (process, key, outcome, attempt, session, token,
    pending_since, started_at, ended_at)
SELECT process, key, ",
            $outcome,
            ", failures + 1, lease_session, lease_token, enqueued_at, started_at, ?1
FROM drover_items WHERE id IN (SELECT value FROM json_each(",
            $ids,
            ")) ORDER BY lease_token"
        )
    };
}
pub(super) use log_from_rows_sql;

/// Like [`LOG_FROM_ROWS`] for runs that carry an error (or a batch's runs of
/// several outcomes, in one statement): `?2` is a JSON array of `[id,
/// outcome, error]`, the error `null` for none.
const LOG_WITH_ERRORS: &str = "
INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
    started_at, ended_at, error)
SELECT i.process, i.key, json_extract(j.value, '$[1]'), i.failures + 1, i.lease_session,
    i.lease_token, i.enqueued_at, i.started_at, ?1, json_extract(j.value, '$[2]')
FROM json_each(?2) AS j JOIN drover_items i ON i.id = json_extract(j.value, '$[0]')
ORDER BY i.lease_token";

/// Writes the history rows of running items (ids as a JSON array) whose runs
/// end with `outcome` and no error.
pub(super) async fn log_from_rows(
    tx: &mut Tx,
    now: i64,
    outcome: RunOutcome,
    ids: &str,
) -> Result<(), StoreError> {
    sqlx::query(LOG_FROM_ROWS)
        .bind(now)
        .bind(outcome.as_str())
        .bind(ids)
        .exec(&mut **tx)
        .await?;
    Ok(())
}

/// Writes the history rows of running items whose runs end with an error:
/// `runs` holds `[id, outcome, error]` arrays.
pub(super) async fn log_with_errors(
    tx: &mut Tx,
    now: i64,
    runs: Vec<Value>,
) -> Result<(), StoreError> {
    if runs.is_empty() {
        return Ok(());
    }
    sqlx::query(LOG_WITH_ERRORS)
        .bind(now)
        .bind(Value::from(runs).to_string())
        .exec(&mut **tx)
        .await?;
    Ok(())
}

/// Records an operator's action on a key, on the action's transaction.
pub(super) async fn log_action(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    (process, key): (&str, &str),
    (action, actor): (RunOutcome, &str),
    error: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO drover_runs (process, key, outcome, ended_at, error, actor)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .bind(process)
    .bind(key)
    .bind(action.as_str())
    .bind(now)
    .bind(error)
    .bind(actor)
    .exec(conn)
    .await?;
    Ok(())
}

/// A key's page of runs: `process = ?1 AND key = ?2` stated plainly, so the
/// `(process, key, id)` index is walked backwards from the cursor (with the
/// optional filters written as above, SQLite walks every run instead).
pub(super) const BY_KEY: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM drover_runs
     WHERE process = ?1 AND key = ?2
         AND (?3 IS NULL OR outcome = ?3) AND id < COALESCE(?4, 9223372036854775807)
     ORDER BY id DESC LIMIT ?5"
);

/// A page of history, newest first. With a key, the `(process, key, id)` index
/// gives the page directly; otherwise the primary key is walked backwards from
/// the cursor.
pub(super) async fn list(store: &SqliteStore, params: RunList) -> Result<Vec<Run>, StoreError> {
    if let Some(process) = &params.process {
        check_process(store, process).await?;
    }
    let sql = concat!(
        "SELECT ",
        run_columns!(),
        " FROM drover_runs
         WHERE (?1 IS NULL OR process = ?1) AND (?2 IS NULL OR key = ?2)
             AND (?3 IS NULL OR outcome = ?3) AND id < COALESCE(?4, 9223372036854775807)
         ORDER BY id DESC LIMIT ?5"
    );
    let sql = if params.process.is_some() && params.key.is_some() {
        BY_KEY
    } else {
        sql
    };
    let rows: Vec<RunRow> = sqlx::query_as(sql)
        .bind(&params.process)
        .bind(&params.key)
        .bind(params.outcome.map(RunOutcome::as_str))
        .bind(params.before)
        .bind(params.limit)
        .fetch_all(&store.pool)
        .await
        .db()?;
    runs(rows)
}

/// Takes, renews or is refused `params.process`'s turn to prune (see
/// [`prune_turn`](crate::store::StoreEngine::prune_turn)): one upsert whose
/// update applies only when the turn is the holder's or has run out (times
/// in milliseconds on the database clock).
pub(super) async fn prune_turn(
    store: &SqliteStore,
    params: &PruneTurn,
) -> Result<bool, StoreError> {
    let (mut tx, now) = store.write().await?;
    let hold = i64::try_from(params.hold.as_millis()).unwrap_or(i64::MAX);
    let held: Option<i64> = sqlx::query_scalar(
        "INSERT INTO drover_prune_turns (process, holder, held_until)
         SELECT process, ?2, ?3 FROM drover_processes WHERE process = ?1
         ON CONFLICT (process) DO UPDATE
             SET holder = excluded.holder, held_until = excluded.held_until
             WHERE drover_prune_turns.holder = excluded.holder
                 OR drover_prune_turns.held_until <= ?4
         RETURNING 1",
    )
    .bind(&params.process)
    .bind(params.holder)
    .bind(now.saturating_add(hold))
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    tx.commit().await.db()?;
    Ok(held.is_some())
}

/// Deletes up to `?3` runs of `?1` that ended before `?2`, the oldest first:
/// through the `ended_at` index (`+process` keeps SQLite from reading every
/// run of the process through the key index instead and sorting the old
/// ones, a cost in proportion to the history held while holding the write
/// lock, at every tick).
pub(super) const PRUNE_OLD: &str = "
DELETE FROM drover_runs WHERE id IN (
    SELECT id FROM drover_runs WHERE ended_at < ?2 AND +process = ?1
    ORDER BY ended_at LIMIT ?3)";

/// Deletes the runs of `?1` over the cap of `?3` of each key in `?2` (a
/// JSON array of the keys' bytes in hex), at most `?4` of them, each key's
/// oldest first (its index order). `CROSS JOIN` keeps the keys the outer
/// loop, each key's runs probed through the key index: joined plainly,
/// SQLite read every run of the process and looked each up among the keys,
/// at every step of the walk, holding the write lock.
pub(super) const CAP_RUNS: &str = "
DELETE FROM drover_runs WHERE id IN (
    SELECT r.id FROM (SELECT CAST(unhex(value) AS TEXT) AS key FROM json_each(?2)) AS k
    CROSS JOIN drover_runs r ON r.process = ?1 AND r.key = k.key
    WHERE r.id <= (SELECT o.id FROM drover_runs o
                   WHERE o.process = ?1 AND o.key = k.key
                   ORDER BY o.id DESC LIMIT 1 OFFSET ?3)
    LIMIT ?4)";

impl PruneSteps for SqliteStore {
    async fn rules(&self, process: &str) -> Result<Rules, StoreError> {
        check_process(self, process).await?;
        sqlx::query_as(
            "SELECT keep_runs_ms, keep_runs_per_key, forget_idle_ms
             FROM drover_processes WHERE process = ?1",
        )
        .bind(process)
        .fetch_one(&self.pool)
        .await
        .db()
    }

    async fn prune_old(&self, process: &str, keep_ms: i64, batch: u32) -> Result<u64, StoreError> {
        let (mut tx, now) = self.write().await?;
        let deleted = sqlx::query(PRUNE_OLD)
            .bind(process)
            .bind(now.saturating_sub(keep_ms.max(0)))
            .bind(batch)
            .exec(&mut *tx)
            .await?;
        tx.commit().await.db()?;
        Ok(deleted)
    }

    async fn cap_window(
        &self,
        process: &str,
        after: Option<&str>,
        batch: u32,
        keep: u32,
    ) -> Result<(u64, Option<String>), StoreError> {
        // Walked by the keys' exact bytes, in hex (see `forget_window`).
        let window: Vec<(String, i64)> = sqlx::query_as(
            "SELECT hex(key), count(*) FROM (
                 SELECT key FROM drover_runs
                 WHERE process = ?1 AND key > CAST(unhex(?2) AS TEXT)
                 ORDER BY key LIMIT ?3)
             GROUP BY key ORDER BY key",
        )
        .bind(process)
        .bind(after.unwrap_or(""))
        .bind(batch)
        .fetch_all(&self.pool)
        .await
        .db()?;
        let window = runs_window(window, batch, keep);
        if window.cap.is_empty() {
            return Ok((0, window.next));
        }
        let (mut tx, _) = self.write().await?;
        let deleted = sqlx::query(CAP_RUNS)
            .bind(process)
            .bind(Value::from(window.cap).to_string())
            .bind(keep)
            .bind(batch)
            .exec(&mut *tx)
            .await?;
        tx.commit().await.db()?;
        Ok((deleted, window.next))
    }

    async fn forget_window(
        &self,
        process: &str,
        after: Option<&str>,
        batch: u32,
        forget_ms: i64,
    ) -> Result<(u64, Option<String>), StoreError> {
        // The walk's cursors are the keys' exact bytes in hex: a key SQL
        // wrote as text that is not UTF-8 cannot be read as a `String`, and
        // read with U+FFFD it would sort before its own bytes.
        let after = after.unwrap_or("");
        let (entries, last): (i64, Option<String>) = sqlx::query_as(
            "SELECT count(*), nullif(hex(max(key)), '') FROM (
                 SELECT key FROM drover_items
                 WHERE process = ?1 AND key > CAST(unhex(?2) AS TEXT)
                 ORDER BY key LIMIT ?3)",
        )
        .bind(process)
        .bind(after)
        .bind(batch)
        .fetch_one(&self.pool)
        .await
        .db()?;
        let Some(last) = last else {
            return Ok((0, None));
        };
        let (mut tx, now) = self.write().await?;
        let forgotten = sqlx::query(
            "DELETE FROM drover_items
             WHERE process = ?1 AND key > CAST(unhex(?2) AS TEXT)
                 AND key <= CAST(unhex(?3) AS TEXT) AND state = 'idle'
                 AND COALESCE(last_ended_at, enqueued_at) < ?4",
        )
        .bind(process)
        .bind(after)
        .bind(&last)
        .bind(now.saturating_sub(forget_ms.max(0)))
        .exec(&mut *tx)
        .await?;
        tx.commit().await.db()?;
        Ok((forgotten, (entries >= i64::from(batch)).then_some(last)))
    }
}
