//! The informer of the SQL world (issue 16): a `machines` table is watched, so
//! every insert, every change of its `wanted` column and every delete enqueues
//! the machine's id in the transaction that made it, like a Kubernetes
//! informer's add, update and delete events. One controller converges
//! `actual` to `wanted` (writing `actual` does not re-enqueue: only `wanted`
//! is watched) and notices deleted machines. A rolled-back change enqueues
//! nothing; changes that come faster than the controller coalesce.
//!
//! `cargo run --example informer [-- DATABASE_URL]` (default: a fresh SQLite
//! file). It prints a summary once every machine has converged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

mod support;

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{Store, TableWatch};
use sqlx::AnyPool;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "converge";
const MACHINES: u32 = 40;
const CHANGES: u32 = 400;

#[derive(Debug, Default)]
struct Tally {
    runs: AtomicU32,
    gone: AtomicU32,
}

/// One run: make the machine's `actual` what it `wanted`, or notice it is gone.
async fn converge(task: Task, db: AnyPool, tally: Arc<Tally>) -> Result<Action, BoxError> {
    tally.runs.fetch_add(1, Relaxed);
    let id = task.key().to_owned();
    let updated = sqlx::query("UPDATE machines SET actual = wanted WHERE id = $1")
        .bind(&id)
        .execute(&db)
        .await?;
    if updated.rows_affected() == 0 {
        tally.gone.fetch_add(1, Relaxed); // the delete event: clean up after it
    }
    Ok(Action::Done)
}

/// The table, the watch, and the machines (inserted after the watch, so each
/// insert is an event).
async fn setup(store: &Store, db: &AnyPool) -> Result<(), BoxError> {
    sqlx::query("CREATE TABLE machines (id TEXT PRIMARY KEY, wanted TEXT NOT NULL, actual TEXT)")
        .execute(db)
        .await?;
    let watch = TableWatch::new("machines", PROCESS, "id").columns(["wanted"]);
    store.table_watch(&watch).await?;
    for i in 0..MACHINES {
        sqlx::query("INSERT INTO machines (id, wanted) VALUES ($1, 'v0')")
            .bind(format!("machine-{i:03}"))
            .execute(db)
            .await?;
    }
    Ok(())
}

/// The "API server": `CHANGES` changes of `wanted`, every tenth in a
/// transaction that rolls back, then a few deletes.
async fn change(db: &AnyPool) -> Result<(), BoxError> {
    for n in 1..=CHANGES {
        let mut tx = db.begin().await?;
        sqlx::query("UPDATE machines SET wanted = $1 WHERE id = $2")
            .bind(format!("v{n}"))
            .bind(format!("machine-{:03}", n % MACHINES))
            .execute(&mut *tx)
            .await?;
        if n % 10 == 0 {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
    }
    sqlx::query("DELETE FROM machines WHERE id IN ('machine-000', 'machine-001')")
        .execute(db)
        .await?;
    Ok(())
}

/// Machines whose `actual` is not yet what they want.
async fn diverged(db: &AnyPool) -> Result<i64, BoxError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM machines WHERE actual IS NULL OR actual <> wanted")
            .fetch_one(db)
            .await?;
    Ok(n)
}

/// Runs the informer on `url` until every machine converged and both deletes
/// were seen; returns the summary.
async fn run(url: &str) -> Result<String, BoxError> {
    let store = Store::connect(url).await?;
    sqlx::any::install_default_drivers();
    let db = AnyPool::connect(url).await?;
    setup(&store, &db).await?;
    let tally = Arc::new(Tally::default());
    let reconcile = {
        let (db, tally) = (db.clone(), Arc::clone(&tally));
        move |task: Task| converge(task, db.clone(), Arc::clone(&tally))
    };
    // On PostgreSQL the triggers' NOTIFY wakes the controller at each commit;
    // SQLite cannot signal another connection, so it finds them at its idle
    // poll (1 s by default, 20 ms here).
    let controller = Controller::builder(store, PROCESS, reconcile)
        .parallelism(4)
        .idle_poll(Duration::from_millis(20))
        .build()?;
    let stop = CancellationToken::new();
    let loop_task = tokio::spawn(controller.run(stop.clone()));
    change(&db).await?;
    while diverged(&db).await? > 0 || tally.gone.load(Relaxed) < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    loop_task.await??;
    Ok(format!(
        "{} machines converged after {MACHINES} inserts, {CHANGES} changes (a tenth rolled back) \
         and 2 deletes, in {} runs ({} deletes seen)",
        MACHINES - 2,
        tally.runs.load(Relaxed),
        tally.gone.load(Relaxed)
    ))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = support::database_url("informer.db")?;
    println!("informer: {}", run(&url).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::run;
    use crate::support::on_every_engine;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_informer_converges_every_machine_and_sees_the_deletes_on_every_engine() {
        for summary in on_every_engine(|url| async move { run(&url).await }).await {
            assert!(summary.starts_with("38 machines converged"), "{summary}");
        }
    }
}
