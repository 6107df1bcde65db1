//! The HTTP API's wire format: the JSON shapes [`server`](crate::server) answers
//! with and [`client`](crate::client) sends, defined once for both. They are
//! separate from the store's domain types so the format is stable and documented
//! (every type here appears in `/openapi.json`). Durations are whole
//! milliseconds (`*_ms`); times are RFC 3339 in UTC.
//!
//! One file per noun, as the server's routes are: items,
//! leases, sessions, processes, runs, series, error groups, settings, health;
//! with the error body and the limits every route shares.
//!
//! One concept keeps one name from the store to the wire, with a suffix that
//! says the layer wherever the shapes differ: the store's domain type is the
//! bare noun ([`ProcessSettings`](crate::store::ProcessSettings)), its
//! parameters noun-then-verb ([`ProcessConfigure`](crate::store::ProcessConfigure)),
//! an engine's row `…Row`; here a resource as shown is `…Body`
//! ([`ProcessSettingsBody`]), an operation's input `…Request`
//! ([`ProcessConfigureRequest`]) and its answer, when it is not a resource,
//! `…Response` ([`PauseResponse`]). The wire shapes differ from the store's
//! where the wire needs it: durations as whole milliseconds, optional fields
//! that distinguish "unset" from "clear".

mod error;
mod groups;
mod health;
mod items;
mod leases;
mod limits;
mod path;
mod processes;
mod runs;
mod series;
mod sessions;
mod settings;

pub use error::ErrorBody;
#[cfg(feature = "server")]
pub(crate) use groups::ErrorGroupsQuery;
pub use groups::{
    BulkParkRequest, BulkRequest, BulkResponse, BulkState, ErrorGroupBody, ErrorGroupList,
};
pub use health::Health;
pub use items::{
    EnqueueRequest, EnqueueResponse, ItemBody, ItemDetailBody, ItemPage, StateName, TriagePageBody,
};
#[cfg(feature = "server")]
pub(crate) use items::{ItemGetQuery, ItemListQuery, TriageQuery};
pub use leases::{
    ClaimRequest, ClaimResponse, CompleteBatchRequest, CompleteBatchResponse, CompleteRequest,
    CompletionResult, LeaseBody, LeaseRef, OutcomeBody, ReleaseRequest, TraceContextBody,
    TraceLinkRequest, TraceLinksBody,
};
pub use limits::{MAX_CLAIM, MAX_COMPLETE_BATCH, MAX_ENQUEUE_KEYS, MAX_PAGE, MAX_TTL_MS};
#[cfg(feature = "server")]
pub(crate) use limits::{PROCESS_PAGE, SESSION_PAGE, max_delay_ms, ms};
pub(crate) use path::path_segment;
pub use processes::{ProcessList, ProcessSummary};
#[cfg(feature = "server")]
pub(crate) use processes::{ProcessListQuery, ProcessNameQuery};
#[cfg(feature = "server")]
pub(crate) use runs::RunListQuery;
pub use runs::{OutcomeName, RunBody, RunPage};
pub use series::{DepthPointBody, RunBucketBody, SeriesBody};
#[cfg(feature = "server")]
pub(crate) use sessions::SessionListQuery;
pub use sessions::{
    CloseResponse, HeartbeatResponse, HeldLeaseBody, SessionBody, SessionInfoBody, SessionListBody,
    SessionRequest,
};
pub use settings::{PauseResponse, ProcessConfigureRequest, ProcessSettingsBody};
