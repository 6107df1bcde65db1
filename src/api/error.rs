//! The error body every failed request answers with.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The JSON body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code: `bad_request`, `unauthorized`,
    /// `forbidden`, `cross_origin` (a browser's request for another site's
    /// page), `not_found`, `method_not_allowed`, `lease_lost`,
    /// `session_expired`, `item_running`, `process_held`, `key_busy` (one
    /// outcome of a batch, whose key's row another transaction holds: send it
    /// again), `payload_too_large`, `invalid_key`,
    /// `invalid_process`, `unavailable`, `commit_unknown` (a 503 after which
    /// the request may have been applied), `internal`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    /// The request field at fault (`keys[2]`, `ttl_ms`, `limit`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
