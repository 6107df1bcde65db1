//! Sessions on the wire: start, heartbeat, close, and the list of live workers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::limits::millis;
use crate::store::Session;

/// A session as `GET /v1/sessions` lists it: who runs it and what it holds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionInfoBody {
    /// The session id.
    pub id: i64,
    /// The component that started it.
    pub component: String,
    /// The worker's host, as it reported it (null from older clients).
    pub host: Option<String>,
    /// The worker's process id.
    pub pid: Option<u32>,
    /// The worker's drover version.
    pub version: Option<String>,
    /// The TTL in milliseconds.
    pub ttl_ms: u64,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub deadline: DateTime<Utc>,
    /// Past its deadline: its leases go back to pending at the next reclaim.
    pub expired: bool,
    /// How many leases it holds.
    pub lease_count: u64,
    /// The oldest of them (at most 100).
    pub leases: Vec<HeldLeaseBody>,
}

/// A lease a session holds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeldLeaseBody {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// When its run started.
    pub started_at: Option<DateTime<Utc>>,
    /// Its fencing token; null for a viewer token, which may look at the
    /// workers but not at what would let it act for them.
    pub token: Option<i64>,
}

/// Query of `GET /v1/sessions` (and of the dashboard's workers page): one
/// page of the sessions, oldest first.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct SessionListQuery {
    /// Where the previous page ended: its `next` (a session id).
    pub(crate) after: Option<i64>,
    /// At most this many sessions (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// Response of `GET /v1/sessions`: one page of the sessions.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionListBody {
    /// The page's sessions, oldest (lowest id) first.
    pub sessions: Vec<SessionInfoBody>,
    /// Pass as `after` for the next page; null on the last page (absent from
    /// servers older than paging, which listed every session at once).
    #[serde(default)]
    pub next: Option<i64>,
}

#[cfg(feature = "server")] // built by the server only
impl From<crate::store::SessionInfo> for SessionInfoBody {
    fn from(s: crate::store::SessionInfo) -> Self {
        Self {
            id: s.id.0,
            component: s.component,
            host: s.identity.host,
            pid: s.identity.pid,
            version: s.identity.version,
            ttl_ms: millis(s.ttl),
            started_at: s.started_at,
            heartbeat_at: s.heartbeat_at,
            deadline: s.deadline,
            expired: s.expired,
            lease_count: s.lease_count,
            leases: s
                .leases
                .into_iter()
                .map(|l| HeldLeaseBody {
                    process: l.process,
                    key: l.key,
                    started_at: l.started_at,
                    token: Some(l.token.0),
                })
                .collect(),
        }
    }
}

/// Body of `POST /v1/sessions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Who is starting it, for operators ("billing-worker"); at most 1024
    /// bytes.
    #[schema(max_length = 1024)]
    pub component: String,
    /// How long the session lives without a heartbeat (1 ms – 1 day); heartbeat
    /// every third of it.
    #[schema(minimum = 1, maximum = 86400000)]
    pub ttl_ms: u64,
    /// The worker's host name, shown on the workers page (optional, as are
    /// `pid` and `version`: clients older than these fields send none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub host: Option<String>,
    /// The worker's process id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, maximum = 4294967295_u64)]
    pub pid: Option<u32>,
    /// The worker's drover (or client library) version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub version: Option<String>,
}

/// A live session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionBody {
    /// The id to heartbeat, claim with and close.
    pub id: i64,
    /// The component.
    pub component: String,
    /// The TTL in milliseconds.
    pub ttl_ms: u64,
    /// When it expires unless renewed (database clock).
    pub deadline: DateTime<Utc>,
}

impl From<Session> for SessionBody {
    fn from(s: Session) -> Self {
        Self {
            id: s.id.0,
            component: s.component,
            ttl_ms: millis(s.ttl),
            deadline: s.deadline,
        }
    }
}

/// Response of a heartbeat.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatResponse {
    /// The new deadline.
    pub deadline: DateTime<Utc>,
}

/// Response of closing a session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CloseResponse {
    /// How many leases went back to pending.
    pub released: u64,
}
