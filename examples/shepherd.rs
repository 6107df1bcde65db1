//! Seed 2, the Monogon shepherd control loop: a `machines` table in the user's own
//! schema; an agent-start loop whose query selects machines whose agent has not
//! started; each candidate is locked for one worker; a fake provider fails at
//! random and the failures back off in the database (the seed's 5 m, ×1.2, 4 h,
//! scaled down to milliseconds: 5 ms, ×1.2, 240 ms).
//!
//! `cargo run --example shepherd [-- DATABASE_URL]` (default: a fresh SQLite
//! file). It prints a summary once every agent has started.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

mod support;

use drover::backoff::Backoff;
use drover::runner::{Action, BoxError, Controller, Source, Task};
use drover::store::Store;
use rand::RngExt as _;
use sqlx::AnyPool;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "agent_start";
const MACHINES: u32 = 60;

#[derive(Debug, Default)]
struct Tally {
    attempts: AtomicU32,
    failures: AtomicU32,
}

/// The candidate query: machines whose agent has not started and that drover
/// would lock (not leased, parked or backing off).
async fn candidates(db: AnyPool, filter: Arc<String>, limit: u32) -> Result<Vec<String>, BoxError> {
    let sql = format!(
        "SELECT m.id FROM machines m WHERE NOT m.agent_started AND {filter} ORDER BY m.id LIMIT {limit}"
    );
    let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(&db)
        .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Starts one machine's agent through a provider that fails 30 % of the time.
async fn start_agent(task: Task, db: AnyPool, tally: Arc<Tally>) -> Result<Action, BoxError> {
    tally.attempts.fetch_add(1, Relaxed);
    if rand::rng().random_bool(0.3) {
        tally.failures.fetch_add(1, Relaxed);
        return Err(format!("provider: cannot reach {}", task.key()).into());
    }
    sqlx::query("UPDATE machines SET agent_started = TRUE WHERE id = $1")
        .bind(task.key().to_owned())
        .execute(&db)
        .await?;
    Ok(Action::Done)
}

async fn setup(db: &AnyPool) -> Result<(), BoxError> {
    sqlx::query(
        "CREATE TABLE machines (id TEXT PRIMARY KEY, agent_started BOOLEAN NOT NULL DEFAULT FALSE)",
    )
    .execute(db)
    .await?;
    for i in 0..MACHINES {
        sqlx::query("INSERT INTO machines (id) VALUES ($1)")
            .bind(format!("machine-{i:03}"))
            .execute(db)
            .await?;
    }
    Ok(())
}

async fn unstarted(db: &AnyPool) -> Result<i64, BoxError> {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM machines WHERE NOT agent_started")
        .fetch_one(db)
        .await?;
    Ok(n)
}

/// Runs the shepherd on `url` until every agent started; returns the summary.
async fn run(url: &str) -> Result<String, BoxError> {
    let store = Store::connect(url).await?;
    sqlx::any::install_default_drivers();
    let db = AnyPool::connect(url).await?;
    setup(&db).await?;
    let tally = Arc::new(Tally::default());
    let filter = Arc::new(store.candidate_filter(&format!("'{PROCESS}'"), "m.id"));
    let query = {
        let db = db.clone();
        move |_store: Store, limit: u32| candidates(db.clone(), Arc::clone(&filter), limit)
    };
    let agent = {
        let (db, tally) = (db.clone(), Arc::clone(&tally));
        move |task: Task| start_agent(task, db.clone(), Arc::clone(&tally))
    };
    let backoff = Backoff::new(Duration::from_millis(5), 1.2, Duration::from_millis(240))?;
    let controller = Controller::builder(store, PROCESS, agent)
        .source(Source::query(query))
        .parallelism(4)
        .poll_rate(Duration::from_millis(1), 100)
        .idle_poll(Duration::from_millis(5))
        .backoff(backoff)
        .build()?;
    let stop = CancellationToken::new();
    let loop_task = tokio::spawn(controller.run(stop.clone()));
    while unstarted(&db).await? > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    loop_task.await??;
    Ok(format!(
        "{MACHINES} agents started in {} attempts ({} provider failures backed off)",
        tally.attempts.load(Relaxed),
        tally.failures.load(Relaxed)
    ))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = support::database_url("shepherd.db")?;
    println!("shepherd: {}", run(&url).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{MACHINES, run};
    use crate::support::on_every_engine;

    fn attempts(summary: &str) -> u32 {
        summary
            .split_whitespace()
            .nth(4)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shepherd_starts_every_agent_on_every_engine() {
        for summary in on_every_engine(|url| async move { run(&url).await }).await {
            assert!(attempts(&summary) >= MACHINES, "{summary}");
        }
    }
}
