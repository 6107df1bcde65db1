//! [`AppState`]: what every handler shares.

use std::sync::Arc;

use axum::http::HeaderMap;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::handed::HandedOut;
use super::known::KnownProcesses;
use super::options::ServerOptions;
use super::owner::{SessionOwners, Standing, fingerprint};
use super::role::Role;
use super::waiting::Waiting;
use crate::metrics::ServerMetrics;
use crate::store::Store;

/// The handlers' shared state; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    /// The store every request works on.
    pub(crate) store: Store,
    /// The process page's slow reads, kept a few seconds.
    pub(crate) slow_reads: super::dashboard::SlowReads,
    /// Limits and tokens.
    pub(crate) options: Arc<ServerOptions>,
    /// HTTP and database metrics.
    pub(crate) metrics: Arc<ServerMetrics>,
    /// Fires on shutdown, ending waiting claims at once.
    pub(crate) shutdown: CancellationToken,
    /// Which token owns each session this server has seen.
    pub(crate) owners: Arc<SessionOwners>,
    /// When this server handed out each lease it has not seen end.
    pub(crate) handed: Arc<HandedOut>,
    /// The claims waiting for work, by process.
    pub(crate) waiting: Arc<Waiting>,
    /// The processes enqueues may go to without creating one.
    pub(crate) known: Arc<KnownProcesses>,
}

impl AppState {
    /// The caller's role and its token's fingerprint (see `owner.rs`):
    /// admin and no fingerprint on an open server; 401 for a missing or
    /// unknown token.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<(Role, Option<String>), ApiError> {
        match &self.options.tokens {
            None => Ok((Role::Admin, None)),
            Some(tokens) => tokens
                .caller_of(headers)
                .map(|(role, token)| (role, Some(fingerprint(&token))))
                .ok_or(ApiError::Unauthorized),
        }
    }

    /// Refuses `auth`'s caller unless it started `session` (see `owner.rs`);
    /// an unknown session is answered as an expired one, 409
    /// `session_expired`, without acting on it.
    pub(crate) async fn check_owner<C>(
        &self,
        auth: &super::auth::Authorized<C>,
        session: crate::store::SessionId,
    ) -> Result<(), ApiError> {
        match self.standing(auth, session).await? {
            Standing::Yours => Ok(()),
            Standing::Unknown => Err(crate::store::StoreError::SessionExpired { session }.into()),
        }
    }

    /// What the owner check found of `session` (see
    /// [`SessionOwners::check`](super::owner::SessionOwners::check)), for an
    /// act that answers an unknown session itself.
    pub(crate) async fn standing<C>(
        &self,
        auth: &super::auth::Authorized<C>,
        session: crate::store::SessionId,
    ) -> Result<Standing, ApiError> {
        self.owners
            .check(&self.store, auth.owner.as_deref(), session)
            .await
    }
}
