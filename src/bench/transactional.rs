//! `enqueue --transactional`: enqueueing inside the caller's transaction
//! (DESIGN.md rule 11) next to the normal enqueue, and what watching a table
//! costs its update throughput.

use tokio::time::Instant;

use super::Figure;
use super::store::{BenchError, StoreBench, cleanup, fresh_process, key, per_s};
use crate::store::{ItemEnqueue, Store, StoreEngine as _, StoreTx, TableWatch};

/// The batch sizes measured: single keys and batches of 1,000.
const BATCHES: [u64; 2] = [1, 1_000];

/// The rows of the table whose updates are measured.
const ROWS: u64 = 1_000;

/// Keys per second enqueued by the normal call and through the SQL function
/// (view on SQLite) inside caller transactions, in batches of 1 and of 1,000
/// fresh keys, one transaction per batch; `b.keys` keys per figure for
/// batches of 1,000, a tenth of that for single keys. Then the update rate of
/// a table unwatched and watched.
pub async fn enqueue_transactional(b: &StoreBench) -> Result<Vec<Figure>, BenchError> {
    let mut figures = Vec::new();
    for batch in BATCHES {
        let keys = if batch == 1 {
            (b.keys / 10).max(1)
        } else {
            b.keys
        };
        for transactional in [false, true] {
            let process = fresh_process("enqueue_tx");
            b.phase("enqueueing", keys);
            let start = Instant::now();
            for first in (0..keys).step_by(usize::try_from(batch).unwrap_or(1)) {
                let params = ItemEnqueue::new(&process, (first..keys.min(first + batch)).map(key));
                if transactional {
                    let mut tx = b.store.begin().await?;
                    tx.item_enqueue(params).await?;
                    tx.commit().await?;
                } else {
                    b.store.item_enqueue(params).await?;
                }
                b.progress.inc(batch);
            }
            let elapsed = start.elapsed();
            cleanup(&b.store, &process).await?;
            let mode = if transactional {
                "transactional"
            } else {
                "normal"
            };
            figures.push(
                b.figure("enqueue", keys)
                    .with("batch", batch)
                    .with("mode", mode)
                    .with("keys_per_s", per_s(keys, elapsed)),
            );
        }
    }
    figures.extend(watched_updates(b).await?);
    Ok(figures)
}

/// Single-row update transactions per second on a table of [`ROWS`] rows,
/// unwatched and then watched (every update enqueues its key), `b.keys / 10`
/// updates each; the watched figure carries the ratio of the two rates.
async fn watched_updates(b: &StoreBench) -> Result<Vec<Figure>, BenchError> {
    let table = fresh_process("watched");
    let process = fresh_process("watch");
    execute(
        &b.store,
        &format!("CREATE TABLE {table} (id TEXT PRIMARY KEY, v BIGINT NOT NULL)"),
    )
    .await?;
    let rows: Vec<_> = (0..ROWS).map(|i| format!("('{}', 0)", key(i))).collect();
    execute(
        &b.store,
        &format!("INSERT INTO {table} VALUES {}", rows.join(", ")),
    )
    .await?;
    let updates = (b.keys / 10).max(1);
    let unwatched = update_rate(b, &table, updates).await?;
    b.store
        .table_watch(&TableWatch::new(&table, &process, "id"))
        .await?;
    let watched = update_rate(b, &table, updates).await?;
    b.store.table_unwatch(&table).await?;
    execute(&b.store, &format!("DROP TABLE {table}")).await?;
    cleanup(&b.store, &process).await?;
    let figure = |watch: &str, rate: f64| {
        b.figure("watched_update", ROWS)
            .with("table", watch)
            .with("updates", updates)
            .with("updates_per_s", format!("{rate:.0}"))
    };
    let ratio = if unwatched > 0.0 {
        watched / unwatched
    } else {
        0.0
    };
    Ok(vec![
        figure("unwatched", unwatched),
        figure("watched", watched).with("ratio", format!("{ratio:.2}")),
    ])
}

/// Runs `updates` single-row update transactions round the table's rows; per second.
async fn update_rate(b: &StoreBench, table: &str, updates: u64) -> Result<f64, BenchError> {
    b.phase("updating", updates);
    let sql = format!("UPDATE {table} SET v = v + 1 WHERE id = $1");
    let start = Instant::now();
    for i in 0..updates {
        let mut tx = b.store.begin().await?;
        run_in(&mut tx, &sql, Some(key(i % ROWS))).await?;
        tx.commit().await?;
        b.progress.inc(1);
    }
    #[allow(clippy::cast_precision_loss)] // a count of updates, far below 2^52
    Ok(updates as f64 / start.elapsed().as_secs_f64().max(f64::EPSILON))
}

/// Runs one of the bench's own statements on the store's database.
async fn execute(store: &Store, sql: &str) -> Result<(), BenchError> {
    let mut tx = store.begin().await?;
    run_in(&mut tx, sql, None).await?;
    tx.commit().await?;
    Ok(())
}

/// Runs `sql` (its one parameter written `$1`) in `tx`, on whichever engine
/// the transaction is.
async fn run_in(tx: &mut StoreTx, sql: &str, bind: Option<String>) -> Result<(), BenchError> {
    if let Some(conn) = tx.postgres() {
        let query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
        let query = match bind {
            Some(value) => query.bind(value),
            None => query,
        };
        query.execute(conn).await?;
    } else if let Some(conn) = tx.sqlite() {
        let query = sqlx::query(sqlx::AssertSqlSafe(sql.replace("$1", "?1")));
        let query = match bind {
            Some(value) => query.bind(value),
            None => query,
        };
        query.execute(conn).await?;
    }
    Ok(())
}
