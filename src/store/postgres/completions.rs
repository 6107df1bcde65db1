//! Completions grouped per store ([`grouped`](crate::store::grouped)): the batches
//! of outcomes that several controllers sharing one store write at once
//! settle in one transaction.
//!
//! Each controller's completer already writes its runs' outcomes in batches,
//! but a node running a hundred control loops of ten runs each still wrote a
//! hundred small batches, each with its own transaction and commit. Grouped,
//! they are one batch: [`complete_in_parts`] settles a batch of many sessions
//! and processes the general way (the session check, the locking read in
//! key order, the runs, the rows), each lease answered on its own as before.

use std::sync::Arc;

use super::engine::PostgresStore;
use super::retry::{bounded, watched};
use crate::store::StoreError;
use crate::store::TraceId;
use crate::store::grouped::{self, Answer, Group, Grouped};
use crate::store::params::LeaseComplete;
use crate::store::rules::parts::{complete_callers_in_parts, complete_in_parts};
use crate::store::rules::written::Settlements;
use crate::store::types::{Lease, Outcome};

/// One outcome to write, owned, as it waits for its group.
pub(super) struct Owned {
    lease: Lease,
    outcome: Outcome,
    trace_id: Option<TraceId>,
}

impl Owned {
    fn of(params: &LeaseComplete<'_>) -> Self {
        Self {
            lease: params.lease.clone(),
            outcome: params.outcome.clone(),
            trace_id: params.trace_id,
        }
    }

    fn params(&self) -> LeaseComplete<'_> {
        LeaseComplete {
            lease: &self.lease,
            outcome: &self.outcome,
            trace_id: self.trace_id,
        }
    }
}

/// The completion groups of one store.
pub(super) type Completions = Grouped<Vec<Owned>, Answer<Settlements>>;

/// Completions, grouped.
struct Completing;

impl Group for Completing {
    type Store = PostgresStore;
    type Req = Vec<Owned>;
    type Ans = Answer<Settlements>;

    fn weight(batch: &Vec<Owned>) -> usize {
        batch.len()
    }

    /// Twice the runner's completer's largest batch (2,048): a group stays
    /// one transaction of bounded size, and a full batch still joins the one
    /// before it.
    const MOST: usize = 4096;

    fn grouped(store: &PostgresStore) -> &Arc<Completions> {
        &store.completions
    }

    /// A group of several callers steps aside from a row lock held past
    /// [`STALL`](crate::store::grouped::STALL) (see
    /// [`PostgresStore::stepping_aside`]): its callers then run their batches
    /// on their own. A group of one runs as its caller would.
    async fn run(store: &PostgresStore, group: Vec<Vec<Owned>>) -> Vec<Self::Ans> {
        let all: Vec<LeaseComplete<'_>> = group.iter().flatten().map(Owned::params).collect();
        let callers: Vec<usize> = group.iter().map(Vec::len).collect();
        let stepping_aside;
        let store = if group.len() > 1 {
            stepping_aside = store.stepping_aside();
            &stepping_aside
        } else {
            store
        };
        match bounded(
            store,
            watched(store, complete_callers_in_parts(store, &all, &callers)),
        )
        .await
        {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                group
                    .iter()
                    .map(|batch| Answer::Done(answers.by_ref().take(batch.len()).collect()))
                    .collect()
            }
            Err(e) => Answer::failed(group.len(), e, "completions"),
        }
    }
}

/// Settles `batch` in the next group of the store's completions.
pub(super) async fn complete(
    store: &PostgresStore,
    batch: &[LeaseComplete<'_>],
) -> Result<Settlements, StoreError> {
    if let Some(_leading) = grouped::lead::<Completing>(store) {
        return bounded(store, watched(store, complete_in_parts(store, batch))).await;
    }
    let owned = batch.iter().map(Owned::of).collect();
    match Answer::result(grouped::wait::<Completing>(store, owned).await) {
        Some(result) => result,
        None => bounded(store, watched(store, complete_in_parts(store, batch))).await,
    }
}
