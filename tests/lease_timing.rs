//! What a run knows of its lease, and how a controller's timing holds when the
//! database misbehaves: the fencing token reaches the work (library and
//! `drover work --exec`), a TTL too short for the safety margin is refused, and
//! a database that refuses every write, or does not answer at all (a frozen
//! link), cannot hold shutdown up.

mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use drover::runner::{Action, BoxError, ConfigError, Controller, MIN_TTL, Task};
use drover::store::{
    FencingToken, ItemEnqueue, ItemGet, ItemState, RunList, RunOutcome, Store, StoreEngine as _,
};
use support::fault_proxy::FaultProxy;
use support::process::{eventually, stop};
use support::{TestDb, each_engine};
use tokio::process::Command;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "fenced";

async fn enqueue(store: &Store, key: &str) {
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, [key]))
        .await
        .expect("enqueue");
}

async fn lease_token(store: &Store, key: &str) -> Option<FencingToken> {
    let params = ItemGet {
        process: PROCESS.into(),
        key: key.into(),
        runs_limit: 1,
    };
    let detail = store.item_get(params).await.expect("item_get");
    detail.and_then(|d| d.item.lease_token)
}

async fn state(store: &Store, key: &str) -> Option<ItemState> {
    let params = ItemGet {
        process: PROCESS.into(),
        key: key.into(),
        runs_limit: 1,
    };
    let detail = store.item_get(params).await.expect("item_get");
    detail.map(|d| d.item.state)
}

#[tokio::test]
async fn a_ttl_too_short_for_the_safety_margin_is_refused() {
    let (db, _dir) = support::sqlite().await;
    let build = |ttl| {
        Controller::builder(db.store.clone(), PROCESS, |_task: Task| async {
            Ok::<_, BoxError>(Action::Done)
        })
        .ttl(ttl)
        .build()
    };
    let refused = build(MIN_TTL - Duration::from_millis(1)).expect_err("too short");
    assert!(matches!(refused, ConfigError::Ttl(_)));
    assert_eq!(
        refused.to_string(),
        "session ttl 749ms is too short for the safety margin of 250ms: it must be at least 750ms"
    );
    build(MIN_TTL).expect("the shortest TTL is accepted");
}

/// A TTL longer than a database keeps a session (it clamps every duration to
/// `MAX_DELAY`, 180 days) is refused: the database would give the session's
/// leases away 180 days after its last heartbeat, while this node's timer
/// gave them up only ttl − margin after it (rule 6), and a TTL past what a
/// clock instant holds (`--ttl 300000000000y`) panicked the session's keeper,
/// leaving the claim loop on a session nothing renewed or gave up.
#[tokio::test]
async fn a_ttl_longer_than_a_database_keeps_a_session_is_refused() {
    let (db, _dir) = support::sqlite().await;
    let build = |ttl| {
        Controller::builder(db.store.clone(), PROCESS, |_task: Task| async {
            Ok::<_, BoxError>(Action::Done)
        })
        .ttl(ttl)
        .build()
    };
    let longest = drover::backoff::MAX_DELAY;
    for ttl in [longest + Duration::from_millis(1), Duration::MAX] {
        let refused = build(ttl).expect_err("longer than a database keeps a session");
        assert!(matches!(refused, ConfigError::TtlTooLong(_)), "{refused}");
    }
    let refused = build(longest * 2).expect_err("too long");
    assert_eq!(
        refused.to_string(),
        "session ttl 31104000s is longer than a database keeps a session: it must be at most 15552000s"
    );
    build(longest).expect("the longest TTL is accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_knows_its_leases_fencing_token() {
    each_engine(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let reconciler = {
            let gate = Arc::clone(&gate);
            move |task: Task| {
                let (tx, gate) = (tx.clone(), Arc::clone(&gate));
                async move {
                    tx.send(task.fencing_token()).expect("test alive");
                    gate.acquire().await?.forget();
                    Ok::<_, BoxError>(Action::Done)
                }
            }
        };
        let controller = Controller::builder(db.store.clone(), PROCESS, reconciler)
            .idle_poll(Duration::from_millis(50))
            .build()
            .expect("valid settings");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(controller.run(shutdown.clone()));
        let mut seen = Vec::new();
        for key in ["a", "b"] {
            enqueue(&db.store, key).await;
            let token = tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .expect("the run started")
                .expect("sender alive");
            assert_eq!(Some(token), lease_token(&db.store, key).await, "{key}");
            seen.push(token);
            gate.add_permits(1);
        }
        assert!(seen[0] < seen[1], "tokens grow: {seen:?}");
        shutdown.cancel();
        running.await.expect("task").expect("controller runs");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_command_gets_its_key_and_fencing_token_in_its_environment() {
    each_engine(|db: TestDb| async move {
        let log = support::ticks::TickLog::new();
        let exec = format!(
            r#"sh -c 'echo env $DROVER_KEY $DROVER_FENCING_TOKEN >> {}; exec sleep 60' sh"#,
            log.path().display()
        );
        let worker = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["work", PROCESS, "--db", &db.url, "--exec", &exec])
            .args(["--shutdown-deadline", "100ms"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn drover work");
        enqueue(&db.store, "ns/web").await;
        let line = || {
            std::fs::read_to_string(log.path())
                .unwrap_or_default()
                .lines()
                .next()
                .map(str::to_owned)
        };
        eventually("the command started", || async { line().is_some() }).await;
        let token = lease_token(&db.store, "ns/web").await.expect("leased");
        assert_eq!(
            line().as_deref(),
            Some(format!("env ns/web {token}").as_str())
        );
        stop(worker).await;
    })
    .await;
}

/// A fresh database of its own on the PostgreSQL server at `base` (a schema
/// cannot be made read-only): its name and URL.
async fn fresh_database(admin: &sqlx::PgPool, base: &str) -> (String, String) {
    let name = format!(
        "drover_ro_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(admin)
        .await
        .expect("create database");
    let (server, rest) = base.rsplit_once('/').expect("a URL with a database");
    let query = rest.split_once('?').map(|(_, q)| format!("?{q}"));
    (
        name.clone(),
        format!("{server}/{name}{}", query.unwrap_or_default()),
    )
}

/// Makes every transaction on `name` read-only, its open connections included
/// (they are ended; the pool's new ones start read-only).
async fn refuse_writes(admin: &sqlx::PgPool, name: &str) {
    let alter = format!("ALTER DATABASE {name} SET default_transaction_read_only = on");
    sqlx::query(sqlx::AssertSqlSafe(alter))
        .execute(admin)
        .await
        .expect("make the database read-only");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(name)
        .execute(admin)
        .await
        .expect("end its connections");
}

/// A run of [`held_run`]'s reconciler.
type HeldRun =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Action, BoxError>> + Send>>;

/// A reconciler whose runs say they started (on the receiver) and then wait
/// for a permit of the semaphore before they end done.
fn held_run() -> (
    impl Fn(Task) -> HeldRun + Send + Sync + 'static,
    mpsc::UnboundedReceiver<()>,
    Arc<Semaphore>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let held = Arc::clone(&gate);
    let reconciler = move |_task: Task| -> HeldRun {
        let (tx, gate) = (tx.clone(), Arc::clone(&held));
        Box::pin(async move {
            tx.send(()).expect("test alive");
            gate.acquire().await?.forget();
            Ok::<_, BoxError>(Action::Done)
        })
    };
    (reconciler, rx, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_within_its_deadline_plus_a_second_when_the_database_refuses_every_write() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let admin = sqlx::PgPool::connect(&base).await.expect("connect");
    let (name, url) = fresh_database(&admin, &base).await;
    let store = Store::connect(&url).await.expect("connect and migrate");
    let (reconciler, mut rx, gate) = held_run();
    let deadline = Duration::from_secs(1);
    // A TTL past the test: only the shutdown deadline can end the run's retries.
    let controller = Controller::builder(store.clone(), PROCESS, reconciler)
        .ttl(Duration::from_secs(60))
        .shutdown_deadline(deadline)
        .build()
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    enqueue(&store, "k").await;
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the run started");
    refuse_writes(&admin, &name).await;
    gate.add_permits(1); // the outcome cannot be written from now on
    shutdown.cancel();
    tokio::time::timeout(deadline + Duration::from_secs(1), running)
        .await
        .expect("shutdown ended within its deadline plus a second")
        .expect("task")
        .expect("controller runs");
    assert_eq!(
        state(&store, "k").await,
        Some(ItemState::Running),
        "the outcome was never written: the lease is left to expire"
    );
    store.close().await;
    let drop = format!("DROP DATABASE {name} WITH (FORCE)");
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(&admin)
        .await
        .expect("drop the database");
}

/// Makes the database refuse, on every try (drover's own retry without the
/// error text included), to store a run of the key [`UNSTORABLE`] that ended
/// in a retry: a trigger on the runs table, in the test's own database.
async fn refuse_unstorable_runs(db: &TestDb) {
    if db.engine == "postgres" {
        db.execute(&format!(
            "CREATE FUNCTION drover_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.key = '{UNSTORABLE}' AND NEW.outcome = 'retry' THEN
                 RAISE EXCEPTION 'the test refuses this run';
               END IF;
               RETURN NEW;
             END $$"
        ))
        .await;
        db.execute(
            "CREATE TRIGGER drover_test_refuse BEFORE INSERT ON drover_runs
             FOR EACH ROW EXECUTE FUNCTION drover_test_refuse()",
        )
        .await;
    } else {
        db.execute(&format!(
            "CREATE TRIGGER drover_test_refuse BEFORE INSERT ON drover_runs
             WHEN NEW.key = '{UNSTORABLE}' AND NEW.outcome = 'retry'
             BEGIN SELECT RAISE(ABORT, 'the test refuses this run'); END"
        ))
        .await;
    }
}

/// The key whose failed runs [`refuse_unstorable_runs`] refuses to store.
const UNSTORABLE: &str = "unstorable";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_database_cannot_store_is_dropped_after_a_ttl_and_its_key_runs_again() {
    each_engine(|db| async move {
        refuse_unstorable_runs(&db).await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let reconciler = move |_task: Task| {
            let (tx, runs) = (tx.clone(), Arc::clone(&runs));
            async move {
                let run = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                tx.send(run).expect("test alive");
                if run == 1 {
                    // The database refuses this outcome's run, on every retry.
                    return Err::<Action, BoxError>("a failure".into());
                }
                Ok(Action::Done)
            }
        };
        let controller = Controller::builder(db.store.clone(), PROCESS, reconciler)
            .idle_poll(Duration::from_millis(50))
            .ttl(Duration::from_secs(1))
            .build()
            .expect("valid settings");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(controller.run(shutdown.clone()));
        enqueue(&db.store, UNSTORABLE).await;
        for expected in [1, 2] {
            let run = tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .expect("the key ran again within 20 s, not stuck running")
                .expect("sender alive");
            assert_eq!(run, expected);
        }
        eventually("the second run's outcome written", || async {
            state(&db.store, UNSTORABLE).await == Some(ItemState::Idle)
        })
        .await;
        // The first outcome was dropped, not stored in some other form, and
        // its lease handed back (a canceled run): then the second run.
        let history = db
            .store
            .run_list(RunList {
                process: Some(PROCESS.into()),
                key: Some(UNSTORABLE.into()),
                limit: 10,
                ..RunList::default()
            })
            .await
            .expect("history");
        let outcomes: Vec<_> = history.iter().map(|r| r.outcome).collect();
        assert_eq!(
            outcomes,
            [RunOutcome::Done, RunOutcome::Canceled],
            "{history:?}"
        );
        shutdown.cancel();
        running.await.expect("task").expect("controller runs");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_within_its_deadline_plus_a_second_when_the_database_does_not_answer() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    // The controller reaches the database through a link the test freezes:
    // no answer, no error, no reset, as behind a dead switch.
    let (proxy, store) = FaultProxy::in_front_of(&base, &db.url).await;
    let (reconciler, mut rx, gate) = held_run();
    let deadline = Duration::from_secs(1);
    // A TTL past the test: only the shutdown deadline can end the wait for
    // the outcome's write and the session's close.
    let controller = Controller::builder(store.clone(), PROCESS, reconciler)
        .ttl(Duration::from_secs(60))
        .shutdown_deadline(deadline)
        .build()
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    enqueue(&db.store, "k").await;
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the run started");
    proxy.freeze();
    gate.add_permits(1); // the outcome goes into a link that never answers
    shutdown.cancel();
    tokio::time::timeout(deadline + Duration::from_secs(1), running)
        .await
        .expect("shutdown ended within its deadline plus a second")
        .expect("task")
        .expect("controller runs");
    assert_eq!(
        state(&db.store, "k").await,
        Some(ItemState::Running),
        "the outcome never reached the database: the lease is left to expire"
    );
    drop(store);
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}
