//! A session's start as both engines check and store it: the TTL it must
//! have and the texts cleaned before they are written.

use sqlx::query::QueryAs;

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

    /// Binds the session's values to an engine's `INSERT INTO
    /// drover_sessions` in the order both engines' statements take them:
    /// the component (`1`), the TTL in milliseconds (`2`), the start `now`
    /// (`3`, as the engine keeps times), then host, pid, version and owner
    /// (`4`–`7`). The engines differ only in their SQL.
    pub(crate) fn bind<'q, DB, O, T>(
        &self,
        query: QueryAs<'q, DB, O, DB::Arguments>,
        now: T,
    ) -> QueryAs<'q, DB, O, DB::Arguments>
    where
        DB: sqlx::Database,
        T: 'q,
        for<'t> T: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> Option<String>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> Option<i64>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.component.clone())
            .bind(self.ttl_ms)
            .bind(now)
            .bind(self.host.clone())
            .bind(self.pid)
            .bind(self.version.clone())
            .bind(self.owner.map(str::to_owned))
    }
}
