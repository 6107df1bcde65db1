//! `enqueue --transactional`: enqueueing inside the caller's transaction
//! (DESIGN.md rule 11) next to the normal enqueue, and what watching a table
//! costs its update throughput.

use std::time::Duration;

use tokio::time::Instant;

use super::Figure;
use super::store::{BenchError, StoreBench, cleanup, fresh_process, key, per_s};
use crate::store::{ItemEnqueue, Store, StoreEngine as _, StoreTx, TableWatch};

/// The batch sizes measured: single keys and batches of 1,000.
const BATCHES: [u64; 2] = [1, 1_000];

/// The rows of the table whose updates are measured.
const ROWS: u64 = 1_000;

/// Keys per second enqueued by the normal call (`mode=normal`), by the
/// library inside caller transactions (`mode=transactional`: `StoreTx`, the
/// store's own statements) and by SQL a program in another language would
/// run inside its transaction (`mode=sql`: the function `drover_enqueue` on
/// PostgreSQL, an insert into the view `drover_enqueue` on SQLite), in batches
/// of 1 and of 1,000 fresh keys, one transaction per batch; `b.keys` keys per
/// figure for batches of 1,000, a tenth of that for single keys. Then the
/// update rates of an unwatched and a watched table, their updates
/// alternating.
pub async fn enqueue_transactional(b: &StoreBench) -> Result<Vec<Figure>, BenchError> {
    let mut figures = Vec::new();
    for batch in BATCHES {
        let keys = if batch == 1 {
            (b.keys / 10).max(1)
        } else {
            b.keys
        };
        for mode in ["normal", "transactional", "sql"] {
            let process = fresh_process("enqueue_tx");
            b.phase("enqueueing", keys);
            let start = Instant::now();
            for first in (0..keys).step_by(usize::try_from(batch).unwrap_or(1)) {
                let keys = (first..keys.min(first + batch)).map(key);
                match mode {
                    "normal" => {
                        b.store
                            .item_enqueue(ItemEnqueue::new(&process, keys))
                            .await?;
                    }
                    "transactional" => {
                        let mut tx = b.store.begin().await?;
                        tx.item_enqueue(ItemEnqueue::new(&process, keys)).await?;
                        tx.commit().await?;
                    }
                    _ => {
                        let keys = serde_json::to_string(&keys.collect::<Vec<_>>())
                            .expect("a list of strings is JSON");
                        let mut tx = b.store.begin().await?;
                        let sql = sql_enqueue(tx_engine(&mut tx), &process);
                        run_in(&mut tx, &sql, Some(keys)).await?;
                        tx.commit().await?;
                    }
                }
                b.progress.inc(batch);
            }
            let elapsed = start.elapsed();
            let pending = b
                .counts_of(&process)
                .await?
                .map_or(0, |c| c.pending + c.backoff);
            cleanup(&b.store, &process).await?;
            if pending != keys {
                return Err(BenchError::Missing(format!(
                    "mode {mode}: {pending} of {keys} keys pending"
                )));
            }
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

/// Rounds of the watched-update figure. Within a round the two tables' updates
/// alternate one by one (each timed on its own), so a swing in the shared
/// machine's speed, or a WAL checkpoint, hits both tables alike; the rounds
/// give the median.
const ROUNDS: u64 = 5;

/// Single-row update transactions per second on two tables of [`ROWS`] rows,
/// one unwatched and one watched (every update enqueues its key),
/// `b.keys / 10` updates each, in [`ROUNDS`] rounds of alternating updates;
/// the figures are the median round's rates, and the watched one carries the
/// median of the rounds' ratios.
async fn watched_updates(b: &StoreBench) -> Result<Vec<Figure>, BenchError> {
    let plain = fresh_process("unwatched");
    let table = fresh_process("watched");
    let process = fresh_process("watch");
    for name in [&plain, &table] {
        create_table(b, name).await?;
    }
    b.store
        .table_watch(&TableWatch::new(&table, &process, "id"))
        .await?;
    let updates = (b.keys / 10).max(ROUNDS);
    let per_round = updates / ROUNDS;
    b.phase("updating", 2 * per_round * ROUNDS);
    let (mut unwatched, mut watched, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (u, w) = paired_round(b, [&plain, &table], round * per_round, per_round).await?;
        unwatched.push(u);
        watched.push(w);
        ratios.push(if u > 0.0 { w / u } else { 0.0 });
    }
    b.store.table_unwatch(&table).await?;
    for name in [&plain, &table] {
        execute(&b.store, &format!("DROP TABLE {name}")).await?;
    }
    cleanup(&b.store, &process).await?;
    let figure = |watch: &str, rate: f64| {
        b.figure("watched_update", ROWS)
            .with("table", watch)
            .with("updates", per_round * ROUNDS)
            .with("rounds", ROUNDS)
            .with("updates_per_s", format!("{rate:.0}"))
    };
    Ok(vec![
        figure("unwatched", median(&mut unwatched)),
        figure("watched", median(&mut watched))
            .with("ratio", format!("{:.2}", median(&mut ratios))),
    ])
}

/// The middle value (of an odd count; the upper middle of an even one).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Creates the table `name` of [`ROWS`] rows `(id, v)` the updates change.
async fn create_table(b: &StoreBench, name: &str) -> Result<(), BenchError> {
    execute(
        &b.store,
        &format!("CREATE TABLE {name} (id TEXT PRIMARY KEY, v BIGINT NOT NULL)"),
    )
    .await?;
    let rows: Vec<_> = (0..ROWS).map(|i| format!("('{}', 0)", key(i))).collect();
    execute(
        &b.store,
        &format!("INSERT INTO {name} VALUES {}", rows.join(", ")),
    )
    .await
}

/// Runs `updates` single-row update transactions on each of `tables`, the
/// two alternating one update at a time (which goes first alternates too),
/// round the tables' rows from row `first`; each table's updates per second.
async fn paired_round(
    b: &StoreBench,
    tables: [&str; 2],
    first: u64,
    updates: u64,
) -> Result<(f64, f64), BenchError> {
    let sql = tables.map(|t| format!("UPDATE {t} SET v = v + 1 WHERE id = $1"));
    let mut spent = [Duration::ZERO; 2];
    for i in first..first + updates {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let start = Instant::now();
            let mut tx = b.store.begin().await?;
            run_in(&mut tx, &sql[side], Some(key(i % ROWS))).await?;
            tx.commit().await?;
            spent[side] += start.elapsed();
            b.progress.inc(1);
        }
    }
    #[allow(clippy::cast_precision_loss)] // a count of updates, far below 2^52
    let rate = |d: Duration| updates as f64 / d.as_secs_f64().max(f64::EPSILON);
    Ok((rate(spent[0]), rate(spent[1])))
}

/// Which engine a transaction is on.
fn tx_engine(tx: &mut StoreTx) -> &'static str {
    if tx.postgres().is_some() {
        "postgres"
    } else {
        "sqlite"
    }
}

/// The SQL enqueue of the keys in the JSON array `$1` to `process` (a bench
/// name, quoted as a literal), as another program would write it.
fn sql_enqueue(engine: &str, process: &str) -> String {
    let process = process.replace('\'', "''");
    if engine == "postgres" {
        format!(
            "SELECT * FROM drover_enqueue('{process}', \
             ARRAY(SELECT json_array_elements_text($1::json)))"
        )
    } else {
        format!(
            "INSERT INTO drover_enqueue (process, key) \
             SELECT '{process}', value FROM json_each($1)"
        )
    }
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
