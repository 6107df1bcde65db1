//! Error groups and bulk actions on the wire: the failing keys of a process by
//! error, and retry / park / delete of every key a filter matches.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::items::StateName;
use crate::store::{ErrorGroup, ItemState};

/// Query of `GET /v1/processes/{process}/error-groups`.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ErrorGroupsQuery {
    /// At most this many groups, most keys first (1–1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// The failing keys (parked or backing off) whose last errors differ only by
/// the key or by numbers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorGroupBody {
    /// The error with the key replaced by `<key>` and every run of digits by
    /// `<n>`: pass it as `error` to act on the group's keys.
    pub signature: String,
    /// One of the group's errors as stored.
    pub sample: String,
    /// How many keys have it.
    pub count: u64,
    /// The states those keys are in: `parked`, `backoff` or both.
    pub states: Vec<StateName>,
}

impl From<ErrorGroup> for ErrorGroupBody {
    fn from(g: ErrorGroup) -> Self {
        Self {
            signature: g.signature,
            sample: g.sample,
            count: g.count,
            states: g.states.into_iter().map(Into::into).collect(),
        }
    }
}

/// Response of `GET /v1/processes/{process}/error-groups`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorGroupList {
    /// The groups, most keys first.
    pub groups: Vec<ErrorGroupBody>,
}

/// A state a bulk action may select keys by (never `running`: only a key's
/// worker may end its run).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkState {
    /// Waiting to run.
    Pending,
    /// Waiting for its backoff to end.
    Backoff,
    /// Stopped after a permanent error until the next enqueue.
    Parked,
    /// Converged.
    Idle,
}

impl From<BulkState> for ItemState {
    fn from(s: BulkState) -> Self {
        match s {
            BulkState::Pending => Self::Pending,
            BulkState::Backoff => Self::Backoff,
            BulkState::Parked => Self::Parked,
            BulkState::Idle => Self::Idle,
        }
    }
}

/// Body of `POST /v1/processes/{process}/items:retry` and `…/items:delete`:
/// which keys. Every condition given must hold; at least one is required, so
/// nobody acts on a whole process by accident. Running keys are never touched.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// Only keys in this state.
    #[serde(default)]
    #[schema(nullable = false)]
    pub state: Option<BulkState>,
    /// Only keys whose last error has this signature (an error group's
    /// `signature`); without `state`, only parked and backing-off keys.
    #[serde(default)]
    #[schema(nullable = false, min_length = 1, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
    /// Only keys starting with this (at most 1024 bytes, as a key).
    #[serde(default)]
    #[schema(
        nullable = false,
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000]*$"
    )]
    pub key_prefix: Option<String>,
}

/// Body of `POST /v1/processes/{process}/items:park`: which keys, as for
/// [`BulkRequest`], and why.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkParkRequest {
    /// Only keys in this state.
    #[serde(default)]
    #[schema(nullable = false)]
    pub state: Option<BulkState>,
    /// Only keys whose last error has this signature.
    #[serde(default)]
    #[schema(nullable = false, min_length = 1, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
    /// Only keys starting with this (at most 1024 bytes, as a key).
    #[serde(default)]
    #[schema(
        nullable = false,
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000]*$"
    )]
    pub key_prefix: Option<String>,
    /// The keys' new last error (default "parked by an operator").
    #[serde(default)]
    pub reason: Option<String>,
}

/// What a bulk action did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BulkResponse {
    /// How many keys changed (each with a row in its history).
    pub changed: u64,
}
