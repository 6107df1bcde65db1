//! Every `drover bench` store scenario runs to its figure on every engine (tiny
//! sizes: these tests check that the scenarios work, never how fast they are).

mod support;

use std::path::Path;
use std::time::Duration;

use drover::bench::{self, Figure, StoreBench};
use drover::store::StoreEngine as _;
use indicatif::ProgressBar;
use support::backend::TestBackend;
use support::{TestDb, each_engine};

fn small(db: &TestDb, keys: u64, workers: usize) -> StoreBench {
    StoreBench {
        store: db.store.clone(),
        url: db.url.clone(),
        keys,
        workers,
        progress: ProgressBar::hidden(),
        server: None,
        idle: 0,
    }
}

fn assert_figure(figure: &Figure, scenario: &str, engine: &str, numbers: &[&str]) {
    assert_eq!(figure.scenario(), scenario);
    assert_eq!(figure.get("engine"), Some(engine));
    for name in numbers {
        let value = figure
            .get(name)
            .unwrap_or_else(|| panic!("{figure} lacks {name}"));
        let number: f64 = value.parse().unwrap_or_else(|_| panic!("{name}={value}"));
        assert!(number >= 0.0, "{figure}");
    }
    assert!(
        figure
            .to_string()
            .starts_with(&format!("BENCH scenario={scenario} engine={engine} "))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_and_burn_down_report_keys_per_second() {
    each_engine(|db| async move {
        let enqueued = bench::enqueue(&small(&db, 250, 2)).await.expect("enqueue");
        assert_figure(&enqueued, "enqueue", db.engine, &["keys_per_s"]);
        let drained = bench::burn_down(&small(&db, 250, 8))
            .await
            .expect("burn-down");
        assert_figure(&drained, "burn_down", db.engine, &["keys_per_s"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_transactional_reports_each_mode_and_the_watched_update_rate() {
    each_engine(|db| async move {
        let figures = bench::enqueue_transactional(&small(&db, 2_000, 1))
            .await
            .expect("enqueue --transactional");
        let modes: Vec<_> = figures
            .iter()
            .filter_map(|f| Some((f.get("batch")?, f.get("mode")?)))
            .collect();
        let expected = [
            ("1", "normal"),
            ("1", "transactional"),
            ("1", "sql"),
            ("1000", "normal"),
            ("1000", "transactional"),
            ("1000", "sql"),
        ];
        assert_eq!(modes, expected, "{figures:?}");
        for figure in &figures[..6] {
            assert_figure(figure, "enqueue", db.engine, &["keys_per_s"]);
        }
        let tables: Vec<_> = figures[6..].iter().filter_map(|f| f.get("table")).collect();
        assert_eq!(tables, ["unwatched", "watched"]);
        assert_figure(
            &figures[7],
            "watched_update",
            db.engine,
            &["updates_per_s", "ratio"],
        );
        let counts = db.store.process_counts_all().await.expect("counts");
        assert!(
            counts.iter().all(|c| c.pending == 0),
            "cleaned up: {counts:?}"
        );
        assert!(db.store.table_watches().await.expect("watches").is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_down_through_a_server_drains_every_key_over_http() {
    each_engine(|db| async move {
        let db = db.served();
        let TestBackend::Client(client, ..) = &db.worker else {
            unreachable!("served() puts a server in front")
        };
        let b = StoreBench {
            server: Some(client.clone()),
            ..small(&db, 250, 8)
        };
        // burn_down fails unless every key was drained and none is left.
        let drained = bench::burn_down(&b).await.expect("burn-down over HTTP");
        assert_figure(&drained, "burn_down", db.engine, &["keys_per_s"]);
        assert_eq!(drained.get("backend"), Some("server"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_reports_percentiles_of_single_enqueues() {
    each_engine(|db| async move {
        let figure = bench::latency(&small(&db, 20, 2), 1_000)
            .await
            .expect("latency");
        assert_figure(
            &figure,
            "latency",
            db.engine,
            &["p50_ms", "p99_ms", "max_ms"],
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_compares_a_large_backlog_with_a_small_one() {
    each_engine(|db| async move {
        let b = StoreBench {
            idle: 500,
            ..small(&db, 300, 4)
        };
        let figure = bench::backlog(&b).await.expect("backlog");
        assert_figure(
            &figure,
            "backlog",
            db.engine,
            &["ratio", "small_keys_per_s"],
        );
        assert_eq!(figure.get("front"), Some("300"));
        assert_eq!(figure.get("idle"), Some("500"));
        let counts = db.store.process_counts_all().await.expect("counts");
        assert!(counts.is_empty(), "cleaned up: {counts:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_runs_a_killed_workers_keys_elsewhere() {
    each_engine(|db| async move {
        let drover = Path::new(env!("CARGO_BIN_EXE_drover"));
        let ttl = Duration::from_millis(750);
        let figure = bench::recovery(&small(&db, 5, 2), drover, ttl)
            .await
            .expect("recovery");
        assert_figure(&figure, "recovery", db.engine, &["recovery_s", "ttl_s"]);
    })
    .await;
}

/// The hostile-callers scenario on a tiny scale: every enqueue attempt is
/// either a created process or a refusal, the long-polls all waited (else it
/// fails), and `drover work --exec true` ran every key exactly once under one
/// session, counted from the runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_measures_metrics_growth_long_polls_and_an_exec_fan_out() {
    each_engine(|db| async move {
        let drover = Path::new(env!("CARGO_BIN_EXE_drover"));
        let figures = bench::hostile(&small(&db, 50, 20), drover)
            .await
            .expect("hostile");
        let [growth, polls, fanout] = &figures[..] else {
            panic!("three figures: {figures:?}");
        };
        assert_figure(
            growth,
            "metrics_growth",
            db.engine,
            &["bytes_10", "bytes_after"],
        );
        let number = |f: &Figure, name: &str| -> u64 {
            f.get(name)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{f} {name}"))
        };
        assert_eq!(number(growth, "created") + number(growth, "refused"), 100);
        assert!(
            number(growth, "bytes_after") > number(growth, "bytes_10"),
            "{growth}"
        );
        assert_figure(
            polls,
            "long_poll",
            db.engine,
            &["claims_per_s", "claims_per_s_idle"],
        );
        assert_eq!(number(polls, "long_polls"), 10);
        assert_eq!(
            polls.get("xacts_per_s").is_some(),
            db.engine == "postgres",
            "{polls}"
        );
        assert_figure(fanout, "exec_fanout", db.engine, &["keys_per_s"]);
        assert_eq!(number(fanout, "runs"), 50, "{fanout}");
        assert_eq!(number(fanout, "not_done"), 0, "{fanout}");
        assert_eq!(number(fanout, "sessions"), 1, "{fanout}");
    })
    .await;
}

/// A burn-down spread over node processes and process names drains every key
/// (the scenario fails if any is left pending or running) on every engine,
/// in this process and on two nodes, and on PostgreSQL says what the
/// write-ahead log cost per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burn_down_spread_over_nodes_and_processes_drains_every_key() {
    each_engine(|db| async move {
        let drover = Path::new(env!("CARGO_BIN_EXE_drover"));
        for nodes in [1, 2] {
            let spread = bench::Spread {
                nodes,
                processes: 3,
            };
            let figure = bench::burn_down_spread(&small(&db, 300, 12), spread, drover)
                .await
                .expect("spread burn-down");
            assert_figure(&figure, "burn_down", db.engine, &["keys_per_s"]);
            assert_eq!(figure.get("nodes"), Some(nodes.to_string().as_str()));
            assert_eq!(figure.get("processes"), Some("3"));
            assert_eq!(
                figure.get("runs_per_controller"),
                Some((12 / (nodes * 3)).to_string().as_str())
            );
            let wal = figure.get("wal_bytes_per_key").map(str::parse::<f64>);
            match db.engine {
                "postgres" => assert!(wal.expect("WAL on PostgreSQL").unwrap() > 0.0, "{figure}"),
                _ => assert!(wal.is_none(), "{figure}"),
            }
        }
    })
    .await;
}
