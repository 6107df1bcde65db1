//! [`Controller`]: the claim loop, its background services, and graceful
//! shutdown.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::completer::Completer;
use super::config::{ControllerBuilder, Settings};
use super::finished::Finished;
use super::reconciler::Reconciler;
use super::run::Run;
use super::session::{Keeper, Live};
use super::source::Source;
use super::{Pruner, Resyncer};
use crate::metrics::RunnerMetrics;
use crate::queue::rate_limit::{Bucket, RateLimiter as _};
use crate::store::{
    Claimed, Lease, LeaseClaim, LeaseLock, LeaseRelease, ProcessConfigure, SessionId, SessionStart,
    Store, StoreEngine, StoreError, WorkerBackend,
};

/// A control loop: workers that claim keys of one process from a backend and run
/// a [`Reconciler`] on each, with a session, fencing, backoff and graceful
/// shutdown.
///
/// The backend is where the work lives: a [`Store`] (the database, the
/// default) or a [`Client`](crate::client::Client) of a drover server. The
/// loop is the same over both; only how it waits for work differs (a wake-up
/// subscription on a database, a long-polling claim over HTTP).
///
/// Guarantees, across any number of controllers on any number of machines
/// sharing one database (directly or through servers):
/// - a key runs in at most one place at a time, and a run whose lease was lost is
///   cancelled and its result discarded (the store's fencing refuses it anyway);
/// - an enqueue during a run leads to exactly one more run after it;
/// - a shutdown loses nothing: runs still going at the deadline are cancelled and
///   their keys released, pending for the next worker.
///
/// On a [`Store`] it also applies every process's retention in the
/// background ([`Pruner`], see
/// [`prune_every`](ControllerBuilder::prune_every)) and resyncs the
/// processes that ask for it ([`Resyncer`]).
///
/// ```no_run
/// use drover::runner::{Action, Controller, Task};
/// use drover::store::Store;
/// use tokio_util::sync::CancellationToken;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Store::connect("sqlite://drover.db").await?;
/// let controller = Controller::builder(store, "persist", |task: Task| async move {
///     println!("saving {}", task.key());
///     Ok::<_, std::io::Error>(Action::Done)
/// })
/// .parallelism(4)
/// .build()?;
/// controller.run(CancellationToken::new()).await?;
/// # Ok(()) }
/// ```
pub struct Controller<R, B = Store> {
    backend: B,
    reconciler: Arc<R>,
    source: Source,
    settings: Settings,
    poll: Bucket,
}

impl<R, B> std::fmt::Debug for Controller<R, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("settings", &self.settings)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// The shortest wait of an idle controller's long-polling claim, on a backend
/// that waits for work itself (a server): the server wakes the claim on
/// enqueues and polls the database for delayed keys, so a longer wait only
/// saves requests. Kept under the read timeouts of the gateways that stand
/// in front of servers (envoy's route timeout is 15 s by default, load
/// balancers' 30–60 s): a gateway's own 5xx page leaves a claim's fate
/// unknown, and the worker then gives its session up, with its runs. It was
/// 20 s.
const LONG_POLL: Duration = Duration::from_secs(10);

/// Why a controller could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Writing the process's backoff policy failed at start.
    #[error("cannot configure process {process}")]
    Configure {
        /// The process.
        process: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The first session could not be started (the database or server is
    /// unreachable, or refuses the token). Sessions lost later are replaced
    /// with retries instead.
    #[error("cannot start a session")]
    Session(#[source] StoreError),
}

impl<R: Reconciler, B: WorkerBackend> Controller<R, B> {
    /// Starts building a controller for `process` on `backend` (a [`Store`] or
    /// a [`Client`](crate::client::Client)).
    pub fn builder(
        backend: B,
        process: impl Into<String>,
        reconciler: R,
    ) -> ControllerBuilder<R, B> {
        ControllerBuilder::new(backend, process, reconciler)
    }

    pub(crate) fn new(
        backend: B,
        reconciler: Arc<R>,
        source: Source,
        settings: Settings,
        poll: Bucket,
    ) -> Self {
        Self {
            backend,
            reconciler,
            source,
            settings,
            poll,
        }
    }

    /// Runs until `shutdown` is cancelled, then shuts down gracefully: stops
    /// claiming, lets runs finish until the shutdown deadline, cancels and
    /// releases the rest, and closes the session.
    ///
    /// The first session is started before anything else, and failing to start
    /// it ends the run with [`RunError::Session`]: a wrong URL or token fails
    /// at once. Every later failure (a lost session, a database or server that
    /// goes away) is retried while the run goes on.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let process = self.settings.process.clone();
        // A shutdown asked for before the first session started ends the run
        // at once: a server or database that does not answer held it for the
        // whole of its request's timeout. A session started meanwhile, unheard
        // of, holds no lease and expires.
        if let Some(backoff) = self.settings.backoff {
            let params = ProcessConfigure::new(process.clone()).backoff(backoff);
            let Some(configured) = or_stop(&shutdown, self.backend.process_configure(params)).await
            else {
                return Ok(());
            };
            configured.map_err(|source| RunError::Configure { process, source })?;
        }
        let sent = tokio::time::Instant::now();
        let start = self.backend.session_start(SessionStart::new(
            self.settings.component.clone(),
            self.settings.ttl,
        ));
        let Some(first) = or_stop(&shutdown, start).await else {
            return Ok(());
        };
        let first = first.map_err(RunError::Session)?;
        let metrics = RunnerMetrics::global(&self.settings.process);
        let force = CancellationToken::new();
        let services_stop = CancellationToken::new();
        let services = TaskTracker::new();
        let (publish, live) = watch::channel(None);
        services.spawn(
            Keeper {
                backend: self.backend.clone(),
                settings: self.settings.clone(),
                metrics: metrics.clone(),
                force: force.clone(),
                publish,
                first: Some((first, sent)),
            }
            .run(services_stop.clone()),
        );
        if let Some(store) = self.backend.local_store() {
            let pruner = Pruner::new(store.clone()).every(self.settings.prune_every);
            services.spawn(pruner.run(services_stop.clone()));
            services.spawn(Resyncer::new(store.clone()).run(services_stop.clone()));
        }
        if B::RECLAIMS {
            services.spawn(reclaim(
                self.backend.clone(),
                self.settings.reclaim_every(),
                metrics.clone(),
                self.settings.process.clone(),
                services_stop.clone(),
            ));
        }
        let wake = self.backend.subscribe(&self.settings.process);
        let completer = Completer::start(
            self.backend.clone(),
            self.settings.heartbeat_every(),
            &services,
            services_stop.clone(),
        );
        let run = Arc::new(Run {
            backend: self.backend.clone(),
            reconciler: Arc::clone(&self.reconciler),
            settings: self.settings.clone(),
            metrics,
            completer,
            writing: Arc::new(Semaphore::new(super::run::OUTCOMES_IN_WRITING)),
            finished: matches!(self.source, Source::Query(_)).then(Finished::default),
            force: force.clone(),
        });
        let runs = TaskTracker::new();
        self.claim_loop(&shutdown, live, wake.as_deref(), &run, &runs)
            .await;

        runs.close();
        if tokio::time::timeout(self.settings.shutdown_deadline, runs.wait())
            .await
            .is_err()
        {
            tracing::warn!(process = %self.settings.process, "shutdown deadline passed; cancelling runs");
            force.cancel();
            runs.wait().await;
        }
        services_stop.cancel();
        services.close();
        services.wait().await;
        Ok(())
    }

    /// Claims while there are free slots, a live session and work; returns when
    /// `shutdown` fires.
    ///
    /// Claimed leases wait in `ready` (at most the prefetch beyond the free
    /// slots) and start as slots free up; a claim is made only when `ready`
    /// cannot fill the free slots, or when its oldest lease was claimed more
    /// than an idle poll ago (the claim's answer says whether the process
    /// was paused since; if it was, they are handed back unstarted). Leases
    /// of a session that was lost are
    /// dropped unstarted (another node reclaims them); those still waiting at
    /// shutdown go back to pending when the session is closed. Each turn is
    /// [`claim_turn`](Self::claim_turn).
    async fn claim_loop(
        &self,
        shutdown: &CancellationToken,
        mut live: watch::Receiver<Option<Live>>,
        wake: Option<&Notify>,
        run: &Arc<Run<R, B>>,
        runs: &TaskTracker,
    ) {
        let mut loop_state = Claiming {
            slots: Arc::new(Semaphore::new(self.settings.parallelism)),
            ready: VecDeque::new(),
            idle: false,
            handing_back: Vec::new(),
        };
        while self
            .claim_turn(shutdown, &mut loop_state, &mut live, wake, run, runs)
            .await
            .is_some()
        {}
    }

    /// One turn of the claim loop: start what is ready if it fills the free
    /// slots, else claim more (handling a failed claim on its own), start what
    /// came, and wait when nothing more is ready. `None` once `shutdown` fires.
    async fn claim_turn(
        &self,
        shutdown: &CancellationToken,
        loop_state: &mut Claiming,
        live: &mut watch::Receiver<Option<Live>>,
        wake: Option<&Notify>,
        run: &Arc<Run<R, B>>,
        runs: &TaskTracker,
    ) -> Option<()> {
        let permits = or_stop(shutdown, free_slots(&loop_state.slots)).await?;
        let session = or_stop(shutdown, current(live)).await?;
        loop_state.drop_lost(session.id);
        if !loop_state.handing_back.is_empty() {
            // Shutdown is heard here too: a server that does not answer held
            // a stopping worker for a request timeout (30 s) per lease.
            // Leases not handed back go back with the session's close.
            or_stop(shutdown, self.hand_back(&mut loop_state.handing_back)).await?;
        }
        let ready = &mut loop_state.ready;
        // Leases claimed within the idle poll start at once. Older ones wait
        // for a claim first, whose answer says whether the process was
        // paused since: a pause reaches prefetched keys within one poll, as
        // it reaches claims.
        let fresh = ready
            .front()
            .is_some_and(|(_, claimed)| claimed.elapsed() < self.settings.idle_poll);
        if ready.len() >= permits.len() && fresh {
            start(ready, permits, &session, run, runs);
            return Some(());
        }
        // Registered before the claim, so an enqueue during it is not missed.
        let woken = wake.map(Notify::notified);
        // At least one: a claim made to hear the gate for stale leases that
        // fill the free slots takes at most one key beyond the prefetch.
        let asked = (permits.len() + self.settings.prefetch)
            .saturating_sub(ready.len())
            .max(1);
        // Without a subscription, the backend waits for work itself (a
        // long-poll) once a claim found less than it asked for; the server
        // watches the database meanwhile, so the wait can be long. Never
        // with leases waiting to start: they wait on the answer.
        let wait = if wake.is_none() && loop_state.idle && ready.is_empty() {
            self.settings.idle_poll.max(LONG_POLL)
        } else {
            Duration::ZERO
        };
        let claim = self.claim(&session, asked, wait, run.finished.as_ref());
        // A claim still in flight when its session is lost is dropped with it
        // (what it may have leased goes back when the session expires): the
        // loop then claims under the next session at once. Over a link gone
        // silent it waited for the client's request timeout (30 s, 40 s for
        // a long-poll) while the next session claimed nothing.
        // One flat select (`or_stop` inline): with a nested future, the
        // simulation's worker future overflowed the compiler's query depth.
        let claimed = tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            () = session.token.cancelled() => return Some(()),
            claimed = claim => claimed,
        };
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                if self
                    .claim_failed(shutdown, &session, &e, live, wake)
                    .await?
                {
                    return Some(());
                }
                if !fresh && !ready.is_empty() {
                    // Stale leases wait for a claim that answers whether the
                    // process was paused since; until then, the idle poll.
                    drop(permits);
                    return self.wait_for_work(shutdown, loop_state, 0, woken).await;
                }
                Claimed::default()
            }
        };
        let next_token_in = claimed.gate.next_token_in;
        let got = claimed.leases.len();
        let now = Instant::now();
        ready.extend(claimed.leases.into_iter().map(|lease| (lease, now)));
        if claimed.gate.paused {
            // Paused since these were claimed: none of them starts. They are
            // handed back, pending again for whoever claims after the resume.
            drop(permits);
            let handing_back = &mut loop_state.handing_back;
            handing_back.extend(ready.drain(..).map(|(lease, _)| lease));
            or_stop(shutdown, self.hand_back(handing_back)).await?;
            return self.wait_for_work(shutdown, loop_state, 0, woken).await;
        }
        start(ready, permits, &session, run, runs);
        if got == asked || !ready.is_empty() {
            loop_state.idle = false;
            return Some(());
        }
        if let Some(token) = next_token_in {
            // The process's rate limit, not an empty queue, held the claim
            // back: claim again when its next token comes, not at a poll;
            // or at the poll if it comes first, so that a limit raised or
            // removed meanwhile is obeyed within one poll, as every change is.
            loop_state.idle = false;
            let nap = token.min(self.settings.idle_poll);
            return or_stop(shutdown, sleep(nap)).await;
        }
        self.wait_for_work(shutdown, loop_state, got, woken).await
    }

    /// After a failed claim: logs it, then, when the error says the session
    /// is gone or unknown, waits for the keeper to replace it (it closes the
    /// old one first, handing its leases back) and answers `true`: claim again
    /// at once under the new one. Otherwise, without wake-ups (so with no wait
    /// of its own ahead), pauses before asking a failing backend again and
    /// answers `false`. `None` once `shutdown` fires.
    async fn claim_failed(
        &self,
        shutdown: &CancellationToken,
        session: &Live,
        e: &StoreError,
        live: &mut watch::Receiver<Option<Live>>,
        wake: Option<&Notify>,
    ) -> Option<bool> {
        tracing::warn!(process = %self.settings.process, error = %e, "claim failed");
        if abandon_if_unknown(session, e) {
            or_stop(shutdown, replaced(live, session.id)).await?;
            return Some(true);
        }
        if wake.is_none() {
            let pause = self.settings.idle_poll.min(Duration::from_secs(1));
            or_stop(shutdown, sleep(pause)).await?;
        }
        Some(false)
    }

    /// Hands back the leases in `handing_back` (claimed, never started: the
    /// process was paused since). One the backend could not release stays,
    /// to be handed back at the next turn, and is never started: a release
    /// whose answer was lost may have gone through, and a lease given up so
    /// must not run. One whose lease is already lost is dropped.
    ///
    /// Each release may take a heartbeat interval: one whose answer does not
    /// come in time is kept, as one whose answer was lost, and the claim
    /// loop goes on (it waited a request timeout, 30 s over HTTP, per lease).
    async fn hand_back(&self, handing_back: &mut Vec<Lease>) {
        let mut kept = Vec::new();
        let within = self.settings.heartbeat_every();
        for lease in std::mem::take(handing_back) {
            let release = self.backend.lease_release(LeaseRelease { lease: &lease });
            match tokio::time::timeout(within, release).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_lease_rejection() => {}
                Ok(Err(e)) => {
                    tracing::warn!(process = %self.settings.process, key = %lease.key, error = %e, "could not hand back a lease of a paused process");
                    kept.push(lease);
                }
                Err(_) => {
                    tracing::warn!(process = %self.settings.process, key = %lease.key, "handing back a lease of a paused process timed out");
                    kept.push(lease);
                }
            }
        }
        *handing_back = kept;
    }

    /// Nothing more is ready: waits for an enqueue (`woken`) or the idle poll.
    /// Only a poll that found nothing right after another one that found
    /// nothing costs a token of the poll bucket: idle loops (and nodes that
    /// keep losing the race for woken keys) cannot hammer the database, while
    /// busy ones, and wake-ups that find work, are never slowed down. `None`
    /// once `shutdown` fires.
    async fn wait_for_work(
        &self,
        shutdown: &CancellationToken,
        loop_state: &mut Claiming,
        got: usize,
        woken: Option<Notified<'_>>,
    ) -> Option<()> {
        // Counted from now, so it overlaps the wait for a wake-up below.
        let pause = sleep(if got == 0 && loop_state.idle {
            self.poll.when(&())
        } else {
            Duration::ZERO
        });
        // Without a subscription a partial claim, too, makes the next claim
        // wait (long-poll) for more.
        loop_state.idle = got == 0 || woken.is_none();
        if let Some(woken) = woken {
            let wake_or_poll = async {
                tokio::select! {
                    () = woken => {}
                    () = sleep(self.settings.idle_poll) => {}
                }
            };
            or_stop(shutdown, wake_or_poll).await?;
        }
        or_stop(shutdown, pause).await
    }

    async fn claim(
        &self,
        session: &Live,
        max: usize,
        wait: Duration,
        finished: Option<&Finished>,
    ) -> Result<Claimed, StoreError> {
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        let process = &self.settings.process;
        match (&self.source, self.backend.local_store()) {
            (Source::Queue, _) => {
                let params = LeaseClaim {
                    session: session.id,
                    process: process.clone(),
                    max,
                    trace_links: super::trace::links_wanted(),
                };
                self.backend.lease_claim_wait(params, wait).await
            }
            // `build` refuses a query source on a backend without a store.
            (Source::Query(_), None) => Ok(Claimed::default()),
            (Source::Query(query), Some(store)) => {
                // Runs of a query source always record their endings.
                let unrecorded = Finished::default();
                let finished = finished.unwrap_or(&unrecorded);
                finished.begin();
                let keys = match query(store.clone(), max).await {
                    Ok(keys) => keys,
                    Err(e) => {
                        tracing::warn!(%process, error = %e, "candidate query failed");
                        return Ok(Claimed::default());
                    }
                };
                let leases = self
                    .lock_candidates(store, session, keys, max as usize, finished)
                    .await?;
                if !leases.is_empty() {
                    return Ok(Claimed::open(leases));
                }
                // No lock went through, so none said whether the process is
                // paused: keys locked ahead start only if it is not.
                let paused = store.process_paused(process).await?;
                Ok(Claimed {
                    gate: crate::store::ClaimGate {
                        paused,
                        ..crate::store::ClaimGate::default()
                    },
                    ..Claimed::default()
                })
            }
        }
    }

    /// Locks candidates one by one until `max` are held, skipping keys that are
    /// leased, backing off or parked, and keys whose run on this node ended
    /// since the query began (see [`Finished`]).
    async fn lock_candidates(
        &self,
        store: &Store,
        session: &Live,
        keys: Vec<String>,
        max: usize,
        finished: &Finished,
    ) -> Result<Vec<Lease>, StoreError> {
        let mut leases = Vec::new();
        for key in keys {
            if leases.len() == max {
                break;
            }
            if finished.contains(&key) {
                continue;
            }
            let params = LeaseLock {
                session: session.id,
                process: self.settings.process.clone(),
                key,
            };
            match store.lease_lock(params).await {
                Ok(lease) if finished.contains(&lease.key) => {
                    // Its last run ended between the check above and the lock.
                    // Not released, it would stay leased to a session that
                    // lives on and never run again: the session is given up
                    // instead, and closing it hands the lease back (a lease
                    // refused is another's already).
                    let release = StoreEngine::lease_release(store, LeaseRelease { lease: &lease });
                    if let Err(e) = release.await
                        && !e.is_lease_rejection()
                    {
                        tracing::warn!(key = %lease.key, error = %e, "cannot release a stale candidate; its session is given up");
                        session.abandon();
                        return Ok(Vec::new());
                    }
                }
                Ok(lease) => leases.push(lease),
                Err(
                    StoreError::AlreadyLeased { .. }
                    | StoreError::InBackoff { .. }
                    | StoreError::Parked { .. },
                ) => {}
                // Paused, or at a fleet limit: no other candidate would do.
                Err(StoreError::Held { .. }) => break,
                Err(StoreError::InvalidKey { key, reason }) => {
                    tracing::warn!(%key, %reason, "candidate query returned an invalid key");
                }
                Err(e) if leases.is_empty() => return Err(e),
                Err(e) if abandon_if_unknown(session, &e) => {
                    // The session is given up: what it locked goes back with
                    // it, none of it started under a session being closed.
                    tracing::warn!(error = %e, "lock failed; its session is given up");
                    return Ok(Vec::new());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lock failed; running what is locked");
                    break;
                }
            }
        }
        Ok(leases)
    }
}

/// What the claim loop keeps from one turn to the next.
#[derive(Debug)]
struct Claiming {
    /// One permit per run the controller may have in flight.
    slots: Arc<Semaphore>,
    /// Claimed leases not started yet (the prefetch), oldest first, each
    /// with when it was claimed.
    ready: VecDeque<(Lease, Instant)>,
    /// Whether the last claim found less than it asked for.
    idle: bool,
    /// Claimed leases of a paused process whose hand-back has not been
    /// answered yet: handed back again at each turn, never started.
    handing_back: Vec<Lease>,
}

impl Claiming {
    /// Drops the ready leases of a lost session. Claims come in order and a
    /// new session only replaces an old one, so they are the oldest: at the
    /// front.
    fn drop_lost(&mut self, session: SessionId) {
        while self
            .ready
            .front()
            .is_some_and(|(lease, _)| lease.session != session)
        {
            self.ready.pop_front();
        }
        // Closing a lost session handed its leases back already.
        self.handing_back.retain(|lease| lease.session == session);
    }
}

/// `future`'s output, unless `shutdown` fires first (checked first, so a loop
/// that is told to stop starts nothing more).
async fn or_stop<T>(shutdown: &CancellationToken, future: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        out = future => Some(out),
    }
}

/// Starts a run for each free slot that a waiting lease can fill, oldest lease
/// first; slots left over are given back.
fn start<R: Reconciler, B: WorkerBackend>(
    ready: &mut VecDeque<(Lease, Instant)>,
    permits: Vec<OwnedSemaphorePermit>,
    session: &Live,
    run: &Arc<Run<R, B>>,
    runs: &TaskTracker,
) {
    for permit in permits {
        let Some((lease, _)) = ready.pop_front() else {
            return;
        };
        // Boxed: the run future is kilobytes, and tokio would copy it into the
        // task and again at each stage change (9 % of a burn-down's samples).
        // The session's own token, not a child: nothing cancels one run's
        // token alone here (a timeout cancels the reconcile's own child, in
        // `Run::reconcile`), and a child is an allocation and two locks of
        // the session token's tree per run.
        // Tracked as the session's, so that a session given up is closed
        // (its leases handed back) only once its runs have stopped.
        runs.spawn(Box::pin(session.track(Arc::clone(run).execute(
            lease,
            session.token.clone(),
            permit,
        ))));
    }
}

/// Waits for one free slot, then takes every other free one too, so a claim asks
/// for as many keys as can run.
async fn free_slots(slots: &Arc<Semaphore>) -> Vec<OwnedSemaphorePermit> {
    // The semaphore is never closed, so acquiring cannot fail.
    let first = Arc::clone(slots)
        .acquire_owned()
        .await
        .expect("slot semaphore is never closed");
    let mut permits = vec![first];
    while let Ok(permit) = Arc::clone(slots).try_acquire_owned() {
        permits.push(permit);
    }
    permits
}

/// A claim or lock whose commit is unknown may have leased keys this node will
/// never hear of, held for as long as the session lives: give the session up
/// (see [`Live::abandon`]) and say so. Retrying instead could lease twice as many.
/// A claim refused because the session expired gives it up too, so a new one
/// starts at once instead of at the next heartbeat.
fn abandon_if_unknown(session: &Live, e: &StoreError) -> bool {
    let give_up = e.is_commit_unknown() || matches!(e, StoreError::SessionExpired { .. });
    if give_up {
        session.abandon();
    }
    give_up
}

/// Waits until a session other than `old` is live.
async fn replaced(live: &mut watch::Receiver<Option<Live>>, old: SessionId) {
    let next = live.wait_for(|now| now.as_ref().is_some_and(|l| l.id != old));
    if next.await.is_err() {
        // The keeper is gone only at shutdown; wait for the caller's select.
        std::future::pending::<()>().await;
    }
}

/// Waits until a session is live and returns it.
async fn current(live: &mut watch::Receiver<Option<Live>>) -> Live {
    loop {
        if let Some(session) = live.borrow_and_update().clone() {
            return session;
        }
        if live.changed().await.is_err() {
            // The keeper is gone only at shutdown; wait for the caller's select.
            std::future::pending::<()>().await;
        }
    }
}

/// Reclaims expired sessions' leases every `every` until `stop` fires, waking
/// the claim loops of `process` when leases came back (they are ready at once).
async fn reclaim<B: WorkerBackend>(
    backend: B,
    every: Duration,
    metrics: RunnerMetrics,
    process: String,
    stop: CancellationToken,
) {
    loop {
        let reclaimed = tokio::select! {
            () = stop.cancelled() => return,
            reclaimed = backend.session_reclaim() => reclaimed,
        };
        match reclaimed {
            Ok(report) => {
                metrics.leases_reclaimed.inc_by(report.leases);
                if report.leases > 0 {
                    crate::store::wakeup::notify(&process);
                }
                if report.sessions > 0 {
                    tracing::info!(
                        sessions = report.sessions,
                        leases = report.leases,
                        "reclaimed expired sessions"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "reclaiming expired sessions failed"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep(every) => {}
        }
    }
}
