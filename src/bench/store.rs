//! What every store scenario shares: the target database, fresh process names,
//! filling a backlog, draining it through a real [`Controller`], and cleaning up.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::ProgressBar;
use sqlx::Executor as _;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Figure;
use crate::client::Client;
use crate::runner::{Action, ConfigError, Controller, Reconciler, RunError, Task};
use crate::store::{
    ItemEnqueue, ProcessCounts, Store, StoreEngine as _, StoreError, WorkerBackend,
};

/// Keys per enqueue call when a scenario fills a backlog.
pub const ENQUEUE_BATCH: usize = 10_000;

/// One store scenario's target and sizes.
#[derive(Debug, Clone)]
pub struct StoreBench {
    /// The store to measure, on either engine.
    pub store: Store,
    /// The URL that reaches the same database (for child processes).
    pub url: String,
    /// How many keys (each scenario documents what it does with them).
    pub keys: u64,
    /// How many workers (in-process runs at once, or concurrent producers).
    pub workers: usize,
    /// Shows progress; pass [`ProgressBar::hidden`] when nobody watches.
    pub progress: ProgressBar,
    /// Drain through this drover server (serving the same database) instead
    /// of on the database: the same controller over HTTP.
    pub server: Option<Client>,
    /// `backlog`: this many idle (known, converged) keys beside the large
    /// backlog, interleaved with its keys: claims and counts must not slow
    /// down for them.
    pub idle: u64,
}

/// Why a scenario could not produce its figure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A store operation failed.
    #[error("store operation failed")]
    Store(#[from] StoreError),
    /// A direct SQL statement (set-up or clean-up) failed.
    #[error("bench SQL failed")]
    Sql(#[from] sqlx::Error),
    /// The controller's settings were refused.
    #[error("bad controller settings")]
    Config(#[from] ConfigError),
    /// The controller stopped with an error.
    #[error("the controller failed")]
    Run(#[from] RunError),
    /// A child process could not be started or watched.
    #[error("child process: {0}")]
    Child(#[from] std::io::Error),
    /// A node process of a spread burn-down did not start or failed.
    #[error("node: {0}")]
    Node(String),
    /// A request to the bench's own server failed or was refused.
    #[error("HTTP: {0}")]
    Http(String),
    /// The scenario did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The scenario's work did not all reach the store (a figure for work
    /// that was not done would be a lie).
    #[error("work went missing: {0}")]
    Missing(String),
}

impl StoreBench {
    /// A figure for `scenario` with this bench's engine, keys and workers.
    pub(crate) fn figure(&self, scenario: &'static str, keys: u64) -> Figure {
        let backend = if self.server.is_some() {
            "server"
        } else {
            "store"
        };
        Figure::new(scenario)
            .with("engine", self.store.engine_name())
            .with("backend", backend)
            .with("keys", keys)
            .with("workers", self.workers)
    }

    /// Resets the progress bar for a phase of `len` steps.
    pub(crate) fn phase(&self, message: &'static str, len: u64) {
        self.progress.set_message(message);
        self.progress.set_length(len);
        self.progress.set_position(0);
    }

    /// `process`'s counts as the store has them now (`None` for a process
    /// it does not know): how a scenario sees what is left of its keys.
    pub(crate) async fn counts_of(
        &self,
        process: &str,
    ) -> Result<Option<ProcessCounts>, StoreError> {
        let counts = self.store.process_counts_all().await?;
        Ok(counts.into_iter().find(|c| c.process == process))
    }
}

/// A process name no other run uses, so scenarios can share any database.
pub(crate) fn fresh_process(scenario: &str) -> String {
    format!(
        "bench_{scenario}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// The `i`th key of a scenario.
pub(crate) fn key(i: u64) -> String {
    format!("key-{i:08}")
}

/// `n` keys in batches of [`ENQUEUE_BATCH`], built before any timing starts.
pub(crate) fn batches(n: u64) -> Vec<Vec<String>> {
    let keys: Vec<String> = (0..n).map(key).collect();
    keys.chunks(ENQUEUE_BATCH).map(<[String]>::to_vec).collect()
}

/// Enqueues `n` keys to `process` (not timed: a scenario's set-up).
pub(crate) async fn fill(b: &StoreBench, process: &str, n: u64) -> Result<(), BenchError> {
    b.phase("filling", n);
    for batch in batches(n) {
        let len = batch.len() as u64;
        b.store
            .item_enqueue(ItemEnqueue::new(process, batch))
            .await?;
        b.progress.inc(len);
    }
    Ok(())
}

/// Makes `n` keys of `process` idle, as if each had run once and converged,
/// named to interleave with [`key`]'s (`key-00000007-idle` sorts between
/// `key-00000007` and `key-00000008`): set-up in one statement, not timed.
pub(crate) async fn idle_keys(store: &Store, process: &str, n: u64) -> Result<(), BenchError> {
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    if let Some(pool) = store.postgres_pool() {
        let insert = sqlx::query(
            "INSERT INTO drover_items (process, key, state, ready_at, enqueued_at,
                 first_enqueued_at, last_enqueued_at, enqueue_count, last_outcome, last_ended_at)
             SELECT $1, 'key-' || lpad(g::text, 8, '0') || '-idle', 'idle', now(), now(), now(),
                 now(), 1, 'done', now()
             FROM generate_series(0, $2 - 1) g",
        )
        .bind(process)
        .bind(n);
        through_bouncer(pool, insert).await?;
    } else if let Some(pool) = store.sqlite_pool() {
        sqlx::query(
            "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < ?2)
             INSERT INTO drover_items (process, key, state, ready_at, enqueued_at,
                 first_enqueued_at, last_enqueued_at, enqueue_count, last_outcome, last_ended_at)
             SELECT ?1, printf('key-%08d-idle', i), 'idle', t, t, t, t, 1, 'done', t
             FROM g, (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS t)",
        )
        .bind(process)
        .bind(n)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Runs a set-up statement on PostgreSQL as a transaction-pooling PgBouncer
/// lets it through (see `bench … --db postgres://…?pool_mode=transaction`):
/// in a transaction of its own, unnamed (not prepared, since the next
/// statement may reach another server connection). A VACUUM, which cannot
/// run in a transaction, goes as a simple query instead.
async fn through_bouncer(
    pool: &sqlx::PgPool,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    query.persistent(false).execute(&mut *tx).await?;
    tx.commit().await
}

/// Lets the database settle what a scenario's set-up (and the scenarios
/// before it) wrote, before the timing starts: on PostgreSQL the items
/// vacuumed and analyzed (hint bits set, statistics fresh) and a checkpoint
/// taken, on SQLite the WAL checkpointed.
///
/// Without the checkpoint a million-key set-up left PostgreSQL half a
/// gigabyte of WAL into its next checkpoint, which then ran during the timed
/// drain of 10,000 keys: one `bench backlog` run drained its small backlog at
/// 1,612 keys/s instead of about 35,000. `CHECKPOINT` needs a superuser (or
/// `pg_checkpoint`); without one the figures are only noisier, so a refusal is
/// ignored.
pub(crate) async fn settle(store: &Store) -> Result<(), BenchError> {
    if let Some(pool) = store.postgres_pool() {
        pool.execute("VACUUM ANALYZE drover_items").await?;
        if let Err(e) = pool.execute("CHECKPOINT").await {
            tracing::warn!(error = %e, "no checkpoint before the timing: the figures may be noisier");
        }
    } else if let Some(pool) = store.sqlite_pool() {
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Deletes everything a scenario left under `process`: items, runs, settings.
/// On PostgreSQL it then vacuums the two big tables, so the dead rows of one
/// scenario do not slow down the next (autovacuum would, only later).
pub(crate) async fn cleanup(store: &Store, process: &str) -> Result<(), BenchError> {
    const TABLES: [&str; 6] = [
        "drover_items",
        "drover_runs",
        "drover_resync",
        "drover_prune_turns",
        "drover_depth_samples",
        "drover_processes",
    ];
    for table in TABLES {
        if let Some(pool) = store.postgres_pool() {
            let sql = format!("DELETE FROM {table} WHERE process = $1");
            let delete = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(process);
            through_bouncer(pool, delete).await?;
        } else if let Some(pool) = store.sqlite_pool() {
            let sql = format!("DELETE FROM {table} WHERE process = ?1");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(process)
                .execute(pool)
                .await?;
        }
    }
    if let Some(pool) = store.postgres_pool() {
        pool.execute("VACUUM ANALYZE drover_items, drover_runs")
            .await?;
    }
    Ok(())
}

/// Counts reconciles and fires when a target count is reached.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) done: AtomicU64,
    pub(crate) reached: Notify,
}

impl Tally {
    /// Counts one run; wakes the waiter on the `target`th.
    pub(crate) fn count(&self, target: u64) {
        if self.done.fetch_add(1, Ordering::Relaxed) + 1 == target {
            self.reached.notify_one();
        }
    }
}

/// A controller on `process` with `workers` no-op runs that count into `tally`
/// and a prefetch of `workers` more leases (default settings otherwise, or the
/// given session TTL).
pub(crate) fn counting_controller<B: WorkerBackend>(
    backend: B,
    process: &str,
    workers: usize,
    tally: &Arc<Tally>,
    target: u64,
    ttl: Option<Duration>,
) -> Result<Controller<impl Reconciler + use<B>, B>, BenchError> {
    let tally = Arc::clone(tally);
    let reconciler = move |_task: Task| {
        tally.count(target);
        async { Ok::<_, Infallible>(Action::Done) }
    };
    let mut builder = Controller::builder(backend, process, reconciler)
        .component("drover bench")
        .parallelism(workers)
        .prefetch(workers);
    if let Some(ttl) = ttl {
        builder = builder.ttl(ttl);
    }
    Ok(builder.build()?)
}

/// Drains `count` keys of `process` through the full claim → reconcile →
/// complete path with `workers` runs at once; the time from the controller's
/// start until its graceful shutdown wrote the last outcome.
pub(crate) async fn drain(
    b: &StoreBench,
    process: &str,
    count: u64,
) -> Result<Duration, BenchError> {
    drain_names(b, &[process.to_owned()], b.workers, count).await
}

/// [`drain`] over several process names in this process: one controller per
/// name with `workers` runs each, until `count` keys ran in all.
pub(crate) async fn drain_names(
    b: &StoreBench,
    names: &[String],
    workers: usize,
    count: u64,
) -> Result<Duration, BenchError> {
    b.phase("draining", count);
    let tally = Arc::new(Tally::default());
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let mut running = JoinSet::new();
    for name in names {
        match &b.server {
            Some(client) => {
                let controller =
                    counting_controller(client.clone(), name, workers, &tally, count, None)?;
                running.spawn(controller.run(shutdown.clone()))
            }
            None => {
                let controller =
                    counting_controller(b.store.clone(), name, workers, &tally, count, None)?;
                running.spawn(controller.run(shutdown.clone()))
            }
        };
    }
    let ticker = tick_progress(b.progress.clone(), Arc::clone(&tally));
    let limit = Duration::from_secs(600);
    let reached = tokio::time::timeout(limit, tally.reached.notified()).await;
    shutdown.cancel();
    let mut result = Ok(());
    while let Some(ended) = running.join_next().await {
        result = result.and(ended.map_err(std::io::Error::other)?);
    }
    let elapsed = start.elapsed();
    ticker.abort();
    result?;
    reached.map_err(|_| BenchError::Timeout(format!("{count} keys not drained in {limit:?}")))?;
    Ok(elapsed)
}

/// Copies the tally into the progress bar a few times a second.
pub(crate) fn tick_progress(
    progress: ProgressBar,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            progress.set_position(tally.done.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// `n / elapsed`, for `…_per_s` figures.
pub(crate) fn per_s(n: u64, elapsed: Duration) -> f64 {
    (n as f64 / elapsed.as_secs_f64().max(1e-9)).round()
}
