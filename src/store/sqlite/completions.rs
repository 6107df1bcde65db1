//! Completions grouped per store ([`grouped`](crate::store::grouped)): the
//! common batches ([`ONE_TRIP`](super::complete::ONE_TRIP): clean `done`s of
//! one session and one process) of many controllers sharing one SQLite store
//! that arrive while a batch holds the writer settle in the next
//! transaction, one commit for all of them.
//!
//! Each batch in a group runs [`ONE_TRIP`](super::complete::ONE_TRIP)'s own
//! statements in a savepoint of its own, one after the other, and is answered
//! the tokens it settled, as on its own; the leases it did not settle go the
//! general way afterwards, outside the group, as they did. A batch whose
//! statements fail takes back its own writes and runs again on its own.

use std::sync::Arc;

use super::complete::{Clean, ONE_TRIP, ONE_TRIP_IN_GROUP};
use super::engine::SqliteStore;
use super::savepoints::each_in_its_savepoint;
use crate::store::StoreError;
use crate::store::grouped::{self, Answer, Group, Grouped};

/// The completion groups of one store.
pub(super) type Completions = Grouped<Clean, Answer<(String,)>>;

/// Common completion batches, grouped.
struct Completing;

impl Group for Completing {
    type Store = SqliteStore;
    type Req = Clean;
    type Ans = Answer<(String,)>;

    fn weight(batch: &Clean) -> usize {
        batch.len()
    }

    /// Twice the runner's completer's largest batch (2,048), as on
    /// PostgreSQL: a group holds SQLite's one writer for a bounded time, and
    /// a full batch still joins the one before it.
    const MOST: usize = 4096;

    fn grouped(store: &SqliteStore) -> &Arc<Completions> {
        &store.completions
    }

    async fn run(store: &SqliteStore, group: Vec<Clean>) -> Vec<Self::Ans> {
        match each_in_its_savepoint(store, &group, (ONE_TRIP, ONE_TRIP_IN_GROUP), Clean::bind).await
        {
            Ok(answers) => answers,
            Err(e) => Answer::failed(group.len(), e, "completions"),
        }
    }
}

/// The tokens `batch` settled (as JSON), in the next group of the store's
/// common batches (or at once, in a transaction of its own, when no batch
/// holds the writer).
pub(super) async fn clean(store: &SqliteStore, batch: Clean) -> Result<String, StoreError> {
    if let Some(_leading) = grouped::lead::<Completing>(store) {
        return batch.write(store).await;
    }
    // Kept for a run on its own: the group takes the batch itself.
    let alone = batch.clone();
    match Answer::result(grouped::wait::<Completing>(store, batch).await) {
        Some(settled) => settled.map(|(settled,)| settled),
        None => alone.write(store).await,
    }
}
