//! The session keeper: one live session per controller, renewed every TTL/3.
//!
//! A failed heartbeat is retried (BMDB dropped the session on the first error,
//! so one network blip restarted every worker) until this node's own timer says
//! the database may soon give the session away: ttl − margin after the last
//! successful heartbeat was *sent* (see [`super::lapse`]). When the session is
//! lost — the timer fired, or the database says it expired — its token is
//! cancelled, which cancels every run started under it, and a new session
//! starts.
//!
//! A claim whose commit went unknown (the connection broke at `COMMIT`) may
//! have leased keys nobody here knows of; nothing would ever finish or release
//! them while the session lives. The claim loop then abandons the session: its
//! runs are cancelled, and once they have stopped the session is closed (which
//! hands every lease it still has back, the unknown ones included) and a new
//! one starts.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::Settings;
use super::lapse::{Held, hold};
use crate::metrics::RunnerMetrics;
use crate::store::{
    Session, SessionClose, SessionHeartbeat, SessionId, SessionStart, WorkerBackend,
};

/// How long closing a session may take at shutdown before it is left to
/// expire: part of what a shutdown may take past its deadline.
const CLOSE_WITHIN: Duration = Duration::from_millis(500);

/// The session work is claimed under, with the token that fires when it is lost.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) id: SessionId,
    pub(crate) token: CancellationToken,
    /// The runs started under this session ([`Live::track`]): an abandoned
    /// session is closed only once they have stopped.
    runs: TaskTracker,
    /// Cancelled by [`Live::abandon`].
    abandoned: CancellationToken,
}

impl Live {
    /// Asks the keeper to give this session up: cancel its runs, close it
    /// (releasing every lease it holds) and start a new one. For a claim whose
    /// commit is unknown, which may have leased keys this node never heard of.
    pub(crate) fn abandon(&self) {
        self.abandoned.cancel();
    }

    /// `run`, counted as one of this session's runs until it ends.
    pub(crate) fn track<F: Future>(&self, run: F) -> impl Future<Output = F::Output> + use<F> {
        self.runs.track_future(run)
    }

    /// A session just started: its own token under `force`, no runs yet.
    fn new(id: SessionId, force: &CancellationToken) -> Self {
        Self {
            id,
            token: force.child_token(),
            runs: TaskTracker::new(),
            abandoned: CancellationToken::new(),
        }
    }
}

/// Keeps a session alive and publishes it; see the module doc.
pub(crate) struct Keeper<B> {
    pub(crate) backend: B,
    pub(crate) settings: Settings,
    pub(crate) metrics: RunnerMetrics,
    /// Parent of every session token: cancelled when shutdown forces.
    pub(crate) force: CancellationToken,
    pub(crate) publish: watch::Sender<Option<Live>>,
    /// The session [`Controller::run`](super::Controller::run) started before
    /// the keeper (so a wrong URL, token or database fails the run at once),
    /// with the instant taken before its start was sent.
    pub(crate) first: Option<(Session, Instant)>,
}

/// How a session ended.
enum End {
    Lost,
    /// Given up on request ([`Live::abandon`]).
    Abandoned,
    Stopped,
}

impl<B: WorkerBackend> Keeper<B> {
    /// Runs until `stop` fires, then closes the session it holds (giving its
    /// remaining leases back).
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        while let Some((live, sent)) = self.start(&stop).await {
            self.publish.send_replace(Some(live.clone()));
            self.metrics.sessions_active.inc();
            let end = self.keep_alive(&live, sent, &stop).await;
            self.publish.send_replace(None);
            self.metrics.sessions_active.dec();
            live.token.cancel();
            match end {
                End::Lost => tracing::warn!(session = %live.id, "session lost; starting a new one"),
                End::Abandoned => {
                    tracing::warn!(
                        session = %live.id,
                        "a claim's commit is unknown or its session expired; closing it so that any \
                         lease it took goes back, and starting a new one"
                    );
                    // Shutdown is heard meanwhile: a close over a link gone
                    // silent waited its whole TTL whatever the shutdown's
                    // deadline. The controller stops the keeper only once
                    // every run has ended, so the session is then closed as
                    // at any shutdown, within `CLOSE_WITHIN`.
                    let give_up = async {
                        self.stopped(&live).await;
                        self.close(live.id, self.settings.ttl).await;
                    };
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => {
                            self.close(live.id, CLOSE_WITHIN).await;
                            return;
                        }
                        () = give_up => {}
                    }
                }
                End::Stopped => {
                    self.close(live.id, CLOSE_WITHIN).await;
                    return;
                }
            }
        }
    }

    /// Starts a session, retrying transient failures until `stop` fires; with
    /// it, the instant taken before its start was sent.
    async fn start(&mut self, stop: &CancellationToken) -> Option<(Live, Instant)> {
        if let Some((session, sent)) = self.first.take() {
            return Some((Live::new(session.id, &self.force), sent));
        }
        let mut delay = Duration::from_millis(50);
        loop {
            let params = SessionStart::new(self.settings.component.clone(), self.settings.ttl);
            let sent = Instant::now();
            // Each try is bounded by a heartbeat interval, as a heartbeat is:
            // over a link gone silent one try waited the client's request
            // timeout (30 s) before the next, while the worker claimed
            // nothing. A start given up may have started a session nobody
            // hears of: it holds no lease, and expires.
            let start = timeout(
                self.settings.heartbeat_every(),
                self.backend.session_start(params),
            );
            let started = tokio::select! {
                () = stop.cancelled() => return None,
                started = start => started,
            };
            match started {
                Ok(Ok(session)) => return Some((Live::new(session.id, &self.force), sent)),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot start a session; retrying"),
                Err(_) => tracing::warn!("starting a session timed out; retrying"),
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = sleep(delay) => {}
            }
            delay = (delay * 2).min(self.settings.heartbeat_every());
        }
    }

    /// Heartbeats until the session is lost or abandoned, or `stop` fires.
    /// `sent` is the instant taken before the session start was sent: the
    /// session is given up by this node's clock (see [`super::lapse`]).
    async fn keep_alive(&self, live: &Live, sent: Instant, stop: &CancellationToken) -> End {
        let id = live.id;
        let beat = || async move {
            let params = SessionHeartbeat { session: id };
            self.backend.session_heartbeat(params).await.map(drop)
        };
        let until = async {
            tokio::select! {
                () = stop.cancelled() => End::Stopped,
                () = live.abandoned.cancelled() => End::Abandoned,
            }
        };
        match hold(self.settings.ttl, sent, beat, until).await {
            Held::Lost => End::Lost,
            Held::Until(end) => end,
        }
    }

    /// Waits until the runs of `live` (its token cancelled) have stopped, for
    /// one TTL at most. Closing a session hands its leases back at once,
    /// where losing it hands them on only past its deadline: closed while a
    /// cancelled run still stopped (a reconcile's grace to return, a command
    /// being killed), its key could start again, here or on another node,
    /// beside it. Past one TTL without a heartbeat the database gives the
    /// leases away anyway.
    async fn stopped(&self, live: &Live) {
        live.runs.close();
        if timeout(self.settings.ttl, live.runs.wait()).await.is_err() {
            tracing::warn!(
                session = %live.id,
                "runs of a session given up have not stopped within its TTL; closing it anyway"
            );
        }
    }

    /// Closes the session, handing its leases back; gives up after `within`
    /// (the session then expires and is reclaimed), so that an unreachable
    /// database cannot hold shutdown up.
    async fn close(&self, id: SessionId, within: Duration) {
        let close = self.backend.session_close(SessionClose { session: id });
        match timeout(within, close).await {
            Ok(Ok(released)) if released > 0 => {
                tracing::info!(session = %id, released, "session closed; leases released");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(session = %id, error = %e, "cannot close the session; it will expire")
            }
            Err(_) => {
                tracing::warn!(session = %id, "closing the session timed out; it will expire")
            }
        }
    }
}
