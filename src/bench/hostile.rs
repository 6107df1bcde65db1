//! `hostile`: what callers pushing on the server's limits cost (DESIGN.md
//! rule 13, issue 35), on an in-process `drover serve` with a worker token
//! and a spawned `drover work`. Three figures, sized by `keys` (`N`):
//!
//! - `metrics_growth`: `/metrics`' size and scrape time with 10 processes,
//!   then after 2 N enqueue attempts by a worker token to new process names
//!   (the process cap, `--max-processes`, refuses those over it);
//! - `long_poll`: claims sent to the database per second, and on PostgreSQL
//!   its transactions per second, with no claim waiting and then with N / 5
//!   idle long-polls on one empty process (they share one wake-up per
//!   process, so the figure should not grow with their number);
//! - `exec_fanout`: `drover work --exec true --parallelism W` over N keys:
//!   every key run exactly once (`runs`, `not_done`) under one session.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Figure;
use super::store::{BenchError, StoreBench, cleanup, fill, fresh_process};
use crate::server::{Server, ServerOptions, Tokens};
use crate::store::{RunList, RunOutcome, Store, StoreEngine as _};

/// Scrapes of `/metrics` per measurement (their median is printed).
const SCRAPES: usize = 9;
/// How long the idle long-polls (and the baseline before them) are watched.
const WATCHED: Duration = Duration::from_secs(5);
/// How long PostgreSQL may take to count a connection's transactions: a
/// backend that goes idle reports them within its idle-statistics interval
/// (10 s), so the set-up's transactions (a clean-up, 1,000 claims starting to
/// wait) would otherwise land in the window watched.
const SETTLE: Duration = Duration::from_secs(11);
/// Waiting claims one session may hold (the server's per-session cap).
const CLAIMS_PER_SESSION: u64 = 16;
/// The longest the spawned worker may take to drain its keys.
const EXEC_DEADLINE: Duration = Duration::from_secs(600);

/// An in-process server with an admin and a worker token, and an HTTP client.
struct Served {
    base: String,
    http: reqwest::Client,
    admin: String,
    worker: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(store: &Store) -> Result<Self, BenchError> {
        let secret = format!("{:016x}", rand::random::<u64>());
        let (admin, worker) = (format!("admin-{secret}"), format!("worker-{secret}"));
        let tokens = Tokens::parse(&format!("admin:{admin}\nworker:{worker}"))
            .map_err(|e| BenchError::Http(format!("bench tokens: {e}")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        // No retention pass or depth sample during the measurements.
        let options = ServerOptions::default()
            .tokens(tokens)
            .sample_interval(Duration::from_secs(3600))
            .prune_interval(Duration::from_secs(86_400));
        let stop = CancellationToken::new();
        let task = tokio::spawn(Server::new(store.clone(), options).serve(listener, stop.clone()));
        Ok(Self {
            base,
            http: reqwest::Client::new(),
            admin,
            worker,
            stop,
            task,
        })
    }

    /// A worker's POST of `body` to `path`: its status and JSON answer.
    async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<(StatusCode, serde_json::Value), BenchError> {
        let reply = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.worker)
            .json(&body)
            .send()
            .await
            .map_err(|e| BenchError::Http(format!("POST {path}: {e}")))?;
        let status = reply.status();
        let json = reply.json().await.unwrap_or(serde_json::Value::Null);
        Ok((status, json))
    }

    /// `/metrics` as an admin sees it, and how long it took.
    async fn metrics(&self) -> Result<(String, Duration), BenchError> {
        let sent = Instant::now();
        let reply = self
            .http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(&self.admin)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| BenchError::Http(format!("GET /metrics: {e}")))?;
        let text = reply
            .text()
            .await
            .map_err(|e| BenchError::Http(format!("GET /metrics: {e}")))?;
        Ok((text, sent.elapsed()))
    }

    /// The median of [`SCRAPES`] scrapes: the size in bytes and the time.
    async fn scraped(&self) -> Result<(usize, Duration), BenchError> {
        let mut times = Vec::with_capacity(SCRAPES);
        let mut bytes = 0;
        for _ in 0..SCRAPES {
            let (text, took) = self.metrics().await?;
            bytes = text.len();
            times.push(took);
        }
        times.sort();
        Ok((bytes, times[SCRAPES / 2]))
    }

    /// A counter or gauge of `/metrics` without labels.
    async fn metric(&self, name: &str) -> Result<f64, BenchError> {
        let (text, _) = self.metrics().await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| BenchError::Http(format!("/metrics has no {name}")))
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.ok();
    }
}

/// Milliseconds with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// Runs the three scenarios: one figure each.
pub async fn hostile(b: &StoreBench, drover: &Path) -> Result<Vec<Figure>, BenchError> {
    let served = Served::start(&b.store).await?;
    let growth = metrics_growth(b, &served).await;
    let polls = match &growth {
        Ok(_) => Some(long_poll(b, &served).await),
        Err(_) => None,
    };
    served.stop().await;
    let mut figures = vec![growth?];
    figures.extend(polls.transpose()?);
    figures.push(exec_fanout(b, drover).await?);
    Ok(figures)
}

/// `/metrics` with 10 processes, then after 2 N enqueue attempts to new
/// process names by a worker token.
async fn metrics_growth(b: &StoreBench, served: &Served) -> Result<Figure, BenchError> {
    let attempts = b.keys * 2;
    let mut created = Vec::new();
    let mut refused = 0_u64;
    let result = async {
        b.phase("10 processes", 10);
        for _ in 0..10 {
            created.push(enqueue_new(served, &mut refused).await?);
            b.progress.inc(1);
        }
        let ten = served.scraped().await?;
        b.phase("new names", attempts);
        for _ in 0..attempts {
            if let Some(name) = enqueue_new(served, &mut refused).await? {
                created.push(Some(name));
            }
            b.progress.inc(1);
        }
        let after = served.scraped().await?;
        Ok::<_, BenchError>((ten, after))
    }
    .await;
    b.phase("cleaning up", created.len() as u64);
    for name in created.iter().flatten() {
        cleanup(&b.store, name).await?;
    }
    let ((bytes_10, ms_10), (bytes_after, ms_after)) = result?;
    let accepted = created.iter().flatten().count() - 10;
    Ok(Figure::new("metrics_growth")
        .with("engine", b.store.engine_name())
        .with("attempts", attempts)
        .with("created", accepted)
        .with("refused", refused)
        .with("bytes_10", bytes_10)
        .with("bytes_after", bytes_after)
        .with("scrape_ms_10", ms(ms_10))
        .with("scrape_ms_after", ms(ms_after)))
}

/// Enqueues one key to a process name never seen: the name if the server
/// created it, `None` if it refused it with 422 (counted in `refused`).
async fn enqueue_new(served: &Served, refused: &mut u64) -> Result<Option<String>, BenchError> {
    let name = fresh_process("hostile");
    let path = format!("/v1/processes/{name}/items");
    match served.post(&path, json!({ "keys": ["k"] })).await? {
        (status, _) if status.is_success() => Ok(Some(name)),
        (StatusCode::UNPROCESSABLE_ENTITY, _) => {
            *refused += 1;
            Ok(None)
        }
        (status, body) => Err(BenchError::Http(format!("enqueue: {status} {body}"))),
    }
}

/// Claims and (on PostgreSQL) transactions per second, first with no claim
/// waiting, then with N / 5 idle long-polls on one empty process.
async fn long_poll(b: &StoreBench, served: &Served) -> Result<Figure, BenchError> {
    let polls = (b.keys / 5).max(1);
    let process = fresh_process("hostile_poll");
    let idle = load(b, served).await?;
    b.phase("long-polls", polls);
    let mut claims = JoinSet::new();
    for s in 0..polls.div_ceil(CLAIMS_PER_SESSION) {
        let body = json!({ "component": "bench-long-poll", "ttl_ms": 120_000 });
        let (status, session) = served.post("/v1/sessions", body).await?;
        if status != StatusCode::CREATED {
            return Err(BenchError::Http(format!("session: {status} {session}")));
        }
        let path = format!("/v1/sessions/{}/claim", session["id"]);
        let here = CLAIMS_PER_SESSION.min(polls - s * CLAIMS_PER_SESSION);
        for _ in 0..here {
            let (http, url, token) = (
                served.http.clone(),
                format!("{}{path}", served.base),
                served.worker.clone(),
            );
            let body = json!({ "process": process, "max": 1, "wait_ms": 60_000 });
            claims.spawn(async move { http.post(url).bearer_auth(token).json(&body).send().await });
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while served.metric("drover_claims_waiting").await? < polls as f64 {
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(
                "the long-polls never all waited".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.progress.inc(polls);
    let waiting = load(b, served).await?;
    claims.abort_all();
    cleanup(&b.store, &process).await?;
    let mut figure = Figure::new("long_poll")
        .with("engine", b.store.engine_name())
        .with("long_polls", polls)
        .with("claims_per_s_idle", format!("{:.1}", idle.claims))
        .with("claims_per_s", format!("{:.1}", waiting.claims));
    if let (Some(idle), Some(waiting)) = (idle.transactions, waiting.transactions) {
        figure = figure
            .with("xacts_per_s_idle", format!("{idle:.1}"))
            .with("xacts_per_s", format!("{waiting:.1}"));
    }
    Ok(figure)
}

/// What the database was asked per second over [`WATCHED`].
struct Load {
    /// Claims the server sent for HTTP workers.
    claims: f64,
    /// Transactions committed or rolled back (PostgreSQL only; every
    /// session on the database counts, so run the bench on a quiet one).
    transactions: Option<f64>,
}

async fn load(b: &StoreBench, served: &Served) -> Result<Load, BenchError> {
    if b.store.postgres_pool().is_some() {
        tokio::time::sleep(SETTLE).await;
    }
    let claims = served.metric("drover_claim_attempts_total").await?;
    let xacts = transactions(&b.store).await?;
    tokio::time::sleep(WATCHED).await;
    let per_s = |d: f64| d / WATCHED.as_secs_f64();
    let claims = per_s(served.metric("drover_claim_attempts_total").await? - claims);
    let after = transactions(&b.store).await?;
    Ok(Load {
        claims,
        transactions: xacts.zip(after).map(|(x, a)| per_s(a - x)),
    })
}

/// The database's transactions so far (PostgreSQL's statistics; `None` on
/// SQLite, which keeps none).
async fn transactions(store: &Store) -> Result<Option<f64>, BenchError> {
    let Some(pool) = store.postgres_pool() else {
        return Ok(None);
    };
    // The statistics are a snapshot per transaction: a fresh one each time.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database
         WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    Ok(Some(n as f64))
}

/// `drover work --exec true --parallelism W` over N keys until every key ran.
async fn exec_fanout(b: &StoreBench, drover: &Path) -> Result<Figure, BenchError> {
    let process = fresh_process("hostile_exec");
    fill(b, &process, b.keys).await?;
    b.phase("running", b.keys);
    let started = Instant::now();
    let mut child = Command::new(drover)
        .args(["work", &process, "--exec", "true", "--ttl", "3s"])
        .args(["--parallelism", &b.workers.to_string(), "--db", &b.url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let drained = loop {
        let left = b
            .counts_of(&process)
            .await?
            .map_or(0, |c| c.pending + c.backoff + c.running);
        b.progress.set_position(b.keys.saturating_sub(left));
        if left == 0 {
            break Ok(started.elapsed());
        }
        if started.elapsed() > EXEC_DEADLINE || child.try_wait()?.is_some() {
            break Err(BenchError::Timeout(format!(
                "drover work left {left} keys of {}",
                b.keys
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    child.start_kill().ok();
    child.wait().await.ok();
    let runs = b
        .store
        .run_list(RunList {
            process: Some(process.clone()),
            limit: u32::try_from(b.keys * 2).unwrap_or(u32::MAX),
            ..RunList::default()
        })
        .await?;
    cleanup(&b.store, &process).await?;
    let took = drained?;
    let not_done = runs
        .iter()
        .filter(|r| r.outcome != RunOutcome::Done)
        .count();
    let mut sessions: Vec<_> = runs.iter().map(|r| r.session).collect();
    sessions.sort_unstable();
    sessions.dedup();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let per_s = b.keys as f64 / took.as_secs_f64();
    Ok(Figure::new("exec_fanout")
        .with("engine", b.store.engine_name())
        .with("keys", b.keys)
        .with("workers", b.workers)
        .with("runs", runs.len())
        .with("not_done", not_done)
        .with("sessions", sessions.len())
        .with("keys_per_s", format!("{per_s:.0}")))
}
