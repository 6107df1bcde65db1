//! The history on PostgreSQL: one row per run, written when it ends, and one
//! per operator action; reading it a page at a time; pruning it by each
//! process's retention.

use crate::store::exec::Exec as _;

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::inspect::check_process;
use super::rows::{RunRow, run_columns};
use super::tid::Tid;
use crate::store::StoreError;
use crate::store::params::{PruneTurn, RunList};
use crate::store::rules::retention::{PruneSteps, Rules, runs_window};
use crate::store::rules::rows::runs;
use crate::store::rules::settle::later;
use crate::store::types::{Run, RunOutcome};

/// Ends the runs of the running rows whose `ctid`s are in `$3` (rows this
/// transaction holds locked, see [`Tid`]; each found by one TID fetch, in a
/// `LATERAL … LIMIT 1` that cannot be flattened into a join, so no estimate
/// can turn it into a scan of the table), with the outcome,
/// error and trace id (of a traced run, else NULL) of the same position in
/// `$2`, `$4` and `$5`, at `$1`; everything else is
/// read from the rows themselves: the lease, the attempt (nothing changes a
/// running row's failures, so `failures + 1` is the lease's attempt), when the
/// key became pending and when the run started. Must run before the rows change.
const LOG_FROM_ROWS: &str = "
INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
    started_at, ended_at, error, trace_id)
SELECT i.process, i.key, r.outcome, i.failures + 1, i.lease_session, i.lease_token,
    i.enqueued_at, i.started_at, $1, r.error, r.trace_id
FROM UNNEST($2::text[], $3::text[]::tid[], $4::text[], $5::text[]) AS r(outcome, ctid, error, trace_id)
CROSS JOIN LATERAL (SELECT j.* FROM drover_items j WHERE j.ctid = r.ctid LIMIT 1) i
ORDER BY i.lease_token";

/// The history rows of runs about to end, gathered for one [`log_runs`].
#[derive(Debug, Default)]
pub(super) struct Ending {
    outcome: Vec<&'static str>,
    ctid: Vec<Tid>,
    error: Vec<Option<String>>,
    trace_id: Vec<Option<String>>,
}

impl Ending {
    /// Adds the run of the locked running row at `ctid`, ending with `outcome`
    /// and `error`.
    pub(super) fn push(&mut self, ctid: Tid, outcome: RunOutcome, error: Option<String>) {
        self.push_traced(ctid, outcome, error, None);
    }

    /// [`push`](Self::push) for a run whose span was exported: its trace id
    /// goes into the history row as it is written (one row version, not an
    /// insert and then an update).
    pub(super) fn push_traced(
        &mut self,
        ctid: Tid,
        outcome: RunOutcome,
        error: Option<String>,
        trace_id: Option<String>,
    ) {
        self.outcome.push(outcome.as_str());
        self.ctid.push(ctid);
        self.error.push(error);
        self.trace_id.push(trace_id);
    }

    /// The runs of the locked rows `ctids`, all ending with `outcome` and no
    /// error.
    pub(super) fn all(ctids: &[Tid], outcome: RunOutcome) -> Self {
        let mut ending = Self::default();
        for &ctid in ctids {
            ending.push(ctid, outcome, None);
        }
        ending
    }
}

/// Writes the history rows of running items whose runs end now ([`LOG_FROM_ROWS`]).
pub(super) async fn log_runs(
    tx: &mut Tx,
    now: DateTime<Utc>,
    ending: &Ending,
) -> Result<(), StoreError> {
    if ending.ctid.is_empty() {
        return Ok(());
    }
    sqlx::query(LOG_FROM_ROWS)
        .bind(now)
        .bind(&ending.outcome)
        .bind(&ending.ctid)
        .bind(&ending.error)
        .bind(&ending.trace_id)
        .exec(&mut *tx)
        .await?;
    Ok(())
}

/// Records an operator's action on a key, on the action's transaction.
pub(super) async fn log_action<C>(
    conn: &mut C,
    now: DateTime<Utc>,
    (process, key): (&str, &str),
    (action, actor): (RunOutcome, &str),
    error: Option<&str>,
) -> Result<(), StoreError>
where
    C: ?Sized + Send,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    sqlx::query(
        "INSERT INTO drover_runs (process, key, outcome, ended_at, error, actor)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(process)
    .bind(key)
    .bind(action.as_str())
    .bind(now)
    .bind(error)
    .bind(actor)
    .exec(&mut *conn)
    .await?;
    Ok(())
}

/// A key's page of runs: `process = $1 AND key = $2` stated plainly, so the
/// `(process, key, id)` index is walked backwards from the cursor in every
/// plan (a generic plan of the optional filters below may walk every run).
const BY_KEY: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM drover_runs
     WHERE process = $1::text AND key = $2::text
         AND ($3::text IS NULL OR outcome = $3) AND id < COALESCE($4, 9223372036854775807)
     ORDER BY id DESC LIMIT $5"
);

/// A page of history, newest first. With a key, the `(process, key, id)` index
/// gives the page directly; otherwise the primary key is walked backwards from
/// the cursor.
pub(super) async fn list(store: &PostgresStore, params: &RunList) -> Result<Vec<Run>, StoreError> {
    if let Some(process) = &params.process {
        check_process(store, process).await?;
    }
    let sql = concat!(
        "SELECT ",
        run_columns!(),
        " FROM drover_runs
         WHERE ($1::text IS NULL OR process = $1) AND ($2::text IS NULL OR key = $2)
             AND ($3::text IS NULL OR outcome = $3) AND id < COALESCE($4, 9223372036854775807)
         ORDER BY id DESC LIMIT $5"
    );
    let sql = if params.process.is_some() && params.key.is_some() {
        BY_KEY
    } else {
        sql
    };
    let mut tx = store.read().await?;
    let rows: Vec<RunRow> = sqlx::query_as(sql)
        .bind(&params.process)
        .bind(&params.key)
        .bind(params.outcome.map(RunOutcome::as_str))
        .bind(params.before)
        .bind(i64::from(params.limit))
        .fetch_all(&mut tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    runs(rows)
}

/// A retention period of `ms` milliseconds before `now`, as the operator set
/// it (not clamped to the 180 days a delay is), or the earliest time there is.
fn before(now: DateTime<Utc>, ms: i64) -> DateTime<Utc> {
    now.checked_sub_signed(chrono::Duration::milliseconds(ms.max(0)))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Takes, renews or is refused `params.process`'s turn to prune (see
/// [`prune_turn`](crate::store::StoreEngine::prune_turn)): one upsert whose
/// update applies only when the turn is the holder's or has run out, so of
/// two pruners racing for a free turn one inserts and the other, waiting on
/// its row, finds it held.
pub(super) async fn prune_turn(
    store: &PostgresStore,
    params: &PruneTurn,
) -> Result<bool, StoreError> {
    let (mut tx, now) = store.write().await?;
    let held: Option<i32> = sqlx::query_scalar(
        "INSERT INTO drover_prune_turns (process, holder, held_until)
         SELECT process, $2, $3 FROM drover_processes WHERE process = $1
         ON CONFLICT (process) DO UPDATE
             SET holder = EXCLUDED.holder, held_until = EXCLUDED.held_until
             WHERE drover_prune_turns.holder = EXCLUDED.holder
                 OR drover_prune_turns.held_until <= $4
         RETURNING 1",
    )
    .bind(&params.process)
    .bind(params.holder)
    .bind(later(now, params.hold))
    .bind(now)
    .fetch_optional(&mut tx)
    .await
    .db()?;
    commit(tx).await?;
    Ok(held.is_some())
}

impl PruneSteps for PostgresStore {
    async fn rules(&self, process: &str) -> Result<Rules, StoreError> {
        check_process(self, process).await?;
        let mut tx = self.read().await?;
        let rules = sqlx::query_as(
            "SELECT keep_runs_ms, keep_runs_per_key, forget_idle_ms
             FROM drover_processes WHERE process = $1",
        )
        .bind(process)
        .fetch_one(&mut tx)
        .await
        .db()?;
        tx.commit().await.db()?;
        Ok(rules)
    }

    async fn prune_old(&self, process: &str, keep_ms: i64, batch: u32) -> Result<u64, StoreError> {
        let (mut tx, now) = self.write().await?;
        let deleted = sqlx::query(
            "DELETE FROM drover_runs WHERE id = ANY(ARRAY(
                 SELECT id FROM drover_runs WHERE ended_at < $2 AND process = $1 LIMIT $3))",
        )
        .bind(process)
        .bind(before(now, keep_ms))
        .bind(i64::from(batch))
        .exec(&mut tx)
        .await?;
        commit(tx).await?;
        Ok(deleted)
    }

    async fn cap_window(
        &self,
        process: &str,
        after: Option<&str>,
        batch: u32,
        keep: u32,
    ) -> Result<(u64, Option<String>), StoreError> {
        let mut tx = self.read().await?;
        let window: Vec<(String, i64)> = sqlx::query_as(
            "SELECT key, count(*) FROM (
                 SELECT key FROM drover_runs WHERE process = $1 AND key > $2
                 ORDER BY key LIMIT $3) w
             GROUP BY key ORDER BY key",
        )
        .bind(process)
        .bind(after.unwrap_or(""))
        .bind(i64::from(batch))
        .fetch_all(&mut tx)
        .await
        .db()?;
        let window = runs_window(window, batch, keep);
        if window.cap.is_empty() {
            tx.commit().await.db()?;
            return Ok((0, window.next));
        }
        // At most `batch` runs, each key's oldest first (its index order).
        let deleted = sqlx::query(
            "DELETE FROM drover_runs WHERE id = ANY(ARRAY(
                 SELECT r.id FROM (
                     SELECT k.key, (SELECT o.id FROM drover_runs o
                                    WHERE o.process = $1 AND o.key = k.key
                                    ORDER BY o.id DESC OFFSET $3 LIMIT 1) AS id
                     FROM UNNEST($2::text[]) AS k(key)) cut
                 JOIN drover_runs r ON r.process = $1 AND r.key = cut.key AND r.id <= cut.id
                 LIMIT $4))",
        )
        .bind(process)
        .bind(&window.cap)
        .bind(i64::from(keep))
        .bind(i64::from(batch))
        .exec(&mut tx)
        .await?;
        commit(tx).await?;
        Ok((deleted, window.next))
    }

    async fn forget_window(
        &self,
        process: &str,
        after: Option<&str>,
        batch: u32,
        forget_ms: i64,
    ) -> Result<(u64, Option<String>), StoreError> {
        let after = after.unwrap_or("");
        let mut tx = self.read().await?;
        let (entries, last): (i64, Option<String>) = sqlx::query_as(
            "SELECT count(*), max(key) FROM (
                 SELECT key FROM drover_items WHERE process = $1 AND key > $2
                 ORDER BY key LIMIT $3) w",
        )
        .bind(process)
        .bind(after)
        .bind(i64::from(batch))
        .fetch_one(&mut tx)
        .await
        .db()?;
        tx.commit().await.db()?;
        let Some(last) = last else {
            return Ok((0, None));
        };
        // The window's rows another transaction holds (a caller's that
        // enqueued an idle key, not committed yet) are skipped, left for the
        // next pass: deleting the range row by row waited for such a row
        // while holding the rows deleted before it, so a producer's enqueue
        // of any of those keys waited for the caller's commit too. The outer
        // conditions are checked again on the row the delete meets.
        let (mut tx, now) = self.write().await?;
        let forgotten = sqlx::query(
            "DELETE FROM drover_items d
             USING (SELECT process, key FROM drover_items
                    WHERE process = $1 AND key > $2 AND key <= $3 AND state = 'idle'
                        AND COALESCE(last_ended_at, enqueued_at) < $4
                    ORDER BY key
                    FOR UPDATE SKIP LOCKED) f
             WHERE d.process = f.process AND d.key = f.key AND d.state = 'idle'
                 AND COALESCE(d.last_ended_at, d.enqueued_at) < $4",
        )
        .bind(process)
        .bind(after)
        .bind(&last)
        .bind(before(now, forget_ms))
        .exec(&mut tx)
        .await?;
        commit(tx).await?;
        Ok((forgotten, (entries >= i64::from(batch)).then_some(last)))
    }
}
