//! Fleet controls obeyed by `drover work` processes on both engines: a
//! cluster-wide concurrency limit judged from the commands' own start/end log,
//! a rate limit judged on the database clock, and pause / resume.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover::store::{
    ItemEnqueue, ProcessConfigure, ProcessPause, Run, RunList, RunOutcome, Store, StoreEngine as _,
};
use support::process::{eventually_within, stop};
use support::{TestDb, each_engine};
use tokio::process::Child;

const PROCESS: &str = "fleet";

/// Starts `drover work` on `db` with `exec` and extra flags.
fn worker(db: &TestDb, exec: &str, flags: &[&str]) -> Child {
    support::cli::worker(&db.url, PROCESS, exec, flags)
}

async fn enqueue(store: &Store, n: usize) {
    let keys = (0..n).map(|i| format!("key-{i:04}"));
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, keys))
        .await
        .expect("enqueue");
}

/// (pending + backoff, running) of the process.
async fn counts(store: &Store) -> (u64, u64) {
    let all = store.process_counts_all().await.expect("counts");
    all.iter()
        .find(|c| c.process == PROCESS)
        .map_or((0, 0), |c| (c.pending + c.backoff, c.running))
}

/// Every run of the process (at most 10,000).
async fn all_runs(store: &Store) -> Vec<Run> {
    store
        .run_list(RunList {
            process: Some(PROCESS.into()),
            limit: 10_000,
            ..RunList::default()
        })
        .await
        .expect("runs")
}

/// The runs that ended `done`.
async fn done_runs(store: &Store) -> Vec<Run> {
    let mut runs = all_runs(store).await;
    runs.retain(|r| r.outcome == RunOutcome::Done);
    runs
}

fn log_path(db: &TestDb) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drover-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("log dir");
    dir.join(format!("{}-{}.log", db.engine, rand::random::<u32>()))
}

/// A command that logs its own start and end (nanoseconds) around `sleep`.
fn logging_exec(log: &Path, sleep: &str) -> String {
    format!(
        r#"sh -c 'echo s $1 $(date +%s%N) >> {0}; sleep {sleep}; echo e $1 $(date +%s%N) >> {0}' sh"#,
        log.display()
    )
}

/// The log's (time, +1 for a start / -1 for an end) marks, in time order.
fn marks(log: &Path) -> Vec<(u128, i32)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut marks: Vec<(u128, i32)> = text
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let at = parts[2].parse().expect("a timestamp");
            // At one instant an end sorts before a start: they did not overlap.
            (at, if parts[0] == "s" { 1 } else { -1 })
        })
        .collect();
    marks.sort_unstable();
    marks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_of_parallelism_eight_never_run_more_than_the_concurrency_limit() {
    each_engine(|db| async move {
        const LIMIT: i32 = 5;
        const KEYS: usize = 60;
        let run = Duration::from_millis(200);
        let configure = ProcessConfigure::new(PROCESS).concurrency(Some(5));
        db.store.process_configure(configure).await.expect("limit");
        enqueue(&db.store, KEYS).await;
        let log = log_path(&db);
        let exec = logging_exec(&log, "0.2");
        let started = Instant::now();
        let workers: Vec<_> = (0..4)
            .map(|_| worker(&db, &exec, &["--parallelism", "8"]))
            .collect();
        eventually_within("every key ran", Duration::from_secs(120), || async {
            counts(&db.store).await == (0, 0)
        })
        .await;
        let took = started.elapsed();
        for w in workers {
            stop(w).await;
        }
        let marks = marks(&log);
        assert_eq!(marks.len(), 2 * KEYS, "every run logged its start and end");
        let mut overlap = 0;
        let mut peak = 0;
        for (_, step) in &marks {
            overlap += step;
            peak = peak.max(overlap);
        }
        assert!(peak <= LIMIT, "{peak} commands ran at once under a limit of {LIMIT}");
        assert!(peak >= 2, "the workers did run side by side ({peak})");
        let ideal = f64::from(LIMIT) / run.as_secs_f64();
        eprintln!(
            "{}: {KEYS} runs of {run:?} under a limit of {LIMIT}: {:.1} runs/s (ideal {ideal:.1}), peak overlap {peak}, took {took:?} (with worker start-up)",
            db.engine,
            KEYS as f64 / took.as_secs_f64(),
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_start_at_most_rate_plus_burst_runs_in_any_second_and_never_finish_early() {
    each_engine(|db| async move {
        const KEYS: usize = 200;
        const RATE: f64 = 20.0;
        const BURST: u32 = 5;
        let configure = ProcessConfigure::new(PROCESS).rate(Some(RATE)).burst(BURST);
        db.store.process_configure(configure).await.expect("limit");
        enqueue(&db.store, KEYS).await;
        let exec = "sh -c 'exit 0' sh";
        let workers: Vec<_> = (0..3)
            .map(|_| worker(&db, exec, &["--parallelism", "8"]))
            .collect();
        eventually_within("every key ran", Duration::from_secs(120), || async {
            counts(&db.store).await == (0, 0)
        })
        .await;
        for w in workers {
            stop(w).await;
        }
        // Judged on the database clock, which the bucket runs on: when each
        // run started (as its lease was taken) and when the last one ended.
        let runs = done_runs(&db.store).await;
        assert_eq!(runs.len(), KEYS);
        let mut starts: Vec<_> = runs
            .iter()
            .map(|r| r.started_at.expect("a run's start"))
            .collect();
        starts.sort_unstable();
        let most = f64::from(BURST) + RATE;
        for (i, from) in starts.iter().enumerate() {
            let within = starts[i..]
                .iter()
                .take_while(|at| **at - *from < chrono::TimeDelta::seconds(1))
                .count();
            assert!(
                within as f64 <= most,
                "{within} runs started within one second from {from} (at most {most})"
            );
        }
        let last_end = runs.iter().map(|r| r.ended_at).max().expect("runs");
        let took = (last_end - starts[0]).to_std().expect("ends after it starts");
        let expected = Duration::from_secs_f64(KEYS as f64 / RATE);
        eprintln!(
            "{}: {KEYS} runs at {RATE}/s burst {BURST}: first start to last end {took:?} (200 / R = {expected:?})",
            db.engine
        );
        // The bucket holds the fleet back: the runs cannot finish sooner
        // than the rate allows (a loaded machine may make them later).
        assert!(
            took >= expected.mul_f64(0.9),
            "took {took:?}, faster than the rate allows ({expected:?})"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_process_with_running_workers_claims_nothing_then_drains_after_resume() {
    each_engine(|db| async move {
        const KEYS: usize = 1000;
        let pause = |paused| ProcessPause {
            process: PROCESS.into(),
            paused,
            actor: "test".into(),
        };
        db.store.process_pause(pause(true)).await.expect("pause");
        enqueue(&db.store, KEYS).await;
        let log = log_path(&db);
        let exec = format!(r#"sh -c 'echo $1 >> {}' sh"#, log.display());
        let workers: Vec<_> = (0..2)
            .map(|_| worker(&db, &exec, &["--parallelism", "16"]))
            .collect();
        // The workers are up once their sessions exist; from then on they
        // claim (and are refused) at least once per idle poll (1 s).
        eventually_within("the workers' sessions", Duration::from_secs(30), || async {
            let sessions: i64 = match (db.store.postgres_pool(), db.store.sqlite_pool()) {
                (Some(pool), _) => sqlx::query_scalar("SELECT count(*) FROM drover_sessions")
                    .fetch_one(pool)
                    .await
                    .expect("sessions"),
                (_, Some(pool)) => sqlx::query_scalar("SELECT count(*) FROM drover_sessions")
                    .fetch_one(pool)
                    .await
                    .expect("sessions"),
                _ => unreachable!("a database store"),
            };
            sessions == 2
        })
        .await;
        // The issue's observation period: five seconds of paused workers.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            counts(&db.store).await,
            (KEYS as u64, 0),
            "nothing claimed while paused"
        );
        assert!(!log.exists(), "no command ran while paused");

        let resumed = Instant::now();
        db.store.process_pause(pause(false)).await.expect("resume");
        eventually_within("the backlog drained", Duration::from_secs(180), || async {
            counts(&db.store).await == (0, 0)
        })
        .await;
        eprintln!(
            "{}: {KEYS} keys drained {:?} after resume",
            db.engine,
            resumed.elapsed()
        );
        for w in workers {
            stop(w).await;
        }
        let log = std::fs::read_to_string(&log).expect("the log");
        let ran: Vec<&str> = log.lines().collect();
        let keys: std::collections::HashSet<&str> = ran.iter().copied().collect();
        assert_eq!(keys.len(), KEYS, "every key ran after resume");
        // Each key converged once. A key runs again only after a run of it
        // that did not end `done` (at least once: on a loaded machine a
        // lease may expire under a slow heartbeat), and each such run has
        // its row.
        let runs = all_runs(&db.store).await;
        let done = runs
            .iter()
            .filter(|r| r.outcome == RunOutcome::Done)
            .count();
        assert_eq!(done, KEYS, "one done run per key");
        let other = runs.len() - done;
        assert!(
            ran.len() <= KEYS + other,
            "{} commands for {KEYS} keys, with {other} runs that did not end done",
            ran.len()
        );
    })
    .await;
}
