//! Parameter structs, one per store operation, so adding an option never breaks a
//! caller.

use std::time::Duration;

use crate::backoff::Backoff;

use super::types::{ItemState, Lease, Outcome, SessionId};

/// Parameters of [`session_start`](super::StoreEngine::session_start).
#[derive(Debug, Clone)]
pub struct SessionStart {
    /// The component starting the session, for operators (stored as
    /// [`clean_text`](super::clean_text) makes it).
    pub component: String,
    /// How long the session lives without a heartbeat; heartbeat every `ttl / 3`.
    /// Must be at least one millisecond.
    pub ttl: Duration,
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
}

/// Parameters of [`lease_complete`](super::StoreEngine::lease_complete).
#[derive(Debug, Clone, Copy)]
pub struct LeaseComplete<'a> {
    /// The lease being completed.
    pub lease: &'a Lease,
    /// What the run returned.
    pub outcome: &'a Outcome,
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

/// Parameters of [`item_get`](super::StoreEngine::item_get).
#[derive(Debug, Clone)]
pub struct ItemGet {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// At most this many history events, newest first.
    pub history_limit: u32,
}

/// Parameters of [`history_list`](super::StoreEngine::history_list).
#[derive(Debug, Clone, Default)]
pub struct HistoryList {
    /// Only this process (it must be known).
    pub process: Option<String>,
    /// Only this key.
    pub key: Option<String>,
    /// Only events older than this id (paging backwards).
    pub before_id: Option<i64>,
    /// At most this many events, newest first.
    pub limit: u32,
}

/// Parameters of [`history_prune`](super::StoreEngine::history_prune).
#[derive(Debug, Clone, Copy)]
pub struct HistoryPrune {
    /// Delete events older than now − `retention`.
    pub retention: Duration,
}

/// Parameters of [`process_configure`](super::StoreEngine::process_configure).
#[derive(Debug, Clone)]
pub struct ProcessConfigure {
    /// The process; created if unknown.
    pub process: String,
    /// Its backoff after transient failures (default 1 s, ×2, 360 s).
    pub backoff: Backoff,
}

/// Parameters of [`item_retry`](super::StoreEngine::item_retry).
#[derive(Debug, Clone)]
pub struct ItemRetry {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
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
}

/// Parameters of [`item_delete`](super::StoreEngine::item_delete).
#[derive(Debug, Clone)]
pub struct ItemDelete {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
}

/// Parameters of [`history_activity`](super::StoreEngine::history_activity).
#[derive(Debug, Clone, Copy)]
pub struct HistoryActivity {
    /// Count the runs that ended within this long before now.
    pub window: Duration,
}
