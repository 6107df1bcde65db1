//! Parameter structs, one per store operation, so adding an option never breaks a
//! caller. A process's settings ([`ProcessConfigure`](super::ProcessConfigure))
//! live beside what they read back, in `settings.rs`.

use std::time::Duration;

use super::trace::{TraceContext, TraceId};
use super::types::{ItemState, Lease, Outcome, PruneCursor, RunOutcome, SessionId};

/// Parameters of [`session_start`](super::StoreEngine::session_start).
#[derive(Debug, Clone)]
pub struct SessionStart {
    /// The component starting the session, for operators (stored as
    /// [`clean_text`](super::clean_text) makes it).
    pub component: String,
    /// How long the session lives without a heartbeat; heartbeat every `ttl / 3`.
    /// Must be at least one millisecond.
    pub ttl: Duration,
    /// Who runs it, for the workers page: the worker's host, pid and drover
    /// version ([`WorkerIdentity::current`] for this process). Each part is
    /// optional, so older clients that send none still start sessions.
    pub identity: WorkerIdentity,
    /// Who may act on the session through a server: a fingerprint of the
    /// bearer token that started it (`None`: anyone who reaches the store).
    /// The store keeps it; `drover serve` compares it ([`session_owners`](super::StoreEngine::session_owners)).
    pub owner: Option<String>,
}

impl SessionStart {
    /// A session for `component`, identified as this process
    /// ([`WorkerIdentity::current`]).
    #[must_use]
    pub fn new(component: impl Into<String>, ttl: Duration) -> Self {
        Self {
            component: component.into(),
            ttl,
            identity: WorkerIdentity::current(),
            owner: None,
        }
    }
}

/// Where a session's worker runs, as the worker reports it: shown to
/// operators, never trusted for anything else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// The worker's host name.
    pub host: Option<String>,
    /// The worker's process id.
    pub pid: Option<u32>,
    /// The drover version the worker runs (`drover work`, a library
    /// controller), or the client's own version string.
    pub version: Option<String>,
}

impl WorkerIdentity {
    /// This process: its host name (from the kernel on Linux, else `HOSTNAME`
    /// or `COMPUTERNAME`), its pid and this crate's version.
    #[must_use]
    pub fn current() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty());
        Self {
            host,
            pid: Some(std::process::id()),
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        }
    }
}

/// Parameters of [`session_heartbeat`](super::StoreEngine::session_heartbeat).
#[derive(Debug, Clone, Copy)]
pub struct SessionHeartbeat {
    /// The session to keep alive.
    pub session: SessionId,
}

/// Parameters of [`session_close`](super::StoreEngine::session_close).
#[derive(Debug, Clone, Copy)]
pub struct SessionClose {
    /// The session to end.
    pub session: SessionId,
}

/// Parameters of [`item_enqueue`](super::StoreEngine::item_enqueue).
#[derive(Debug, Clone)]
pub struct ItemEnqueue {
    /// The process the keys belong to.
    pub process: String,
    /// The keys; duplicates count once. All are validated before anything is written.
    pub keys: Vec<String>,
    /// Do not run before now + `after` (default: at once).
    pub after: Duration,
    /// Higher runs first (default 0). Resyncs use a negative priority.
    pub priority: i32,
    /// Let this enqueue cut a running backoff short (default `false`: an enqueue
    /// never shortens a backoff). A pending key's backoff is then cleared, so
    /// the key shows as pending and `lease_lock` takes it; its failure count is
    /// kept, so a further failure backs off as before.
    pub bypass_backoff: bool,
    /// The trace context of the change behind this enqueue (DESIGN.md rule
    /// 14), kept on each key for its next run, whose span links to it.
    /// `None` (the default) stores nothing. With the `otel` feature,
    /// [`Store`](super::Store)'s enqueue fills it from the current `tracing`
    /// span when that span is part of an OpenTelemetry trace.
    pub trace: Option<TraceContext>,
}

impl ItemEnqueue {
    /// Enqueue `keys` for `process` now, priority 0, respecting backoff.
    #[must_use]
    pub fn new<K: Into<String>>(
        process: impl Into<String>,
        keys: impl IntoIterator<Item = K>,
    ) -> Self {
        Self {
            process: process.into(),
            keys: keys.into_iter().map(Into::into).collect(),
            after: Duration::ZERO,
            priority: 0,
            bypass_backoff: false,
            trace: None,
        }
    }

    /// Delays the keys by `after`.
    #[must_use]
    pub fn after(self, after: Duration) -> Self {
        Self { after, ..self }
    }

    /// Sets the priority.
    #[must_use]
    pub fn priority(self, priority: i32) -> Self {
        Self { priority, ..self }
    }

    /// Carries the trace context of the change behind this enqueue.
    #[must_use]
    pub fn trace(self, trace: Option<TraceContext>) -> Self {
        Self { trace, ..self }
    }

    /// Lets this enqueue shorten a running backoff.
    #[must_use]
    pub fn bypass_backoff(self, bypass_backoff: bool) -> Self {
        Self {
            bypass_backoff,
            ..self
        }
    }
}

/// Parameters of [`lease_claim`](super::StoreEngine::lease_claim).
#[derive(Debug, Clone)]
pub struct LeaseClaim {
    /// The claiming session; it must be alive.
    pub session: SessionId,
    /// The process to claim from.
    pub process: String,
    /// At most this many leases (0 claims nothing).
    pub max: u32,
    /// Whether each lease should bring the trace contexts its run absorbed
    /// ([`Lease::trace_links`]), read in the claim's own statements: ask
    /// when the runs' spans are recorded (the runner does, when a subscriber
    /// records its spans), not otherwise, and nothing more is read.
    pub trace_links: bool,
}

/// Parameters of [`lease_complete`](super::StoreEngine::lease_complete).
#[derive(Debug, Clone, Copy)]
pub struct LeaseComplete<'a> {
    /// The lease being completed.
    pub lease: &'a Lease,
    /// What the run returned.
    pub outcome: &'a Outcome,
    /// The trace id of the run's span, when it was sampled (and so
    /// exported): kept in the run's history row ([`Run::trace_id`]) so the
    /// run can be found in a tracing UI. `None` (tracing off) writes nothing
    /// more than a run without tracing does.
    ///
    /// [`Run::trace_id`]: super::Run::trace_id
    pub trace_id: Option<TraceId>,
}

/// Parameters of [`lease_release`](super::StoreEngine::lease_release).
#[derive(Debug, Clone, Copy)]
pub struct LeaseRelease<'a> {
    /// The lease given back.
    pub lease: &'a Lease,
}

/// Parameters of [`lease_lock`](super::StoreEngine::lease_lock).
#[derive(Debug, Clone)]
pub struct LeaseLock {
    /// The locking session; it must be alive.
    pub session: SessionId,
    /// The process.
    pub process: String,
    /// The key chosen by the caller.
    pub key: String,
}

/// Parameters of [`item_list`](super::StoreEngine::item_list).
#[derive(Debug, Clone)]
pub struct ItemList {
    /// The process (it must be known).
    pub process: String,
    /// Only items in this state (default: all).
    pub state: Option<ItemState>,
    /// Page after this key (keys are listed in ascending byte order).
    pub after_key: Option<String>,
    /// At most this many items.
    pub limit: u32,
}

/// Parameters of [`session_list`](super::StoreEngine::session_list): one
/// page of sessions in id order (oldest first), so a fleet of any size is
/// listed a bounded number of rows at a time (DESIGN.md rule 13).
#[derive(Debug, Clone, Copy)]
pub struct SessionList {
    /// Only sessions with a greater id: the previous page's
    /// [`next`](super::Page::next); `None` for the first page.
    pub after: Option<SessionId>,
    /// At most this many sessions (0 reads one).
    pub limit: u32,
    /// The most leases listed per session (their count is always given; 0
    /// reads no lease rows at all).
    pub leases_per_session: u32,
}

/// One page of processes in name order (byte order on both engines): the
/// parameters of [`process_counts`](super::StoreEngine::process_counts) and
/// the page of [`HistoryActivity`]. Each page is one range of the process
/// index, so the last page costs what the first does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessPage {
    /// Only processes named after this (the previous page's
    /// [`next`](super::Page::next)); `None` for the first page.
    pub after: Option<String>,
    /// At most this many processes (0 reads one).
    pub limit: u32,
}

impl ProcessPage {
    /// The first page of at most `limit` processes.
    #[must_use]
    pub fn first(limit: u32) -> Self {
        Self { after: None, limit }
    }
}

/// Parameters of [`process_series`](super::StoreEngine::process_series).
#[derive(Debug, Clone)]
pub struct ProcessSeries {
    /// The process.
    pub process: String,
    /// How far back from now (the charts use one hour).
    pub window: Duration,
}

/// Parameters of [`depth_sample`](super::StoreEngine::depth_sample).
#[derive(Debug, Clone, Copy)]
pub struct DepthSample {
    /// Samples older than this are deleted.
    pub keep: Duration,
    /// No sample is written for a process that has one younger than this, so
    /// several servers on one database sample as one.
    pub min_gap: Duration,
}

/// Parameters of [`item_triage`](super::StoreEngine::item_triage).
#[derive(Debug, Clone)]
pub struct ItemTriage {
    /// The process.
    pub process: String,
    /// Only items in this state (all when `None`).
    pub state: Option<ItemState>,
    /// Only keys starting with this (then every section is in key order).
    pub key_prefix: Option<String>,
    /// Where the previous page ended (its [`TriagePage::next`](super::TriagePage::next)),
    /// with the same filters.
    pub after: Option<super::TriageCursor>,
    /// The most items on the page (at least 1).
    pub limit: u32,
}

/// Parameters of [`item_get`](super::StoreEngine::item_get).
#[derive(Debug, Clone)]
pub struct ItemGet {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// At most this many runs, newest first.
    pub runs_limit: u32,
}

#[cfg(feature = "_engine")]
impl ItemGet {
    /// The runs an item's detail shows: the key's newest `runs_limit`.
    pub(crate) fn runs(&self) -> RunList {
        RunList {
            process: Some(self.process.clone()),
            key: Some(self.key.clone()),
            limit: self.runs_limit,
            ..RunList::default()
        }
    }
}

/// Parameters of [`run_list`](super::StoreEngine::run_list): one page of
/// history, newest first, paged by run id (keyset, never by offset).
#[derive(Debug, Clone, Default)]
pub struct RunList {
    /// Only this process (it must be known).
    pub process: Option<String>,
    /// Only this key.
    pub key: Option<String>,
    /// Only rows with this outcome (or action).
    pub outcome: Option<RunOutcome>,
    /// Only rows older than this id: the previous page's last id.
    pub before: Option<i64>,
    /// At most this many rows.
    pub limit: u32,
}

/// Parameters of [`retention_prune`](super::StoreEngine::retention_prune):
/// one small batch of a process's retention, so pruning never holds up claims.
#[derive(Debug, Clone)]
pub struct RetentionPrune {
    /// The process whose rules apply.
    pub process: String,
    /// Where the previous batch stopped ([`PruneCursor::default`] to start).
    pub cursor: PruneCursor,
    /// At most about this many rows are looked at per step (at least 1).
    pub batch: u32,
}

/// Parameters of [`prune_turn`](super::StoreEngine::prune_turn): a pruner
/// taking, or keeping, one process's turn to prune.
#[derive(Debug, Clone)]
pub struct PruneTurn {
    /// The process.
    pub process: String,
    /// Who asks: a number the pruner drew for itself, the same at every tick.
    pub holder: i64,
    /// How long the turn is held from now, on the database clock, unless
    /// renewed: longer than the pruner's interval, so its next tick renews
    /// the turn before anyone else can take it.
    pub hold: std::time::Duration,
}

/// Parameters of [`resync_batch`](super::StoreEngine::resync_batch): one
/// small batch of a process's resync walk.
#[derive(Debug, Clone)]
pub struct ResyncBatch {
    /// The process whose idle keys to walk.
    pub process: String,
    /// At most this many idle keys are read (at least 1).
    pub batch: u32,
    /// Start a pass now even if none is due yet (a pass under way goes on
    /// either way).
    pub start: bool,
}

/// Parameters of [`item_retry`](super::StoreEngine::item_retry).
#[derive(Debug, Clone)]
pub struct ItemRetry {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// Who did it, recorded in the history (`admin` for the API's admin role,
    /// `cli` for the command line).
    pub actor: String,
}

/// Parameters of [`item_park`](super::StoreEngine::item_park).
#[derive(Debug, Clone)]
pub struct ItemPark {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// Why the operator parked it; shown as the item's last error (stored as
    /// [`clean_text`](super::clean_text) makes it).
    pub reason: String,
    /// Who did it, recorded in the history (`admin` for the API's admin role,
    /// `cli` for the command line).
    pub actor: String,
}

/// Parameters of [`item_delete`](super::StoreEngine::item_delete).
#[derive(Debug, Clone)]
pub struct ItemDelete {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// Who did it, recorded in the history (`admin` for the API's admin role,
    /// `cli` for the command line).
    pub actor: String,
}

/// Parameters of [`history_activity`](super::StoreEngine::history_activity).
#[derive(Debug, Clone)]
pub struct HistoryActivity {
    /// Count the runs that ended within this long before now.
    pub window: Duration,
    /// Which processes: the same page as a
    /// [`process_counts`](super::StoreEngine::process_counts) read gives the
    /// same names, so the two join row for row.
    pub page: ProcessPage,
}

/// Parameters of [`error_groups`](super::StoreEngine::error_groups).
#[derive(Debug, Clone)]
pub struct ErrorGroups {
    /// The process (it must be known).
    pub process: String,
    /// At most this many groups, most keys first.
    pub limit: u32,
}

/// Which keys of a process a bulk action applies to: every condition given
/// must hold. Running keys never match (only their lease holder may end a
/// run). At least one condition is required (an empty text counts as none),
/// so an empty filter can never retry, park or delete a whole process by
/// accident; a text holding a NUL is refused.
#[derive(Debug, Clone, Default)]
pub struct ItemFilter {
    /// The process (it must be known).
    pub process: String,
    /// Only keys in this state as seen now (`backoff` = pending and still
    /// backing off); never `running`.
    pub state: Option<ItemState>,
    /// Only keys whose last error has this signature
    /// ([`error_signature`](super::error_signature)); without a `state`, only
    /// failing keys (parked or backing off) match, exactly the keys of that
    /// [`ErrorGroup`](super::ErrorGroup).
    pub error_signature: Option<String>,
    /// Only keys starting with this (byte-wise).
    pub key_prefix: Option<String>,
}

impl ItemFilter {
    /// No condition yet (a bulk action refuses it until one is set).
    #[must_use]
    pub fn new(process: impl Into<String>) -> Self {
        Self {
            process: process.into(),
            ..Self::default()
        }
    }

    /// Only keys in `state`.
    #[must_use]
    pub fn state(self, state: ItemState) -> Self {
        Self {
            state: Some(state),
            ..self
        }
    }

    /// Only keys whose last error has `signature`.
    #[must_use]
    pub fn error_signature(self, signature: impl Into<String>) -> Self {
        Self {
            error_signature: Some(signature.into()),
            ..self
        }
    }

    /// Only keys starting with `prefix`.
    #[must_use]
    pub fn key_prefix(self, prefix: impl Into<String>) -> Self {
        Self {
            key_prefix: Some(prefix.into()),
            ..self
        }
    }
}

/// The keys a bulk action changes per batch by default: each batch is one
/// short transaction, so claims never wait long behind an operator.
pub const BULK_BATCH: u32 = 1000;

/// Parameters of [`items_retry_where`](super::StoreEngine::items_retry_where).
#[derive(Debug, Clone)]
pub struct ItemsRetry {
    /// Which keys.
    pub filter: ItemFilter,
    /// Who did it, recorded in each key's history.
    pub actor: String,
    /// Keys looked at per batch (default [`BULK_BATCH`]; at least 1).
    pub batch: u32,
}

/// Parameters of [`items_park_where`](super::StoreEngine::items_park_where).
#[derive(Debug, Clone)]
pub struct ItemsPark {
    /// Which keys.
    pub filter: ItemFilter,
    /// Who did it, recorded in each key's history.
    pub actor: String,
    /// Why: each key's last error from now on (stored as
    /// [`clean_text`](super::clean_text) makes it).
    pub reason: String,
    /// Keys looked at per batch (default [`BULK_BATCH`]; at least 1).
    pub batch: u32,
}

/// Parameters of [`items_delete_where`](super::StoreEngine::items_delete_where).
#[derive(Debug, Clone)]
pub struct ItemsDelete {
    /// Which keys.
    pub filter: ItemFilter,
    /// Who did it, recorded in each key's history.
    pub actor: String,
    /// Keys looked at per batch (default [`BULK_BATCH`]; at least 1).
    pub batch: u32,
}

/// The constructor and batch setter of a bulk action that needs nothing but
/// its filter and actor ([`ItemsRetry`], [`ItemsDelete`]).
macro_rules! filter_and_actor {
    ($($params:ident),*) => {$(
        impl $params {
            /// Acts on the keys `filter` matches as `actor`, [`BULK_BATCH`] keys per batch.
            #[must_use]
            pub fn new(filter: ItemFilter, actor: impl Into<String>) -> Self {
                Self {
                    filter,
                    actor: actor.into(),
                    batch: BULK_BATCH,
                }
            }

            /// Looks at `batch` keys per batch (at least 1).
            #[must_use]
            pub fn batch(self, batch: u32) -> Self {
                Self { batch, ..self }
            }
        }
    )*};
}

filter_and_actor!(ItemsRetry, ItemsDelete);

impl ItemsPark {
    /// Acts on the keys `filter` matches as `actor`, [`BULK_BATCH`] keys per batch.
    #[must_use]
    pub fn new(filter: ItemFilter, actor: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            filter,
            actor: actor.into(),
            reason: reason.into(),
            batch: BULK_BATCH,
        }
    }

    /// Looks at `batch` keys per batch (at least 1).
    #[must_use]
    pub fn batch(self, batch: u32) -> Self {
        Self { batch, ..self }
    }
}
