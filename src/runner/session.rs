//! The session keeper: one live session per controller, renewed every TTL/3.
//!
//! A failed heartbeat is retried until the session's deadline has passed (BMDB
//! dropped the session on the first error, so one network blip restarted every
//! worker). When the session is lost — the database says it expired, or the
//! deadline passed without a successful heartbeat — its token is cancelled, which
//! cancels every run started under it, and a new session starts.
//!
//! A claim whose commit went unknown (the connection broke at `COMMIT`) may
//! have leased keys nobody here knows of; nothing would ever finish or release
//! them while the session lives. The claim loop then abandons the session: its
//! runs are cancelled, the session is closed (which hands every lease it still
//! has back, the unknown ones included) and a new one starts.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::config::Settings;
use super::metrics::RunnerMetrics;
use crate::store::{
    Session, SessionClose, SessionHeartbeat, SessionId, SessionStart, StoreError, WorkerBackend,
};

/// The session work is claimed under, with the token that fires when it is lost.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) id: SessionId,
    pub(crate) token: CancellationToken,
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
    /// the keeper, so a wrong URL, token or database fails the run at once.
    pub(crate) first: Option<Session>,
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
        while let Some(live) = self.start(&stop).await {
            self.publish.send_replace(Some(live.clone()));
            self.metrics.sessions_active.inc();
            let end = self.keep_alive(&live, &stop).await;
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
                    self.close(live.id).await;
                }
                End::Stopped => {
                    self.close(live.id).await;
                    return;
                }
            }
        }
    }

    /// Starts a session, retrying transient failures until `stop` fires.
    async fn start(&mut self, stop: &CancellationToken) -> Option<Live> {
        if let Some(session) = self.first.take() {
            return Some(Live {
                id: session.id,
                token: self.force.child_token(),
                abandoned: CancellationToken::new(),
            });
        }
        let mut delay = Duration::from_millis(50);
        loop {
            let params = SessionStart {
                component: self.settings.component.clone(),
                ttl: self.settings.ttl,
            };
            match self.backend.session_start(params).await {
                Ok(session) => {
                    let token = self.force.child_token();
                    return Some(Live {
                        id: session.id,
                        token,
                        abandoned: CancellationToken::new(),
                    });
                }
                Err(e) => tracing::warn!(error = %e, "cannot start a session; retrying"),
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = sleep(delay) => {}
            }
            delay = (delay * 2).min(self.settings.heartbeat_every());
        }
    }

    /// Heartbeats until the session is lost or abandoned, or `stop` fires.
    async fn keep_alive(&self, live: &Live, stop: &CancellationToken) -> End {
        let (id, ttl) = (live.id, self.settings.ttl);
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return End::Stopped,
                () = live.abandoned.cancelled() => return End::Abandoned,
                () = sleep(self.settings.heartbeat_every()) => {}
            }
            loop {
                let beat = timeout(
                    ttl / 3,
                    self.backend
                        .session_heartbeat(SessionHeartbeat { session: id }),
                );
                match beat.await {
                    Ok(Ok(_)) => {
                        renewed = Instant::now();
                        break;
                    }
                    Ok(Err(StoreError::SessionExpired { .. })) => return End::Lost,
                    Ok(Err(e)) => {
                        tracing::warn!(session = %id, error = %e, "heartbeat failed; retrying")
                    }
                    Err(_) => tracing::warn!(session = %id, "heartbeat timed out; retrying"),
                }
                // The deadline was at most `ttl` after the last renewal: past it,
                // another node may already have reclaimed our leases.
                if renewed.elapsed() >= ttl {
                    return End::Lost;
                }
                tokio::select! {
                    () = stop.cancelled() => return End::Stopped,
                    () = live.abandoned.cancelled() => return End::Abandoned,
                    () = sleep(ttl / 10) => {}
                }
            }
        }
    }

    async fn close(&self, id: SessionId) {
        match self
            .backend
            .session_close(SessionClose { session: id })
            .await
        {
            Ok(released) if released > 0 => {
                tracing::info!(session = %id, released, "session closed; leases released");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "cannot close the session; it will expire")
            }
        }
    }
}
