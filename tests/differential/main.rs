//! Differential checks of the engines against the model (issue 36, item 3).
//!
//! proptest draws sequences of store operations ([`ops`]: enqueues with
//! delays and priorities, claims, completions with every outcome, one at a
//! time and in batches, releases, locks of a chosen key, heartbeats,
//! session closes, reclaims after the database clock moved, operators'
//! retry, park and delete, pause and the concurrency and rate limits,
//! retention's rules and whole retention passes in small batches; a
//! quarter of the cases are rounds of work that give retention something
//! to remove) and runs each on the model store of the
//! simulation (`tests/sim/model.rs` and `tests/sim/retention.rs`, the
//! executable form of DESIGN.md's rules), on SQLite and, when
//! `DROVER_TEST_POSTGRES_URL` is set, on PostgreSQL. Every answer (leases
//! handed out and their order, refusals, reports, what a prune removed) and
//! the state after every operation (each item's state, dirty mark, failures,
//! priority, last error and lease; each key's history, so a run pruned on
//! one side and kept on another shows) must agree with the model's
//! ([`case`]). A divergence is shrunk to a short sequence and printed with
//! the model's answers along it.
//!
//! `cargo test --test differential` runs 96 cases of up to 40 operations.
//! More: `DROVER_DIFF_CASES=2000 cargo test --test differential`; longer
//! sequences: `DROVER_DIFF_OPS=80`. A failure is saved in
//! `tests/differential/main.proptest-regressions` and replayed first on
//! every later run; `PROPTEST_RNG_SEED=N` fixes the generator's seed.
//!
//! Times are whole minutes (`ops::UNIT`) moved through each store's test
//! clock, plus a millisecond before every call on every side, so real time
//! never decides a comparison. `DROVER_DIFF_TALLY=1` prints how many answers
//! of each kind the run produced (what it exercised).
//!
//! What an atomic model cannot see, a reclaim racing a completion or a
//! release of the same lease, is forced on PostgreSQL in
//! `tests/store_reclaim_race.rs` (and a heartbeat's race in
//! `tests/store_sessions.rs`).

#[allow(dead_code)] // the simulation's log: the model writes to it
#[path = "../sim/log.rs"]
mod log;
#[allow(dead_code)] // the simulation's model, of which this test uses a part
#[path = "../sim/model.rs"]
mod model;
#[path = "../sim/retention.rs"]
mod retention;

#[path = "../support/mod.rs"]
mod support;

mod aliases;
mod case;
mod engines;
mod on_engine;
mod on_model;
mod ops;
mod view;

use std::sync::atomic::{AtomicU32, Ordering};

use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestError, TestRunner};

/// Cases per `cargo test` run.
const DEFAULT_CASES: u32 = 96;

/// The most operations in one case.
const DEFAULT_OPS: usize = 40;

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a whole number")),
    )
}

#[test]
fn engines_agree_with_the_model() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let engines = rt.block_on(engines::Engines::connect());
    // `Config::default()` reads the `PROPTEST_*` variables (the seed).
    let config = Config {
        cases: env_number("DROVER_DIFF_CASES").unwrap_or(DEFAULT_CASES),
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    let max_ops = env_number("DROVER_DIFF_OPS").unwrap_or(DEFAULT_OPS);
    let began = std::time::Instant::now();
    let mut runner = TestRunner::new(config.clone());
    // Runs so far, and the run that first diverged (then shrinking began).
    let (runs, first) = (AtomicU32::new(0), AtomicU32::new(0));
    let result = runner.run(&ops::sequence(max_ops), |ops| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        rt.block_on(case::run(&engines.stores, &ops.0))
            .map_err(|d| {
                let _ = first.compare_exchange(0, run, Ordering::SeqCst, Ordering::SeqCst);
                TestCaseError::fail(d.report)
            })
    });
    rt.block_on(engines.close());
    eprintln!(
        "{} runs of cases on {:?} in {:.1}s",
        runs.load(Ordering::SeqCst),
        engines.names(),
        began.elapsed().as_secs_f64()
    );
    if first.load(Ordering::SeqCst) > 0 {
        eprintln!(
            "the first divergence came in run {}; shrinking took the other {}",
            first.load(Ordering::SeqCst),
            runs.load(Ordering::SeqCst) - first.load(Ordering::SeqCst)
        );
    }
    if std::env::var_os("DROVER_DIFF_TALLY").is_some() {
        eprintln!("{:#?}", case::TALLY.lock().expect("not poisoned"));
    }
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, ops)) => panic!(
            "the engines diverged from the model; the shortest sequence found ({} operations; \
             sN, lN: the Nth newest session, lease):\n{ops}\n{reason}",
            ops.0.len()
        ),
        Err(TestError::Abort(why)) => panic!("proptest gave up: {why}"),
    }
}

/// The process's own history rows (pause and resume, under the key `""`)
/// are no key's runs: retention's per-key cap leaves them (the engines'
/// walks over the keys start after `""`), and only the period removes them.
/// The first divergence the retention checks found, the model then capping
/// them too; kept as a fixed case because proptest's saved seeds replay
/// other sequences once the generator changes.
#[test]
fn the_cap_leaves_the_pause_rows_to_the_period() {
    use ops::Op;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let engines = rt.block_on(engines::Engines::connect());
    let rules = |keep| Op::Retention {
        keep,
        per_key: 1,
        forget: None,
    };
    let ops = [
        Op::Start { ttl: 3 },
        rules(2),
        Op::Pause(true),
        Op::Pause(false),
        Op::Pause(true),
        Op::Prune { batch: 1 },
        Op::Advance(3),
        Op::Pause(false),
        Op::Prune { batch: 2 },
    ];
    let result = rt.block_on(case::run(&engines.stores, &ops));
    rt.block_on(engines.close());
    if let Err(d) = result {
        panic!("{}", d.report);
    }
}
