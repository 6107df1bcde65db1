//! [`StoreError`]: every way a store operation can fail, in drover's words.

use std::fmt;

use chrono::{DateTime, Utc};

use super::types::{FencingToken, SessionId};

/// Why a store operation failed.
///
/// Engine-specific errors (SQLite result codes, PostgreSQL SQLSTATEs) are mapped to
/// these variants by the engine adapters, so callers can react to `LeaseLost` or
/// `Busy` the same way whichever database sits underneath. Every variant that
/// rejects an operation guarantees the operation changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL could not be parsed.
    #[error("invalid database URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A drover server's URL (`--server`, the `client` module's
    /// `Client::new`) is not one to send requests to.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidServerUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL names an engine drover does not have, or one this build left
    /// out (the `sqlite` and `postgres` features).
    #[error("unsupported database scheme {scheme:?}: use {ENGINE_URLS}")]
    UnsupportedScheme {
        /// The scheme found in the URL.
        scheme: String,
    },
    /// The database could not be reached or refused the connection.
    #[cfg(feature = "_engine")]
    #[error("cannot connect to {url}{}", connect_hint(source))]
    Connect {
        /// The URL, with any password removed.
        url: String,
        /// What the driver reported.
        #[source]
        source: DriverError,
    },
    /// The database did not answer within the connect timeout.
    #[error("cannot connect to {url}: no answer within {timeout:?}")]
    ConnectTimeout {
        /// The URL, with any password removed.
        url: String,
        /// How long drover waited.
        timeout: std::time::Duration,
    },
    /// The database holds a schema written by a newer drover; this binary refuses to
    /// touch it rather than misread it.
    #[error(
        "the database schema is version {found}, newer than this drover supports ({supported}); upgrade drover"
    )]
    SchemaTooNew {
        /// The newest migration applied to the database.
        found: i64,
        /// The newest migration this binary knows.
        supported: i64,
    },
    /// The database schema is older than this binary and migrations were not
    /// requested on connect.
    #[error(
        "the database schema is version {found}, older than this drover needs ({supported}); run `drover migrate`"
    )]
    SchemaBehind {
        /// The newest migration applied to the database (0 = none).
        found: i64,
        /// The newest migration this binary knows.
        supported: i64,
    },
    /// Applying the embedded migrations failed.
    #[cfg(feature = "_engine")]
    #[error("cannot migrate the database")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A key is empty, longer than 1024 bytes or contains NUL.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key (cut to 64 characters when long).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A process name is empty, longer than 1024 bytes or contains NUL.
    #[error("invalid process name {process:?}: {reason}")]
    InvalidProcess {
        /// The name (cut to 64 characters when long).
        process: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A query named a process that was never enqueued to nor configured.
    #[error("unknown process {0:?}")]
    UnknownProcess(String),
    /// A table watch cannot be installed: the table or a column does not
    /// exist, the key column's type cannot be a key, or the table is watched
    /// already. Nothing was installed.
    #[error("{0}")]
    Watch(String),
    /// A parameter is out of range (a zero TTL, a zero limit, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The session is gone or past its deadline: its leases may already belong to
    /// someone else. Start a new session.
    #[error("session {session} expired")]
    SessionExpired {
        /// The expired session.
        session: SessionId,
    },
    /// The lease is no longer held (reclaimed, released, or superseded by a newer
    /// fencing token): the caller must stop working on the key.
    #[error("lease on {process}/{key} (token {token}) was lost")]
    LeaseLost {
        /// The lease's process.
        process: String,
        /// The lease's key.
        key: String,
        /// The stale fencing token.
        token: FencingToken,
    },
    /// `lease_lock` was refused because another session holds the key.
    #[error("{process}/{key} is leased by another worker")]
    AlreadyLeased {
        /// The process.
        process: String,
        /// The key.
        key: String,
    },
    /// `lease_lock` was refused because the key is not ready yet: backing off
    /// after a failure, or delayed (a `RequeueAfter` outcome, an enqueue's
    /// `after`) until `until`.
    #[error("{process}/{key} is backing off or delayed until {until}")]
    InBackoff {
        /// The process.
        process: String,
        /// The key.
        key: String,
        /// When the backoff or the delay ends.
        until: DateTime<Utc>,
    },
    /// `lease_lock` was refused because the key is parked after a permanent error;
    /// an enqueue revives it.
    #[error("{process}/{key} is parked after a permanent error")]
    Parked {
        /// The process.
        process: String,
        /// The key.
        key: String,
    },
    /// `lease_lock` was refused by the process's fleet controls: it is paused,
    /// at its concurrency limit, or out of rate-limit tokens. Try again later
    /// (a claim would have taken nothing either).
    #[error("{process} is {why}")]
    Held {
        /// The process.
        process: String,
        /// `paused`, `at its concurrency limit` or `out of rate-limit tokens`.
        why: &'static str,
    },
    /// One outcome of a completion batch was not written because another
    /// transaction holds its key's row: a caller's transaction that enqueued
    /// the running key and has not committed yet, or an operator's action in
    /// flight (PostgreSQL). The batch's other outcomes were written; this one
    /// changed nothing and may be sent again once that transaction ends. A
    /// completion waits 100 ms at most for such a row and then skips it, so
    /// one caller's open transaction holds back the outcome of its own keys
    /// only, not every outcome written in the same batch.
    #[error(
        "{process}/{key} is held by another transaction; its outcome was not written: send it again"
    )]
    KeyBusy {
        /// The process.
        process: String,
        /// The key whose row is held.
        key: String,
    },
    /// Contention outlasted drover's patience: SQLite stayed locked past its busy
    /// timeout, PostgreSQL kept aborting the transaction (serialization failure,
    /// deadlock) through every retry, or no pooled connection came free. Nothing
    /// was written; retrying later may succeed.
    #[cfg(feature = "_engine")]
    #[error("the database is busy")]
    Busy(#[source] DriverError),
    /// The connection to the database failed before the operation committed,
    /// or the server refused it as read-only (a standby, a demoted primary) or
    /// shutting down, so nothing was written; retrying (on a fresh connection,
    /// to whichever host then accepts writes) may succeed. The PostgreSQL
    /// engine retries these itself a few times before reporting one. The
    /// message names the cause.
    #[cfg(feature = "_engine")]
    #[error("{}", unavailable(.0))]
    Unavailable(#[source] DriverError),
    /// The connection failed while committing: the operation may or may not have
    /// been applied. Not retried, since applying it twice could be wrong; a lost
    /// claim's leases stay with the session until it is closed or reclaimed.
    #[cfg(feature = "_engine")]
    #[error(
        "the database connection failed while committing; the outcome is unknown: the write may have committed"
    )]
    CommitUnknown(#[source] DriverError),
    /// The database ended the transaction because it sat idle between its
    /// statements past its bound: a caller's transaction
    /// ([`Store::begin`](super::Store::begin)) past
    /// [`StoreOptions::caller_idle_timeout`](super::StoreOptions::caller_idle_timeout),
    /// or one of drover's own past 5 s (its process was frozen). The
    /// transaction was rolled back, so nothing of it was written; run it
    /// again, whole.
    #[cfg(feature = "_engine")]
    #[error(
        "the database ended the transaction after it sat idle too long: nothing of it was written; run it again (for a caller's transaction, keep it busy or raise StoreOptions::caller_idle_timeout)"
    )]
    IdleTimeout(#[source] DriverError),
    /// The database has no room left for the write: its disk is full (SQLite's
    /// `SQLITE_FULL`, PostgreSQL's `disk_full`) or a SQLite file reached its
    /// size limit. The transaction was rolled back, so nothing was written;
    /// the same operation may succeed once space is freed.
    #[cfg(feature = "_engine")]
    #[error(
        "the database has no room left (its disk is full): nothing was written; free space, then retry"
    )]
    Full(#[source] DriverError),
    /// Any other database error.
    #[cfg(feature = "_engine")]
    #[error("database error")]
    Database(#[source] DriverError),
    /// A drover server (the [`client`](crate::client) backend) failed to answer
    /// as its API promises: unreachable, a timeout, a 5xx or a reply that does
    /// not parse. [`RemoteError::unknown`] says whether the request may have
    /// been applied (it was sent and no answer came back), like
    /// [`CommitUnknown`](Self::CommitUnknown) on a database.
    #[error("drover server: {0}")]
    Remote(RemoteError),
}

/// What an [`StoreError::Unavailable`] means, in words, from its SQLSTATE.
#[cfg(feature = "_engine")]
fn unavailable(e: &DriverError) -> &'static str {
    let code = match e.get() {
        sqlx::Error::Database(db) => db.code().map(std::borrow::Cow::into_owned),
        _ => None,
    };
    match code.as_deref() {
        Some("25006") => {
            "the database is read-only (a standby, or a primary that was demoted): nothing was \
             written; drover reconnects to the host that accepts writes, retry"
        }
        Some(c) if c.starts_with("57P") => {
            "the database server is shutting down or restarting: nothing was written; retry \
             once it (or its promoted standby) accepts connections"
        }
        _ => {
            "the database connection failed (host unreachable or the link broke) before \
             committing: nothing was written; retry"
        }
    }
}

/// A hint after "cannot connect to URL" naming the cause: a refused login, an
/// unreachable host.
#[cfg(feature = "_engine")]
fn connect_hint(e: &DriverError) -> &'static str {
    match e.get() {
        sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("28")) => {
            " (authentication refused: check the user and password)"
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            " (host unreachable: check the host, the port and that the server runs)"
        }
        _ => "",
    }
}

/// The database URLs this build accepts, for error messages.
pub(crate) const ENGINE_URLS: &str = match (cfg!(feature = "sqlite"), cfg!(feature = "postgres")) {
    (true, true) => "sqlite://PATH, sqlite::memory: or postgres://…",
    (true, false) => "sqlite://PATH or sqlite::memory: (this drover is built without `postgres`)",
    (false, true) => "postgres://… (this drover is built without `sqlite`)",
    (false, false) => "a drover server's client (this drover is built without any database engine)",
};

/// A failed call to a drover server, in the terms a worker acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    /// What went wrong (the method and path, the status, the server's message).
    pub message: String,
    /// The HTTP status, when one came back.
    pub status: Option<u16>,
    /// `true` when the request was sent and its fate is unknown (a timeout, a
    /// connection lost before the answer, a 5xx page of a gateway in front
    /// of the server rather than drover's own answer, or a success whose
    /// body does not parse): it may have been applied.
    pub unknown: bool,
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A database driver's error, kept whole for inspection ([`DriverError::get`]).
/// Only builds with an engine (`sqlite`, `postgres`) have one.
///
/// It reports the driver's message as its own and no further source: sqlx
/// repeats its cause's text in its message, so an error chain printed with
/// `{:#}` would otherwise say everything twice.
#[cfg(feature = "_engine")]
#[derive(Debug)]
pub struct DriverError(pub sqlx::Error);

#[cfg(feature = "_engine")]
impl DriverError {
    /// The driver's error.
    #[must_use]
    pub fn get(&self) -> &sqlx::Error {
        &self.0
    }
}

/// The driver's message, but for a PostgreSQL error without the line of the
/// server's own C source it was raised at: sqlx shows PostgreSQL's `L` field
/// as "at line 948", which reads as a line of the caller's input. SQLite's
/// errors keep sqlx's text, with their result code ("(code: 26) file is not
/// a database"): several codes share one message.
#[cfg(feature = "_engine")]
impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "postgres")]
        if let sqlx::Error::Database(db) = &self.0
            && let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        {
            return write!(f, "error returned from database: {}", pg.message());
        }
        self.0.fmt(f)
    }
}

#[cfg(feature = "_engine")]
impl std::error::Error for DriverError {}

#[cfg(feature = "_engine")]
impl From<sqlx::Error> for DriverError {
    fn from(e: sqlx::Error) -> Self {
        Self(e)
    }
}

impl StoreError {
    /// Whether this rejects one lease (`LeaseLost`, `SessionExpired`) rather than
    /// the whole operation.
    pub(crate) fn is_lease_rejection(&self) -> bool {
        matches!(self, Self::LeaseLost { .. } | Self::SessionExpired { .. })
    }

    /// Whether the operation may or may not have been applied: the database
    /// connection broke at `COMMIT`, or a server got the request and no answer
    /// came back. A claim in that state may have leased keys nobody will hear of.
    #[must_use]
    pub fn is_commit_unknown(&self) -> bool {
        match self {
            #[cfg(feature = "_engine")]
            Self::CommitUnknown(_) => true,
            Self::Remote(remote) => remote.unknown,
            _ => false,
        }
    }

    /// The database's own error code (a PostgreSQL SQLSTATE, a SQLite result
    /// code) when the database refused a statement, for the engine that knows
    /// what it means.
    #[cfg(feature = "_engine")]
    pub(crate) fn database_code(&self) -> Option<String> {
        let Self::Database(e) = self else {
            return None;
        };
        let sqlx::Error::Database(db) = e.get() else {
            return None;
        };
        db.code().map(std::borrow::Cow::into_owned)
    }

    /// A copy of this error for a second caller (driver errors cannot be
    /// cloned): the same variant, its driver error carried as text.
    #[cfg(feature = "_engine")]
    pub(crate) fn duplicate(&self) -> Self {
        let text = |e: &DriverError| DriverError(sqlx::Error::Protocol(e.to_string()));
        match self {
            Self::Busy(e) => Self::Busy(text(e)),
            Self::Unavailable(e) => Self::Unavailable(text(e)),
            Self::CommitUnknown(e) => Self::CommitUnknown(text(e)),
            Self::Full(e) => Self::Full(text(e)),
            Self::Database(e) => Self::Database(text(e)),
            Self::Remote(remote) => Self::Remote(remote.clone()),
            Self::KeyBusy { process, key } => Self::KeyBusy {
                process: process.clone(),
                key: key.clone(),
            },
            other => Self::Database(DriverError(sqlx::Error::Protocol(other.to_string()))),
        }
    }

    /// Whether retrying the same operation later may succeed (`Busy`, lost
    /// connections, a server that is down or overloaded); `false` for errors
    /// that will repeat (`LeaseLost`, bad input).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::ConnectTimeout { .. } | Self::KeyBusy { .. } => true,
            #[cfg(feature = "_engine")]
            Self::Busy(_) | Self::Unavailable(_) | Self::Full(_) => true,
            Self::Remote(remote) => {
                !remote.unknown && remote.status.is_none_or(|s| s >= 500 || s == 429)
            }
            #[cfg(feature = "_engine")]
            Self::Connect { source, .. } => {
                matches!(source.get(), sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut)
            }
            _ => false,
        }
    }
}

/// An error with its sources on one line, `outer: cause: root`, each cause
/// written once (many errors repeat their source's text in their own).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(err) = next {
        let part = err.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = err.source();
    }
    text
}
