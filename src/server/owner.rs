//! Sessions belong to the token that started them (DESIGN.md rule 13).
//!
//! Session ids are sequential and fencing tokens are shown on the workers
//! page, so a worker that could act on any session could heartbeat, claim,
//! complete or close another worker's. A session started through the server
//! stores a fingerprint of its caller's bearer token (SHA-256: the token
//! itself is never stored), and every later act on the session must come with
//! the same token; any other, admin tokens included, is refused with 403
//! `not_your_session`. An open server (no tokens) has one caller and checks
//! nothing. Sessions started on the database directly (a library worker) have
//! no owner, and no token may act on them through the server.
//!
//! A session's owner never changes, so the server keeps what it learnt
//! ([`SessionOwners`]): an act costs a database read only the first time this
//! server sees its session.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use sha2::{Digest as _, Sha256};

use super::error::ApiError;
use crate::store::{SessionId, Store, StoreEngine as _};

/// The most sessions whose owner is kept; past it the memory starts over
/// (each session is then read once more).
const KEPT: usize = 100_000;

/// The fingerprint of a bearer token, as stored with the sessions it starts.
pub(crate) fn fingerprint(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The owners of the sessions this server has seen.
#[derive(Debug, Default)]
pub(crate) struct SessionOwners {
    known: Mutex<HashMap<SessionId, Option<String>>>,
}

impl SessionOwners {
    /// Records the owner of a session this server just started.
    pub(crate) fn remember(&self, session: SessionId, owner: Option<String>) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= KEPT {
            known.clear();
        }
        known.insert(session, owner);
    }

    /// Refuses `caller` (a token's fingerprint; `None` on an open server)
    /// unless it started `session`; says whether the session is known.
    ///
    /// An unknown session is not passed on to the act: session ids are
    /// sequential and never reused, and a caller learns one only once its
    /// session has committed, so an id the database does not know is gone or
    /// someone else's next. Passed, a caller naming the next id could close,
    /// or claim under, the session another token was starting, between this
    /// check and its own act (on SQLite nearly every time: the check reads
    /// on a reader while the act queues behind that start on the writer).
    pub(crate) async fn check(
        &self,
        store: &Store,
        caller: Option<&str>,
        session: SessionId,
    ) -> Result<Standing, ApiError> {
        let unknown = self.check_all(store, caller, &[session]).await?;
        Ok(if unknown.is_empty() {
            Standing::Yours
        } else {
            Standing::Unknown
        })
    }

    /// [`check`](Self::check) for many sessions at once (a completion
    /// batch's): refuses `caller` unless it started every one the database
    /// knows, and returns those it does not know. The sessions this server
    /// has not seen are read in one query, so a batch naming thousands of
    /// made-up ids costs one read, not thousands.
    pub(crate) async fn check_all(
        &self,
        store: &Store,
        caller: Option<&str>,
        sessions: &[SessionId],
    ) -> Result<HashSet<SessionId>, ApiError> {
        let Some(caller) = caller else {
            return Ok(HashSet::new());
        };
        let mut owners = HashMap::with_capacity(sessions.len());
        let mut unseen = Vec::new();
        {
            let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            for &session in sessions {
                match known.get(&session) {
                    Some(owner) => {
                        owners.insert(session, owner.clone());
                    }
                    None => unseen.push(session),
                }
            }
        }
        if !unseen.is_empty() {
            // Not remembered ones may not have started yet: those the
            // database does not know stay out of `owners`.
            for (session, owner) in store.session_owners(&unseen).await? {
                self.remember(session, owner.clone());
                owners.insert(session, owner);
            }
        }
        let mut unknown = HashSet::new();
        for &session in sessions {
            match owners.get(&session) {
                None => {
                    unknown.insert(session);
                }
                Some(owner) if owner.as_deref() == Some(caller) => {}
                Some(_) => return Err(ApiError::NotYourSession(session)),
            }
        }
        Ok(unknown)
    }
}

/// What [`SessionOwners::check`] found of a session its caller may act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The caller's (or any session, on an open server).
    Yours,
    /// Not in the database: expired and gone, or not started yet. Nothing
    /// may act on it (an act answers as for an expired session).
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_sha256_in_hex_and_hides_the_token() {
        // SHA-256 of "abc", from FIPS 180-2's examples.
        assert_eq!(
            fingerprint("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(!fingerprint("secret-token").contains("secret"));
    }
}
