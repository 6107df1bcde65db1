//! Leases on SQLite: claim, complete, release and lock, each checked against the
//! session and the fencing token inside one write transaction.

use super::claims;
use super::counted;
use super::engine::{SqliteStore, Tx, begin_immediate, clock_ms};
use super::error::{Db as _, map};
use super::gate::{self, gate_columns};
use super::processes::ensure_process;
use super::rows::{RunningRow, SqlInt, json_rows, running_columns, to_time};
use super::savepoints::{on_its_own, release, savepoint};
use super::sessions::requeue;
use super::trace;
use super::writer::{SqliteQuery, padded};
use crate::store::exec::Exec as _;
use crate::store::fleet::{ClaimGate, Claimed};
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{LeaseClaim, LeaseLock, LeaseRelease};
use crate::store::rules::decode::corrupt;
use crate::store::rules::groups::error_signature;
use crate::store::rules::refusal::{Unlockable, lock_refusal};
use crate::store::types::{FencingToken, Lease, RunOutcome, SessionId};
use crate::store::{StoreError, TraceLinks};

/// `column` as an `i32` priority, as SQLite reads a value as an integer and
/// clamped to an `i32`: SQL may write anything into `drover_items` (see
/// [`SqlInt`]).
macro_rules! priority_i32 {
    ($column:literal) => {
        concat!(
            "MAX(-2147483648, MIN(2147483647, CAST(",
            $column,
            " AS INTEGER)))"
        )
    };
}

/// Fails with `SessionExpired` unless the session exists and its deadline is
/// still ahead.
async fn check_session(tx: &mut Tx, now: i64, session: SessionId) -> Result<(), StoreError> {
    let alive: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM drover_sessions WHERE id = ?1 AND deadline > ?2")
            .bind(session.0)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .db()?;
    alive
        .map(|_| ())
        .ok_or(StoreError::SessionExpired { session })
}

/// Takes `n` fencing tokens; returns the first.
async fn take_tokens(tx: &mut Tx, n: i64) -> Result<i64, StoreError> {
    let last: i64 = sqlx::query_scalar(
        "UPDATE drover_counters SET value = value + ?1 WHERE name = 'lease_token' RETURNING value",
    )
    .bind(n)
    .fetch_one(&mut **tx)
    .await
    .db()?;
    Ok(last - n + 1)
}

/// Marks one item running under a lease. A run's start has no history row of
/// its own: the running item shows it, and the run's row is written when it
/// ends.
async fn start_run(
    tx: &mut Tx,
    now: i64,
    id: i64,
    session: SessionId,
    token: i64,
) -> Result<Lease, StoreError> {
    let (process, key, priority, failures, enqueued_at): (String, String, i32, i64, i64) =
        sqlx::query_as(
            "UPDATE drover_items SET state = 'running', lease_session = ?2, lease_token = ?3,
                 started_at = ?4 WHERE id = ?1
             RETURNING process, key, priority, failures, enqueued_at",
        )
        .bind(id)
        .bind(session.0)
        .bind(token)
        .bind(now)
        .fetch_one(&mut **tx)
        .await
        .db()?;
    Ok(lease(
        session,
        process,
        key,
        token,
        (priority, failures, enqueued_at, now),
    ))
}

/// The lease of an item just started under `session` with `token`: its
/// attempt is one more than the failures before it; `row` is its priority,
/// failures, enqueue time and start time.
fn lease(
    session: SessionId,
    process: String,
    key: String,
    token: i64,
    (priority, failures, enqueued_at, started_at): (i32, i64, i64, i64),
) -> Lease {
    Lease {
        session,
        process,
        key,
        token: FencingToken(token),
        attempt: u32::try_from(failures).unwrap_or(0).saturating_add(1),
        priority,
        enqueued_at: to_time(enqueued_at),
        started_at: to_time(started_at),
        trace_links: None,
    }
}

/// Up to `max` ready items in claim order, from priority `top` (the highest
/// pending one, read by [`OPENING`]) down, one index probe per priority, each
/// priority's ready rows by (ready time, id), and how many undecodable keys it
/// parked on the way ([`park_undecodable`]: a write the transaction must
/// commit even when it starts nothing). Walking the priorities keeps a
/// claim O(P log n) for P distinct priorities, where one `ORDER BY priority
/// DESC, ready_at` scan would step over every not-yet-ready row of a higher
/// priority (a million keys in backoff after an outage) on each poll.
async fn ready_rows(
    tx: &mut Tx,
    now: i64,
    process: &str,
    max: u32,
    (top, mut first): (Option<i32>, Option<String>),
) -> Result<(Vec<ReadyRow>, u64), StoreError> {
    let mut rows = Vec::new();
    let mut parked = 0;
    let mut next = top.filter(|_| max > 0);
    while let Some(priority) = next {
        let limit = i64::from(max) - rows.len() as i64;
        let read = match first.take() {
            Some(read) => Ok(read),
            None => {
                sqlx::query_scalar::<_, String>(READY)
                    .bind(process)
                    .bind(priority)
                    .bind(now)
                    .bind(limit)
                    .fetch_one(&mut **tx)
                    .await
            }
        };
        let more = match read {
            Ok(more) => more,
            Err(e @ sqlx::Error::ColumnDecode { .. }) => {
                // Not UTF-8: a key only SQL can have written. Parked, the
                // priority is read again; anything else is the database's.
                match park_undecodable(tx, now, process, priority, limit).await? {
                    0 => return Err(map(e)),
                    n => parked += n,
                }
                continue;
            }
            Err(e) => return Err(map(e)),
        };
        let mut more: Vec<(SqlInt, i64, String, SqlInt, SqlInt)> =
            json_rows(&more, "a claim's ready rows")?;
        // In the order SQLite aggregated them, which is the subquery's; sorted
        // again here, on the task's side, so the claim order never rests on it.
        more.sort_unstable_by_key(|&(ready_at, id, ..)| (ready_at.0, id));
        more.truncate(usize::try_from(limit).unwrap_or(0));
        rows.extend(more.into_iter().map(|(_, id, key, failures, enqueued_at)| {
            (id, key, priority, failures.0, enqueued_at.0)
        }));
        if rows.len() >= max as usize {
            break;
        }
        next = sqlx::query_scalar(concat!(
            "SELECT ",
            priority_i32!("priority"),
            " FROM drover_items
                 WHERE process = ?1 AND state = 'pending' AND priority < ?2
                 ORDER BY priority DESC LIMIT 1"
        ))
        .bind(process)
        .bind(priority)
        .fetch_optional(&mut **tx)
        .await
        .db()?;
    }
    Ok((rows, parked))
}

/// The rows [`READY`] reads, which [`park_undecodable`] reads again when they
/// do not decode: `?4` ready rows of process `?1` at priority `?2` at time
/// `?3`, the earliest ready first.
macro_rules! ready_front {
    () => {
        "FROM drover_items
         WHERE process = ?1 AND state = 'pending' AND priority = ?2 AND ready_at <= ?3
         ORDER BY ready_at, id LIMIT ?4"
    };
}

/// Up to `?4` ready rows of process `?1` at priority `?2` at time `?3`, the
/// earliest ready first, as one JSON array of `[ready_at, id, key, failures,
/// enqueued_at]` ([`json_rows`] says why one value; the priority is `?2`).
const READY: &str = concat!(
    "SELECT json_group_array(json_array(ready_at, id, key, failures, enqueued_at))
FROM (SELECT id, key, failures, enqueued_at, ready_at ",
    ready_front!(),
    ")"
);

/// Parks the keys among the first `limit` ready ones of `process` at
/// `priority` that are not UTF-8 text, and returns how many.
///
/// drover's own API only takes UTF-8, but SQL can write any bytes as text (a
/// `drover_enqueue` insert, a watched table's trigger), and SQLite has no way
/// to check them at the door. Such a key cannot be handed to a worker, and
/// left pending it failed every claim of its process, so the keys behind it
/// never ran either. Parked with the reason (and the SQL that removes it) as
/// its error, it shows in the counts and the error groups; a retry of it is
/// parked again here rather than wedging the claims. Called only when a
/// claim's read failed to decode: nothing is checked on the claim's common
/// path.
async fn park_undecodable(
    tx: &mut Tx,
    now: i64,
    process: &str,
    priority: i32,
    limit: i64,
) -> Result<u64, StoreError> {
    let ready: Vec<(i64, Vec<u8>)> =
        sqlx::query_as(concat!("SELECT id, CAST(key AS BLOB) ", ready_front!()))
            .bind(process)
            .bind(priority)
            .bind(now)
            .bind(limit)
            .fetch_all(&mut **tx)
            .await
            .db()?;
    let mut parked = 0;
    for (id, key) in ready {
        if std::str::from_utf8(&key).is_ok() {
            continue;
        }
        let shown = String::from_utf8_lossy(&key);
        let error = format!(
            "the key {shown:?} is not valid Unicode text, so no worker can be handed it: \
             it was written by SQL; remove it with `DELETE FROM drover_items WHERE id = {id}` \
             and enqueue the key again as text"
        );
        parked += sqlx::query(
            "UPDATE drover_items SET state = 'parked', backoff_until = NULL, backoff_ms = NULL,
                 last_error = ?2, error_signature = ?3, last_outcome = 'parked', last_ended_at = ?4
             WHERE id = ?1 AND state = 'pending'",
        )
        .bind(id)
        .bind(&error)
        .bind(error_signature(&shown, &error))
        .bind(now)
        .exec(&mut **tx)
        .await?;
    }
    Ok(parked)
}

/// A ready item as a claim reads it: its id, and what its lease carries. The
/// claim's `UPDATE` changes none of these, and the write lock is held from
/// this read to the commit, so the lease is built from this row.
type ReadyRow = (i64, String, i32, i64, i64);

/// A claim's `BEGIN` and first read, in one trip to the connection's thread
/// where they were six (each trip a wait for that thread, and right after a
/// commit released a thousand runs, for a CPU): the database clock shifted by
/// the test offset `?1`, whether session `?2` is alive, process `?3`'s
/// fleet-control columns (NULL without a process row), its highest pending
/// priority (NULL with nothing pending), the last fencing token taken, and up
/// to `?4` ready rows of that priority as [`READY`] reads them, as bytes (a
/// key SQL wrote as text that is not UTF-8 fails to decode only there, and
/// sends the claim the way that parks it). The rows are read before the
/// session and the fleet controls are checked, which may refuse them or admit
/// fewer; a paused process's are not read at all (its workers poll it).
pub(super) const OPENING: &str = concat!(
    begin_immediate!(),
    "WITH t(now) AS (SELECT ",
    clock_ms!(),
    " + ?1)
SELECT t.now, EXISTS (SELECT 1 FROM drover_sessions WHERE id = ?2 AND deadline > t.now) AS alive,
    ",
    gate_columns!(),
    ", ",
    priority_i32!("top.priority"),
    " AS top,
    (SELECT value FROM drover_counters WHERE name = 'lease_token') AS tokens,
    (SELECT CAST(json_group_array(json_array(ready_at, id, key, failures, enqueued_at)) AS BLOB)
     FROM (SELECT id, key, failures, enqueued_at, ready_at FROM drover_items
           WHERE process = ?3 AND state = 'pending' AND priority = top.priority
               AND ready_at <= t.now AND NOT COALESCE(p.paused, 0)
           ORDER BY ready_at, id LIMIT ?4)) AS ready
FROM t LEFT JOIN (SELECT priority FROM drover_items WHERE process = ?3 AND state = 'pending'
        ORDER BY priority DESC LIMIT 1) AS top
    LEFT JOIN drover_processes p ON p.process = ?3"
);

/// What [`OPENING`] reads.
#[derive(sqlx::FromRow)]
struct Opening {
    now: i64,
    alive: bool,
    paused: Option<bool>,
    concurrency: Option<i64>,
    rate_per_s: Option<f64>,
    rate_burst: Option<i64>,
    rate_tokens: Option<f64>,
    rate_tokens_at: Option<i64>,
    top: Option<i32>,
    tokens: i64,
    ready: Option<Vec<u8>>,
}

impl Opening {
    /// The process row's fleet-control columns, if it has a row.
    fn gate(&self) -> Option<gate::Columns> {
        let (paused, burst) = self.paused.zip(self.rate_burst)?;
        Some((
            paused,
            self.concurrency,
            self.rate_per_s,
            burst,
            self.rate_tokens,
            self.rate_tokens_at,
        ))
    }
}

/// Leases up to `params.max` ready keys: the common claim in one trip
/// ([`QUICK`]), then the general way ([`claim_general`]) for the rest when
/// [`QUICK`] left ready keys it does not take (fleet controls, keys that are
/// not printable ASCII, lower priorities), in a transaction of its own.
pub(super) async fn claim(store: &SqliteStore, params: LeaseClaim) -> Result<Claimed, StoreError> {
    validate_process(&params.process)?;
    if params.max == 0 {
        return claim_general(store, params).await;
    }
    let quick = claims::quick(store, &params).await?;
    let started = u32::try_from(quick.leases.len()).unwrap_or(u32::MAX);
    if !quick.more || started >= params.max {
        if quick.leases.is_empty() && !quick.alive {
            return Err(StoreError::SessionExpired {
                session: params.session,
            });
        }
        if quick.leases.is_empty() {
            // Nothing was ready: whether the process is paused is one read
            // more, which a worker holding keys claimed ahead waits on (they
            // start only if it is not; see the runner's claim loop).
            return Ok(Claimed {
                gate: ClaimGate {
                    paused: store.process_paused(&params.process).await?,
                    ..ClaimGate::default()
                },
                ..Claimed::default()
            });
        }
        return Ok(Claimed::open(quick.leases));
    }
    let rest = LeaseClaim {
        max: params.max - started,
        ..params
    };
    match claim_general(store, rest).await {
        Ok(mut claimed) => {
            claimed.leases.splice(0..0, quick.leases);
            Ok(claimed)
        }
        Err(e) if quick.leases.is_empty() => Err(e),
        // The quick part has committed: its leases are this session's, and
        // the caller claims again for the rest.
        Err(e) => {
            tracing::warn!(error = %e, "the rest of a claim failed; running what was claimed");
            Ok(Claimed::open(quick.leases))
        }
    }
}

/// What [`QUICK`] claimed, and whether the claim should go on the general
/// way.
pub(super) struct Quick {
    leases: Vec<Lease>,
    /// The session was alive when the claim ended.
    alive: bool,
    /// Ready rows may be left that [`QUICK`] does not take (the process's
    /// fleet controls, a key that is not printable ASCII, a lower priority).
    more: bool,
}

/// A lease as [`QUICK`] reads it back: `[ready_at, id, token, key,
/// priority, failures, enqueued_at, started_at, trace_run]`, the last
/// `null` unless the claim asked for its trace links.
/// The item's own numbers are [`SqlInt`]s: SQL may have written anything
/// there.
type QuickRow = (
    SqlInt,
    i64,
    i64,
    String,
    SqlInt,
    SqlInt,
    SqlInt,
    i64,
    Option<String>,
);

/// The common claim ([`QUICK`], one trip to the connection's thread) in a
/// transaction of its own; [`claims::quick`] runs it so when no other claim
/// waits for the writer, and in one transaction with theirs when some do.
pub(super) async fn claim_quick_alone(
    store: &SqliteStore,
    params: &LeaseClaim,
) -> Result<Quick, StoreError> {
    let row: QuickAnswer = on_its_own(store, params, QUICK, bind_quick).await?;
    quick_of(params, row)
}

/// [`QUICK`]'s one row: the leases as JSON text, whether the session is
/// alive, whether the general claim may find more.
pub(super) type QuickAnswer = (Vec<u8>, bool, bool);

/// `query` ([`QUICK`] or [`QUICK_IN_GROUP`]) with `params`' arguments.
pub(super) fn bind_quick<'q>(
    store: &SqliteStore,
    params: &'q LeaseClaim,
    query: SqliteQuery<'q>,
) -> SqliteQuery<'q> {
    query
        .bind(store.clock().offset_ms())
        .bind(params.session.0)
        .bind(params.process.as_str())
        .bind(i64::from(params.max))
        .bind(params.trace_links)
}

/// The claim `params` as [`QUICK`] answered it.
pub(super) fn quick_of(
    params: &LeaseClaim,
    (leases, alive, more): QuickAnswer,
) -> Result<Quick, StoreError> {
    // The keys are printable ASCII ([`QUICK`] takes no other).
    let leases = String::from_utf8(leases)
        .map_err(|_| corrupt("a claim's leases came back as bytes that are not text".into()))?;
    let rows: Vec<QuickRow> = json_rows(&leases, "a claim's leases")?;
    let mut leases: Vec<_> = rows
        .into_iter()
        .map(
            |(ready_at, id, token, key, priority, failures, enqueued_at, started_at, trace)| {
                let row = (priority.to_i32(), failures.0, enqueued_at.0, started_at);
                let process = params.process.clone();
                let mut lease = lease(params.session, process, key, token, row);
                if params.trace_links {
                    lease.trace_links = Some(TraceLinks::from_json(trace.as_deref()));
                }
                ((ready_at.0, id), lease)
            },
        )
        .collect();
    // In claim order, sorted here rather than resting on the order SQLite
    // aggregated in.
    leases.sort_unstable_by_key(|&(order, _)| order);
    Ok(Quick {
        leases: leases.into_iter().map(|(_, lease)| lease).collect(),
        alive,
        more,
    })
}

/// The common claim of up to `?4` keys of process `?3` for session `?2`, at
/// the database clock shifted by the test offset `?1`, in one trip (with
/// each run's trace contexts, which migration 0018's trigger moved to
/// `trace_run`, when `?5` asks): the ready
/// rows of the highest pending priority, earliest ready first, started with
/// tokens past the counter's (`first + id - lowest id`, as [`START`] gives
/// them), counted ([`counted`]), read back, the counter moved past them, and
/// the transaction committed.
///
/// It starts nothing when the session is not alive, when the process has a
/// fleet control that binds (the general claim applies it), or when a ready
/// key is not printable ASCII (the general claim checks that it is text, and
/// parks it when it is not); it then commits a transaction that wrote
/// nothing. Its one row: the leases as one JSON array of `[ready_at, id,
/// token, key, priority, failures, enqueued_at, started_at, trace_run]`, whether the
/// session is alive, and whether ready rows may be left that the general
/// claim would take (some at the highest pending priority, or a lower
/// priority pending).
pub(super) const QUICK: &str = concat!(begin_immediate!(), quick_sql!(), "COMMIT");

/// [`QUICK`] for one claim of several in one transaction ([`claims`](super::claims)):
/// the same statements in a savepoint of their own, so that a claim that
/// fails takes back its own writes alone.
pub(super) const QUICK_IN_GROUP: &str = concat!(savepoint!(), quick_sql!(), release!());

/// [`QUICK`]'s statements, each ending with `;`, without its `BEGIN` and
/// `COMMIT`.
macro_rules! quick_sql {
    () => {
        concat!(
            "WITH t(now) AS (SELECT ",
            clock_ms!(),
            " + ?1),
r(id, key) AS MATERIALIZED (
    SELECT id, key FROM drover_items
    WHERE process = ?3 AND state = 'pending' AND ready_at <= (SELECT now FROM t)
        AND priority = (SELECT priority FROM drover_items
                        WHERE process = ?3 AND state = 'pending'
                        ORDER BY priority DESC LIMIT 1)
    ORDER BY ready_at, id LIMIT ?4)
UPDATE drover_items SET state = 'running', lease_session = ?2,
    lease_token = (SELECT value FROM drover_counters WHERE name = 'lease_token') + 1
        + id - (SELECT min(id) FROM r),
    started_at = (SELECT now FROM t), counts_mark = counts_mark + 1
WHERE id IN (SELECT id FROM r) AND +state = 'pending' AND +process = ?3
    AND EXISTS (SELECT 1 FROM t, drover_sessions AS s WHERE s.id = ?2 AND s.deadline > t.now)
    AND NOT EXISTS (SELECT 1 FROM drover_processes WHERE process = ?3
                    AND (paused OR concurrency IS NOT NULL OR rate_per_s IS NOT NULL))
    AND NOT EXISTS (SELECT 1 FROM r WHERE key GLOB '*[^ -~]*');
",
            counted::shift_sql!("?3", "'pending'", "'running'", "changes()"),
            ";
WITH t(now) AS (SELECT ",
            clock_ms!(),
            " + ?1)
SELECT
    (SELECT CAST(json_group_array(json_array(ready_at, id, lease_token, key, priority, failures,
                                             enqueued_at, started_at, trace)) AS BLOB)
     FROM (SELECT ready_at, id, lease_token, key, priority, failures, enqueued_at, started_at,
               CASE WHEN ?5 THEN trace_run END AS trace
           FROM drover_items
           WHERE lease_session = ?2 AND state = 'running' AND lease_token >
               (SELECT value FROM drover_counters WHERE name = 'lease_token'))) AS leases,
    EXISTS (SELECT 1 FROM drover_sessions WHERE id = ?2 AND deadline > t.now) AS alive,
    top.priority IS NOT NULL AND (
        EXISTS (SELECT 1 FROM drover_items WHERE process = ?3 AND state = 'pending'
                AND priority = top.priority AND ready_at <= t.now)
        OR EXISTS (SELECT 1 FROM drover_items WHERE process = ?3 AND state = 'pending'
                   AND priority < top.priority)) AS more
FROM t LEFT JOIN (SELECT priority FROM drover_items WHERE process = ?3 AND state = 'pending'
                  ORDER BY priority DESC LIMIT 1) AS top;
UPDATE drover_counters SET value = (SELECT max(lease_token) FROM drover_items
                                    WHERE lease_session = ?2 AND state = 'running')
WHERE name = 'lease_token' AND value < (SELECT max(lease_token) FROM drover_items
                                        WHERE lease_session = ?2 AND state = 'running');
"
        )
    };
}
use quick_sql;

/// The claim the general way: the session and the fleet controls checked,
/// the priorities walked, undecodable keys parked.
async fn claim_general(store: &SqliteStore, params: LeaseClaim) -> Result<Claimed, StoreError> {
    let mut tx = store.lock().await?;
    let opening = sqlx::query_as::<_, Opening>(OPENING)
        .bind(store.clock().offset_ms())
        .bind(params.session.0)
        .bind(&params.process)
        .bind(i64::from(params.max));
    let opening = padded(opening).fetch_one(&mut *tx).await.db()?;
    if !opening.alive {
        return Err(StoreError::SessionExpired {
            session: params.session,
        });
    }
    let now = opening.now;
    let decided = gate::decide(&mut tx, now, &params.process, opening.gate(), params.max).await?;
    let max = decided.map_or(params.max, |(_, admission)| admission.allowed);
    let first = opening.ready.and_then(|json| String::from_utf8(json).ok());
    let (ready, parked) =
        ready_rows(&mut tx, now, &params.process, max, (opening.top, first)).await?;
    let mut leases = start_runs(
        &mut tx,
        now,
        &params.process,
        params.session,
        (ready, opening.tokens),
    )
    .await?;
    if params.trace_links {
        trace::claimed_links(&mut tx, &mut leases).await?;
    }
    let gate = match decided {
        Some(decided) => {
            let taken = u32::try_from(leases.len()).unwrap_or(u32::MAX);
            gate::take(&mut tx, &params.process, decided, taken).await?
        }
        None => ClaimGate::default(),
    };
    if leases.is_empty() {
        if parked > 0 {
            // The keys it parked stay parked, or every claim would meet them
            // again, park them again and roll that back.
            tx.commit().await.db()?;
        } else {
            // Nothing to write: a bucket's refill is recomputed from what is stored.
            tx.rollback().await.db()?;
        }
        return Ok(Claimed { leases, gate });
    }
    let started = leases.len() as u64;
    counted::shift_and_commit(tx, &params.process, ("pending", "running"), started).await?;
    Ok(Claimed { leases, gate })
}

/// Takes `?6` fencing tokens from the counter and starts the claimed items
/// whose ids are in `?1` (a JSON array) under session `?2`, each with token
/// `?3 + id`, at `?4`: only the pending rows of process `?5`, marked as
/// counted by the statement ([`counted`]); reads how many it started. The unary
/// `+` keeps those two checks off the indexes: each row is found by its id,
/// where `state = 'pending' AND process = ?5` would lead SQLite to walk the
/// claim index over the whole backlog.
///
/// A token computed from the row's own id is what lets this be a plain
/// `UPDATE … WHERE id IN`, with no `RETURNING`: numbering the rows by their
/// place in the array (`UPDATE … FROM json_each`) and reading them back took
/// twice as long, 4.1 against 2.0 µs per key, when it was a third of a drain's
/// SQL time (`scripts/bare/sqlite_drover_sql.py`).
pub(super) const START: &str = "
UPDATE drover_counters SET value = value + ?6 WHERE name = 'lease_token';
UPDATE drover_items SET state = 'running', lease_session = ?2,
    lease_token = ?3 + id, started_at = ?4, counts_mark = counts_mark + 1
WHERE id IN (SELECT value FROM json_each(?1)) AND +state = 'pending' AND +process = ?5;
SELECT changes()";

/// Starts the `ready` items of `process` (one `UPDATE`; the claim counts
/// them as it commits: see [`counted`]) and returns their leases in `ready`'s
/// order. `tokens` is the last token taken, read under this transaction's
/// write lock by [`OPENING`].
///
/// The tokens are `first + (id - lowest id)`: each item's differs, all exceed
/// every token taken before, and the claim takes the whole span from the
/// counter. The span has gaps where the ready ids do (fencing needs tokens
/// that only grow, not consecutive ones); a burn-down's ids, in enqueue
/// order, leave few, and even a claim spanning a billion ids would leave the
/// counter room for nine billion such claims.
async fn start_runs(
    tx: &mut Tx,
    now: i64,
    process: &str,
    session: SessionId,
    (ready, tokens): (Vec<ReadyRow>, i64),
) -> Result<Vec<Lease>, StoreError> {
    let ids: Vec<i64> = ready.iter().map(|row| row.0).collect();
    let (Some(&low), Some(&high)) = (ids.iter().min(), ids.iter().max()) else {
        return Ok(Vec::new());
    };
    let first = tokens + 1;
    let start = sqlx::query_scalar::<_, i64>(START)
        .bind(serde_json::Value::from(ids).to_string())
        .bind(session.0)
        .bind(first - low)
        .bind(now)
        .bind(process)
        .bind(high - low + 1);
    let started = padded(start).fetch_one(&mut **tx).await.db()?;
    if started != ready.len() as i64 {
        // The rows were read under this transaction's write lock a moment ago.
        return Err(corrupt(format!(
            "a claim of {} ready items of {process} started {started}",
            ready.len()
        )));
    }
    Ok(ready
        .into_iter()
        .map(|(id, key, priority, failures, enqueued_at)| {
            let row = (priority, failures, enqueued_at, now);
            lease(session, process.to_owned(), key, first - low + id, row)
        })
        .collect())
}

/// Checks the session, then finds the lease's running row; `LeaseLost` if the
/// token or session no longer match.
async fn held(tx: &mut Tx, now: i64, lease: &Lease) -> Result<RunningRow, StoreError> {
    check_session(tx, now, lease.session).await?;
    let row: Option<RunningRow> = sqlx::query_as(concat!(
        "SELECT ",
        running_columns!(),
        " FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
         WHERE i.process = ?1 AND i.key = ?2 AND i.state = 'running'
             AND i.lease_token = ?3 AND i.lease_session = ?4"
    ))
    .bind(&lease.process)
    .bind(&lease.key)
    .bind(lease.token.0)
    .bind(lease.session.0)
    .fetch_optional(&mut **tx)
    .await
    .db()?;
    row.ok_or_else(|| StoreError::lease_lost(lease))
}

pub(super) async fn release(
    store: &SqliteStore,
    params: LeaseRelease<'_>,
) -> Result<(), StoreError> {
    let (mut tx, now) = store.write().await?;
    let row = held(&mut tx, now, params.lease).await?;
    let requeued = requeue(&mut tx, now, &[row.id], RunOutcome::Canceled).await?;
    tx.commit().await.db()?;
    requeued.wake();
    Ok(())
}

pub(super) async fn lock(store: &SqliteStore, params: LeaseLock) -> Result<Lease, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let (mut tx, now) = store.write().await?;
    check_session(&mut tx, now, params.session).await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let decided = gate::admit(&mut tx, now, &params.process, 1).await?;
    if let Some((row, admission)) = &decided
        && admission.allowed == 0
    {
        return Err(StoreError::Held {
            process: params.process,
            why: row.why_held(admission),
        });
    }
    // An idle key is taken like a new one: pending since now.
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at)
         VALUES (?1, ?2, 'pending', 0, ?3, ?3)
         ON CONFLICT (process, key) DO UPDATE SET
             enqueued_at = CASE i.state WHEN 'idle' THEN ?3 ELSE i.enqueued_at END
         WHERE (i.state = 'pending' AND i.ready_at <= ?3 AND COALESCE(i.backoff_until, ?3) <= ?3)
             OR i.state = 'idle'
         RETURNING id",
    )
    .bind(&params.process)
    .bind(&params.key)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    let Some(id) = id else {
        return Err(refusal(&mut tx, now, params).await);
    };
    let token = take_tokens(&mut tx, 1).await?;
    let lease = start_run(&mut tx, now, id, params.session, token).await?;
    if let Some(decided) = decided {
        gate::take(&mut tx, &params.process, decided, 1).await?;
    }
    tx.commit().await.db()?;
    Ok(lease)
}

/// Why `lease_lock` could not take a key.
async fn refusal(tx: &mut Tx, now: i64, params: LeaseLock) -> StoreError {
    let row: Option<(String, Option<i64>, i64)> = match sqlx::query_as(
        "SELECT state, backoff_until, ready_at FROM drover_items WHERE process = ?1 AND key = ?2",
    )
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&mut **tx)
    .await
    {
        Ok(row) => row,
        Err(e) => return super::error::map(e),
    };
    let row = row
        .as_ref()
        .map(|(state, backoff_until, ready_at)| Unlockable {
            state,
            backoff_until: backoff_until.map(to_time),
            ready_at: to_time(*ready_at),
        });
    lock_refusal(params.process, params.key, row, to_time(now))
}
