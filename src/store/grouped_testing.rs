//! What the grouping tests of both engines share: requests made in tasks of
//! their own (so that several can queue behind the first), the set-up they
//! claim from, and waiting without sleeping.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::store::fleet::Claimed;
use crate::store::params::{ItemEnqueue, LeaseClaim, LeaseComplete, SessionStart};
use crate::store::types::{Lease, Outcome, SessionId};
use crate::store::{StoreEngine, StoreError};

/// How long a step may take before the test fails instead of hanging.
pub(super) const PATIENCE: Duration = Duration::from_secs(30);

/// Claims up to `max` keys of `process` for `session`, in a task of its own.
pub(super) fn claim<S: StoreEngine + Clone + 'static>(
    store: &S,
    session: SessionId,
    process: &str,
    max: u32,
) -> JoinHandle<Result<Claimed, StoreError>> {
    let (store, process) = (store.clone(), process.to_owned());
    tokio::spawn(async move {
        store
            .lease_claim(LeaseClaim {
                session,
                process,
                max,
                trace_links: false,
            })
            .await
    })
}

/// Settles `outcomes` as one batch, in a task of its own.
pub(super) fn complete<S: StoreEngine + Clone + 'static>(
    store: &S,
    outcomes: Vec<(Lease, Outcome)>,
) -> JoinHandle<Result<Vec<Result<(), StoreError>>, StoreError>> {
    let store = store.clone();
    tokio::spawn(async move {
        let batch: Vec<LeaseComplete<'_>> = outcomes
            .iter()
            .map(|(lease, outcome)| LeaseComplete {
                lease,
                outcome,
                trace_id: None,
            })
            .collect();
        store.lease_complete_batch(&batch).await
    })
}

/// `process`'s six keys (`process-0` to `process-5`), enqueued.
pub(super) async fn enqueue<S: StoreEngine>(store: &S, process: &str) {
    let keys: Vec<String> = (0..6).map(|k| format!("{process}-{k}")).collect();
    store
        .item_enqueue(ItemEnqueue::new(process, keys))
        .await
        .expect("keys enqueue");
}

/// `process`'s six keys, enqueued, and the first `n` claimed by `session`.
pub(super) async fn claimed<S: StoreEngine + Clone + 'static>(
    store: &S,
    session: SessionId,
    process: &str,
    n: u32,
) -> Vec<Lease> {
    enqueue(store, process).await;
    claim(store, session, process, n)
        .await
        .expect("a claim's task")
        .expect("a claim")
        .leases
}

/// Each lease's clean `done`.
pub(super) fn done(leases: &[Lease]) -> Vec<(Lease, Outcome)> {
    leases.iter().map(|l| (l.clone(), Outcome::Done)).collect()
}

/// A session of `store`'s, for ten minutes.
pub(super) async fn session<S: StoreEngine>(store: &S, name: &str) -> SessionId {
    store
        .session_start(SessionStart::new(name, Duration::from_secs(600)))
        .await
        .expect("a session starts")
        .id
}

/// Commits `holder`'s transaction (the lock the first request waits for),
/// then awaits `first` and `rest`.
pub(super) async fn release<T, C>(
    holder: &mut C,
    first: JoinHandle<T>,
    rest: Vec<JoinHandle<T>>,
) -> (T, Vec<T>)
where
    for<'c> &'c mut C: sqlx::Executor<'c>,
{
    sqlx::Executor::execute(&mut *holder, "COMMIT")
        .await
        .expect("the lock is released");
    let first = first.await.expect("the first request's task");
    let mut answers = Vec::new();
    for task in rest {
        answers.push(task.await.expect("a request's task"));
    }
    (first, answers)
}

/// Waits, without sleeping, until `ready` holds.
pub(super) async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !ready() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("still waiting for {what} after {PATIENCE:?}"));
}

/// The keys of a claim's leases, in claim order.
pub(super) fn keys(claimed: &Claimed) -> Vec<&str> {
    claimed.leases.iter().map(|l| l.key.as_str()).collect()
}
