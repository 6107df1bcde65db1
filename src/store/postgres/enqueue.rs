//! Enqueueing on PostgreSQL: the SQL function `drover_enqueue` (or `COPY`)
//! for the items, and a `NOTIFY` delivered on commit. An enqueue writes no history
//! row: the item counts its enqueues and keeps the first and last one's time.
//!
//! A batch that cannot meet an existing item — no item of the process has a
//! key between the batch's least and greatest key: a new process, or fresh
//! keys from a growing range — is copied in as new rows: with nothing to
//! coalesce, `ON CONFLICT`'s speculative insertion is pure overhead (about a fifth of the items' server time on a 10,000-key
//! batch). Any other batch goes through the coalescing upsert.

use chrono::{DateTime, Utc};
use sqlx::{Executor, Postgres};

use super::copy_rows::{CopyRows, int4, timestamptz};
use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit, map};
use super::processes::ensure_process;
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::params::ItemEnqueue;
use crate::store::rules::enqueue::checked_keys;
use crate::store::rules::settle::later;
use crate::store::types::EnqueueReport;

/// Whether the process has an item whose key lies between the batch's least
/// (`$2`) and greatest (`$3`) key: one index probe. When it has none, every
/// key of the batch is new. (Probing each key instead costs about as much
/// server time as the fast path then saves.) Keys compare byte by byte
/// (`COLLATE "C"`), as Rust orders `str`.
const ANY_IN_RANGE: &str = "
SELECT EXISTS (SELECT 1 FROM drover_items
               WHERE process = $1 AND key >= $2 AND key <= $3)";

/// The fewest keys an enqueue sends by `COPY`. sqlx leaves Nagle's algorithm
/// on and flushes `COPY`'s data and its end as two writes; when the data is
/// small the end then waits for the server's delayed ACK, about 40 ms per
/// `COPY` (measured: single-key enqueues went from 1.4 ms to 88 ms). Large
/// batches keep the socket busy enough not to wait, and are where `COPY` pays.
const COPY_MIN_KEYS: usize = 1_000;

/// New keys only: the fresh pending items that [`new_item_rows`] encodes. A key
/// that a concurrent enqueue created after [`ANY_IN_RANGE`] looked makes this
/// fail with a unique violation (after waiting for that enqueue to commit),
/// never coalesce wrongly.
const COPY_NEW_ITEMS: &str = "COPY drover_items (process, key, state, priority, ready_at, \
     enqueued_at, first_enqueued_at, last_enqueued_at, enqueue_count) FROM STDIN (FORMAT binary)";

/// DESIGN.md rule 2, as the SQL function `drover_enqueue` (migration 0006)
/// writes it: the same function other programs call inside their own
/// transactions, and triggers on watched tables. It makes the process known,
/// coalesces the keys into the items in byte order and queues the `NOTIFY`;
/// it yields the keys now pending and the keys that were running (now dirty).
/// Its times are read when it writes them, shifted by `$6`, the test clock's
/// offset, so a wait on a row locked by a completion never shortens a delay.
const ENQUEUE: &str = "SELECT pending, dirty FROM drover_enqueue($1, $2, $3, $4, $5, $6)";

/// unique_violation: only [`COPY_NEW_ITEMS`] can raise it, on `(process, key)`.
const UNIQUE_VIOLATION: &str = "23505";

/// How one transaction ended.
enum Attempt {
    Written(EnqueueReport),
    /// The copy of new items met a key a concurrent enqueue had just created;
    /// the transaction is rolled back, nothing was written.
    Raced,
}

/// Validates the batch, then writes it in one transaction (two if the fast
/// path loses a race; see [`Attempt::Raced`]).
pub(super) async fn enqueue(
    store: &PostgresStore,
    params: &ItemEnqueue,
) -> Result<EnqueueReport, StoreError> {
    let mut keys = checked_keys(&params.process, &params.keys)?;
    if keys.is_empty() {
        return Ok(EnqueueReport::default());
    }
    // Rows are locked in key order (bytewise, as `COLLATE "C"` compares), as
    // completions and reclaims lock them, so no two writers wait on each other
    // in a cycle (a deadlock, which PostgreSQL breaks by aborting one).
    keys.sort_unstable();
    let mut fast = true;
    loop {
        match attempt(store, params, &keys, fast).await? {
            Attempt::Written(report) => {
                // New or revived pending rows (an upper bound on new ones).
                store
                    .statistics
                    .inserted(&store.pool, &params.process, report.pending);
                return Ok(report);
            }
            // The racing key exists now, so the upsert coalesces with it; the
            // upsert never races, so this loops at most once.
            Attempt::Raced => {
                tracing::debug!("a concurrent enqueue created one of the keys; coalescing");
                fast = false;
            }
        }
    }
}

/// One transaction: items, `NOTIFY`. New items are copied in only
/// when `fast` is allowed and no item of the process lies in the batch's range;
/// any other batch goes through [`ENQUEUE`], which notifies itself.
async fn attempt(
    store: &PostgresStore,
    params: &ItemEnqueue,
    keys: &[&str],
    fast: bool,
) -> Result<Attempt, StoreError> {
    let mut tx = store.begin().await?;
    let bulk = keys.len() >= COPY_MIN_KEYS;
    // A traced batch goes through the upsert, after which its context is
    // linked to every key (`COPY` writes rows, not links).
    let fast = fast && params.trace.is_none();
    let report = if bulk && fast && !overlaps(&mut tx, &params.process, keys).await? {
        let now = store.now(&mut tx).await?;
        ensure_process(&mut tx, now, &params.process).await?;
        let items = new_item_rows(params, keys, later(now, params.after), now);
        match copy_in(&mut tx, COPY_NEW_ITEMS, items).await {
            Ok(copied) => {
                PostgresStore::notify_ready(&mut tx, &params.process).await?;
                EnqueueReport {
                    pending: copied,
                    dirty: 0,
                }
            }
            Err(e) if is_unique_violation(&e) => return Ok(Attempt::Raced),
            Err(e) => return Err(map(e)),
        }
    } else {
        coalesce(store, &mut tx, params, keys).await?
    };
    commit(tx).await?;
    Ok(Attempt::Written(report))
}

/// Whether an item of `process` lies in the batch's key range ([`ANY_IN_RANGE`]).
async fn overlaps(tx: &mut Tx, process: &str, keys: &[&str]) -> Result<bool, StoreError> {
    let (least, greatest) = key_range(keys);
    sqlx::query_scalar(ANY_IN_RANGE)
        .bind(process)
        .bind(least)
        .bind(greatest)
        .fetch_one(&mut *tx)
        .await
        .db()
}

/// Coalesces checked, distinct `keys` into the items with [`ENQUEUE`] on `conn`,
/// the store's own transaction or a caller's.
pub(super) async fn coalesce<C>(
    store: &PostgresStore,
    conn: &mut C,
    params: &ItemEnqueue,
    keys: &[&str],
) -> Result<EnqueueReport, StoreError>
where
    C: ?Sized + Send,
    for<'c> &'c mut C: Executor<'c, Database = Postgres>,
{
    let (offset, delay) = (store.clock.offset_ms(), duration_ms(params.after));
    let (pending, dirty): (i64, i64) = sqlx::query_as(ENQUEUE)
        .bind(&params.process)
        .bind(keys)
        .bind(params.priority)
        .bind(delay)
        .bind(params.bypass_backoff)
        .bind(offset)
        .fetch_one(&mut *conn)
        .await
        .db()?;
    if let Some(context) = &params.trace {
        super::trace::link(conn, &params.process, keys, context).await?;
    }
    // Counts of rows are never negative.
    Ok(EnqueueReport {
        pending: pending.unsigned_abs(),
        dirty: dirty.unsigned_abs(),
    })
}

/// Sends `rows` through `statement` (a `COPY … FROM STDIN`); the rows copied.
async fn copy_in(tx: &mut Tx, statement: &str, rows: Vec<u8>) -> Result<u64, sqlx::Error> {
    let mut copy = tx.conn().copy_in_raw(statement).await?;
    copy.send(rows).await?;
    copy.finish().await
}

/// A fresh pending item per key, for [`COPY_NEW_ITEMS`].
fn new_item_rows(
    params: &ItemEnqueue,
    keys: &[&str],
    ready_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<u8> {
    const STATE: &[u8] = b"pending";
    let (process, priority) = (params.process.as_bytes(), int4(params.priority));
    let (ready_at, enqueued_at) = (timestamptz(ready_at), timestamptz(now));
    let count = 1_i64.to_be_bytes();
    let fixed = CopyRows::overhead(9) + process.len() + STATE.len() + 4 + 8 * 5;
    let mut rows = CopyRows::with_capacity(keys.iter().map(|k| fixed + k.len()).sum());
    for key in keys {
        rows.row(9)
            .field(process)
            .field(key.as_bytes())
            .field(STATE)
            .field(&priority)
            .field(&ready_at)
            .field(&enqueued_at)
            .field(&enqueued_at)
            .field(&enqueued_at)
            .field(&count);
    }
    rows.finish()
}

/// The least and greatest of a non-empty batch.
fn key_range<'a>(keys: &[&'a str]) -> (&'a str, &'a str) {
    let first = keys.first().copied().unwrap_or_default();
    keys.iter()
        .fold((first, first), |(lo, hi), &k| (lo.min(k), hi.max(k)))
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(UNIQUE_VIOLATION))
}
