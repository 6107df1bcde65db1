//! Which leases of a completion batch still hold their key, decided on the rows
//! the engine locked (or, on SQLite, read under the write lock).
//!
//! Both engines find the rows the cheapest way their planner cannot get wrong
//! (one probe per key or per token) and leave the fencing decision to this one
//! function, so the rule is written once: a lease holds its key when the row is
//! running under the lease's own token and session, and that session is live.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::settle::{Running, Settled, settle};
use crate::store::StoreError;
use crate::store::params::LeaseComplete;
use crate::store::types::{Lease, SessionId};

/// What an engine found at one lease's key: a row of its lease query (the
/// engine's own running-row type flattened into `row`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Found<T> {
    pub(crate) process: String,
    pub(crate) key: String,
    pub(crate) state: String,
    pub(crate) lease_token: Option<i64>,
    pub(crate) lease_session: Option<i64>,
    /// The engine's own row, handed back for the leases that hold it.
    #[sqlx(flatten)]
    pub(crate) row: T,
}

/// Each lease's row by position in `batch`, `None` where the lease no longer
/// holds its key or its session is not in `live`. A row is its lease's when
/// it runs under the lease's token and session for the lease's process and
/// key, all four: a store's completion groups put many callers' batches in
/// one, and a lease forged with another caller's token (tokens are handed
/// out in order, so they are easy to guess) must not take that caller's
/// place and leave its key running with no one to end it. A lease repeated
/// in the batch keeps only its first position (the repeat is refused as
/// lost).
pub(crate) fn match_leases<R>(
    batch: &[LeaseComplete<'_>],
    live: &[i64],
    found: impl IntoIterator<Item = Found<R>>,
) -> Vec<Option<R>> {
    let mut position = HashMap::with_capacity(batch.len());
    for (n, params) in batch.iter().enumerate() {
        let lease = params.lease;
        let holder = (
            lease.token.0,
            lease.session.0,
            lease.process.as_str(),
            lease.key.as_str(),
        );
        position.entry(holder).or_insert(n);
    }
    let mut rows: Vec<Option<R>> = batch.iter().map(|_| None).collect();
    for found in found {
        let (Some(token), Some(session)) = (found.lease_token, found.lease_session) else {
            continue;
        };
        let holder = (token, session, found.process.as_str(), found.key.as_str());
        let Some(&n) = position.get(&holder) else {
            continue;
        };
        if found.state == "running" && live.contains(&session) {
            rows[n] = Some(found.row);
        }
    }
    rows
}

/// An engine's running row as a completion reads it: its id and what
/// [`settle`] needs.
pub(crate) trait Held {
    /// The row's primary key.
    fn id(&self) -> i64;
    /// The row's running state.
    fn running(&self) -> Running;
}

/// The distinct sessions of `batch`, to look up once each.
pub(crate) fn asked_sessions(batch: &[LeaseComplete<'_>]) -> Vec<i64> {
    let asked: HashSet<i64> = batch.iter().map(|p| p.lease.session.0).collect();
    asked.into_iter().collect()
}

/// The `asked` sessions missing from `live` (gone, or past their deadline).
pub(crate) fn expired_sessions(asked: Vec<i64>, live: &[i64]) -> HashSet<SessionId> {
    asked
        .into_iter()
        .filter(|id| !live.contains(id))
        .map(SessionId)
        .collect()
}

/// What a batch of completions settles to, before the engine writes it.
#[derive(Debug)]
pub(crate) struct Settling<'a> {
    /// Each lease's answer, by position in the batch.
    pub(crate) results: Vec<Result<(), StoreError>>,
    /// Processes with a key pending again and ready now (a dirty re-run), whose
    /// idle controllers should be woken once the batch commits.
    pub(crate) ready: HashSet<&'a str>,
}

/// Settles each lease of `batch` whose row is held (`rows`, by position, as
/// [`match_leases`] gives them): hands the lease, its row and its outcome to
/// `write`, answers `Ok`. The others are refused on their own, `SessionExpired` when their
/// session is in `expired`, `LeaseLost` otherwise; a row met twice in one batch
/// is settled once.
pub(crate) fn settle_batch<'a, R: Held>(
    now: DateTime<Utc>,
    batch: &[LeaseComplete<'a>],
    rows: Vec<Option<R>>,
    expired: &HashSet<SessionId>,
    mut write: impl FnMut(&LeaseComplete<'a>, R, Settled),
) -> Settling<'a> {
    let mut seen = HashSet::with_capacity(batch.len());
    let mut settling = Settling {
        results: Vec::with_capacity(batch.len()),
        ready: HashSet::new(),
    };
    for (params, row) in batch.iter().zip(rows) {
        let lease: &'a Lease = params.lease;
        let result = match row.filter(|row| seen.insert(row.id())) {
            Some(row) => {
                let mut settled = settle(now, &row.running(), params.outcome);
                settled.next.sign(&lease.key);
                if settled.next.ready_by(now) {
                    settling.ready.insert(lease.process.as_str());
                }
                write(params, row, settled);
                Ok(())
            }
            None if expired.contains(&lease.session) => Err(StoreError::SessionExpired {
                session: lease.session,
            }),
            None => Err(StoreError::lease_lost(lease)),
        };
        settling.results.push(result);
    }
    settling
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::store::{FencingToken, Lease, Outcome, SessionId};

    fn lease(key: &str, token: i64, session: i64) -> Lease {
        Lease {
            session: SessionId(session),
            process: "p".into(),
            key: key.into(),
            token: FencingToken(token),
            attempt: 1,
            priority: 0,
            enqueued_at: Utc::now(),
            started_at: Utc::now(),
            trace_links: None,
        }
    }

    fn found(key: &str, running: bool, token: i64, session: i64) -> Found<&'static str> {
        Found {
            process: "p".into(),
            key: key.into(),
            state: if running { "running" } else { "pending" }.into(),
            lease_token: Some(token),
            lease_session: Some(session),
            row: "row",
        }
    }

    /// Each of `leases` completed `done`, as a batch.
    fn done<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Vec<LeaseComplete<'a>> {
        leases
            .into_iter()
            .map(|lease| LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            })
            .collect()
    }

    /// Two callers' batches in one group: a lease forged with the other
    /// caller's token, its session and key its own, comes first. The row
    /// stays the genuine lease's, and the forged one is refused.
    #[test]
    fn a_lease_forged_with_another_callers_token_does_not_take_its_row() {
        let forged = Lease {
            process: "q".into(),
            ..lease("mine", 2, 8)
        };
        let genuine = lease("victim", 2, 7);
        let rows = match_leases(
            &done([&forged, &genuine]),
            &[7, 8],
            [found("victim", true, 2, 7), found("mine", true, 5, 8)],
        );
        let held: Vec<bool> = rows.iter().map(Option::is_some).collect();
        assert_eq!(held, [false, true], "the genuine lease keeps its row");
    }

    #[test]
    fn only_running_rows_under_the_same_token_session_and_key_hold() {
        let leases = [
            lease("held", 1, 7),
            lease("requeued", 2, 7),
            lease("retoken", 3, 7),
            lease("stolen", 4, 7),
            lease("dead", 5, 8),
            lease("forged", 6, 7),
            lease("held", 1, 7),
        ];
        let rows = match_leases(
            &done(&leases),
            &[7],
            [
                found("held", true, 1, 7),
                found("requeued", false, 2, 7),
                found("retoken", true, 33, 7),
                found("stolen", true, 4, 9),
                found("dead", true, 5, 8),
                found("other", true, 6, 7),
            ],
        );
        let held: Vec<bool> = rows.iter().map(Option::is_some).collect();
        assert_eq!(held, [true, false, false, false, false, false, false]);
    }
}
