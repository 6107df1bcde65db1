//! Claims grouped per store ([`grouped`](crate::store::grouped)): the common
//! claims ([`QUICK`](super::leases::QUICK)) of many controllers sharing one
//! SQLite store that arrive while a claim holds the writer go together in the
//! next transaction, one commit (and, with `synchronous=FULL`, one sync of
//! the write-ahead log) for all of them.
//!
//! SQLite runs one write transaction at a time, so controllers sharing a
//! store already queued for its writer one after the other; each claim was
//! still a transaction and a commit of its own. A node running a hundred
//! control loops of ten runs each (`drover bench burn-down --processes 100`,
//! or one `drover serve` answering a hundred workers) paid a commit for every
//! few keys.
//!
//! Each claim in a group runs [`QUICK`](super::leases::QUICK)'s own
//! statements, with its own session, process and maximum, in a savepoint of
//! its own, one after the other: its order, its fencing tokens and its
//! answer are those of a claim on its own that ran at that moment. A claim
//! whose statements fail takes back its own writes and runs again on its
//! own, with its own error if it fails again.

use std::sync::Arc;

use super::engine::SqliteStore;
use super::leases::{
    QUICK, QUICK_IN_GROUP, Quick, QuickAnswer, bind_quick, claim_quick_alone, quick_of,
};
use super::savepoints::each_in_its_savepoint;
use crate::store::StoreError;
use crate::store::grouped::{self, Answer, Group, Grouped};
use crate::store::params::LeaseClaim;

/// The claim groups of one store.
pub(super) type Claims = Grouped<LeaseClaim, Answer<QuickAnswer>>;

/// Common claims, grouped.
struct Claiming;

impl Group for Claiming {
    type Store = SqliteStore;
    type Req = LeaseClaim;
    type Ans = Answer<QuickAnswer>;

    fn weight(_: &LeaseClaim) -> usize {
        1
    }

    /// A group holds SQLite's one writer for all of its claims: bounded so
    /// that a completion or an enqueue behind it waits for at most this many.
    const MOST: usize = 128;

    fn grouped(store: &SqliteStore) -> &Arc<Claims> {
        &store.claims
    }

    async fn run(store: &SqliteStore, group: Vec<LeaseClaim>) -> Vec<Self::Ans> {
        match each_in_its_savepoint(store, &group, (QUICK, QUICK_IN_GROUP), bind_quick).await {
            Ok(answers) => answers,
            Err(e) => Answer::failed(group.len(), e, "claims"),
        }
    }
}

/// [`QUICK`](super::leases::QUICK)'s answer to `params`, in the next group
/// of the store's claims (or at once, in a transaction of its own, when no
/// claim holds the writer).
pub(super) async fn quick(store: &SqliteStore, params: &LeaseClaim) -> Result<Quick, StoreError> {
    if let Some(_leading) = grouped::lead::<Claiming>(store) {
        return claim_quick_alone(store, params).await;
    }
    match Answer::result(grouped::wait::<Claiming>(store, params.clone()).await) {
        Some(answer) => quick_of(params, answer?),
        None => claim_quick_alone(store, params).await,
    }
}
