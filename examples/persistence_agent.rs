//! Seed 1, the Kubeflow persistence agent: a stream of add / update / delete
//! events about objects is turned into keys; a saver persists each object's
//! latest state into a table. Transient failures are retried with backoff;
//! permanent ones park the key until its next change.
//!
//! `cargo run --example persistence_agent [-- DATABASE_URL]` (default: a fresh
//! SQLite file). It prints a summary and checks that the table ends up exactly
//! like the objects, whatever failed along the way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod support;

use drover::backoff::Backoff;
use drover::runner::{Action, BoxError, Controller, Task, permanent};
use drover::store::{ItemEnqueue, Store, StoreEngine as _};
use rand::RngExt as _;
use sqlx::AnyPool;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "persist";

/// The cluster: object name → version (the source of truth the agent mirrors).
type Cluster = Arc<Mutex<BTreeMap<String, u32>>>;

/// What happened, for the summary.
#[derive(Debug, Default)]
struct Tally {
    events: AtomicU32,
    runs: AtomicU32,
    transient: AtomicU32,
    permanent: AtomicU32,
}

/// The saver: mirror one object into `saved_runs`.
async fn save(
    task: Task,
    db: AnyPool,
    cluster: Cluster,
    tally: Arc<Tally>,
) -> Result<Action, BoxError> {
    tally.runs.fetch_add(1, Relaxed);
    if rand::rng().random_bool(0.2) {
        tally.transient.fetch_add(1, Relaxed);
        return Err("storage timed out".into()); // unmarked: transient, retried
    }
    if task.key().starts_with("invalid") {
        tally.permanent.fetch_add(1, Relaxed);
        return Err(permanent(std::io::Error::other("manifest cannot be parsed")).into());
    }
    let version = cluster
        .lock()
        .expect("cluster lock")
        .get(task.key())
        .copied();
    let query = match version {
        Some(v) => sqlx::query(
            "INSERT INTO saved_runs (name, version) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET version = excluded.version",
        )
        .bind(task.key().to_owned())
        .bind(i64::from(v)),
        None => sqlx::query("DELETE FROM saved_runs WHERE name = $1").bind(task.key().to_owned()),
    };
    query.execute(&db).await?;
    Ok(Action::Done)
}

/// Emits `count` random events on 40 objects, enqueueing each changed key.
async fn events(
    store: &Store,
    cluster: &Cluster,
    tally: &Tally,
    count: usize,
) -> Result<(), BoxError> {
    for i in 0..count {
        let (name, event) = {
            let mut rng = rand::rng();
            let prefix = if rng.random_bool(0.05) {
                "invalid"
            } else {
                "run"
            };
            (
                format!("{prefix}-{:02}", rng.random_range(0..40)),
                rng.random_range(0..10),
            )
        };
        {
            let mut objects = cluster.lock().expect("cluster lock");
            match event {
                0 => drop(objects.remove(&name)),                    // delete
                _ => *objects.entry(name.clone()).or_insert(0) += 1, // add or update
            }
        }
        tally.events.fetch_add(1, Relaxed);
        store
            .item_enqueue(ItemEnqueue::new(PROCESS, [name]))
            .await?;
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// Runs the agent on `url` until every event is persisted; returns the summary.
async fn run(url: &str) -> Result<String, BoxError> {
    let store = Store::connect(url).await?;
    // The agent's own table lives beside drover's, in the same database.
    sqlx::any::install_default_drivers();
    let db = AnyPool::connect(url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS saved_runs (name TEXT PRIMARY KEY, version BIGINT NOT NULL)",
    )
    .execute(&db)
    .await?;
    let cluster: Cluster = Arc::default();
    let tally = Arc::new(Tally::default());
    let saver = {
        let (db, cluster, tally) = (db.clone(), Arc::clone(&cluster), Arc::clone(&tally));
        move |task: Task| save(task, db.clone(), Arc::clone(&cluster), Arc::clone(&tally))
    };
    let controller = Controller::builder(store.clone(), PROCESS, saver)
        .parallelism(4)
        .poll_rate(Duration::from_millis(1), 100)
        .idle_poll(Duration::from_millis(20))
        .backoff(Backoff::new(
            Duration::from_millis(5),
            2.0,
            Duration::from_millis(50),
        )?)
        .build()?;
    let stop = CancellationToken::new();
    let agent = tokio::spawn(controller.run(stop.clone()));
    events(&store, &cluster, &tally, 400).await?;
    settle(&store).await?;
    stop.cancel();
    agent.await??;
    verify(&db, &cluster).await?;
    Ok(format!(
        "{} events, {} saver runs, {} transient failures retried, {} permanent failures parked",
        tally.events.load(Relaxed),
        tally.runs.load(Relaxed),
        tally.transient.load(Relaxed),
        tally.permanent.load(Relaxed)
    ))
}

/// Waits until nothing is pending, backing off or running (parked keys stay).
async fn settle(store: &Store) -> Result<(), BoxError> {
    loop {
        let counts = store.process_counts_all().await?;
        let busy = counts
            .iter()
            .filter(|c| c.process == PROCESS)
            .any(|c| c.pending + c.backoff + c.running > 0);
        if !busy {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the table mirrors every valid object exactly.
async fn verify(db: &AnyPool, cluster: &Cluster) -> Result<(), BoxError> {
    let saved: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, version FROM saved_runs ORDER BY name")
            .fetch_all(db)
            .await?;
    let expected: Vec<(String, i64)> = cluster
        .lock()
        .expect("cluster lock")
        .iter()
        .filter(|(name, _)| !name.starts_with("invalid"))
        .map(|(name, v)| (name.clone(), i64::from(*v)))
        .collect();
    if saved != expected {
        return Err(format!("table diverged from the objects: {saved:?} vs {expected:?}").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = support::database_url("agent.db")?;
    println!("persistence agent: {}", run(&url).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::run;
    use crate::support::on_every_engine;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_persistence_agent_runs_to_completion_on_every_engine() {
        for summary in on_every_engine(|url| async move { run(&url).await }).await {
            assert!(summary.starts_with("400 events"), "{summary}");
        }
    }
}
