//! `dashboard`: the response time of every dashboard page, of
//! `/v1/processes` and of `/metrics` against a large process — by default
//! 1,000,000 items (mostly idle, a backlog of pending ones, failing ones
//! backing off and parked, some running under ten sessions) and 5,000,000
//! runs spread over the last week (written in the order they ended, as a
//! live system appends them) — served by an in-process `drover serve`
//! over HTTP. The data set is written by bulk SQL (one `INSERT … SELECT` per
//! table), not through the API, so it takes seconds to build, not hours.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Figure;
use super::store::{BenchError, StoreBench, cleanup, fresh_process};
use crate::server::{Server, ServerOptions};
use crate::store::{ItemEnqueue, SessionStart, Store, StoreEngine as _, StoreError};

/// Requests per page (the p99 of 200 is its second slowest).
const REQUESTS: usize = 200;
/// Runs per item in the data set.
const RUNS_PER_ITEM: u64 = 5;
/// Sessions holding the running items.
const SESSIONS: i64 = 10;

/// The data set on PostgreSQL: `$1` process, `$2` items, `$3` runs, `$4` the
/// first session id. Keys `key-00000000`…; every 1000th running, every 50th
/// parked, every 50th (offset 25) backing off, every 10th pending, the rest
/// idle; errors vary by a number and the key, as real ones do (their
/// signature, as the store would write it, beside them).
const POSTGRES: [&str; 3] = [
    "INSERT INTO drover_items (process, key, state, priority, ready_at, enqueued_at, failures,
         backoff_until, last_error, error_signature, lease_session, lease_token, started_at,
         first_enqueued_at, last_enqueued_at, enqueue_count, last_outcome, last_ended_at)
     SELECT $1, 'key-' || lpad(g::text, 8, '0'),
         CASE s.shown WHEN 'backoff' THEN 'pending' ELSE s.shown END, 0,
         now() - (g % 3600) * interval '1 second', now() - (g % 3600) * interval '1 second',
         CASE WHEN s.shown IN ('parked', 'backoff') THEN 3 ELSE 0 END,
         CASE WHEN s.shown = 'backoff' THEN now() + (g % 600) * interval '1 second' END,
         CASE WHEN s.shown IN ('parked', 'backoff')
              THEN 'error ' || (g % 7) || ': cannot reach key-' || lpad(g::text, 8, '0')
                   || ' after ' || (g % 13) || ' attempts' END,
         CASE WHEN s.shown IN ('parked', 'backoff')
              THEN 'error <n>: cannot reach <key> after <n> attempts' END,
         CASE WHEN s.shown = 'running' THEN $4 + g % 10 END,
         CASE WHEN s.shown = 'running' THEN g END,
         CASE WHEN s.shown = 'running' THEN now() END,
         now() - interval '7 days', now(), 1 + g % 5, 'done', now() - interval '1 hour'
     FROM generate_series(0, $2 - 1) g,
     LATERAL (SELECT CASE WHEN g % 1000 = 0 THEN 'running' WHEN g % 50 = 0 THEN 'parked'
                  WHEN g % 50 = 25 THEN 'backoff' WHEN g % 10 = 3 THEN 'pending'
                  ELSE 'idle' END AS shown) s",
    "INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
         started_at, ended_at, error)
     SELECT $1, 'key-' || lpad((g % $2)::text, 8, '0'), o.outcome, 1, 1, g,
         e.at - interval '2 seconds', e.at - interval '1 second', e.at,
         CASE WHEN o.outcome <> 'done' THEN 'error ' || (g % 7) END
     FROM generate_series(0, $3 - 1) g,
     LATERAL (SELECT now() - ($3 - g) * (604800.0 / $3) * interval '1 second' AS at) e,
     LATERAL (SELECT CASE WHEN g % 20 = 0 THEN 'retry' WHEN g % 97 = 0 THEN 'parked'
                  ELSE 'done' END AS outcome) o",
    "INSERT INTO drover_depth_samples (process, at, pending, backoff, running, parked)
     SELECT $1, now() - g * interval '1 minute', 100000 + g * 10, 20000, 1000, 20000
     FROM generate_series(1, 60) g",
];

/// The same data set on SQLite (`?1`…`?4` as on PostgreSQL; times in ms).
const SQLITE: [&str; 3] = [
    "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < ?2),
     t(now) AS (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)),
     s AS (SELECT i, CASE WHEN i % 1000 = 0 THEN 'running' WHEN i % 50 = 0 THEN 'parked'
              WHEN i % 50 = 25 THEN 'backoff' WHEN i % 10 = 3 THEN 'pending'
              ELSE 'idle' END AS shown FROM g)
     INSERT INTO drover_items (process, key, state, priority, ready_at, enqueued_at, failures,
         backoff_until, last_error, error_signature, lease_session, lease_token, started_at,
         first_enqueued_at, last_enqueued_at, enqueue_count, last_outcome, last_ended_at)
     SELECT ?1, printf('key-%08d', i), CASE shown WHEN 'backoff' THEN 'pending' ELSE shown END, 0,
         now - (i % 3600) * 1000, now - (i % 3600) * 1000,
         CASE WHEN shown IN ('parked', 'backoff') THEN 3 ELSE 0 END,
         CASE WHEN shown = 'backoff' THEN now + (i % 600) * 1000 END,
         CASE WHEN shown IN ('parked', 'backoff')
              THEN printf('error %d: cannot reach key-%08d after %d attempts', i % 7, i, i % 13) END,
         CASE WHEN shown IN ('parked', 'backoff')
              THEN 'error <n>: cannot reach <key> after <n> attempts' END,
         CASE WHEN shown = 'running' THEN ?4 + i % 10 END,
         CASE WHEN shown = 'running' THEN i END,
         CASE WHEN shown = 'running' THEN now END,
         now - 604800000, now, 1 + i % 5, 'done', now - 3600000
     FROM s, t",
    "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < ?3),
     t(now) AS (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER))
     INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
         started_at, ended_at, error)
     SELECT ?1, printf('key-%08d', i % ?2),
         CASE WHEN i % 20 = 0 THEN 'retry' WHEN i % 97 = 0 THEN 'parked' ELSE 'done' END,
         1, 1, i, at - 2000, at - 1000, at,
         CASE WHEN i % 20 = 0 OR i % 97 = 0 THEN printf('error %d', i % 7) END
     FROM (SELECT i, now - (?3 - i) * 604800000 / ?3 AS at FROM g, t)",
    "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 60),
     t(now) AS (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER))
     INSERT INTO drover_depth_samples (process, at, pending, backoff, running, parked)
     SELECT ?1, now - i * 60000, 100000 + i * 10, 20000, 1000, 20000 FROM g, t",
];

/// Writes the data set: `items` items, `items × 5` runs, ten sessions with
/// the running items, an hour of depth samples.
async fn build(store: &Store, process: &str, items: u64) -> Result<Vec<i64>, BenchError> {
    // The process row (and its counts) the way every process gets them.
    store
        .item_enqueue(ItemEnqueue::new(process, ["setup"]))
        .await?;
    let mut sessions = Vec::new();
    for n in 0..SESSIONS {
        let mut start = SessionStart::new(format!("bench-worker-{n}"), Duration::from_secs(3600));
        start.identity.host = Some(format!("node-{n}"));
        sessions.push(store.session_start(start).await?.id.0);
    }
    let first = sessions[0];
    if sessions.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(BenchError::Store(StoreError::InvalidArgument(
            "the bench's sessions must have consecutive ids; run it on a quiet database".into(),
        )));
    }
    let (items, runs) = (
        i64::try_from(items).unwrap_or(i64::MAX),
        i64::try_from(items * RUNS_PER_ITEM).unwrap_or(i64::MAX),
    );
    let values = (process, items, runs, first);
    if let Some(pool) = store.postgres_pool() {
        write(
            pool,
            &POSTGRES,
            values,
            "VACUUM ANALYZE drover_items, drover_runs",
        )
        .await?;
    } else if let Some(pool) = store.sqlite_pool() {
        write(pool, &SQLITE, values, "PRAGMA wal_checkpoint(TRUNCATE)").await?;
    }
    Ok(sessions)
}

/// Runs an engine's statements of the data set on `pool`, each bound to
/// `values` (process, items, runs, first session), then `after` (what makes
/// the engine's reads of it representative): the same steps on either
/// engine, only the SQL differs.
async fn write<DB>(
    pool: &sqlx::Pool<DB>,
    statements: &[&'static str],
    (process, items, runs, first): (&str, i64, i64, i64),
    after: &'static str,
) -> Result<(), sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    for sql in statements {
        let q = sqlx::query(*sql)
            .bind(process)
            .bind(items)
            .bind(runs)
            .bind(first);
        q.execute(pool).await?;
    }
    sqlx::query(after).execute(pool).await?;
    Ok(())
}

/// The pages measured, by name, for a process.
fn pages(process: &str) -> Vec<(&'static str, String)> {
    // Bench process names need no percent-encoding.
    let p = process;
    vec![
        ("overview", "/".to_owned()),
        ("process", format!("/ui/processes/{p}")),
        (
            "process_pending",
            format!("/ui/processes/{p}?state=pending"),
        ),
        (
            "process_prefix",
            format!("/ui/processes/{p}?prefix=key-0005"),
        ),
        ("item", format!("/ui/processes/{p}/items/key-00000050")),
        ("workers", "/ui/workers".to_owned()),
        ("api_processes", "/v1/processes".to_owned()),
        ("api_triage", format!("/v1/processes/{p}/triage")),
        ("api_series", format!("/v1/processes/{p}/series")),
        ("api_sessions", "/v1/sessions".to_owned()),
        ("metrics", "/metrics".to_owned()),
    ]
}

/// Builds the data set, serves it, and times `REQUESTS` sequential GETs of
/// each page: one figure per page with its p50 and p99 in milliseconds.
pub async fn dashboard(b: &StoreBench) -> Result<Vec<Figure>, BenchError> {
    let process = fresh_process("dashboard");
    b.phase("building", 1);
    let built = Instant::now();
    let sessions = build(&b.store, &process, b.keys).await?;
    let build_s = built.elapsed().as_secs_f64();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    // No retention pass or depth sample in the background of the timing.
    let options = ServerOptions::default()
        .sample_interval(Duration::from_secs(3600))
        .prune_interval(Duration::from_secs(86_400));
    let stop = CancellationToken::new();
    let server = tokio::spawn(Server::new(b.store.clone(), options).serve(listener, stop.clone()));
    let http = reqwest::Client::new();
    let mut figures = Vec::new();
    let pages = pages(&process);
    b.phase("requests", (pages.len() * REQUESTS) as u64);
    for (name, path) in pages {
        let mut times = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let sent = Instant::now();
            let reply = http.get(format!("{base}{path}")).send().await;
            let ok = match reply {
                Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                _ => false,
            };
            if !ok {
                return Err(BenchError::Timeout(format!("GET {path} failed")));
            }
            times.push(sent.elapsed());
            b.progress.inc(1);
        }
        // The first request pays what later ones may reuse (the process
        // page keeps slow reads for 10 s): printed on its own.
        let first = times[0];
        times.sort();
        let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
        figures.push(
            Figure::new("dashboard")
                .with("engine", b.store.engine_name())
                .with("items", b.keys)
                .with("runs", b.keys * RUNS_PER_ITEM)
                .with("page", name)
                .with("p50_ms", ms(times[REQUESTS / 2]))
                .with("p99_ms", ms(times[REQUESTS * 99 / 100 - 1]))
                .with("first_ms", ms(first)),
        );
    }
    figures.push(
        Figure::new("dashboard_build")
            .with("engine", b.store.engine_name())
            .with("items", b.keys)
            .with("runs", b.keys * RUNS_PER_ITEM)
            .with("seconds", format!("{build_s:.1}")),
    );
    stop.cancel();
    server.await.ok();
    b.phase("cleaning up", 1);
    for id in sessions {
        let close = crate::store::SessionClose {
            session: crate::store::SessionId(id),
        };
        b.store.session_close(close).await?;
    }
    cleanup(&b.store, &process).await?;
    Ok(figures)
}
