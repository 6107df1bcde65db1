//! [`Role`]: what a token may do. A word of its own, so the error type (which
//! says which role a route needed) and the authentication (which finds a
//! token's role) both name it without importing each other.

use std::fmt;

use serde::Serialize;
use utoipa::ToSchema;

/// What a token may do. Roles are ordered: each includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read: processes, items, history, metrics, the dashboard.
    Viewer,
    /// Viewer, plus enqueue, sessions, claim, complete and release.
    Worker,
    /// Everything, including retry, park and delete.
    Admin,
}

impl Role {
    /// Parses `viewer`, `worker` or `admin`.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "viewer" => Some(Self::Viewer),
            "worker" => Some(Self::Worker),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    /// The role's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Worker => "worker",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
