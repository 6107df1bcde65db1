//! Claims and completions grouped per store, in a schema of their own on the
//! test server (see [`Schema`]): a lock held by a connection of the test's
//! holds the first request in flight (run by its caller, see `lead`) while
//! others queue behind it; released, the queued ones must run as one group,
//! each answered as if it had run alone.
//!
//! Needs `DROVER_TEST_POSTGRES_URL`: without it the tests skip with a printed
//! reason; set, an unreachable database fails them.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::PostgresStore;
use super::plans::Schema;
use crate::store::fleet::ProcessPause;
use crate::store::grouped::Grouped;
use crate::store::grouped_testing::{
    PATIENCE, claim, claimed, complete, done, keys, release, session, until,
};
use crate::store::params::ItemEnqueue;
use crate::store::types::{FencingToken, Lease, Outcome, SessionId};
use crate::store::{StoreEngine as _, StoreError};
use sqlx::{Connection as _, Executor as _, PgConnection};

/// `store` with groups that never start beside a running one, so that the
/// tests that count groups count the same on a slow machine.
fn never_beside(store: &PostgresStore) -> PostgresStore {
    let mut store = store.clone();
    let never = Duration::from_secs(3600);
    store.claims = Arc::new(Grouped::with_stall(never));
    store.completions = Arc::new(Grouped::with_stall(never));
    store
}

/// Holds every completion statement at its start (each writes the runs'
/// history), for as long as the lock is held. A row lock no longer would: a
/// completion waits 100 ms at most for a row another transaction holds,
/// then skips it.
const STALL_COMPLETIONS: &str = "LOCK TABLE drover_runs IN EXCLUSIVE MODE";

/// Locks x-0's row, as a caller's transaction that enqueued the running key
/// does until it commits.
const LOCK_X0: &str = "SELECT 1 FROM drover_items WHERE process = 'x' AND key = 'x-0' FOR UPDATE";

/// A connection of the test's own in a transaction that has run `lock`. Not
/// one of the store's: the store ends its transactions left idle, and its new
/// connections read the lineage table, which a test may lock.
async fn holding(schema: &Schema, lock: &str) -> PgConnection {
    let mut holder = PgConnection::connect(&schema.url)
        .await
        .expect("a connection");
    holder
        .execute(sqlx::AssertSqlSafe(format!("BEGIN; {lock}")))
        .await
        .unwrap_or_else(|e| panic!("{lock}: {e}"));
    holder
}

#[tokio::test]
async fn claims_that_arrive_while_one_runs_share_one_statement_each_answered_as_if_alone() {
    let Some(schema) = Schema::create("drover_claims").await else {
        return;
    };
    let store = never_beside(&schema.store);
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    for process in ["a", "b", "c", "paused"] {
        let keys: Vec<String> = (0..6).map(|n| format!("{process}-{n}")).collect();
        store
            .item_enqueue(ItemEnqueue::new(process, keys))
            .await
            .expect("keys enqueue");
    }
    store
        .process_pause(ProcessPause {
            process: "paused".into(),
            paused: true,
            actor: "test".into(),
        })
        .await
        .expect("the process pauses");

    // Every claim statement waits at its start while this lock is held.
    let mut holder = holding(
        &schema,
        "LOCK TABLE drover_lineage IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let first = claim(&store, one, "a", 2);
    // Run by its caller, it holds the store's claims until it ends, which
    // the lock stops it from doing.
    until("the first claim to start", || store.claims.taken()).await;
    let rest = vec![
        claim(&store, two, "a", 2),
        claim(&store, one, "b", 3),
        claim(&store, two, "c", 10),
        claim(&store, SessionId(-1), "b", 2),
        claim(&store, one, "paused", 2),
    ];
    until("the other claims to queue", || {
        store.claims.waiting() == rest.len()
    })
    .await;
    let (first, answers) = release(&mut holder, first, rest).await;
    let first = first.expect("a claim");
    assert_eq!(
        store.claims.groups.load(Ordering::Relaxed),
        1,
        "the five claims that queued behind the first ran in one statement"
    );
    assert_eq!(keys(&first), ["a-0", "a-1"]);
    let [second, b, c, expired, paused] = <[_; 5]>::try_from(answers).expect("five answers");
    let second = second.expect("the second claim of a");
    // The second claim of the same process took the keys after the first's,
    // in FIFO order, as it would have alone.
    assert_eq!(keys(&second), ["a-2", "a-3"]);
    assert!(second.leases.iter().all(|l| l.session == two));
    assert_eq!(keys(&b.expect("a claim of b")), ["b-0", "b-1", "b-2"]);
    let c = c.expect("a claim of c");
    assert_eq!(
        keys(&c),
        ["c-0", "c-1", "c-2", "c-3", "c-4", "c-5"],
        "a claim asking for more than is ready takes what is"
    );
    // An unknown session's claim is refused alone, and took nothing.
    assert!(
        matches!(expired, Err(StoreError::SessionExpired { session }) if session == SessionId(-1)),
        "{expired:?}"
    );
    let paused = paused.expect("a claim of a paused process");
    assert!(paused.leases.is_empty() && paused.gate.paused, "{paused:?}");
    let tokens: HashSet<i64> = [&first, &second, &c]
        .iter()
        .flat_map(|claimed| claimed.leases.iter().map(|l| l.token.0))
        .collect();
    assert_eq!(
        tokens.len(),
        2 + 2 + 6,
        "every lease has a token of its own"
    );

    // The keys each claim took are running under its session; b's last
    // three are still pending for the next claim.
    let b_next = claim(&store, two, "b", 10)
        .await
        .expect("a claim's task")
        .expect("a claim of b");
    assert_eq!(keys(&b_next), ["b-3", "b-4", "b-5"]);
    let running: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_items WHERE state = 'running' AND lease_session IN ($1, $2)",
    )
    .bind(one.0)
    .bind(two.0)
    .fetch_one(store.pool())
    .await
    .expect("the running rows are counted");
    assert_eq!(running, 2 + 2 + 3 + 6 + 3);
    holder.close().await.expect("the connection closes");
    schema.remove().await;
}

#[tokio::test]
async fn batches_that_arrive_while_one_is_written_share_one_transaction_each_answered_as_if_alone()
{
    let Some(schema) = Schema::create("drover_completions").await else {
        return;
    };
    let store = never_beside(&schema.store);
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    let x = claimed(&store, one, "x", 2).await;
    let y = claimed(&store, two, "y", 2).await;
    let z = claimed(&store, one, "z", 2).await;
    let w = claimed(&store, two, "w", 1).await;
    let forged = Lease {
        token: FencingToken(w[0].token.0 + 1_000),
        ..w[0].clone()
    };

    // The first batch waits for this lock.
    let mut holder = holding(&schema, STALL_COMPLETIONS).await;
    let first = complete(&store, done(&x));
    until("the first batch to start", || store.completions.taken()).await;
    let rest = vec![
        complete(&store, done(&y)),
        complete(
            &store,
            vec![
                (z[0].clone(), Outcome::Done),
                (z[1].clone(), Outcome::Transient("boom".into())),
            ],
        ),
        complete(&store, vec![(forged.clone(), Outcome::Done)]),
    ];
    until("the other batches to queue", || {
        store.completions.waiting() == rest.len()
    })
    .await;
    let (first, answers) = release(&mut holder, first, rest).await;
    let first = first.expect("a batch");
    let answers: Vec<_> = answers.into_iter().map(|a| a.expect("a batch")).collect();
    assert_eq!(
        store.completions.groups.load(Ordering::Relaxed),
        1,
        "the three batches that queued behind the first were written together"
    );
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let [y_answers, z_answers, forged_answers] =
        <[_; 3]>::try_from(answers).expect("three answers");
    assert!(y_answers.iter().all(Result::is_ok), "{y_answers:?}");
    assert!(z_answers.iter().all(Result::is_ok), "{z_answers:?}");
    // The forged lease is refused alone, and the key stays its lease's.
    assert!(
        matches!(
            forged_answers.as_slice(),
            [Err(StoreError::LeaseLost { .. })]
        ),
        "{forged_answers:?}"
    );
    let states: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT key, state, failures FROM drover_items
         WHERE key IN ('x-0', 'x-1', 'y-0', 'y-1', 'z-0', 'z-1', 'w-0') ORDER BY key",
    )
    .fetch_all(store.pool())
    .await
    .expect("the rows are read");
    let expected = [
        ("w-0", "running", 0),
        ("x-0", "idle", 0),
        ("x-1", "idle", 0),
        ("y-0", "idle", 0),
        ("y-1", "idle", 0),
        ("z-0", "idle", 0),
        ("z-1", "pending", 1),
    ];
    let states: Vec<(&str, &str, i32)> = states
        .iter()
        .map(|(k, s, f)| (k.as_str(), s.as_str(), *f))
        .collect();
    assert_eq!(states, expected);
    let runs: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, token FROM drover_runs ORDER BY key")
            .fetch_all(store.pool())
            .await
            .expect("the runs are read");
    let expected: Vec<(String, i64)> = [&x[..], &y[..], &z[..]]
        .concat()
        .into_iter()
        .map(|l| (l.key, l.token.0))
        .collect();
    assert_eq!(runs, expected, "one run each, under its own lease");
    holder.close().await.expect("the connection closes");
    schema.remove().await;
}

/// A caller's transaction keeps x-0's row locked (as an enqueue into a
/// running key does until it commits). x-0's completion waits 100 ms for the
/// row, then skips it and is answered `KeyBusy`, nothing written for it; a batch after it is
/// written while the row is still locked. Sent again after the commit, x-0's
/// outcome is written. (Before, x-0's batch waited for the lock, and the next
/// batch started beside it only after a stall.)
#[tokio::test]
async fn a_batch_that_meets_a_held_row_is_answered_at_once_and_holds_up_no_other_batch() {
    let Some(schema) = Schema::create("drover_stuck").await else {
        return;
    };
    let store = schema.store.clone();
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    let x = claimed(&store, one, "x", 1).await;
    let y = claimed(&store, two, "y", 1).await;
    let mut holder = holding(&schema, LOCK_X0).await;
    let answers = answered(&store, done(&x)).await;
    assert!(
        matches!(answers.as_slice(), [Err(StoreError::KeyBusy { key, .. })] if key == "x-0"),
        "{answers:?}"
    );
    let answers = answered(&store, done(&y)).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    holder
        .execute("COMMIT")
        .await
        .expect("the lock is released");
    let answers = answered(&store, done(&x)).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let idle: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_items WHERE key IN ('x-0', 'y-0') AND state = 'idle'",
    )
    .fetch_one(store.pool())
    .await
    .expect("the rows are counted");
    assert_eq!(idle, 2);
    assert_eq!(runs_of(&store, &["x-0"]).await.len(), 1, "one run for x-0");
    holder.close().await.expect("the connection closes");
    schema.remove().await;
}

/// The answers of `batch`, which must come within [`PATIENCE`].
async fn answered(
    store: &PostgresStore,
    batch: Vec<(Lease, Outcome)>,
) -> Vec<Result<(), StoreError>> {
    tokio::time::timeout(PATIENCE, complete(store, batch))
        .await
        .expect("the batch is answered in time")
        .expect("the batch's task")
        .expect("a batch")
}

/// Runs (key, session, token) of `keys`, in key order.
async fn runs_of(store: &PostgresStore, keys: &[&str]) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT key, session, token FROM drover_runs WHERE key = ANY($1) ORDER BY key, id",
    )
    .bind(keys)
    .fetch_all(store.pool())
    .await
    .expect("the runs are read")
}

/// Completes `first` while completions are held at their start, queues
/// `queued` behind it one after the other (in that order in the group), then
/// releases the lock: the answers of `queued`, each batch's, in order.
async fn queued_behind_a_stall(
    schema: &Schema,
    store: &PostgresStore,
    first: &[Lease],
    queued: Vec<Vec<(Lease, Outcome)>>,
) -> Vec<Vec<Result<(), StoreError>>> {
    let mut holder = holding(schema, STALL_COMPLETIONS).await;
    let first = complete(store, done(first));
    until("the first batch to start", || store.completions.taken()).await;
    let mut rest = Vec::new();
    for batch in queued {
        rest.push(complete(store, batch));
        let n = rest.len();
        until("the batch to queue", || store.completions.waiting() == n).await;
    }
    let (first, answers) = release(&mut holder, first, rest).await;
    assert!(first.expect("a batch").iter().all(Result::is_ok));
    holder.close().await.expect("the connection closes");
    answers.into_iter().map(|a| a.expect("a batch")).collect()
}

/// A caller that names another caller's fencing token (tokens are handed
/// out in order) with its own session and key, its batch in the same group
/// ahead of the genuine one: the genuine lease is settled, the forged one
/// refused. Matched by token alone, the row went to the forged lease's
/// position, failed its check there, and the genuine lease was refused
/// `LeaseLost`, its key left running with no one to end it.
#[tokio::test]
async fn a_lease_forged_with_another_callers_token_takes_nothing_from_it_in_a_group() {
    let Some(schema) = Schema::create("drover_forged_token").await else {
        return;
    };
    let store = never_beside(&schema.store);
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    let x = claimed(&store, one, "x", 1).await;
    let mine = claimed(&store, one, "m", 1).await;
    let victim = claimed(&store, two, "v", 1).await;
    let forged = Lease {
        token: victim[0].token,
        ..mine[0].clone()
    };
    let answers =
        queued_behind_a_stall(&schema, &store, &x, vec![done(&[forged]), done(&victim)]).await;
    assert_eq!(store.completions.groups.load(Ordering::Relaxed), 1);
    assert!(
        matches!(answers[0].as_slice(), [Err(StoreError::LeaseLost { .. })]),
        "the forged lease: {:?}",
        answers[0]
    );
    assert!(answers[1].iter().all(Result::is_ok), "{:?}", answers[1]);
    let states: Vec<(String, String)> = sqlx::query_as(
        "SELECT key, state FROM drover_items WHERE key IN ('m-0', 'v-0') ORDER BY key",
    )
    .fetch_all(store.pool())
    .await
    .expect("the rows are read");
    let expected = [("m-0", "running"), ("v-0", "idle")].map(|(k, s)| (k.into(), s.into()));
    assert_eq!(states, expected);
    assert_eq!(
        runs_of(&store, &["m-0", "v-0"]).await,
        [("v-0".to_owned(), two.0, victim[0].token.0)],
        "one run, the genuine lease's"
    );
    schema.remove().await;
}

/// A caller that retried a completion while its first try still waited
/// for its group (an HTTP client that timed out and sent it again) meets
/// the first try in the same group: both are answered as written, and the
/// run is recorded once. The first try's settling of the lease is another
/// caller's, not a repeat within the retry's own batch.
#[tokio::test]
async fn a_retry_that_meets_its_first_try_in_one_group_is_answered_as_written() {
    let Some(schema) = Schema::create("drover_retry_in_group").await else {
        return;
    };
    let store = never_beside(&schema.store);
    let one = session(&store, "one").await;
    let x = claimed(&store, one, "x", 1).await;
    let y = claimed(&store, one, "y", 1).await;
    let answers = queued_behind_a_stall(&schema, &store, &x, vec![done(&y), done(&y)]).await;
    assert_eq!(store.completions.groups.load(Ordering::Relaxed), 1);
    assert!(
        answers.iter().flatten().all(Result::is_ok),
        "both tries: {answers:?}"
    );
    assert_eq!(
        runs_of(&store, &["y-0"]).await,
        [("y-0".to_owned(), one.0, y[0].token.0)],
        "one run"
    );
    schema.remove().await;
}

/// A caller's own transaction keeps y-0's row locked (an enqueue into a
/// running key, not yet committed) while the caller completes its own lease
/// on z-0, and another worker's completion of y-0 lands in the same group.
/// Had the group waited for the caller's transaction, the caller would have
/// waited for the group; the group skips y-0's row instead, answers its
/// lease `KeyBusy`, and writes the caller's completion while its
/// transaction is open. y-0's outcome, sent again after the commit, is
/// written.
#[tokio::test]
async fn a_group_skips_a_row_its_own_callers_transaction_holds() {
    let Some(schema) = Schema::create("drover_steps_aside").await else {
        return;
    };
    let store = never_beside(&schema.store);
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    let x = claimed(&store, one, "x", 1).await;
    let y = claimed(&store, two, "y", 1).await;
    let z = claimed(&store, one, "z", 1).await;
    let mut callers = holding(
        &schema,
        "SELECT 1 FROM drover_items WHERE process = 'y' AND key = 'y-0' FOR UPDATE",
    )
    .await;
    let answers = queued_behind_a_stall(&schema, &store, &x, vec![done(&z), done(&y)]).await;
    assert_eq!(
        store.completions.groups.load(Ordering::Relaxed),
        1,
        "the two batches met in one group"
    );
    assert!(answers[0].iter().all(Result::is_ok), "{:?}", answers[0]);
    assert!(
        matches!(answers[1].as_slice(), [Err(StoreError::KeyBusy { key, .. })] if key == "y-0"),
        "{:?}",
        answers[1]
    );
    callers.execute("COMMIT").await.expect("the caller commits");
    let again = answered(&store, done(&y)).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    let idle: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_items WHERE key IN ('x-0', 'y-0', 'z-0') AND state = 'idle'",
    )
    .fetch_one(store.pool())
    .await
    .expect("the rows are counted");
    assert_eq!(idle, 3);
    callers.close().await.expect("the connection closes");
    schema.remove().await;
}

/// Each state's count of `process`'s items as the stored counts and their
/// deltas say, and as the rows say: the two must agree.
async fn counts_of(
    store: &PostgresStore,
    process: &str,
) -> (Vec<(String, i64)>, Vec<(String, i64)>) {
    let stored: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, sum(n)::bigint FROM (
             SELECT state, n FROM drover_item_counts WHERE process = $1
             UNION ALL SELECT state, delta FROM drover_item_count_deltas WHERE process = $1) u
         GROUP BY state HAVING sum(n) <> 0 ORDER BY state",
    )
    .bind(process)
    .fetch_all(store.pool())
    .await
    .expect("the counts are read");
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM drover_items WHERE process = $1 GROUP BY state ORDER BY state",
    )
    .bind(process)
    .fetch_all(store.pool())
    .await
    .expect("the rows are counted");
    (stored, rows)
}

/// A batch of every kind of outcome (done, transient, permanent, requeue,
/// a lease repeated) meets a held row: it is skipped, then waited for, then
/// skipped with its lease answered `KeyBusy`. Each other lease is written
/// once, as if the batch had met no held row: one run each, one failure for
/// the transient, the repeat refused; the counts agree with the rows though
/// two tries were rolled back. Sent again after the holder commits, the
/// held key's outcome is written once.
#[tokio::test]
async fn a_mixed_batch_that_meets_a_held_row_writes_every_other_outcome_once() {
    let Some(schema) = Schema::create("drover_mixed_busy").await else {
        return;
    };
    let store = schema.store.clone();
    let one = session(&store, "one").await;
    let x = claimed(&store, one, "x", 6).await;
    assert_eq!(x.len(), 6);
    let mut holder = holding(&schema, LOCK_X0).await;
    let batch = vec![
        (x[0].clone(), Outcome::Transient("held".into())),
        (x[1].clone(), Outcome::Transient("boom".into())),
        (x[2].clone(), Outcome::Permanent("bad".into())),
        (x[3].clone(), Outcome::RequeueAfter(Duration::from_secs(60))),
        (x[4].clone(), Outcome::Done),
        (x[4].clone(), Outcome::Done),
        (x[0].clone(), Outcome::Transient("held".into())),
    ];
    let answers = answered(&store, batch.clone()).await;
    let busy = |a: &Result<(), StoreError>| matches!(a, Err(StoreError::KeyBusy { key, .. }) if key == "x-0");
    assert!(busy(&answers[0]) && busy(&answers[6]), "{answers:?}");
    assert!(answers[1..5].iter().all(Result::is_ok), "{answers:?}");
    assert!(
        matches!(answers[5], Err(StoreError::LeaseLost { .. })),
        "{answers:?}"
    );
    let (stored, rows) = counts_of(&store, "x").await;
    assert_eq!(stored, rows, "the counts agree with the rows");
    holder
        .execute("COMMIT")
        .await
        .expect("the lock is released");
    let again = answered(&store, vec![batch[0].clone(), batch[1].clone()]).await;
    // x-1's outcome again: recorded by the first batch, answered so.
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    let states: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT key, state, failures FROM drover_items WHERE process = 'x' ORDER BY key",
    )
    .fetch_all(store.pool())
    .await
    .expect("the rows are read");
    let expected = [
        ("x-0", "pending", 1),
        ("x-1", "pending", 1),
        ("x-2", "parked", 1),
        ("x-3", "pending", 0),
        ("x-4", "idle", 0),
        ("x-5", "running", 0),
    ]
    .map(|(k, s, f)| (k.to_owned(), s.to_owned(), f));
    assert_eq!(states, expected);
    let runs: Vec<(String, i64)> = sqlx::query_as(
        "SELECT key, count(*) FROM drover_runs WHERE process = 'x' GROUP BY key ORDER BY key",
    )
    .fetch_all(store.pool())
    .await
    .expect("the runs are read");
    let expected: Vec<(String, i64)> = ["x-0", "x-1", "x-2", "x-3", "x-4"]
        .map(|k| (k.to_owned(), 1))
        .to_vec();
    assert_eq!(runs, expected, "one run each");
    let (stored, rows) = counts_of(&store, "x").await;
    assert_eq!(stored, rows, "the counts agree with the rows");
    holder.close().await.expect("the connection closes");
    schema.remove().await;
}

/// A batch of clean `done`s (the one-statement path) meets a held row in
/// its middle: the statement is rolled back to its savepoint on the first
/// try, times out waiting on the second, and the third writes the other
/// two and answers the held one `KeyBusy`. Nothing of the rolled-back tries
/// is left in the counts or the runs.
#[tokio::test]
async fn clean_dones_that_meet_a_held_row_leave_the_counts_as_the_rows_say() {
    let Some(schema) = Schema::create("drover_clean_busy").await else {
        return;
    };
    let store = schema.store.clone();
    let one = session(&store, "one").await;
    let x = claimed(&store, one, "x", 3).await;
    let mut holder = holding(
        &schema,
        "SELECT 1 FROM drover_items WHERE process = 'x' AND key = 'x-1' FOR UPDATE",
    )
    .await;
    let answers = answered(&store, done(&x)).await;
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert!(
        matches!(&answers[1], Err(StoreError::KeyBusy { key, .. }) if key == "x-1"),
        "{answers:?}"
    );
    let (stored, rows) = counts_of(&store, "x").await;
    assert_eq!(stored, rows, "the counts agree with the rows");
    assert_eq!(
        runs_of(&store, &["x-0", "x-1", "x-2"]).await,
        [("x-0", &x[0]), ("x-2", &x[2])].map(|(k, l)| (k.to_owned(), one.0, l.token.0)),
        "one run each for the written ones"
    );
    holder
        .execute("COMMIT")
        .await
        .expect("the lock is released");
    let again = answered(&store, done(&x)).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    assert_eq!(runs_of(&store, &["x-0", "x-1", "x-2"]).await.len(), 3);
    let (stored, rows) = counts_of(&store, "x").await;
    assert_eq!(stored, rows, "the counts agree with the rows");
    holder.close().await.expect("the connection closes");
    schema.remove().await;
}

/// An enqueue of a running key wakes other nodes at its commit, when the
/// key cannot be claimed yet; the completion that leaves it pending and
/// ready (a dirty re-run) is what they can claim, and must tell them so
/// (as `PostgresStore::subscribe` says: enqueues, retries and dirty
/// completions notify every node). Another node listening on the process's
/// channel hears the completion.
#[tokio::test]
async fn a_dirty_completion_notifies_other_nodes() {
    let Some(schema) = Schema::create("drover_dirty_notify").await else {
        return;
    };
    let store = schema.store.clone();
    let one = session(&store, "one").await;
    let x = claimed(&store, one, "x", 1).await;
    let mut node = sqlx::postgres::PgListener::connect(&schema.url)
        .await
        .expect("a listener");
    node.listen(&PostgresStore::notify_channel("x"))
        .await
        .expect("LISTEN");
    store
        .item_enqueue(ItemEnqueue::new("x", vec!["x-0".to_owned()]))
        .await
        .expect("the running key is enqueued again");
    tokio::time::timeout(PATIENCE, node.recv())
        .await
        .expect("the enqueue's notification")
        .expect("a notification");
    let answers = answered(&store, done(&x)).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let state: String =
        sqlx::query_scalar("SELECT state FROM drover_items WHERE process = 'x' AND key = 'x-0'")
            .fetch_one(store.pool())
            .await
            .expect("the row is read");
    assert_eq!(state, "pending", "a dirty re-run, ready now");
    let heard = tokio::time::timeout(Duration::from_secs(5), node.recv()).await;
    assert!(
        heard.is_ok(),
        "another node hears nothing of the key that became claimable"
    );
    schema.remove().await;
}

/// A key given back (a lease released, its session closed, an expired
/// session reclaimed) is pending and ready at once, so every node's waiting
/// claimers must hear of it, as of an enqueue: another node listening on
/// the process's channel hears each at its commit. None of the three sent
/// a notification, and other nodes found such keys only at their poll.
#[tokio::test]
async fn keys_given_back_notify_other_nodes() {
    use crate::store::params::{LeaseRelease, SessionClose};
    let Some(schema) = Schema::create("drover_given_back_notify").await else {
        return;
    };
    let store = schema.store.clone();
    let mut node = sqlx::postgres::PgListener::connect(&schema.url)
        .await
        .expect("a listener");
    for process in ["r", "c", "e"] {
        node.listen(&PostgresStore::notify_channel(process))
            .await
            .expect("LISTEN");
    }
    let one = session(&store, "one").await;
    let released = claimed(&store, one, "r", 1).await;
    let two = session(&store, "two").await;
    claimed(&store, two, "c", 2).await;
    let doomed = store
        .session_start(crate::store::params::SessionStart::new(
            "doomed",
            Duration::from_secs(1),
        ))
        .await
        .expect("a session starts")
        .id;
    claimed(&store, doomed, "e", 3).await;
    // The three enqueues' own notifications, heard before the keys are
    // given back.
    for process in ["r", "c", "e"] {
        heard(&mut node, "enqueue", process).await;
    }
    store
        .lease_release(LeaseRelease {
            lease: &released[0],
        })
        .await
        .expect("the release");
    heard(&mut node, "released key", "r").await;
    store
        .session_close(SessionClose { session: two })
        .await
        .expect("the close");
    heard(&mut node, "closed session's keys", "c").await;
    store.clock().advance(Duration::from_secs(2));
    let report = store.session_reclaim().await.expect("the reclaim");
    assert_eq!(report.leases, 3, "{report:?}");
    heard(&mut node, "reclaimed keys", "e").await;
    schema.remove().await;
}

/// Waits for `node`'s next notification, which must be `process`'s.
async fn heard(node: &mut sqlx::postgres::PgListener, what: &str, process: &str) {
    let got = tokio::time::timeout(PATIENCE, node.recv())
        .await
        .unwrap_or_else(|_| panic!("another node hears nothing of the {what}"))
        .expect("a notification");
    assert_eq!(
        got.channel(),
        PostgresStore::notify_channel(process),
        "{what}"
    );
}
