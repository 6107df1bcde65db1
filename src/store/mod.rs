//! The durable store: DESIGN.md's "Semantics" on a real database, so work survives
//! restarts and a fleet of workers can share it.
//!
//! One trait, [`StoreEngine`], is the seam (noun-then-verb methods taking params
//! structs and returning domain types). Two engines implement it, each with its
//! own SQL:
//!
//! - [`SqliteStore`]: the embedded default; one file, WAL, every write in one
//!   `BEGIN IMMEDIATE` transaction, no server to run;
//! - [`PostgresStore`]: many nodes against one database; `FOR UPDATE SKIP LOCKED`
//!   claims in one statement per batch, `NOTIFY` on enqueue.
//!
//! [`Store`] picks the engine from the URL and implements the same trait, so most
//! code holds a `Store`. What every engine guarantees (and
//! the contract suite, `tests/store_*.rs`, checks on each):
//!
//! - **fencing**: a lease carries a strictly increasing token; completing,
//!   releasing or heartbeating after the session expired or the lease was
//!   reclaimed fails with [`StoreError::SessionExpired`] / [`StoreError::LeaseLost`]
//!   and changes nothing;
//! - **coalescing**: one row per (process, key); a pending key keeps the earlier
//!   ready time and the higher priority, a running key is marked dirty and runs
//!   exactly once more;
//! - **outcomes and backoff**: see [`Outcome`]; the failure count and the backoff
//!   live in the row, configured per process ([`ProcessConfigure`]), and an enqueue
//!   never shortens a backoff unless it sets `bypass_backoff`;
//! - **reclaim**: [`StoreEngine::session_reclaim`] turns the leases of expired
//!   sessions back into pending items;
//! - **known keys and runs**: a converged key stays as an idle item until a
//!   delete forgets it; the history has one row per run ([`Run`]), written
//!   when the run ends, and per operator action, kept per process's
//!   [`Retention`], which the runner's `Pruner` applies in the background.
//!
//! ```
//! use std::time::Duration;
//! use drover::store::{
//!     ItemEnqueue, LeaseClaim, LeaseComplete, Outcome, SessionClose, SessionStart, Store,
//!     StoreEngine as _,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), drover::store::StoreError> {
//! let store = Store::connect("sqlite::memory:").await?; // or sqlite://drover.db, postgres://…
//! store.item_enqueue(ItemEnqueue::new("provision", ["machine-1", "machine-2"])).await?;
//! let session = store
//!     .session_start(SessionStart::new("example", Duration::from_secs(30)))
//!     .await?;
//! let claim = LeaseClaim { session: session.id, process: "provision".into(), max: 10, trace_links: false };
//! let leases = store.lease_claim(claim).await?.leases; // none while the process is paused
//! assert_eq!(leases.len(), 2);
//! for lease in &leases {
//!     // … converge lease.key, then report how it went:
//!     store.lease_complete(LeaseComplete { lease, outcome: &Outcome::Done, trace_id: None }).await?;
//! }
//! store.session_close(SessionClose { session: session.id }).await?;
//! # Ok(()) }
//! ```
//!
//! A producer can enqueue inside its own transaction ([`Store::begin`] and
//! [`StoreTx`]; [`PostgresStore::item_enqueue_in`] and
//! [`SqliteStore::item_enqueue_in`] on a transaction it already holds; the SQL
//! `drover_enqueue` from any language), and a table can be watched
//! ([`Store::table_watch`]) so that its triggers enqueue every changed row's key.
//!
//! Times always come from the database clock. Tests shift it through
//! [`Store::clock`] instead of sleeping.

// The face: what every build with a store holds. The seam, its words and
// `Store`, which has an arm per engine compiled in (none in a `client`-only
// build, where `Store::connect` refuses every URL and the runner runs on a
// `Client`).
mod any;
mod backend;
mod clock;
mod cursor;
mod engine;
mod error;
mod fleet;
mod key;
mod options;
mod params;
mod settings;
mod text;
mod trace;
mod types;
mod url;
pub(crate) mod wakeup;
mod watch;

// What both engines share: the embedded migrations and the caller's own
// transaction over either engine.
#[cfg(feature = "_engine")]
mod exec;
#[cfg(feature = "_engine")]
mod grouped;
#[cfg(all(test, feature = "_engine"))]
mod grouped_testing;
#[cfg(feature = "_engine")]
mod migrate;
#[cfg(feature = "_engine")]
mod transaction;

// The rules both engines decide alike, in Rust, once: each engine reads rows
// with its own SQL and hands them to a rule, then writes what the rule decided.
pub(crate) mod rules;

// The engines, each with its own SQL.
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use any::Store;
pub use backend::WorkerBackend;
pub use clock::Clock;
pub use cursor::TriageCursor;
pub use engine::StoreEngine;
#[cfg(feature = "_engine")]
pub use error::DriverError;
pub(crate) use error::error_chain;
pub use error::{RemoteError, StoreError};
pub use fleet::{
    ClaimGate, Claimed, FleetLimits, LimitChanges, MAX_RATE_PER_S, MIN_RATE_PER_S, ProcessPause,
    RateLimit,
};
pub use key::{MAX_NAME_BYTES, validate_key, validate_process};
pub use options::StoreOptions;
pub use params::{
    BULK_BATCH, DepthSample, ErrorGroups, HistoryActivity, ItemDelete, ItemEnqueue, ItemFilter,
    ItemGet, ItemList, ItemPark, ItemRetry, ItemTriage, ItemsDelete, ItemsPark, ItemsRetry,
    LeaseClaim, LeaseComplete, LeaseLock, LeaseRelease, ProcessPage, ProcessSeries, PruneTurn,
    ResyncBatch, RetentionPrune, RunList, SessionClose, SessionHeartbeat, SessionList,
    SessionStart, WorkerIdentity,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use rules::{MAX_SIGNATURE_BYTES, error_signature};
pub use settings::{ProcessConfigure, ProcessSettings, Resync, Retention};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, is_in_memory};
pub use text::{MAX_TEXT_BYTES, clean_text, text_from_bytes};
pub use trace::{InvalidTraceContext, TRACE_LINKS_KEPT, TraceContext, TraceId, TraceLinks};
#[cfg(feature = "_engine")]
pub use transaction::StoreTx;
pub use types::{
    DepthPoint, EnqueueReport, ErrorGroup, FencingToken, HeldLease, Item, ItemDetail, ItemState,
    Lease, Outcome, Page, PoolStats, ProcessActivity, ProcessCounts, PruneCursor, PruneReport,
    ReclaimReport, ResyncReport, Run, RunBucket, RunOutcome, Series, Session, SessionId,
    SessionInfo, TriagePage,
};
#[cfg(feature = "server")]
pub(crate) use url::form_decoded;
pub use url::redact_url;
pub use watch::TableWatch;
