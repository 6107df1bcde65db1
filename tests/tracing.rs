//! Traces follow the change (DESIGN.md rule 14): an enqueue's W3C context is
//! kept on its key (capped), moved to the run that absorbs it, and the run's
//! span — exported over OTLP by `drover work` to a receiver in this test that
//! decodes real OTLP protobuf, over HTTP and (with the `otlp-grpc` feature)
//! over gRPC — links to it. On both engines.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use drover::store::{
    FencingToken, ItemEnqueue, Lease, LeaseClaim, LeaseComplete, Outcome, ProcessConfigure,
    RunList, SessionId, StoreEngine as _, TRACE_LINKS_KEPT, TraceContext, TraceId, TraceLinks,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message as _;
use support::process::{drover_bin, eventually, stop};
use support::serve::Serve;
use support::{TestDb, each_engine, each_engine_and_pooler};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const PROCESS: &str = "traced";

/// A context with trace id `t…t` and span id `s…s` (each a hex digit).
fn context(t: char, s: char) -> TraceContext {
    let parent = format!(
        "00-{}-{}-01",
        t.to_string().repeat(32),
        s.to_string().repeat(16)
    );
    TraceContext::new(&parent, None).expect("a valid traceparent")
}

/// The `n`th of many distinct contexts.
fn nth(n: usize) -> TraceContext {
    TraceContext::new(&format!("00-{:032x}-{:016x}-01", n + 1, n + 1), None).expect("valid")
}

/// The trace links a claim that asked for them brought with `lease`.
fn brought(lease: &Lease) -> &TraceLinks {
    lease
        .trace_links
        .as_ref()
        .expect("a claim that asks brings each lease's links")
}

/// Claims up to `max` keys of [`PROCESS`] for `session`, asking for their
/// trace links.
async fn claim_traced(db: &TestDb, session: SessionId, max: u32) -> Vec<Lease> {
    let claim = LeaseClaim {
        session,
        process: PROCESS.into(),
        max,
        trace_links: true,
    };
    db.store.lease_claim(claim).await.expect("claim").leases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_keeps_the_first_and_last_enqueues_contexts_and_counts_the_rest() {
    each_engine(|db| async move {
        for n in 0..20 {
            let enqueue = ItemEnqueue::new(PROCESS, ["k"]).trace(Some(nth(n)));
            db.store.item_enqueue(enqueue).await.expect("enqueue");
        }
        // An enqueue without a context (tracing off) adds nothing.
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["k", "untraced"]))
            .await
            .expect("enqueue");
        let session = db.session().await.id;
        let leases = claim_traced(&db, session, 2).await;
        let lease = leases.iter().find(|l| l.key == "k").expect("k is claimed");
        let untraced = leases
            .iter()
            .find(|l| l.key == "untraced")
            .expect("claimed");
        let kept: Vec<_> = (0..TRACE_LINKS_KEPT)
            .chain(20 - TRACE_LINKS_KEPT..20)
            .map(nth)
            .collect();
        assert_eq!(
            brought(lease).links,
            kept,
            "the first and the last {TRACE_LINKS_KEPT}"
        );
        assert_eq!(brought(lease).dropped, 20 - 2 * TRACE_LINKS_KEPT as u64);
        assert!(brought(untraced).is_empty());

        // An enqueue during the run goes to the next run, not this one.
        let during = ItemEnqueue::new(PROCESS, ["k"]).trace(Some(context('a', 'b')));
        db.store.item_enqueue(during).await.expect("enqueue");
        for lease in &leases {
            let done = LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            };
            db.store.lease_complete(done).await.expect("complete");
        }
        let next = claim_traced(&db, session, 2).await;
        assert_eq!(next.len(), 1, "the dirty key runs once more");
        assert_eq!(brought(&next[0]).links, [context('a', 'b')]);
        assert_eq!(brought(&next[0]).dropped, 0);

        // A run that absorbed no context shows none, not its predecessor's.
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
            .await
            .expect("enqueue");
        let done = LeaseComplete {
            lease: &next[0],
            outcome: &Outcome::Done,
            trace_id: None,
        };
        db.store.lease_complete(done).await.expect("complete");
        let last = claim_traced(&db, session, 2).await;
        assert_eq!(last.len(), 1, "the dirty key runs once more");
        assert!(brought(&last[0]).is_empty());
    })
    .await;
}

/// A lease given back without a run (a paused process's claim handed back,
/// a shutdown) did none of the work its enqueues asked for: the run after it
/// does, and links to them, with those that came meanwhile after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_leaves_its_links_to_the_run_after_it() {
    each_engine(|db| async move {
        let enqueue = ItemEnqueue::new(PROCESS, ["k"]).trace(Some(context('a', 'b')));
        db.store.item_enqueue(enqueue).await.expect("enqueue");
        let session = db.session().await.id;
        let leases = claim_traced(&db, session, 1).await;
        assert_eq!(brought(&leases[0]).links, [context('a', 'b')]);
        let during = ItemEnqueue::new(PROCESS, ["k"]).trace(Some(context('c', 'd')));
        db.store.item_enqueue(during).await.expect("enqueue");
        db.store
            .lease_release(drover::store::LeaseRelease { lease: &leases[0] })
            .await
            .expect("release");
        let next = claim_traced(&db, session, 1).await;
        assert_eq!(next.len(), 1, "the released key runs");
        assert_eq!(
            brought(&next[0]).links,
            [context('a', 'b'), context('c', 'd')],
            "{}: the run after a release links to the enqueues the release gave back",
            db.engine
        );
        // Given back with many that came meanwhile, they are kept as an
        // enqueue keeps them: the first and the last, the rest counted.
        for n in 0..20 {
            let during = ItemEnqueue::new(PROCESS, ["k"]).trace(Some(nth(n)));
            db.store.item_enqueue(during).await.expect("enqueue");
        }
        db.store
            .lease_release(drover::store::LeaseRelease { lease: &next[0] })
            .await
            .expect("release");
        let last = claim_traced(&db, session, 1).await;
        let all: Vec<TraceContext> = [context('a', 'b'), context('c', 'd')]
            .into_iter()
            .chain((0..20).map(nth))
            .collect();
        let kept: Vec<TraceContext> = all[..TRACE_LINKS_KEPT]
            .iter()
            .chain(&all[all.len() - TRACE_LINKS_KEPT..])
            .cloned()
            .collect();
        assert_eq!(brought(&last[0]).links, kept);
        assert_eq!(
            brought(&last[0]).dropped,
            (all.len() - 2 * TRACE_LINKS_KEPT) as u64
        );
    })
    .await;
}

/// Each way a claim goes brings the links when it asks, and only then: a
/// claim that does not ask (tracing off) brings none; the general claim (a
/// limited process) brings them as the common one does; so does a claim of
/// many keys, each with its own. Through a transaction-pooling PgBouncer
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_brings_each_runs_links_only_when_it_asks() {
    each_engine_and_pooler(|db| async move {
        let enqueue = |key: &'static str, n: usize| {
            let store = db.store.clone();
            async move {
                let enqueue = ItemEnqueue::new(PROCESS, [key]).trace(Some(nth(n)));
                store.item_enqueue(enqueue).await.expect("enqueue");
            }
        };
        let session = db.session().await.id;
        enqueue("quiet", 0).await;
        let claim = LeaseClaim {
            session,
            process: PROCESS.into(),
            max: 10,
            trace_links: false,
        };
        let quiet = db.store.lease_claim(claim).await.expect("claim").leases;
        assert_eq!(quiet.len(), 1);
        assert_eq!(quiet[0].trace_links, None, "not asked, not read");

        for (n, key) in ["one", "two", "three"].into_iter().enumerate() {
            enqueue(key, n + 1).await;
        }
        let many = claim_traced(&db, session, 10).await;
        assert_eq!(many.len(), 3);
        for (n, key) in ["one", "two", "three"].into_iter().enumerate() {
            let lease = many.iter().find(|l| l.key == key).expect("claimed");
            assert_eq!(brought(lease).links, [nth(n + 1)], "{key}'s own");
        }

        // A limit sends the claim the general way (PostgreSQL: the gated
        // function).
        let limit = ProcessConfigure::new(PROCESS).concurrency(Some(100));
        db.store.process_configure(limit).await.expect("configure");
        for (n, key) in ["limited", "also"].into_iter().enumerate() {
            enqueue(key, n + 10).await;
        }
        let limited = claim_traced(&db, session, 10).await;
        assert_eq!(limited.len(), 2);
        for (n, key) in ["limited", "also"].into_iter().enumerate() {
            let lease = limited.iter().find(|l| l.key == key).expect("claimed");
            assert_eq!(brought(lease).links, [nth(n + 10)], "{key}'s own");
        }
    })
    .await;
}

/// Another program's SQL enqueue adds a context the way drover's own does:
/// `drover_trace_link` after `drover_enqueue` (a function on PostgreSQL, a
/// view on SQLite), or `drover_enqueue`'s own `context`; a NULL context and
/// a key that is not an item change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_sql_carries_a_trace_context_to_the_run() {
    each_engine(|db| async move {
        let change =
            TraceContext::new(context('c', 'd').traceparent(), Some("vendor=y")).expect("valid");
        let stored = format!("{} vendor=y", change.traceparent());
        let statements = if db.engine == "postgres" {
            vec![
                format!("SELECT drover_enqueue('{PROCESS}', ARRAY['sql'])"),
                format!(
                    "SELECT drover_trace_link('{PROCESS}', ARRAY['sql', 'nobody'], '{stored}')"
                ),
                format!("SELECT drover_trace_link('{PROCESS}', ARRAY['sql'], NULL)"),
                format!("SELECT drover_enqueue('{PROCESS}', ARRAY['one'], context => '{stored}')"),
                format!("SELECT drover_enqueue('{PROCESS}', ARRAY['bad'], 0, 0, false, 0, 'x')"),
            ]
        } else {
            vec![
                format!("INSERT INTO drover_enqueue (process, key) VALUES ('{PROCESS}', 'sql')"),
                format!(
                    "INSERT INTO drover_trace_link (process, key, context) \
                     VALUES ('{PROCESS}', 'sql', '{stored}'), ('{PROCESS}', 'nobody', '{stored}')"
                ),
                format!(
                    "INSERT INTO drover_trace_link (process, key, context) \
                     VALUES ('{PROCESS}', 'sql', NULL)"
                ),
                format!(
                    "INSERT INTO drover_enqueue (process, key, context) \
                     VALUES ('{PROCESS}', 'one', '{stored}'), ('{PROCESS}', 'bad', 'x')"
                ),
            ]
        };
        for sql in &statements {
            db.execute(sql).await;
        }
        let session = db.session().await.id;
        let mut leases = claim_traced(&db, session, 10).await;
        leases.sort_by(|a, b| a.key.cmp(&b.key));
        let links: Vec<(&str, &[TraceContext])> = leases
            .iter()
            .map(|l| (l.key.as_str(), brought(l).links.as_slice()))
            .collect();
        // `nobody` is no item; `bad`'s context is no W3C context, but the
        // key is enqueued all the same.
        let change = [change];
        assert_eq!(
            links,
            [("bad", &[][..]), ("one", &change[..]), ("sql", &change[..])]
        );
        assert!(leases.iter().all(|l| brought(l).dropped == 0));
    })
    .await;
}

/// What `key`'s row keeps for its next run, as stored (`trace_links`).
async fn stored_links(db: &TestDb, key: &str) -> Option<String> {
    let sql = "SELECT CAST(trace_links AS TEXT) FROM drover_items WHERE process = $1 AND key = $2";
    if db.engine == "postgres" {
        let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
        let kept = sqlx::query_scalar(sql)
            .bind(PROCESS)
            .bind(key)
            .fetch_one(&pool)
            .await
            .expect("read the item");
        pool.close().await;
        kept
    } else {
        let pool = sqlx::SqlitePool::connect(&db.sql_url)
            .await
            .expect("connect");
        let kept = sqlx::query_scalar(sql)
            .bind(PROCESS)
            .bind(key)
            .fetch_one(&pool)
            .await
            .expect("read the item");
        pool.close().await;
        kept
    }
}

/// A context given in SQL that is not W3C (malformed, huge, an all-zero
/// id, upper-case hex, a `tracestate` with a non-ASCII or control
/// character; on SQLite also a NUL or a blob) is not kept: the row does not
/// grow, the key stays enqueued, and a valid context after them is kept
/// alone. On PostgreSQL, a watched table's write with such a
/// `drover.traceparent` still succeeds and enqueues its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_context_in_sql_is_not_kept_and_the_enqueue_stays() {
    each_engine(|db| async move {
        let valid = context('c', 'd');
        let parent = valid.traceparent().to_owned();
        let mut poison = vec![
            "'not a context'".to_owned(),
            format!("'{parent} {}'", "a".repeat(100_000)),
            format!("'00-{}-{}-01'", "0".repeat(32), "d".repeat(16)),
            format!("'00-{}-{}-01'", "c".repeat(32), "0".repeat(16)),
            format!("'{}'", parent.to_uppercase()),
            format!("'{parent} k=é'"),
            format!("'{parent} k=' || chr(9)"),
        ];
        let sqlite = db.engine == "sqlite";
        if sqlite {
            poison.push(format!("'{parent}' || char(0) || 'x'"));
            poison.push(format!("CAST('{parent}' AS BLOB)"));
            for p in &mut poison {
                *p = p.replace("chr(9)", "char(9)");
            }
        }
        let link = |context: &str| {
            if sqlite {
                format!(
                    "INSERT INTO drover_trace_link (process, key, context) \
                     VALUES ('{PROCESS}', 'k', {context})"
                )
            } else {
                format!("SELECT drover_trace_link('{PROCESS}', ARRAY['k'], {context})")
            }
        };
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
            .await
            .expect("enqueue");
        for context in &poison {
            db.execute(&link(context)).await;
            assert_eq!(
                stored_links(&db, "k").await,
                None,
                "{} kept {}",
                db.engine,
                &context[..context.len().min(90)]
            );
        }
        db.execute(&link(&format!("'{parent} vendor=y'"))).await;
        let kept = TraceContext::new(&parent, Some("vendor=y")).expect("valid");
        let session = db.session().await.id;
        let leases = claim_traced(&db, session, 10).await;
        assert_eq!(leases.len(), 1, "the key stayed enqueued");
        assert_eq!(brought(&leases[0]).links, [kept]);
        assert_eq!(brought(&leases[0]).dropped, 0);
        if db.engine == "postgres" {
            // The watch triggers go through the same check.
            db.execute("CREATE TABLE machines (id text PRIMARY KEY)")
                .await;
            let watch = drover::store::TableWatch::new("machines", PROCESS, "id");
            db.store.table_watch(&watch).await.expect("watch");
            let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
            let mut tx = pool.begin().await.expect("begin");
            for sql in [
                "SELECT set_config('drover.traceparent', 'garbage', true)",
                "INSERT INTO machines VALUES ('m1')",
            ] {
                sqlx::query(sql).execute(&mut *tx).await.expect(sql);
            }
            tx.commit().await.expect("the watched write commits");
            pool.close().await;
            assert_eq!(stored_links(&db, "m1").await, None);
            let leases = claim_traced(&db, session, 10).await;
            assert_eq!(leases.len(), 1, "the watched write enqueued its key");
            assert_eq!(leases[0].key, "m1");
            assert!(brought(&leases[0]).links.is_empty());
        }
    })
    .await;
}

/// A malformed `drover.traceparent` warns once in its transaction, not once
/// for each row a watched table's statement changes: an `INSERT` of fifty
/// rows sent fifty warnings (a bulk update of a million, a million, to the
/// client and the server's log). Another malformed context in the same
/// transaction still warns. Judged from what `psql` prints.
#[tokio::test]
async fn a_malformed_context_in_sql_warns_once_a_transaction() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    db.execute("CREATE TABLE machines (id text PRIMARY KEY)")
        .await;
    let watch = drover::store::TableWatch::new("machines", PROCESS, "id");
    db.store.table_watch(&watch).await.expect("watch");
    let script = format!(
        "BEGIN;
SET LOCAL drover.traceparent = 'garbage';
INSERT INTO machines SELECT 'm' || g FROM generate_series(1, 50) AS g;
UPDATE machines SET id = id || 'x';
SELECT drover_trace_link('{PROCESS}', ARRAY['m1x'], 'other garbage');
COMMIT;
"
    );
    let out = std::process::Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &db.url, "-c", &script])
        .output()
        .expect("psql (it comes with PostgreSQL; CI has it)");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = said.lines().filter(|l| l.contains("WARNING:")).collect();
    assert_eq!(warnings.len(), 2, "one for each malformed context:\n{said}");
    assert!(warnings[0].contains("'garbage'"), "{said}");
    assert!(warnings[1].contains("'other garbage'"), "{said}");
    let pending = db.store.process_counts_all().await.expect("counts");
    assert!(
        pending
            .iter()
            .any(|c| c.process == PROCESS && c.pending == 100),
        "every key stayed enqueued: {pending:?}"
    );
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

#[tokio::test]
async fn a_change_to_a_watched_table_carries_its_transactions_trace_context() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    db.execute("CREATE TABLE machines (id text PRIMARY KEY)")
        .await;
    let watch = drover::store::TableWatch::new("machines", PROCESS, "id");
    db.store.table_watch(&watch).await.expect("watch");
    let change = context('e', 'f');
    // One transaction says whose change it is; the other says nothing, and
    // an empty setting is as good as none.
    let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
    for (id, setting) in [
        ("m1", Some(change.traceparent().to_owned())),
        ("m2", None),
        ("m3", Some(String::new())),
    ] {
        let mut tx = pool.begin().await.expect("begin");
        if let Some(setting) = setting {
            sqlx::query("SELECT set_config('drover.traceparent', $1, true)")
                .bind(setting)
                .execute(&mut *tx)
                .await
                .expect("set");
        }
        sqlx::query("INSERT INTO machines VALUES ($1)")
            .bind(id)
            .execute(&mut *tx)
            .await
            .expect("insert");
        tx.commit().await.expect("commit");
    }
    // A TRUNCATE enqueues every row left, with the context of its transaction.
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SELECT set_config('drover.traceparent', $1, true)")
        .bind(context('a', 'b').traceparent())
        .execute(&mut *tx)
        .await
        .expect("set");
    sqlx::query("TRUNCATE machines")
        .execute(&mut *tx)
        .await
        .expect("truncate");
    tx.commit().await.expect("commit");
    pool.close().await;
    let session = db.session().await.id;
    let mut leases = claim_traced(&db, session, 10).await;
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    let links: Vec<(&str, &[TraceContext])> = leases
        .iter()
        .map(|l| (l.key.as_str(), brought(l).links.as_slice()))
        .collect();
    let truncated = context('a', 'b');
    assert_eq!(
        links,
        [
            ("m1", &[change, truncated.clone()][..]),
            ("m2", &[truncated.clone()][..]),
            ("m3", &[truncated][..]),
        ]
    );
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// The trace ids of `key`'s runs, newest first.
async fn run_trace_ids(store: &drover::store::Store, key: &str) -> Vec<Option<String>> {
    let runs = store
        .run_list(RunList {
            process: Some(PROCESS.into()),
            key: Some(key.into()),
            outcome: None,
            before: None,
            limit: 10,
        })
        .await
        .expect("runs");
    runs.iter()
        .map(|r| r.trace_id.map(|id| id.to_string()))
        .collect()
}

/// What `drover history --process PROCESS --key KEY` prints (`--json` when
/// `json`).
async fn history(db: &TestDb, key: &str, json: bool) -> String {
    let mut args = vec![
        "history",
        "--db",
        &db.url,
        "--process",
        PROCESS,
        "--key",
        key,
    ];
    if json {
        args.push("--json");
    }
    let out = Command::new(drover_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run drover history");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "drover history failed: {stderr}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// A run's history row keeps the trace id its worker completed it with, in
/// a batch that mixes traced and untraced runs and a lost lease; an
/// untraced run's row has none; `drover history` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_history_row_keeps_the_trace_id_it_was_completed_with() {
    each_engine(|db| async move {
        let keys = ["traced", "untraced", "failed"];
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .expect("enqueue");
        let session = db.session().await;
        let claim = LeaseClaim {
            session: session.id,
            process: PROCESS.into(),
            max: 3,
            trace_links: false,
        };
        let mut leases = db.store.lease_claim(claim).await.expect("claim").leases;
        leases.sort_by_key(|l| keys.iter().position(|k| *k == l.key));
        assert_eq!(leases.len(), 3);
        let mut lost = leases[1].clone();
        lost.token = FencingToken(lost.token.0 + 1_000_000);
        let id = |n: u8| TraceId::parse(&format!("{:032x}", u128::from(n) << 64 | 7)).expect("id");
        let (done, failed) = (Outcome::Done, Outcome::Transient("boom".into()));
        let batch = [
            LeaseComplete {
                lease: &leases[0],
                outcome: &done,
                trace_id: Some(id(1)),
            },
            LeaseComplete {
                lease: &leases[1],
                outcome: &done,
                trace_id: None,
            },
            LeaseComplete {
                lease: &lost,
                outcome: &done,
                trace_id: Some(id(2)),
            },
            LeaseComplete {
                lease: &leases[2],
                outcome: &failed,
                trace_id: Some(id(3)),
            },
        ];
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results[2].is_err(), "the lost lease is refused");
        assert_eq!(
            run_trace_ids(&db.store, "traced").await,
            [Some(id(1).to_string())]
        );
        assert_eq!(run_trace_ids(&db.store, "untraced").await, [None]);
        assert_eq!(
            run_trace_ids(&db.store, "failed").await,
            [Some(id(3).to_string())]
        );
        // `drover history` shows them, on its lines and in its JSON.
        for (key, id) in [("traced", Some(id(1))), ("untraced", None)] {
            let line = history(&db, key, false).await;
            let shown = id.map(|id| format!("  trace={id}"));
            assert_eq!(
                line.contains("trace="),
                shown.is_some(),
                "{key}'s line: {line}"
            );
            if let Some(shown) = shown {
                assert!(line.contains(&shown), "{key}'s line shows {shown}: {line}");
            }
            let json: serde_json::Value =
                serde_json::from_str(&history(&db, key, true).await).expect("JSON");
            let want = id.map_or(serde_json::Value::Null, |id| id.to_string().into());
            assert_eq!(json[0]["trace_id"], want, "{key}: {json}");
        }

        // A lone clean done, traced: the common completion's path.
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["traced"]))
            .await
            .expect("enqueue");
        let claim = LeaseClaim {
            session: session.id,
            process: PROCESS.into(),
            max: 1,
            trace_links: false,
        };
        let again = db.store.lease_claim(claim).await.expect("claim").leases;
        let done = LeaseComplete {
            lease: &again[0],
            outcome: &Outcome::Done,
            trace_id: Some(id(4)),
        };
        db.store.lease_complete(done).await.expect("complete");
        assert_eq!(
            run_trace_ids(&db.store, "traced").await,
            [Some(id(4).to_string()), Some(id(1).to_string())]
        );
    })
    .await;
}

/// A loopback OTLP/HTTP receiver: every span of every export request, as
/// `drover work` sent it.
async fn receiver() -> (SocketAddr, mpsc::UnboundedReceiver<Span>) {
    let (spans, received) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let spans = spans.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            spans.send(span).ok();
                        }
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, received)
}

/// Starts `drover work PROCESS --exec EXEC` exporting traces to `endpoint`
/// every 50 ms.
fn traced_worker(db: &TestDb, exec: &str, endpoint: &str) -> Child {
    traced_worker_with(db, exec, endpoint, &[], &[])
}

/// [`traced_worker`] with more `args` and `env`.
fn traced_worker_with(
    db: &TestDb,
    exec: &str,
    endpoint: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Child {
    traced_command(db, exec, endpoint, args, env)
        .spawn()
        .expect("spawn drover work")
}

/// A traced worker (see [`traced_worker_with`]) serving its own metrics, and
/// the address they are on.
async fn traced_worker_with_metrics(
    db: &TestDb,
    exec: &str,
    endpoint: &str,
    env: &[(&str, &str)],
) -> (Child, String) {
    support::cli::with_metrics(traced_command(db, exec, endpoint, &[], env)).await
}

/// The command [`traced_worker_with`] starts.
fn traced_command(
    db: &TestDb,
    exec: &str,
    endpoint: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let mut command = Command::new(drover_bin());
    command
        .args(["work", PROCESS, "--db", &db.url, "--exec", exec])
        .args(args)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("OTEL_SERVICE_NAME", "drover-test")
        .envs(env.iter().copied())
        .env_remove("TRACEPARENT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Waits until `n` keys of [`PROCESS`] are idle (done).
async fn all_idle(db: &TestDb, n: u64) {
    eventually("the keys to be done", || async {
        let counts = db.store.process_counts_all().await.expect("counts");
        counts.iter().any(|c| c.process == PROCESS && c.idle == n)
    })
    .await;
}

/// The next span, within 30 s.
async fn next_span(spans: &mut mpsc::UnboundedReceiver<Span>) -> Span {
    tokio::time::timeout(Duration::from_secs(30), spans.recv())
        .await
        .expect("a span within 30 s")
        .expect("the receiver runs")
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.clone()?.value)
}

fn text(span: &Span, key: &str) -> String {
    match attribute(span, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{key} is not text: {other:?}"),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attribute(span, key) {
        Some(Value::IntValue(n)) => n,
        other => panic!("{key} is not an integer: {other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// (trace id, span id) of each of the span's links, as hex.
fn links(span: &Span) -> Vec<(String, String)> {
    span.links
        .iter()
        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
        .collect()
}

/// `TRACEPARENT` of each attempt, from the command's log.
fn traceparents(log: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (attempt, parent) = l.split_once(' ').expect("attempt and TRACEPARENT");
            (attempt.to_owned(), parent.trim().to_owned())
        })
        .collect()
}

/// Two changes enqueue one key over HTTP with their `traceparent`s; the key
/// fails once, then succeeds. The first run's span links to both changes,
/// the retry's to the failed attempt; each command sees its run's context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_span_links_to_the_enqueues_it_absorbed_and_a_retry_to_the_failed_run() {
    each_engine(|db| async move {
        let template = "https://ui.example/t/{trace_id}?a=1&b={trace_id}";
        let flags = ["--listen", "127.0.0.1:0", "--trace-url", template];
        let serve = Serve::start_with(&db.url, &flags).await;
        let http = reqwest::Client::new();
        let url = format!("{}/v1/processes/{PROCESS}/items", serve.url);
        let changes = [context('1', '2'), context('3', '4')];
        for change in &changes {
            let sent = http
                .post(&url)
                .header("traceparent", change.traceparent())
                .header("tracestate", "vendor=x")
                .json(&serde_json::json!({ "keys": ["k"] }))
                .send()
                .await
                .expect("enqueue over HTTP");
            assert!(sent.status().is_success(), "{}", sent.status());
        }
        // A malformed header is ignored, never a failed enqueue.
        let sent = http
            .post(&url)
            .header("traceparent", "00-nonsense")
            .json(&serde_json::json!({ "keys": ["k"] }))
            .send()
            .await
            .expect("enqueue over HTTP");
        assert!(sent.status().is_success(), "{}", sent.status());

        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("traceparents");
        let exec = format!(
            "sh -c 'echo \"$DROVER_ATTEMPT $TRACEPARENT\" >> {}; test \"$DROVER_ATTEMPT\" -ge 2 || exit 75'",
            log.display()
        );
        let (addr, mut spans) = receiver().await;
        let worker = traced_worker(&db, &exec, &format!("http://{addr}"));
        let failed = next_span(&mut spans).await;
        let retried = next_span(&mut spans).await;
        stop(worker).await;

        for (span, attempt) in [(&failed, 1), (&retried, 2)] {
            assert_eq!(span.name, format!("{PROCESS} process"));
            assert_eq!(span.kind, SpanKind::Consumer as i32);
            assert!(span.parent_span_id.is_empty(), "a run's span has no parent, only links");
            assert_eq!(text(span, "messaging.system"), "drover");
            assert_eq!(text(span, "messaging.operation.type"), "process");
            assert_eq!(text(span, "messaging.destination.name"), PROCESS);
            assert_eq!(text(span, "drover.process"), PROCESS);
            assert_eq!(text(span, "drover.key"), "k");
            assert_eq!(int(span, "drover.attempt"), attempt);
            assert!(int(span, "drover.fencing_token") > 0);
            assert!(int(span, "drover.queue_wait_ms") >= 0);
        }
        assert_eq!(text(&failed, "drover.outcome"), "transient");
        let status = failed.status.clone().expect("a failed run has a status");
        assert_eq!(status.code, StatusCode::Error as i32);
        assert!(status.message.contains("exit"), "{}", status.message);
        assert_eq!(text(&retried, "drover.outcome"), "done");
        assert_ne!(
            retried.status.clone().map(|s| s.code),
            Some(StatusCode::Error as i32)
        );

        let expected: Vec<_> = changes
            .iter()
            .map(|c| (c.trace_id().to_owned(), c.traceparent()[36..52].to_owned()))
            .collect();
        assert_eq!(links(&failed), expected, "the first run absorbed both changes");
        assert_eq!(int(&failed, "messaging.batch.message_count"), 2);
        assert_eq!(
            failed.links[0].trace_state, "vendor=x",
            "the enqueue's tracestate rides with its link"
        );
        assert_eq!(
            links(&retried),
            [(hex(&failed.trace_id), hex(&failed.span_id))],
            "the retry links to the attempt that failed"
        );

        // Each command ran inside its run's span.
        let seen = traceparents(&log);
        let runs = [&failed, &retried];
        assert_eq!(seen.len(), 2, "{seen:?}");
        for ((attempt, parent), span) in seen.iter().zip(runs) {
            let want = format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id));
            assert_eq!(parent, &want, "attempt {attempt}'s TRACEPARENT");
        }

        // The API lists each run with its span's trace id, newest first.
        let page: serde_json::Value = http
            .get(format!("{}/v1/processes/{PROCESS}/runs?key=k", serve.url))
            .send()
            .await
            .expect("list runs")
            .json()
            .await
            .expect("a page of runs");
        let listed: Vec<_> = page["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["trace_id"].as_str().unwrap_or("none").to_owned())
            .collect();
        let exported = [hex(&retried.trace_id), hex(&failed.trace_id)];
        assert_eq!(listed, exported, "each run's trace id is its span's");
        // The key page links each to the tracing UI, the template applied
        // and escaped.
        let html = http
            .get(format!("{}/ui/processes/{PROCESS}/items/k", serve.url))
            .send()
            .await
            .expect("the key page")
            .text()
            .await
            .expect("html");
        for id in &exported {
            let link = format!("href=\"https://ui.example/t/{id}?a=1&amp;b={id}\"");
            assert!(html.contains(&link), "{link} in {html}");
        }
        drop(serve);
    })
    .await;
}

/// The variable naming a Python interpreter that has the OpenTelemetry SDK
/// and its OTLP/HTTP exporter (`scripts/otel-python/setup.sh` makes one and
/// prints this line). Unset, the test that needs it is skipped; set, it is
/// required.
const OTEL_PYTHON_ENV: &str = "DROVER_TEST_OTEL_PYTHON";

/// The Python of [`OTEL_PYTHON_ENV`], checked to import the SDK and the
/// exporter; `None` (the test skips, saying why) when the variable is unset.
async fn otel_python() -> Option<String> {
    let Some(python) = std::env::var(OTEL_PYTHON_ENV)
        .ok()
        .filter(|p| !p.is_empty())
    else {
        eprintln!(
            "skipped: {OTEL_PYTHON_ENV} is not set (scripts/otel-python/setup.sh makes a Python with the OpenTelemetry SDK and prints it)"
        );
        return None;
    };
    let imports =
        "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter";
    let checked = Command::new(&python)
        .args(["-c", imports])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{OTEL_PYTHON_ENV}={python} cannot be run: {e}"));
    assert!(
        checked.status.success(),
        "{OTEL_PYTHON_ENV}={python} cannot import the OpenTelemetry SDK and OTLP/HTTP exporter \
         (run scripts/otel-python/setup.sh): {}",
        String::from_utf8_lossy(&checked.stderr)
    );
    Some(python)
}

/// The command `drover work --exec` runs is a Python program using the
/// OpenTelemetry SDK as a user's would (`scripts/otel-python/child.py`): it
/// reads `TRACEPARENT`, starts its own span and exports it to the same
/// collector. That span joins the run's trace, as the run span's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_using_the_python_sdk_joins_its_runs_trace() {
    let Some(python) = otel_python().await else {
        return;
    };
    let (db, _dir) = support::sqlite().await;
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    let child = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/otel-python/child.py");
    let exec = format!("'{python}' '{}'", child.display());
    let (addr, mut spans) = receiver().await;
    let worker = traced_worker(&db, &exec, &format!("http://{addr}"));
    let (mut run, mut joined) = (None, None);
    while run.is_none() || joined.is_none() {
        let span = next_span(&mut spans).await;
        if span.kind == SpanKind::Consumer as i32 {
            run = Some(span);
        } else if span.name == "python child" {
            joined = Some(span);
        }
    }
    stop(worker).await;
    let (run, joined) = (
        run.expect("the run's span"),
        joined.expect("the command's span"),
    );
    assert_eq!(
        text(&run, "drover.outcome"),
        "done",
        "the command exported its span and exited 0"
    );
    assert_eq!(text(&joined, "drover.key"), "k", "the key was its argument");
    assert_child(&joined, &run, "the command's span");
}

/// Asserts that `child` (`what`) is in `parent`'s trace and its child.
fn assert_child(child: &Span, parent: &Span, what: &str) {
    assert_eq!(
        hex(&child.trace_id),
        hex(&parent.trace_id),
        "{what} is in the parent's trace"
    );
    assert_eq!(
        hex(&child.parent_span_id),
        hex(&parent.span_id),
        "{what} is the parent's child"
    );
}

/// Spans from `spans` until `wanted` of kind `kind` came (others are
/// skipped), within 30 s each.
async fn spans_of_kind(
    spans: &mut mpsc::UnboundedReceiver<Span>,
    kind: SpanKind,
    wanted: usize,
) -> Vec<Span> {
    let mut found = Vec::new();
    while found.len() < wanted {
        let span = next_span(spans).await;
        if span.kind == kind as i32 {
            found.push(span);
        }
    }
    found
}

/// `drover serve` exporting traces: a request's span is named after its
/// route template (no key in it), is a child of the caller's `traceparent`
/// and carries the HTTP attributes; an enqueue keeps the request's span as
/// its keys' context, so the run links to the request that asked for it
/// (the request's own root span when it came without a `traceparent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_span_is_named_by_its_route_and_the_run_links_to_it() {
    each_engine(|db| async move {
        let (addr, mut spans) = receiver().await;
        let endpoint = format!("http://{addr}");
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_SERVICE_NAME", "drover-serve-test"),
        ];
        let serve = Serve::start_with_env(&db.url, &["--listen", "127.0.0.1:0"], &env).await;
        let http = reqwest::Client::new();
        let url = format!("{}/v1/processes/{PROCESS}/items", serve.url);
        let caller = context('1', '2');
        for (key, parent) in [("secret/one", Some(&caller)), ("plain", None)] {
            let mut request = http.post(&url).json(&serde_json::json!({ "keys": [key] }));
            if let Some(parent) = parent {
                request = request.header("traceparent", parent.traceparent());
            }
            let sent = request.send().await.expect("enqueue over HTTP");
            assert!(sent.status().is_success(), "{}", sent.status());
        }
        let item = http
            .get(format!("{url}/secret%2Fone"))
            .send()
            .await
            .expect("get the item");
        assert!(item.status().is_success(), "{}", item.status());
        let server = spans_of_kind(&mut spans, SpanKind::Server, 3).await;

        let enqueue = "POST /v1/processes/{process}/items";
        let traced = server
            .iter()
            .find(|s| s.name == enqueue && !s.parent_span_id.is_empty())
            .expect("the traced enqueue's span");
        let untraced = server
            .iter()
            .find(|s| s.name == enqueue && s.parent_span_id.is_empty())
            .expect("the untraced enqueue's span, a root");
        let get = server
            .iter()
            .find(|s| s.name.starts_with("GET "))
            .expect("the item read's span");
        assert_eq!(
            hex(&traced.trace_id),
            caller.trace_id(),
            "in the caller's trace"
        );
        assert_eq!(hex(&traced.parent_span_id), &caller.traceparent()[36..52]);
        assert_ne!(hex(&untraced.trace_id), caller.trace_id());
        assert_eq!(get.name, "GET /v1/processes/{process}/items/{key}");
        for span in &server {
            assert!(
                !span.name.contains("secret"),
                "no key in a span name: {}",
                span.name
            );
            assert_eq!(text(span, "url.scheme"), "http");
            assert_eq!(int(span, "http.response.status_code"), 200);
        }
        assert_eq!(text(traced, "http.request.method"), "POST");
        assert_eq!(text(traced, "http.route"), "/v1/processes/{process}/items");
        assert_eq!(
            text(traced, "url.path"),
            format!("/v1/processes/{PROCESS}/items")
        );

        // Each run links to the request that enqueued its key.
        let worker = traced_worker(&db, "true", &endpoint);
        let runs = spans_of_kind(&mut spans, SpanKind::Consumer, 2).await;
        stop(worker).await;
        for (key, request) in [("secret/one", traced), ("plain", untraced)] {
            let run = runs
                .iter()
                .find(|r| text(r, "drover.key") == key)
                .expect("the key's run");
            assert_eq!(
                links(run),
                [(hex(&request.trace_id), hex(&request.span_id))],
                "{key}'s run links to its enqueue's request"
            );
        }
        drop(serve);
    })
    .await;
}

/// A request's method is the caller's choice (any token): a method HTTP does
/// not define is `_OTHER` on its span and `HTTP` in its name, as the
/// conventions say, so invented methods make no new span names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_an_invented_method_makes_no_span_name_of_it() {
    let (db, _dir) = support::sqlite().await;
    let (addr, mut spans) = receiver().await;
    let endpoint = format!("http://{addr}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_SERVICE_NAME", "drover-serve-test"),
    ];
    let serve = Serve::start_with_env(&db.url, &["--listen", "127.0.0.1:0"], &env).await;
    let http = reqwest::Client::new();
    for (i, path) in ["/v1/processes", "/nowhere"].into_iter().enumerate() {
        let method =
            reqwest::Method::from_bytes(format!("INVENTED{i}").as_bytes()).expect("a method token");
        let sent = http
            .request(method, format!("{}{path}", serve.url))
            .send()
            .await
            .expect("sent");
        assert!(sent.status().is_client_error(), "{}", sent.status());
    }
    let server = spans_of_kind(&mut spans, SpanKind::Server, 2).await;
    for span in &server {
        assert!(
            !span.name.contains("INVENTED"),
            "an invented method is no span name: {}",
            span.name
        );
        assert!(
            span.name == "HTTP" || span.name.starts_with("HTTP /"),
            "{}",
            span.name
        );
        assert_eq!(text(span, "http.request.method"), "_OTHER", "{}", span.name);
        assert!(
            text(span, "http.request.method_original").starts_with("INVENTED"),
            "{}",
            span.name
        );
    }
    drop(serve);
}

/// `drover work --server` exporting traces: its claims bring each lease's
/// trace links, so the run's span links to the enqueues it absorbed, a
/// failed run's retry links to it, and each completion carries its span's
/// trace id to the run's history row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_over_http_links_its_runs_to_their_enqueues() {
    each_engine(|db| async move {
        let serve = Serve::start(&db.url).await;
        let http = reqwest::Client::new();
        let url = format!("{}/v1/processes/{PROCESS}/items", serve.url);
        let changes = [context('7', '8'), context('9', 'a')];
        for change in &changes {
            let sent = http
                .post(&url)
                .header("traceparent", change.traceparent())
                .json(&serde_json::json!({ "keys": ["remote"] }))
                .send()
                .await
                .expect("enqueue over HTTP");
            assert!(sent.status().is_success(), "{}", sent.status());
        }
        let (addr, mut spans) = receiver().await;
        let worker = Command::new(drover_bin())
            .args(["work", PROCESS, "--server", &serve.url, "--exec"])
            .arg("sh -c 'test \"$DROVER_ATTEMPT\" -ge 2 || exit 75'")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .env_remove("TRACEPARENT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn drover work --server");
        let failed = next_span(&mut spans).await;
        let retried = next_span(&mut spans).await;
        stop(worker).await;
        let expected: Vec<_> = changes
            .iter()
            .map(|c| (c.trace_id().to_owned(), c.traceparent()[36..52].to_owned()))
            .collect();
        assert_eq!(text(&failed, "drover.key"), "remote");
        assert_eq!(links(&failed), expected, "the run absorbed both changes");
        assert_eq!(
            links(&retried),
            [(hex(&failed.trace_id), hex(&failed.span_id))],
            "the retry links to the attempt that failed"
        );
        assert_eq!(
            run_trace_ids(&db.store, "remote").await,
            [Some(hex(&retried.trace_id)), Some(hex(&failed.trace_id))],
            "each completion over HTTP carried its span's trace id"
        );
        drop(serve);
    })
    .await;
}

/// A change whose `traceparent` is good and whose `tracestate` is not (over
/// 512 bytes) still links its key's run to its trace, over HTTP headers and
/// through `drover enqueue`'s environment: W3C asks a receiver to drop a
/// malformed `tracestate` and keep the `traceparent`. Both refused the
/// whole context, so the run linked to neither change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_tracestate_is_dropped_and_its_traceparent_kept() {
    each_engine(|db| async move {
        let too_long = format!("vendor={}", "x".repeat(600));
        let serve = Serve::start_with(&db.url, &["--listen", "127.0.0.1:0"]).await;
        let over_http = context('1', '2');
        let sent = reqwest::Client::new()
            .post(format!("{}/v1/processes/{PROCESS}/items", serve.url))
            .header("traceparent", over_http.traceparent())
            .header("tracestate", &too_long)
            .json(&serde_json::json!({ "keys": ["k"] }))
            .send()
            .await
            .expect("enqueue over HTTP");
        assert!(sent.status().is_success(), "{}", sent.status());
        drop(serve);
        let from_env = context('3', '4');
        let out = Command::new(drover_bin())
            .args(["enqueue", PROCESS, "k", "--db", &db.url])
            .env("TRACEPARENT", from_env.traceparent())
            .env("TRACESTATE", &too_long)
            .output()
            .await
            .expect("drover enqueue");
        assert!(out.status.success(), "{out:?}");
        let warned = String::from_utf8_lossy(&out.stderr);
        assert!(warned.contains("TRACESTATE ignored"), "{warned}");
        let session = db.session().await.id;
        let leases = claim_traced(&db, session, 1).await;
        assert_eq!(
            brought(&leases[0]).links,
            [over_http, from_env],
            "{}: the run links to both changes, without their state",
            db.engine
        );
    })
    .await;
}

/// A collector that takes connections and never answers: every run still
/// ends done, and the worker still stops gracefully within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_changes_no_outcome() {
    each_engine(|db| async move {
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i:03}")).collect();
        let enqueue =
            ItemEnqueue::new(PROCESS, keys.iter().cloned()).trace(Some(context('5', '6')));
        db.store.item_enqueue(enqueue).await.expect("enqueue");
        // Bound, never accepted: the exporter's requests hang until they time out.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", hole.local_addr().expect("addr"));
        let worker = traced_worker(&db, "true", &endpoint);
        all_idle(&db, 200).await;
        stop(worker).await;
        drop(hole);
    })
    .await;
}

/// `drover serve --trace-url` refuses a template that is not http(s) or has
/// no `{trace_id}`, with one line that says so, before it opens anything.
#[tokio::test]
async fn serve_refuses_a_trace_url_without_the_placeholder_or_not_http() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = format!("sqlite://{}", dir.path().join("never.db").display());
    for (bad, says) in [
        ("https://ui.example/trace/", "it must contain {trace_id}"),
        (
            "ftp://ui.example/{trace_id}",
            "it must start with http:// or https://",
        ),
    ] {
        let out = Command::new(drover_bin())
            .args([
                "serve",
                "--db",
                &db,
                "--listen",
                "127.0.0.1:0",
                "--trace-url",
                bad,
            ])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run drover serve");
        assert!(!out.status.success(), "{bad:?} is refused");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains("--trace-url") && first.contains(says),
            "{bad:?}: {stderr}"
        );
        assert!(!dir.path().join("never.db").exists(), "nothing was opened");
    }
}

/// The value of the series `series` (name and labels) on the `/metrics`
/// page at `addr`; 0 when it is not there, or the worker does not listen
/// yet.
async fn metric(addr: &str, series: &str) -> u64 {
    let Ok(reply) = reqwest::get(format!("http://{addr}/metrics")).await else {
        return 0;
    };
    let page = reply.text().await.expect("text");
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

const DROPPED_FAILED: &str = r#"drover_trace_spans_dropped_total{reason="export_failed"}"#;
const DROPPED_FULL: &str = r#"drover_trace_spans_dropped_total{reason="queue_full"}"#;
const EXPORTS_OK: &str = r#"drover_trace_exports_total{result="ok"}"#;
const EXPORTS_FAILED: &str = r#"drover_trace_exports_total{result="failed"}"#;
const SPANS: &str = "drover_trace_spans_total";

/// Waits until the worker whose metrics listen on `addr` has handed at
/// least `runs` spans (one per run, and one per slow outcome write) to the
/// export and counted every one of them dropped; returns (queue full,
/// export failed).
async fn all_dropped(addr: &str, runs: u64) -> (u64, u64) {
    eventually("every span to be counted dropped", || async {
        let spans = metric(addr, SPANS).await;
        let dropped = metric(addr, DROPPED_FULL).await + metric(addr, DROPPED_FAILED).await;
        spans >= runs && dropped == spans
    })
    .await;
    (
        metric(addr, DROPPED_FULL).await,
        metric(addr, DROPPED_FAILED).await,
    )
}

/// A collector that answers 500: every run's span is counted dropped
/// (`export_failed`) and every export failed, on the worker's `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_a_collector_refuses_are_counted_dropped() {
    each_engine(|db| async move {
        let app = axum::Router::new().route(
            "/v1/traces",
            post(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let keys: Vec<String> = (0..10).map(|i| format!("key-{i}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .expect("enqueue");
        let (worker, addr) = traced_worker_with_metrics(&db, "true", &endpoint, &[]).await;
        let (full, _) = all_dropped(&addr, 10).await;
        assert_eq!(full, 0);
        assert!(metric(&addr, EXPORTS_FAILED).await >= 1);
        assert_eq!(metric(&addr, EXPORTS_OK).await, 0);
        stop(worker).await;
    })
    .await;
}

/// A collector that never answers, behind a queue of 4 spans and a 300 ms
/// export timeout: the spans that find the queue full are counted
/// `queue_full`, those in the exports that time out `export_failed`, and
/// together they are every run's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_a_silent_collector_never_takes_are_counted_dropped() {
    each_engine(|db| async move {
        // Bound, never accepted: each export waits until it times out.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", hole.local_addr().expect("addr"));
        let keys: Vec<String> = (0..50).map(|i| format!("key-{i:02}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .expect("enqueue");
        let env = [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2"),
        ];
        let (worker, addr) = traced_worker_with_metrics(&db, "true", &endpoint, &env).await;
        let (full, failed) = all_dropped(&addr, 50).await;
        assert!(full > 0 && failed > 0, "{full} + {failed}");
        assert_eq!(metric(&addr, EXPORTS_OK).await, 0);
        stop(worker).await;
        drop(hole);
    })
    .await;
}

/// A run whose outcome write waits for the database gets a child span for
/// the write (`{process} settle`, kind client), with the write's real
/// duration: a test transaction holds the key's row (PostgreSQL) or the
/// write lock (SQLite) while the run's command returns, until the worker's
/// write is seen waiting, then for 300 ms more. On PostgreSQL the write
/// waits for a held row 100 ms at most and is then answered "busy" and
/// tried again: the span covers every try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_outcome_write_is_a_span_under_its_run() {
    each_engine(|db| async move {
        let (addr, mut spans) = receiver().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let (started, go) = (dir.path().join("started"), dir.path().join("go"));
        let exec = format!(
            "sh -c 'touch {}; while [ ! -e {} ]; do sleep 0.01; done'",
            started.display(),
            go.display()
        );
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["slow"]))
            .await
            .expect("enqueue");
        let worker = traced_worker(&db, &exec, &format!("http://{addr}"));
        eventually("the run's command starts", || async { started.exists() }).await;
        let token: i64 = {
            let sql = "SELECT lease_token FROM drover_items WHERE key = 'slow'";
            if db.engine == "postgres" {
                let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
                sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("token")
            } else {
                let pool = sqlx::SqlitePool::connect(&db.sql_url)
                    .await
                    .expect("connect");
                sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("token")
            }
        };
        let lock = "SELECT 1 FROM drover_items WHERE lease_token = $1 FOR UPDATE";
        let blocker = support::locks::Blocker::hold(&db, lock, token).await;
        std::fs::write(&go, "").expect("let the command return");
        match &blocker {
            support::locks::Blocker::Postgres(..) => blocker.wait_for_a_waiter().await,
            support::locks::Blocker::Sqlite(..) => {
                let pid = worker.id().expect("the worker runs");
                support::locks::wait_for_sqlite_writers_of(pid, "drover-w", 1).await;
            }
        }
        let held = Duration::from_millis(300);
        tokio::time::sleep(held).await; // the fault's length, not a wait for a signal
        blocker.release().await;

        let (mut run, mut settle) = (None, None);
        while run.is_none() || settle.is_none() {
            let span = next_span(&mut spans).await;
            match span.kind {
                k if k == SpanKind::Consumer as i32 => run = Some(span),
                k if k == SpanKind::Client as i32 => settle = Some(span),
                _ => {}
            }
        }
        stop(worker).await;
        let (run, settle) = (run.expect("run span"), settle.expect("settle span"));
        assert_eq!(settle.name, format!("{PROCESS} settle"));
        assert_child(&settle, &run, "the write's span");
        let lasted = settle.end_time_unix_nano - settle.start_time_unix_nano;
        assert!(
            lasted >= held.as_nanos() as u64,
            "the span lasts as long as the write waited: {lasted} ns"
        );
        assert!(settle.start_time_unix_nano >= run.start_time_unix_nano);
        assert!(settle.end_time_unix_nano <= run.end_time_unix_nano);
        assert_eq!(text(&settle, "drover.key"), "slow");
        assert_eq!(text(&settle, "drover.write_result"), "written");
        let tries = int(&settle, "drover.write_tries");
        if db.engine == "postgres" {
            assert!(
                tries >= 2,
                "tried while the row was held, then written: {tries}"
            );
        } else {
            assert_eq!(tries, 1);
        }
        assert_eq!(int(&settle, "drover.fencing_token"), token);
        assert_eq!(text(&settle, "messaging.operation.type"), "settle");
    })
    .await;
}

/// OTLP over gRPC, picked by `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`, to a tonic
/// receiver in this test that serves the collector's `TraceService`.
#[cfg(feature = "otlp-grpc")]
mod over_grpc {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use tokio::io::AsyncReadExt as _;
    use tonic::transport::server::TcpIncoming;

    /// Sends each span of each export down a channel, as the HTTP
    /// [`receiver`] does.
    struct Receiver(mpsc::UnboundedSender<Span>);

    #[tonic::async_trait]
    impl TraceService for Receiver {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            for resource in request.into_inner().resource_spans {
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        self.0.send(span).ok();
                    }
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// A loopback OTLP/gRPC receiver (HTTP/2 only, as collectors are): every
    /// span of every export request, as `drover work` sent it.
    async fn grpc_receiver() -> (SocketAddr, mpsc::UnboundedReceiver<Span>) {
        let (spans, received) = mpsc::unbounded_channel();
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = incoming.local_addr().expect("addr");
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(spans)))
            .serve_with_incoming(incoming);
        tokio::spawn(server);
        (addr, received)
    }

    const GRPC: (&str, &str) = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");

    /// What a gRPC client sends first on a connection (HTTP/2 with prior
    /// knowledge, RFC 9113 §3.4).
    const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A collector that takes connections and never answers: the first
    /// bytes of each connection (as many as the HTTP/2 preface) come down
    /// the channel, and the connection is held open, silent.
    async fn silent_collector() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (first, firsts) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let first = first.clone();
                tokio::spawn(async move {
                    let mut bytes = vec![0; HTTP2_PREFACE.len()];
                    if socket.read_exact(&mut bytes).await.is_ok() {
                        first.send(bytes).ok();
                    }
                    std::future::pending::<()>().await;
                    drop(socket);
                });
            }
        });
        (addr, firsts)
    }

    /// Two traced enqueues of one key that fails once, then succeeds, with
    /// the protocol set to `grpc`: both runs' spans arrive over gRPC, named
    /// and linked as over HTTP, and each command ran inside its run's span.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_workers_run_spans_go_out_over_grpc_when_the_protocol_says_so() {
        each_engine(|db| async move {
            let changes = [context('1', '2'), context('3', '4')];
            for change in &changes {
                let enqueue = ItemEnqueue::new(PROCESS, ["k"]).trace(Some(change.clone()));
                db.store.item_enqueue(enqueue).await.expect("enqueue");
            }
            let dir = tempfile::tempdir().expect("temp dir");
            let log = dir.path().join("traceparents");
            let exec = format!(
                "sh -c 'echo \"$DROVER_ATTEMPT $TRACEPARENT\" >> {}; test \"$DROVER_ATTEMPT\" -ge 2 || exit 75'",
                log.display()
            );
            let (addr, mut spans) = grpc_receiver().await;
            let endpoint = format!("http://{addr}");
            let args = ["--backoff-initial", "10ms"];
            let worker = traced_worker_with(&db, &exec, &endpoint, &args, &[GRPC]);
            let failed = next_span(&mut spans).await;
            let retried = next_span(&mut spans).await;
            stop(worker).await;

            for (span, attempt) in [(&failed, 1), (&retried, 2)] {
                assert_eq!(span.name, format!("{PROCESS} process"));
                assert_eq!(span.kind, SpanKind::Consumer as i32);
                assert!(span.parent_span_id.is_empty(), "only links, no parent");
                assert_eq!(text(span, "drover.key"), "k");
                assert_eq!(int(span, "drover.attempt"), attempt);
            }
            assert_eq!(text(&failed, "drover.outcome"), "transient");
            assert_eq!(text(&retried, "drover.outcome"), "done");
            let expected: Vec<_> = changes
                .iter()
                .map(|c| (c.trace_id().to_owned(), c.traceparent()[36..52].to_owned()))
                .collect();
            assert_eq!(links(&failed), expected, "the first run absorbed both changes");
            assert_eq!(
                links(&retried),
                [(hex(&failed.trace_id), hex(&failed.span_id))],
                "the retry links to the attempt that failed"
            );
            let seen = traceparents(&log);
            assert_eq!(seen.len(), 2, "{seen:?}");
            for ((attempt, parent), span) in seen.iter().zip([&failed, &retried]) {
                let want = format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id));
                assert_eq!(parent, &want, "attempt {attempt}'s TRACEPARENT");
            }
        })
        .await;
    }

    /// A gRPC collector that never answers, behind a queue of 4 spans and a
    /// 300 ms export timeout: the exporter spoke HTTP/2 to it, every run
    /// still ends done, and each span is counted dropped (`queue_full` or
    /// `export_failed`), as over HTTP.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_a_silent_grpc_collector_never_takes_are_counted_dropped() {
        each_engine(|db| async move {
            let (collector, mut firsts) = silent_collector().await;
            let endpoint = format!("http://{collector}");
            let keys: Vec<String> = (0..50).map(|i| format!("key-{i:02}")).collect();
            db.store
                .item_enqueue(ItemEnqueue::new(PROCESS, keys))
                .await
                .expect("enqueue");
            let env = [
                GRPC,
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2"),
            ];
            let (worker, addr) =
                super::traced_worker_with_metrics(&db, "true", &endpoint, &env).await;
            all_idle(&db, 50).await;
            let (_, failed) = super::all_dropped(&addr, 50).await;
            assert!(failed > 0, "some exports were tried and timed out");
            assert_eq!(metric(&addr, EXPORTS_OK).await, 0);
            let first = firsts.recv().await.expect("a connection was made");
            assert_eq!(
                String::from_utf8_lossy(&first),
                String::from_utf8_lossy(HTTP2_PREFACE),
                "the exporter spoke gRPC's HTTP/2"
            );
            stop(worker).await;
        })
        .await;
    }
}

/// A protocol drover does not speak (`http/json`) is refused with one line
/// on stderr naming the variable and what is accepted, and the worker runs
/// its keys as usual, exporting nothing; so is an `https://` endpoint (drover
/// is built without TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_protocol_is_refused_in_one_line_and_work_still_runs() {
    each_engine(|db| async move {
        let (addr, mut spans) = receiver().await;
        let http = format!("http://{addr}");
        let https = format!("https://{addr}");
        // Then the accepted values: `http/protobuf`, and `grpc` when built in.
        let json = "warning: traces are not exported: \
                    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=\"http/json\" is not supported, \
                    use http/protobuf";
        let tls = format!(
            "warning: traces are not exported: OTEL_EXPORTER_OTLP_ENDPOINT=\"{https}\" \
             uses HTTPS, but drover is built without TLS"
        );
        let cases = [
            (Some("http/json"), &http, json),
            (None, &https, tls.as_str()),
        ];
        for (n, (protocol, endpoint, refusal)) in cases.into_iter().enumerate() {
            db.store
                .item_enqueue(ItemEnqueue::new(PROCESS, [format!("k{n}")]))
                .await
                .expect("enqueue");
            let dir = tempfile::tempdir().expect("temp dir");
            let stderr = std::fs::File::create(dir.path().join("stderr")).expect("stderr file");
            let mut worker = Command::new(drover_bin());
            worker
                .args(["work", PROCESS, "--db", &db.url, "--exec", "true"])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                .env("OTEL_BSP_SCHEDULE_DELAY", "50")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
                .env_remove("DROVER_LOG");
            if let Some(protocol) = protocol {
                worker.env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol);
            }
            let worker = worker
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .kill_on_drop(true)
                .spawn()
                .expect("spawn drover work");
            all_idle(&db, n as u64 + 1).await;
            stop(worker).await;
            let said = std::fs::read_to_string(dir.path().join("stderr")).expect("stderr");
            let warned: Vec<_> = said.lines().filter(|l| l.contains("traces")).collect();
            assert_eq!(warned.len(), 1, "{said}");
            assert!(warned[0].starts_with(refusal), "{said}");
        }
        assert!(spans.try_recv().is_err(), "nothing was exported");
    })
    .await;
}
