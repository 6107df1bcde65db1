//! Health on the wire: what `/healthz` and `/readyz` answer.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Response of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unavailable` when the database cannot be reached.
    pub status: String,
    /// The engine: `sqlite` or `postgres`.
    pub database: String,
}
