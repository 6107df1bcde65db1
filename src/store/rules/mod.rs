//! The rules both engines decide alike, in Rust, once — "decide in Rust, write
//! in SQL". Each engine reads the rows a rule needs with its own SQL, hands them
//! here, and writes what the rule decided; so SQLite and PostgreSQL cannot
//! drift apart on what a completion, a claim gate or a bulk action means.
//!
//! One rule per file:
//!
//! - a completion: [`parts`] (a batch one outcome breaks is written in parts),
//!   [`holding`] (which leases still hold their key), [`settle`] (the outcome's
//!   state machine);
//! - a claim: [`gate`] (pause, cluster-wide concurrency and rate limits);
//! - a session started: [`sessions`] (its TTL, its texts cleaned);
//! - a caller refused: [`refusal`] (which error a lock or heartbeat gets),
//!   [`enqueue`] (input checks before any write), [`admin`] (an operator never
//!   races a worker);
//! - the background services' decisions: [`resync`], [`retention`];
//! - what operators read: [`triage`], [`groups`], [`series`], [`counts`],
//!   [`activity`], [`processes`], and how every list is paged: [`pages`];
//! - the rows both engines read and how their stored names decode: [`rows`],
//!   [`decode`].
//!
//! Nothing here names an engine or holds a connection: a rule that needs the
//! database takes the engine's steps as closures or a trait.

#[cfg(feature = "_engine")]
pub(crate) mod activity;
#[cfg(feature = "_engine")]
pub(crate) mod admin;
#[cfg(feature = "_engine")]
pub(crate) mod counts;
#[cfg(feature = "_engine")]
pub(crate) mod decode;
#[cfg(feature = "_engine")]
pub(crate) mod enqueue;
#[cfg(feature = "_engine")]
pub(crate) mod gate;
pub(crate) mod groups;
#[cfg(feature = "_engine")]
pub(crate) mod holding;
pub(crate) mod pages;
#[cfg(feature = "_engine")]
pub(crate) mod parts;
#[cfg(feature = "_engine")]
pub(crate) mod processes;
pub(crate) mod refusal;
#[cfg(feature = "_engine")]
pub(crate) mod resync;
#[cfg(feature = "_engine")]
pub(crate) mod retention;
#[cfg(feature = "_engine")]
pub(crate) mod rows;
#[cfg(feature = "_engine")]
pub(crate) mod series;
#[cfg(feature = "_engine")]
pub(crate) mod sessions;
#[cfg(feature = "_engine")]
pub(crate) mod settle;
#[cfg(feature = "_engine")]
pub(crate) mod triage;
pub(crate) mod written;

pub use groups::{MAX_SIGNATURE_BYTES, error_signature};
