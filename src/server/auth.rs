//! Bearer-token authentication with three roles, checked per route class.
//!
//! Tokens come from `--tokens FILE` or `DROVER_TOKENS`, one `ROLE:TOKEN` per
//! line or comma-separated entry. A request carries its token as
//! `Authorization: Bearer TOKEN`, or, for the dashboard in a browser, as the
//! password of HTTP Basic auth (any user name). Without tokens the server is open
//! and every caller is an admin, which `drover serve` only allows on a loopback
//! address unless `--insecure` is given.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use base64::Engine as _;

use super::error::ApiError;
use super::role::Role;
use super::state::AppState;

/// A token list that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// An entry is not `ROLE:TOKEN` with a known role and a non-empty token.
    #[error("token entry {entry} is not ROLE:TOKEN with ROLE viewer, worker or admin")]
    Malformed {
        /// The 1-based entry number (line or comma-separated item).
        entry: usize,
    },
    /// Two entries give one token different roles. Which was meant cannot be
    /// told, and the later one would win unseen: a viewer's entry copied
    /// after an admin's took the admin's rights away, an admin's after a
    /// viewer's gave them. (The same role twice is only a repeat.)
    #[error(
        "token entry {entry} gives the token of entry {first} another role: give each token one role"
    )]
    Conflicting {
        /// The 1-based number of the later entry.
        entry: usize,
        /// The 1-based number of the entry that first gave the token.
        first: usize,
    },
}

/// The known tokens and their roles. The tokens themselves are never printed
/// (`Debug` shows only how many there are).
#[derive(Clone, Default)]
pub struct Tokens {
    roles: HashMap<String, Role>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokens({} known)", self.roles.len())
    }
}

impl Tokens {
    /// Parses `ROLE:TOKEN` entries separated by newlines or commas; blank entries
    /// and lines starting with `#` are skipped. Any malformed entry, or a token
    /// given two roles, fails the whole list, so a typo never silently locks a
    /// client out (or lets one in).
    pub fn parse(text: &str) -> Result<Self, TokensError> {
        let mut tokens = Self::default();
        let mut first: HashMap<&str, (Role, usize)> = HashMap::new();
        let entries = text.lines().flat_map(|line| line.split(','));
        for (index, entry) in entries.enumerate() {
            let entry = entry.trim();
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let parsed = entry
                .split_once(':')
                .and_then(|(role, token)| Some((Role::parse(role)?, token.trim())))
                .filter(|(_, token)| !token.is_empty());
            let Some((role, token)) = parsed else {
                return Err(TokensError::Malformed { entry: index + 1 });
            };
            let (was, at) = *first.entry(token).or_insert((role, index + 1));
            if was != role {
                return Err(TokensError::Conflicting {
                    entry: index + 1,
                    first: at,
                });
            }
            tokens.insert(token, role);
        }
        Ok(tokens)
    }

    /// Adds (or re-roles) one token.
    pub fn insert(&mut self, token: impl Into<String>, role: Role) {
        self.roles.insert(token.into(), role);
    }

    /// Whether no token is configured (the server is then open).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    /// How many tokens are known.
    #[must_use]
    pub fn len(&self) -> usize {
        self.roles.len()
    }

    /// How many worker tokens there are. An admin's token may claim too,
    /// but it is an operator's, not a fleet's: counted, it would halve the
    /// one worker token of the common set-up (`admin:…,worker:…`).
    pub(crate) fn workers(&self) -> usize {
        self.roles.values().filter(|r| **r == Role::Worker).count()
    }

    /// The caller's role from the request headers; `None` for no or an unknown
    /// token.
    #[cfg(test)]
    pub(crate) fn role_of(&self, headers: &HeaderMap) -> Option<Role> {
        self.caller_of(headers).map(|(role, _)| role)
    }

    /// The caller's role and token from the request headers; `None` for no
    /// or an unknown token.
    pub(crate) fn caller_of(&self, headers: &HeaderMap) -> Option<(Role, String)> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, credentials) = value.split_once(' ')?;
        let token = if scheme.eq_ignore_ascii_case("bearer") {
            credentials.trim().to_owned()
        } else if scheme.eq_ignore_ascii_case("basic") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(credentials.trim())
                .ok()?;
            let pair = String::from_utf8(decoded).ok()?;
            pair.split_once(':')?.1.to_owned()
        } else {
            return None;
        };
        let role = self.roles.get(&token).copied()?;
        Some((role, token))
    }
}

/// A route class: the least role its routes need.
pub(crate) trait Class {
    /// The least role.
    const NEEDS: Role;
}

/// Read routes.
#[derive(Debug)]
pub(crate) struct Read;
/// Worker routes: enqueue, sessions, leases.
#[derive(Debug)]
pub(crate) struct Work;
/// Admin routes: retry, park, delete.
#[derive(Debug)]
pub(crate) struct Manage;

impl Class for Read {
    const NEEDS: Role = Role::Viewer;
}
impl Class for Work {
    const NEEDS: Role = Role::Worker;
}
impl Class for Manage {
    const NEEDS: Role = Role::Admin;
}

/// Proof that the caller may use a route of class `C`. Listed first among a
/// handler's extractors, so an unauthenticated request is refused (401/403)
/// before its body or parameters are even read.
#[derive(Debug)]
pub(crate) struct Authorized<C> {
    /// The caller's role.
    pub(crate) role: Role,
    /// The fingerprint of the caller's token (`None` on an open server): who
    /// owns the sessions it starts (see `owner.rs`).
    pub(crate) owner: Option<String>,
    class: PhantomData<C>,
}

impl<C: Class> FromRequestParts<AppState> for Authorized<C> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let (role, owner) = state.caller(&parts.headers)?;
        if role < C::NEEDS {
            return Err(ApiError::Forbidden {
                needed: C::NEEDS,
                has: role,
            });
        }
        Ok(Self {
            role,
            owner,
            class: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("ascii"),
        );
        h
    }

    #[test]
    fn entries_parse_from_lines_and_commas() {
        let tokens = Tokens::parse("# ops\nadmin:a1\nworker:w1, viewer:v1\n\n").expect("valid");
        assert_eq!(tokens.len(), 3);
        assert_eq!(tokens.role_of(&headers("Bearer w1")), Some(Role::Worker));
        assert_eq!(tokens.role_of(&headers("Bearer nope")), None);
    }

    #[test]
    fn a_malformed_entry_rejects_the_list() {
        assert!(matches!(
            Tokens::parse("admin:a1\nroot:x"),
            Err(TokensError::Malformed { entry: 2 })
        ));
        assert!(Tokens::parse("admin:").is_err());
        assert!(matches!(
            Tokens::parse("viewer:t\nworker:w\nadmin:t"),
            Err(TokensError::Conflicting { entry: 3, first: 1 })
        ));
        assert_eq!(Tokens::parse("admin:t,admin:t").expect("a repeat").len(), 1);
    }

    #[test]
    fn basic_auth_carries_the_token_as_password() {
        let tokens = Tokens::parse("viewer:v1").expect("valid");
        let basic = base64::engine::general_purpose::STANDARD.encode("me:v1");
        assert_eq!(
            tokens.role_of(&headers(&format!("Basic {basic}"))),
            Some(Role::Viewer)
        );
    }

    #[test]
    fn roles_include_the_ones_below() {
        assert!(Role::Admin > Role::Worker && Role::Worker > Role::Viewer);
    }
}
