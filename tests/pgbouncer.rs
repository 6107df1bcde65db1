//! PostgreSQL through PgBouncer in transaction pooling mode (Debian's 1.18,
//! started by `.ci/run`; `DROVER_TEST_PGBOUNCER_URL` makes these tests
//! required). First, why `?pool_mode=transaction` avoids what it avoids: each
//! feature is shown breaking through the pooler, so the mode cannot quietly
//! stop being needed or stop working. Then a control loop through it. (The
//! store contract suite runs through it too: `each_engine_and_pooler`.)

mod support;

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::runner::{Action, Controller, Task};
use drover::store::{
    ItemDelete, ItemEnqueue, LeaseClaim, PostgresStore, SessionStart, Store, StoreEngine as _,
    StoreOptions,
};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Connection as _, Executor as _, PgConnection, PgPool, Row as _};
use support::{TestDb, drop_database, pgbouncer, pgbouncer_url, with_database};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A fresh database behind the pooler, the direct server URL and the
/// database's name; `None` (the test skips, saying why) when
/// `DROVER_TEST_PGBOUNCER_URL` is unset.
async fn setup() -> Option<(TestDb, String, String)> {
    let pooler = pgbouncer_url()?;
    let direct = std::env::var(support::POSTGRES_ENV).unwrap_or_else(|_| {
        panic!(
            "{} is set: set {} too",
            support::PGBOUNCER_ENV,
            support::POSTGRES_ENV
        )
    });
    let (db, name) = pgbouncer(&direct, &pooler).await;
    Some((db, direct, name))
}

/// A plain sqlx connection through the pooler (as any client would open
/// one, minus the startup parameter PgBouncer refuses).
async fn pooled_client(name: &str) -> PgConnection {
    let pooler = pgbouncer_url().expect("set");
    let options = PgConnectOptions::from_str(&with_database(&pooler, name))
        .expect("a valid URL")
        .extra_float_digits(None);
    PgConnection::connect_with(&options)
        .await
        .expect("connect through the pooler")
}

/// The server connection (its backend's pid) that `conn` runs on: in a
/// transaction, the transaction's; outside one, read in a simple query on
/// its own, so it says nothing of the next statement's server.
async fn server_pid(conn: &mut PgConnection) -> i32 {
    let row = conn
        .fetch_one("SELECT pg_backend_pid()")
        .await
        .expect("read the server's pid");
    row.get(0)
}

/// Holds the pooler's server connection whose backend is `pid` in an open
/// transaction (and every other server it is handed on the way), so the next
/// transaction of any other client gets another server. Not the pooler's
/// most recently used server: the store's own background statements share
/// the pool and may have taken it in between.
async fn hold_the_server(name: &str, pid: i32) -> Vec<PgConnection> {
    let mut held = Vec::new();
    for _ in 0..64 {
        let mut holder = pooled_client(name).await;
        holder.execute("BEGIN").await.expect("begin");
        let on = server_pid(&mut holder).await;
        held.push(holder);
        if on == pid {
            return held;
        }
    }
    panic!("the pooler never handed out server {pid}");
}

/// Ends the transactions of [`hold_the_server`], giving the servers back.
async fn release(held: Vec<PgConnection>) {
    for mut holder in held {
        holder.execute("COMMIT").await.expect("commit");
    }
}

#[tokio::test]
async fn a_named_statement_is_gone_when_the_pooler_switches_servers() {
    let Some((db, direct, name)) = setup().await else {
        return;
    };
    let mut client = pooled_client(&name).await;
    let add = "SELECT 1 + $1::int4";
    // sqlx prepares `sqlx_s_1` on the server of this transaction and caches
    // it (in a transaction, so its prepare and its first use share a server).
    client.execute("BEGIN").await.expect("begin");
    let two: i32 = sqlx::query_scalar(add)
        .bind(1)
        .fetch_one(&mut client)
        .await
        .expect("first use");
    assert_eq!(two, 2);
    let prepared_on = server_pid(&mut client).await;
    client.execute("COMMIT").await.expect("commit");
    let held = hold_the_server(&name, prepared_on).await;
    let err = sqlx::query_scalar::<_, i32>(add)
        .bind(1)
        .fetch_one(&mut client)
        .await
        .expect_err("the statement lives on the other server");
    assert!(err.to_string().contains("does not exist"), "{err}");
    // The store names nothing, so it works on whichever server it gets.
    let report = db
        .store
        .item_enqueue(ItemEnqueue::new("p", ["k"]))
        .await
        .expect("enqueue through the pooler");
    assert_eq!(report.pending, 1);
    release(held).await;
    db.store.close().await;
    drop_database(&direct, &name).await;
}

/// An enqueue and a delete in the caller's own transaction (`Store::begin`)
/// through the pooler: drover's statements in it are unnamed, so they work
/// on whichever server the pooler gives that transaction (named, as they
/// were, the second transaction found no such statement, as in the test
/// above), and the transaction carries the store's idle-in-transaction
/// timeout, which through the pooler cannot be set at startup.
#[tokio::test]
async fn the_callers_own_transaction_names_nothing_and_carries_the_idle_timeout() {
    let Some((db, direct, name)) = setup().await else {
        return;
    };
    let in_tx = |keys: &'static [&'static str]| {
        let store = db.store.clone();
        async move {
            let mut tx = store.begin().await.expect("begin through the pooler");
            let conn = tx.postgres().expect("a PostgreSQL transaction");
            let shown: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
                .persistent(false)
                .fetch_one(&mut *conn)
                .await
                .expect("show");
            assert_eq!(shown, "5s", "the store's timeout, set in the transaction");
            let server = server_pid(conn).await;
            let report = tx
                .item_enqueue(ItemEnqueue::new("p", keys.iter().copied()))
                .await
                .expect("enqueue in the caller's transaction");
            let forgot = tx
                .item_delete(ItemDelete {
                    process: "p".into(),
                    key: keys[0].into(),
                    actor: "test".into(),
                })
                .await
                .expect("delete in the caller's transaction");
            tx.commit().await.expect("commit");
            (report.pending, forgot, server)
        }
    };
    let (pending, forgot, first) = in_tx(&["a", "b"]).await;
    assert_eq!((pending, forgot), (2, true));
    // The next transaction of that client gets another server.
    let held = hold_the_server(&name, first).await;
    let (pending, forgot, second) = in_tx(&["c", "d"]).await;
    assert_eq!((pending, forgot), (2, true));
    assert_ne!(
        first, second,
        "the second transaction ran on another server"
    );
    release(held).await;
    let counts = db.store.process_counts_all().await.expect("counts");
    let p = counts.iter().find(|c| c.process == "p").expect("p");
    assert_eq!(p.pending, 2, "b and d stay, a and c were forgotten");
    db.store.close().await;
    drop_database(&direct, &name).await;
}

#[tokio::test]
async fn session_state_does_not_survive_a_transaction_and_startup_options_are_refused() {
    let Some((db, direct, name)) = setup().await else {
        return;
    };
    let mut client = pooled_client(&name).await;
    // One simple query, so the pooler runs both on one server.
    let set_on: i32 = client
        .fetch_one("SET statement_timeout = '4321ms'; SELECT pg_backend_pid()")
        .await
        .expect("set")
        .get(0);
    let held = hold_the_server(&name, set_on).await;
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .persistent(false)
        .fetch_one(&mut client)
        .await
        .expect("show");
    assert_ne!(shown, "4321ms", "the SET stayed on the other server");
    release(held).await;
    // What a direct connection sets at startup, PgBouncer refuses.
    let with_options = format!(
        "{}?options=-c%20idle_in_transaction_session_timeout%3D5s",
        with_database(&pgbouncer_url().expect("set"), &name)
    );
    let options = PgConnectOptions::from_str(&with_options)
        .expect("a valid URL")
        .extra_float_digits(None);
    let err = PgConnection::connect_with(&options)
        .await
        .expect_err("PgBouncer refuses the options parameter");
    assert!(
        err.to_string().contains("unsupported startup parameter"),
        "{err}"
    );
    db.store.close().await;
    drop_database(&direct, &name).await;
}

#[tokio::test]
async fn listen_through_the_pooler_hears_nothing_and_the_direct_listen_url_does() {
    let Some((db, direct, name)) = setup().await else {
        return;
    };
    let pooler = pgbouncer_url().expect("set");
    let options = PgConnectOptions::from_str(&with_database(&pooler, &name))
        .expect("a valid URL")
        .extra_float_digits(None);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("pool");
    let mut pooled = PgListener::connect_with(&pool).await.expect("listener");
    pooled.listen("drover_probe").await.expect("listen");
    let mut straight = PgListener::connect(&db.sql_url).await.expect("listener");
    straight.listen("drover_probe").await.expect("listen");
    let admin = PgPool::connect(&db.sql_url).await.expect("connect");
    sqlx::query("SELECT pg_notify('drover_probe', 'hello')")
        .execute(&admin)
        .await
        .expect("notify");
    let heard = tokio::time::timeout(Duration::from_secs(10), straight.recv())
        .await
        .expect("the direct listener hears the notification")
        .expect("recv");
    assert_eq!(heard.payload(), "hello");
    // The pooled LISTEN was left on a server the pooler took back: by the
    // time the direct one heard it, and well after, nothing arrives.
    let pooled_heard = tokio::time::timeout(Duration::from_secs(1), pooled.try_recv()).await;
    assert!(
        !matches!(pooled_heard, Ok(Ok(Some(_)))),
        "a notification came through the pooler: {pooled_heard:?}"
    );

    // The store listens on the direct URL it is given.
    let options = StoreOptions::default().listen_url(Some(db.sql_url.clone()));
    let store = Store::connect_with(&db.url, &options)
        .await
        .expect("connect");
    let process = format!("listen_{}", rand::random::<u32>());
    let wake = store.wakeup(&process);
    let listening = wake.notified();
    tokio::pin!(listening);
    listening.as_mut().enable();
    let _ = store.subscribe(&process);
    tokio::time::timeout(Duration::from_secs(10), listening)
        .await
        .expect("woken once the LISTEN took effect");
    let woken = wake.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(PostgresStore::notify_channel(&process))
        .execute(&admin)
        .await
        .expect("notify");
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .expect("another node's notification wakes the store's waiters");
    store.close().await;
    admin.close().await;
    db.store.close().await;
    drop_database(&direct, &name).await;
}

#[tokio::test]
async fn two_controllers_through_the_pooler_run_every_key_once_and_never_two_at_once() {
    let Some((db, direct, name)) = setup().await else {
        return;
    };
    const KEYS: usize = 200;
    // What the work itself saw: per key, runs started and whether one was
    // going on when another started.
    let log: Arc<Mutex<HashMap<String, (u32, bool)>>> = Arc::default();
    let overlaps = Arc::new(Mutex::new(0_u32));
    let done = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let store = Store::connect(&db.url).await.expect("connect");
        let (log, overlaps, done) = (log.clone(), overlaps.clone(), done.clone());
        let reconcile = move |task: Task| {
            let (log, overlaps, done) = (log.clone(), overlaps.clone(), done.clone());
            async move {
                let key = task.key().to_owned();
                {
                    let mut log = log.lock().expect("log");
                    let entry = log.entry(key.clone()).or_insert((0, false));
                    if entry.1 {
                        *overlaps.lock().expect("overlaps") += 1;
                    }
                    *entry = (entry.0 + 1, true);
                }
                tokio::task::yield_now().await;
                let mut log = log.lock().expect("log");
                log.get_mut(&key).expect("logged").1 = false;
                if log.len() == KEYS && log.values().all(|(runs, going)| *runs >= 1 && !going) {
                    done.notify_one();
                }
                Ok::<_, std::io::Error>(Action::Done)
            }
        };
        let controller = Controller::builder(store, "loop", reconcile)
            .parallelism(8)
            .idle_poll(Duration::from_millis(50))
            .build()
            .expect("a valid controller");
        handles.push(tokio::spawn(controller.run(stop.clone())));
    }
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i:03}")).collect();
    db.store
        .item_enqueue(ItemEnqueue::new("loop", keys.iter().cloned()))
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(60), done.notified())
        .await
        .expect("every key ran");
    stop.cancel();
    for handle in handles {
        handle.await.expect("join").expect("a clean shutdown");
    }
    {
        let log = log.lock().expect("log");
        assert_eq!(log.len(), KEYS);
        assert!(log.values().all(|(runs, _)| *runs == 1), "a key ran twice");
        assert_eq!(*overlaps.lock().expect("overlaps"), 0);
    }
    // Nothing left behind: no pending or running key, no session.
    let session = db
        .store
        .session_start(SessionStart::new("check", Duration::from_secs(30)))
        .await
        .expect("session");
    let claim = LeaseClaim {
        session: session.id,
        process: "loop".into(),
        max: 10,
        trace_links: false,
    };
    assert!(
        db.store
            .lease_claim(claim)
            .await
            .expect("claim")
            .leases
            .is_empty()
    );
    db.store.close().await;
    drop_database(&direct, &name).await;
}
