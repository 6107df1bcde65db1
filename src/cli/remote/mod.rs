//! `drover work --server URL`: the same worker as `--db`, over the HTTP API, for
//! machines that should not hold database credentials.
//!
//! It keeps the controller's guarantees with the server in between: a session
//! renewed every TTL/3 (failed heartbeats retried until the deadline), long-poll
//! claims, one command per lease, outcomes checked by fencing token (a refused
//! outcome is dropped), commands killed when the session is lost, and graceful
//! shutdown that releases unfinished keys and closes the session.

mod api;

use std::sync::Arc;
use std::time::Duration;

use drover::runner::{Action, outcome_of};
use drover::store::Outcome;
use serde_json::{Value, json};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use api::Api;
use api::{CallError, RemoteLease};

use super::exec::{Exec, Job};

/// The component name sessions are registered under.
const COMPONENT: &str = "drover work --server";

/// How a remote worker runs.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) process: String,
    pub(crate) parallelism: usize,
    pub(crate) ttl: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) shutdown_deadline: Duration,
}

/// The live session's id and the token cancelled when it is lost.
type Live = Option<(i64, CancellationToken)>;

/// What runs share.
struct Worker {
    api: Api,
    exec: Exec,
    settings: Settings,
    /// Cancelled when shutdown's deadline passes.
    force: CancellationToken,
    /// Asks the session keeper to heartbeat now: a claim was refused with 409,
    /// so the session is likely gone (expired, or closed by the server after a
    /// claim whose commit was unknown), and waiting for the next regular
    /// heartbeat (up to TTL/3) would leave the worker idle that long.
    recheck: Notify,
}

/// Starts a first session (so a wrong URL or token fails at once, with the
/// server's answer), runs until `shutdown` fires, then shuts down gracefully.
pub(crate) async fn run(
    api: Api,
    exec: Exec,
    settings: Settings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let first = api
        .session_start(COMPONENT, settings.ttl)
        .await
        .map_err(|e| anyhow::anyhow!("cannot start a session: {e}"))?;
    let worker = Arc::new(Worker {
        api,
        exec,
        settings,
        force: CancellationToken::new(),
        recheck: Notify::new(),
    });
    let (publish, mut live) = watch::channel(None);
    let keeper_stop = CancellationToken::new();
    let keeper = tokio::spawn(keep_session(
        Arc::clone(&worker),
        first,
        publish,
        keeper_stop.clone(),
    ));
    let runs = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(worker.settings.parallelism));
    while let Some((permits, (session, token))) = next_round(&slots, &mut live, &shutdown).await {
        let claim = worker.api.claim(
            session,
            &worker.settings.process,
            permits.len(),
            Duration::from_secs(20),
        );
        let leases = tokio::select! {
            () = shutdown.cancelled() => break,
            leases = claim => leases,
        };
        match leases {
            Ok(leases) => {
                for (lease, permit) in leases.into_iter().zip(permits) {
                    runs.spawn(Arc::clone(&worker).execute(lease, token.child_token(), permit));
                }
            }
            Err(e) => {
                eprintln!("drover work: claim failed: {e}");
                if matches!(e, CallError::Conflict(_)) {
                    worker.recheck.notify_one();
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
    runs.close();
    if timeout(worker.settings.shutdown_deadline, runs.wait())
        .await
        .is_err()
    {
        worker.force.cancel();
        runs.wait().await;
    }
    keeper_stop.cancel();
    let _ = keeper.await;
    Ok(())
}

/// Waits for free slots and a live session; `None` at shutdown.
async fn next_round(
    slots: &Arc<Semaphore>,
    live: &mut watch::Receiver<Live>,
    shutdown: &CancellationToken,
) -> Option<(Vec<OwnedSemaphorePermit>, (i64, CancellationToken))> {
    let first = tokio::select! {
        () = shutdown.cancelled() => return None,
        permit = Arc::clone(slots).acquire_owned() => permit.ok()?,
    };
    let mut permits = vec![first];
    while let Ok(permit) = Arc::clone(slots).try_acquire_owned() {
        permits.push(permit);
    }
    loop {
        if let Some(session) = live.borrow_and_update().clone() {
            return Some((permits, session));
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            changed = live.changed() => changed.ok()?,
        }
    }
}

/// Keeps one session alive (starting with `first`), publishing it; starts a new
/// one when it is lost; closes it when `stop` fires.
async fn keep_session(
    worker: Arc<Worker>,
    first: i64,
    publish: watch::Sender<Live>,
    stop: CancellationToken,
) {
    let ttl = worker.settings.ttl;
    let mut next = Some(first);
    loop {
        let id = match next.take() {
            Some(id) => id,
            None => match worker.api.session_start(COMPONENT, ttl).await {
                Ok(id) => id,
                Err(e) => {
                    eprintln!("drover work: cannot start a session: {e}");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = sleep(ttl / 3) => continue,
                    }
                }
            },
        };
        let token = worker.force.child_token();
        publish.send_replace(Some((id, token.clone())));
        let lost = heartbeat_until_lost(&worker, id, &stop).await;
        publish.send_replace(None);
        token.cancel();
        if !lost {
            if let Err(e) = worker.api.session_close(id).await {
                eprintln!("drover work: cannot close session {id}; it will expire: {e}");
            }
            return;
        }
        eprintln!("drover work: session {id} lost; starting a new one");
    }
}

/// Heartbeats every TTL/3 (and at once when asked to recheck), retrying
/// failures until the deadline passes. Returns `true` when the session is lost,
/// `false` when `stop` fired.
async fn heartbeat_until_lost(worker: &Worker, id: i64, stop: &CancellationToken) -> bool {
    let (api, ttl) = (&worker.api, worker.settings.ttl);
    let mut renewed = Instant::now();
    loop {
        let pause = if renewed.elapsed() < ttl / 3 {
            ttl / 3
        } else {
            ttl / 10
        };
        tokio::select! {
            () = stop.cancelled() => return false,
            () = worker.recheck.notified() => {}
            () = sleep(pause) => {}
        }
        match api.heartbeat(id, ttl / 3).await {
            Ok(()) => renewed = Instant::now(),
            Err(CallError::Conflict(_)) => return true,
            Err(e) => eprintln!("drover work: heartbeat failed, retrying: {e}"),
        }
        if renewed.elapsed() >= ttl {
            return true;
        }
    }
}

impl Worker {
    /// Runs the command for one lease and writes its outcome (or releases it at
    /// the shutdown deadline, or drops it when the session was lost).
    async fn execute(
        self: Arc<Self>,
        lease: RemoteLease,
        token: CancellationToken,
        permit: OwnedSemaphorePermit,
    ) {
        let job = Job {
            key: lease.key.clone(),
            process: lease.process.clone(),
            attempt: lease.attempt,
            fencing_token: lease.body.get("token").and_then(Value::as_i64),
        };
        let limit = self.settings.timeout.unwrap_or(Duration::MAX);
        let outcome = tokio::select! {
            result = timeout(limit, self.exec.run(job)) => match result {
                Ok(result) => outcome(result),
                Err(_) => json!({ "type": "transient", "error": format!("timed out after {limit:?}") }),
            },
            () = token.cancelled() => {
                if self.force.is_cancelled() {
                    if let Err(e) = self.api.release(&lease).await {
                        eprintln!("drover work: cannot release {}; it will expire: {e}", lease.key);
                    }
                }
                drop(permit);
                return;
            }
        };
        match self.api.complete(&lease, outcome).await {
            Ok(()) => {}
            Err(CallError::Conflict(e)) => {
                eprintln!("drover work: outcome of {} refused: {e}", lease.key)
            }
            Err(e) => eprintln!(
                "drover work: cannot record the outcome of {}: {e}",
                lease.key
            ),
        }
        drop(permit);
    }
}

/// The API's outcome object for a command's result.
fn outcome(result: Result<Action, drover::runner::BoxError>) -> Value {
    match outcome_of(result) {
        Outcome::Done => json!({ "type": "done" }),
        Outcome::RequeueAfter(after) => {
            let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            json!({ "type": "requeue_after", "after_ms": after_ms })
        }
        Outcome::Transient(error) => json!({ "type": "transient", "error": error }),
        Outcome::Permanent(error) => json!({ "type": "permanent", "error": error }),
    }
}
