//! Helpers for the store's contract suite (`tests/store_*.rs`): one process, `P`,
//! and short forms of the operations the tests repeat.

use std::time::Duration;

use drover::backoff::Backoff;
use drover::store::{
    Item, ItemEnqueue, ItemGet, ItemTriage, Lease, LeaseClaim, LeaseComplete, Outcome,
    ProcessConfigure, ProcessCounts, Run, RunList, RunOutcome, SessionId, SessionStart, Store,
    StoreEngine as _, StoreError,
};

/// The process every contract test works on.
pub(crate) const P: &str = "provision";

/// `s` seconds.
pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Enqueues `keys` to [`P`] with default options.
pub(crate) async fn enqueue(store: &Store, keys: &[&str]) {
    store
        .item_enqueue(ItemEnqueue::new(P, keys.iter().copied()))
        .await
        .expect("enqueue");
}

/// Claims up to `max` keys of [`P`] for `session`.
pub(crate) async fn claim(store: &Store, session: SessionId, max: u32) -> Vec<Lease> {
    store
        .lease_claim(LeaseClaim {
            session,
            process: P.into(),
            max,
            trace_links: false,
        })
        .await
        .expect("claim")
        .leases
}

/// Claims up to `max` ready keys of `process` under a fresh session and ends
/// each run with `outcome`; the keys, in claim order.
pub(crate) async fn run_ready(
    store: &Store,
    process: &str,
    max: u32,
    outcome: &Outcome,
) -> Vec<String> {
    let session = store
        .session_start(SessionStart::new("test", Duration::from_secs(30)))
        .await
        .expect("session_start");
    let claim = LeaseClaim {
        session: session.id,
        process: process.into(),
        max,
        trace_links: false,
    };
    let leases = store.lease_claim(claim).await.expect("claim").leases;
    let results = store
        .lease_complete_batch(&batch(&leases, outcome))
        .await
        .expect("complete");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    leases.into_iter().map(|l| l.key).collect()
}

/// One completion batch: `outcome` for each of `leases`, in order.
pub(crate) fn batch<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    outcome: &'a Outcome,
) -> Vec<LeaseComplete<'a>> {
    leases
        .into_iter()
        .map(|lease| LeaseComplete {
            lease,
            outcome,
            trace_id: None,
        })
        .collect()
}

/// The leases' keys, in order.
pub(crate) fn keys(leases: &[Lease]) -> Vec<&str> {
    leases.iter().map(|l| l.key.as_str()).collect()
}

/// Completes `batch` as a worker does: an outcome answered
/// [`StoreError::KeyBusy`] (its key's row held by another transaction, a
/// producer's enqueue of the running key on PostgreSQL) is sent again after
/// a short backoff until it is answered otherwise. The answers, by position.
pub(crate) async fn complete_batch_as_a_worker(
    store: &Store,
    batch: &[LeaseComplete<'_>],
) -> Vec<Result<(), StoreError>> {
    let mut answers: Vec<Option<Result<(), StoreError>>> = batch.iter().map(|_| None).collect();
    let mut backoff = std::time::Duration::from_millis(5);
    for _ in 0..100 {
        let todo: Vec<usize> = (0..batch.len()).filter(|&n| answers[n].is_none()).collect();
        if todo.is_empty() {
            break;
        }
        let again: Vec<LeaseComplete<'_>> = todo.iter().map(|&n| batch[n]).collect();
        let got = store.lease_complete_batch(&again).await.expect("complete");
        for (n, answer) in todo.into_iter().zip(got) {
            if !matches!(answer, Err(StoreError::KeyBusy { .. })) {
                answers[n] = Some(answer);
            }
        }
        tokio::time::sleep(backoff).await; // a worker's retry backoff
        backoff = (backoff * 2).min(std::time::Duration::from_millis(100));
    }
    answers
        .into_iter()
        .map(|a| a.expect("answered other than busy within 100 tries"))
        .collect()
}

/// Completes one lease.
pub(crate) async fn complete(
    store: &Store,
    lease: &Lease,
    outcome: Outcome,
) -> Result<(), StoreError> {
    store
        .lease_complete(LeaseComplete {
            lease,
            outcome: &outcome,
            trace_id: None,
        })
        .await
}

/// The item of `key` in [`P`], if any.
pub(crate) async fn item(store: &Store, key: &str) -> Option<Item> {
    store
        .item_get(ItemGet {
            process: P.into(),
            key: key.into(),
            runs_limit: 0,
        })
        .await
        .expect("item_get")
        .map(|d| d.item)
}

/// The first page (up to ten items) of [`P`]'s process page, in triage order.
pub(crate) async fn first_page(store: &Store) -> Vec<Item> {
    let triage = ItemTriage {
        process: P.into(),
        state: None,
        key_prefix: None,
        after: None,
        limit: 10,
    };
    let page = store.item_triage(triage).await.expect("the process page");
    page.items
}

/// The newest `limit` runs (and actions) of `key`, newest first.
pub(crate) async fn history(store: &Store, key: &str, limit: u32) -> Vec<Run> {
    store
        .run_list(RunList {
            process: Some(P.into()),
            key: Some(key.into()),
            limit,
            ..RunList::default()
        })
        .await
        .expect("history")
}

/// Every outcome in `key`'s history, oldest first.
pub(crate) async fn events(store: &Store, key: &str) -> Vec<RunOutcome> {
    let mut events: Vec<_> = history(store, key, 100)
        .await
        .into_iter()
        .map(|e| e.outcome)
        .collect();
    events.reverse();
    events
}

/// Sets [`P`]'s backoff: `initial` seconds, ×2, at most `max` seconds.
pub(crate) async fn configure(store: &Store, initial: u64, max: u64) {
    store
        .process_configure(
            ProcessConfigure::new(P)
                .backoff(Backoff::new(secs(initial), 2.0, secs(max)).expect("valid backoff")),
        )
        .await
        .expect("configure");
}

/// `n` keys `{prefix}0000`, `{prefix}0001`, …: enough of them push a batch
/// onto an engine's bulk path (PostgreSQL's `COPY`, from 1,000 keys).
pub(crate) fn filler(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

/// [`P`]'s stored counts.
pub(crate) async fn p_counts(store: &Store) -> ProcessCounts {
    store
        .process_counts_all()
        .await
        .expect("counts")
        .into_iter()
        .find(|c| c.process == P)
        .expect("P is counted")
}

/// Writes into `drover_items` of SQLite, as hand-written SQL can, a pending
/// key of [`P`] that is not UTF-8 (`f` and the byte 0xFF): ready before every
/// other key, or with `behind`'s ready and enqueue times (so after it).
pub(crate) async fn write_key_not_utf8(db: &super::TestDb, behind: Option<&str>) {
    let times = match behind {
        None => "0, 0".to_owned(),
        Some(key) => format!(
            "(SELECT ready_at FROM drover_items WHERE process = '{P}' AND key = '{key}'),
             (SELECT enqueued_at FROM drover_items WHERE process = '{P}' AND key = '{key}')"
        ),
    };
    db.execute(&format!(
        "INSERT INTO drover_items (process, key, state, ready_at, enqueued_at)
         VALUES ('{P}', CAST(X'66FF' AS TEXT), 'pending', {times})"
    ))
    .await;
}
