//! A session's start as both engines check and store it: the TTL it must
//! have and the texts cleaned before they are written.

use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::params::SessionStart;
use crate::store::text::clean_text;

/// The row values of a session to start, checked and cleaned.
#[derive(Debug)]
pub(crate) struct NewSession<'a> {
    /// The TTL in whole milliseconds (at least 1), clamped to drover's
    /// maximum delay.
    pub(crate) ttl_ms: i64,
    /// The component, cleaned (what the session answers with, too).
    pub(crate) component: String,
    /// The worker's host name, cleaned.
    pub(crate) host: Option<String>,
    /// The worker's process id.
    pub(crate) pid: Option<i64>,
    /// The worker's drover version, cleaned.
    pub(crate) version: Option<String>,
    /// Who may act on the session through a server.
    pub(crate) owner: Option<&'a str>,
}

impl<'a> NewSession<'a> {
    /// `params`' values, or [`StoreError::InvalidArgument`] for a TTL under
    /// 1 ms.
    pub(crate) fn checked(params: &'a SessionStart) -> Result<Self, StoreError> {
        let ttl_ms = duration_ms(params.ttl);
        if ttl_ms < 1 {
            return Err(StoreError::InvalidArgument(
                "a session's ttl must be at least 1 ms".into(),
            ));
        }
        let cleaned = |text: &Option<String>| text.as_deref().map(|t| clean_text(t).into_owned());
        Ok(Self {
            ttl_ms,
            component: clean_text(&params.component).into_owned(),
            host: cleaned(&params.identity.host),
            pid: params.identity.pid.map(i64::from),
            version: cleaned(&params.identity.version),
            owner: params.owner.as_deref(),
        })
    }
}
