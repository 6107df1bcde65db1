//! [`StoreOptions`]: how [`Store::connect_with`](super::Store::connect_with) opens a
//! database.

use std::time::Duration;

/// Connection settings, validated when used. The defaults suit a worker process.
#[derive(Debug, Clone)]
// The engines read these; a `client`-only build has none.
#[cfg_attr(not(feature = "_engine"), allow(dead_code))]
pub struct StoreOptions {
    pub(crate) migrate: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_connections: u32,
    // Read by the SQLite engine only.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) durable: bool,
    // Read by the PostgreSQL engine only.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) listen_url: Option<String>,
    // Read by the SQLite engine only.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) sqlite_enqueue_through_view: bool,
    pub(crate) application_name: String,
    // Read by the PostgreSQL engine only.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) caller_idle_timeout: Duration,
}

/// The default of [`StoreOptions::caller_idle_timeout`]: drover's own
/// transactions' bound, which the caller's used to share.
const CALLER_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            migrate: true,
            connect_timeout: Duration::from_secs(5),
            max_connections: 8,
            durable: true,
            listen_url: None,
            sqlite_enqueue_through_view: false,
            application_name: "drover".to_owned(),
            caller_idle_timeout: CALLER_IDLE_TIMEOUT,
        }
    }
}

impl StoreOptions {
    /// Whether to apply the embedded migrations on connect (default `true`).
    /// With `false` the schema is only checked: a database that is behind is
    /// refused until `drover migrate` runs, one that is newer is always refused.
    #[must_use]
    pub fn migrate(self, migrate: bool) -> Self {
        Self { migrate, ..self }
    }

    /// How long to wait for the database to answer before giving up (default 5 s).
    /// Shorter fails faster on a dead server; longer survives a slow failover.
    #[must_use]
    pub fn connect_timeout(self, connect_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            ..self
        }
    }

    /// The most connections the pool opens (default 8, at least 1). More lets more
    /// workers talk to PostgreSQL at once; SQLite serialises writers anyway and an
    /// in-memory SQLite database always uses exactly one.
    #[must_use]
    pub fn max_connections(self, max_connections: u32) -> Self {
        Self {
            max_connections: max_connections.max(1),
            ..self
        }
    }

    /// Whether a commit is on disk before it is acknowledged (default `true`).
    /// On SQLite `true` is `synchronous=FULL`: the WAL is synced at every
    /// commit, so an acknowledged enqueue or completion survives a power loss
    /// or an OS crash. `false` is `synchronous=NORMAL`: the WAL is synced only
    /// at checkpoints, which is faster (`drover bench … --synchronous normal`
    /// measures by how much) and never corrupts the file, but the last commits
    /// before a power loss may be lost. PostgreSQL ignores it: its durability is
    /// the server's `synchronous_commit`.
    #[must_use]
    pub fn durable(self, durable: bool) -> Self {
        Self { durable, ..self }
    }

    /// A direct PostgreSQL connection used only to `LISTEN` for wake-ups,
    /// when the database URL goes through a pooler in transaction mode
    /// (`?pool_mode=transaction`), which cannot keep a `LISTEN` (default
    /// none: idle workers then poll, about once a second, instead of waking
    /// at once). Ignored otherwise, and by SQLite: a direct URL listens on
    /// its own pool.
    #[must_use]
    pub fn listen_url(self, url: Option<String>) -> Self {
        Self {
            listen_url: url,
            ..self
        }
    }

    /// Whether a SQLite store's own enqueue inserts its keys into the view
    /// `drover_enqueue`, one trigger run per key, instead of coalescing the
    /// whole batch in one set-based upsert (default `false`: the upsert,
    /// about twice as fast on bulk batches). Both follow DESIGN.md rule 2;
    /// the view is what other programs and watched tables run, and the
    /// contract suite connects with `true` as well so the two can never
    /// diverge. PostgreSQL ignores it.
    #[must_use]
    pub fn sqlite_enqueue_through_view(self, through_view: bool) -> Self {
        Self {
            sqlite_enqueue_through_view: through_view,
            ..self
        }
    }

    /// The name this store's connections show to whoever looks (default
    /// `drover`). On PostgreSQL it is the connection's `application_name`, as
    /// `pg_stat_activity` shows it, unless the URL sets one; on SQLite it
    /// names the threads that run the connections (`NAME-w` the writer,
    /// `NAME-rN` the readers), as `top -H`, `ps -L` and a debugger show them.
    /// Linux keeps the first 15 bytes of a thread's name, so keep it short.
    #[must_use]
    pub fn application_name(self, name: impl Into<String>) -> Self {
        Self {
            application_name: name.into(),
            ..self
        }
    }

    /// PostgreSQL: how long a transaction of the caller's
    /// ([`Store::begin`](super::Store::begin)) may sit idle between its
    /// statements before the database ends it, rolling it back (default 5 s;
    /// at least 1 ms, at most 24 hours). Enqueues and deletes in it hold
    /// their keys' rows locked, so a stalled caller would otherwise hold
    /// those keys back from every worker with no end; a caller that thinks
    /// between statements sets a longer bound. Its next statement then fails
    /// with [`StoreError::IdleTimeout`](super::StoreError::IdleTimeout) (for
    /// drover's calls) or the connection's error (for its own). drover's own
    /// transactions keep their 5 s, whatever this says. On SQLite a caller's
    /// transaction holds the one write lock from its start: keep it short.
    #[must_use]
    pub fn caller_idle_timeout(self, timeout: Duration) -> Self {
        Self {
            caller_idle_timeout: timeout
                .clamp(Duration::from_millis(1), Duration::from_secs(86_400)),
            ..self
        }
    }
}
