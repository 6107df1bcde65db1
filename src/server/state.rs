//! [`AppState`]: what every handler shares.

use std::sync::Arc;

use axum::http::HeaderMap;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::options::ServerOptions;
use super::role::Role;
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
}

impl AppState {
    /// The caller's role: admin on an open server, else the token's role;
    /// 401 for a missing or unknown token.
    pub(crate) fn role_of(&self, headers: &HeaderMap) -> Result<Role, ApiError> {
        match &self.options.tokens {
            None => Ok(Role::Admin),
            Some(tokens) => tokens.role_of(headers).ok_or(ApiError::Unauthorized),
        }
    }
}
