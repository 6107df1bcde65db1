//! Claims and completions grouped per store, on a SQLite file: a connection
//! of the test's own holds the file's write lock, so the first request (run
//! by its caller, see `lead`) waits for it while others queue behind it;
//! released, the queued ones must run as one transaction, each answered as if
//! it had run alone, and one whose statements fail must take back its own
//! writes alone.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::SqliteStore;
use super::savepoints::ONES;
use crate::store::fleet::ProcessPause;
use crate::store::grouped::Grouped;
use crate::store::grouped_testing::{
    claim, claimed, complete, done, enqueue, keys, release, session, until,
};
use crate::store::types::{FencingToken, Lease, Outcome, SessionId};
use crate::store::{StoreEngine as _, StoreError, StoreOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Executor as _, SqliteConnection};

/// A store on a fresh file whose groups never start beside a running one
/// (so that the tests count the same groups on a slow machine), and a
/// connection of the test's own to the same file.
async fn store_and_holder() -> (tempfile::TempDir, SqliteStore, SqliteConnection) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g.db");
    let url = format!("sqlite://{}", path.display());
    let mut store = SqliteStore::connect(&url, &StoreOptions::default())
        .await
        .expect("connect");
    let never = Duration::from_secs(3600);
    store.claims = Arc::new(Grouped::with_stall(never));
    store.completions = Arc::new(Grouped::with_stall(never));
    let holder = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .expect("a connection of the test's own");
    (dir, store, holder)
}

/// A claim of process "poison" fails in its own statements, in a group or
/// alone: in the one that counts its keys, after the one that leased them.
const POISON_CLAIMS: &str = "CREATE TRIGGER poison BEFORE UPDATE ON drover_item_counts
    WHEN NEW.process = 'poison' AND NEW.n > OLD.n
    BEGIN SELECT RAISE(ABORT, 'poisoned claim'); END";

/// Takes the file's write lock on `holder`: every write of the store waits.
async fn hold(holder: &mut SqliteConnection) {
    holder
        .execute("BEGIN IMMEDIATE")
        .await
        .expect("the write lock is free");
}

#[tokio::test]
async fn claims_that_arrive_while_one_waits_for_the_writer_share_one_transaction() {
    let (_dir, store, mut holder) = store_and_holder().await;
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    for process in ["a", "b", "c", "paused", "poison"] {
        enqueue(&store, process).await;
    }
    store
        .process_pause(ProcessPause {
            process: "paused".into(),
            paused: true,
            actor: "test".into(),
        })
        .await
        .expect("the process pauses");
    holder
        .execute(POISON_CLAIMS)
        .await
        .expect("the trigger is created");

    hold(&mut holder).await;
    let first = claim(&store, one, "a", 2);
    // Run by its caller, it holds the store's claims until it ends, which
    // the write lock stops it from doing.
    until("the first claim to start", || store.claims.taken()).await;
    let rest = vec![
        claim(&store, two, "a", 2),
        claim(&store, one, "b", 3),
        claim(&store, two, "poison", 2),
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
        "the six claims that queued behind the first ran in one transaction"
    );
    assert_eq!(ONES.get(), 0, "in savepoints");
    assert_eq!(keys(&first), ["a-0", "a-1"]);
    let [second, b, poison, c, expired, paused] = <[_; 6]>::try_from(answers).expect("six answers");
    let second = second.expect("the second claim of a");
    // The second claim of the same process took the keys after the first's,
    // in FIFO order, as it would have alone.
    assert_eq!(keys(&second), ["a-2", "a-3"]);
    assert!(second.leases.iter().all(|l| l.session == two));
    let b = b.expect("a claim of b");
    assert_eq!(keys(&b), ["b-0", "b-1", "b-2"]);
    // The claim that failed took back its own writes, and was answered its
    // own error when it ran again on its own.
    assert!(
        matches!(&poison, Err(e) if format!("{e:?}").contains("poisoned claim")),
        "{poison:?}"
    );
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
    let tokens: HashSet<i64> = [&first, &second, &b, &c]
        .iter()
        .flat_map(|claimed| claimed.leases.iter().map(|l| l.token.0))
        .collect();
    assert_eq!(
        tokens.len(),
        2 + 2 + 3 + 6,
        "every lease has a token of its own"
    );

    // What the rows and counts say: each claim's keys run under its session,
    // nothing of "poison" does, and b's last three are still pending.
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT process, state, count(*) FROM drover_items
         WHERE state IN ('pending', 'running') GROUP BY process, state ORDER BY process, state",
    )
    .fetch_all(store.pool())
    .await
    .expect("the rows are counted");
    let expected = [
        ("a", "pending", 2),
        ("a", "running", 4),
        ("b", "pending", 3),
        ("b", "running", 3),
        ("c", "running", 6),
        ("paused", "pending", 6),
        ("poison", "pending", 6),
    ];
    let rows: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|(p, s, n)| (p.as_str(), s.as_str(), *n))
        .collect();
    assert_eq!(rows, expected);
    let counted: Vec<(String, i64)> = sqlx::query_as(
        "SELECT process, n FROM drover_item_counts WHERE state = 'running' ORDER BY process",
    )
    .fetch_all(store.pool())
    .await
    .expect("the counts are read");
    let counted: Vec<(&str, i64)> = counted.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    assert_eq!(
        counted,
        [("a", 4), ("b", 3), ("c", 6), ("paused", 0), ("poison", 0)]
    );
    store.close().await;
}

#[tokio::test]
async fn batches_that_arrive_while_one_waits_for_the_writer_share_one_transaction() {
    let (_dir, store, mut holder) = store_and_holder().await;
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    let x = claimed(&store, one, "x", 2).await;
    let y = claimed(&store, two, "y", 2).await;
    let z = claimed(&store, one, "z", 2).await;
    let p = claimed(&store, two, "p", 1).await;
    let w = claimed(&store, two, "w", 1).await;
    let forged = Lease {
        token: FencingToken(w[0].token.0 + 1_000),
        ..w[0].clone()
    };
    // p-0 cannot be left idle: its batch fails in its own statements, after
    // the one that wrote its run.
    holder
        .execute(
            "CREATE TRIGGER poison BEFORE UPDATE ON drover_items
             WHEN NEW.key = 'p-0' AND NEW.state = 'idle'
             BEGIN SELECT RAISE(ABORT, 'poisoned run'); END",
        )
        .await
        .expect("the trigger is created");

    hold(&mut holder).await;
    let first = complete(&store, done(&x));
    until("the first batch to start", || store.completions.taken()).await;
    let rest = vec![
        complete(&store, done(&y)),
        complete(&store, done(&p)),
        complete(&store, done(&z)),
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
        "the four batches that queued behind the first were written together"
    );
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let [y_answers, p_answers, z_answers, forged_answers] =
        <[_; 4]>::try_from(answers).expect("four answers");
    assert!(y_answers.iter().all(Result::is_ok), "{y_answers:?}");
    assert!(z_answers.iter().all(Result::is_ok), "{z_answers:?}");
    // The batch that failed took back its own writes, and was answered its
    // own error when it ran again on its own.
    assert!(
        matches!(p_answers.as_slice(), [Err(e)] if format!("{e:?}").contains("poisoned run")),
        "{p_answers:?}"
    );
    // The forged lease is refused alone, and the key stays its lease's.
    assert!(
        matches!(
            forged_answers.as_slice(),
            [Err(StoreError::LeaseLost { .. })]
        ),
        "{forged_answers:?}"
    );
    let states: Vec<(String, String)> = sqlx::query_as(
        "SELECT key, state FROM drover_items
         WHERE key IN ('x-0', 'x-1', 'y-0', 'y-1', 'z-0', 'z-1', 'p-0', 'w-0') ORDER BY key",
    )
    .fetch_all(store.pool())
    .await
    .expect("the rows are read");
    let states: Vec<(&str, &str)> = states
        .iter()
        .map(|(k, s)| (k.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            ("p-0", "running"),
            ("w-0", "running"),
            ("x-0", "idle"),
            ("x-1", "idle"),
            ("y-0", "idle"),
            ("y-1", "idle"),
            ("z-0", "idle"),
            ("z-1", "idle"),
        ]
    );
    // One run per settled lease, under its own token; none for p-0 or w-0.
    let runs: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, token FROM drover_runs ORDER BY key")
            .fetch_all(store.pool())
            .await
            .expect("the runs are read");
    let expected: Vec<(String, i64)> = [&x, &y, &z]
        .iter()
        .flat_map(|leases| leases.iter().map(|l| (l.key.clone(), l.token.0)))
        .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(runs, expected);
    let idle: i64 =
        sqlx::query_scalar("SELECT sum(n) FROM drover_item_counts WHERE state = 'idle'")
            .fetch_one(store.pool())
            .await
            .expect("the counts are read");
    assert_eq!(idle, 6);
    store.close().await;
}

/// A claim or a batch that waited for the writer while nothing else joined
/// it is a group of one: it runs its statements in a transaction of its own
/// (not in a savepoint), answered as on its own, its failure its own error
/// with nothing of it written.
#[tokio::test]
async fn a_group_of_one_is_answered_as_a_request_on_its_own() {
    let (_dir, store, mut holder) = store_and_holder().await;
    let (one, two) = (session(&store, "one").await, session(&store, "two").await);
    for process in ["a", "poison"] {
        enqueue(&store, process).await;
    }
    holder
        .execute(POISON_CLAIMS)
        .await
        .expect("the trigger is created");
    // Each round: the first request holds the store's requests of its kind
    // behind the write lock, and one more queues behind it.
    for (round, (process, session)) in [("a", two), ("poison", two)].into_iter().enumerate() {
        hold(&mut holder).await;
        let first = claim(&store, one, "a", 1);
        until("the first claim to start", || store.claims.taken()).await;
        let lone = vec![claim(&store, session, process, 2)];
        until("the other claim to queue", || store.claims.waiting() == 1).await;
        let (first, answers) = release(&mut holder, first, lone).await;
        assert_eq!(keys(&first.expect("a claim")), [format!("a-{}", round * 3)]);
        assert_eq!(store.claims.groups.load(Ordering::Relaxed), round + 1);
        assert_eq!(
            ONES.get(),
            round + 1,
            "its own transaction, not a savepoint"
        );
        let [lone] = <[_; 1]>::try_from(answers).expect("one answer");
        match process {
            "a" => {
                let lone = lone.expect("a claim of a");
                assert_eq!(keys(&lone), ["a-1", "a-2"], "after the first's, in order");
                assert!(lone.leases.iter().all(|l| l.session == two));
            }
            _ => assert!(
                matches!(&lone, Err(e) if format!("{e:?}").contains("poisoned claim")),
                "{lone:?}"
            ),
        }
    }
    let poisoned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_items WHERE process = 'poison' AND state = 'pending'",
    )
    .fetch_one(store.pool())
    .await
    .expect("the rows are counted");
    assert_eq!(poisoned, 6, "the poisoned claim leased nothing");

    let x = claimed(&store, one, "x", 2).await;
    let y = claimed(&store, two, "y", 2).await;
    hold(&mut holder).await;
    let first = complete(&store, done(&x));
    until("the first batch to start", || store.completions.taken()).await;
    let lone = vec![complete(&store, done(&y))];
    until("the other batch to queue", || {
        store.completions.waiting() == 1
    })
    .await;
    let (first, answers) = release(&mut holder, first, lone).await;
    assert!(first.expect("a batch").iter().all(Result::is_ok));
    assert_eq!(store.completions.groups.load(Ordering::Relaxed), 1);
    assert_eq!(ONES.get(), 3, "its own transaction, not a savepoint");
    let [lone] = <[_; 1]>::try_from(answers).expect("one answer");
    let lone = lone.expect("a batch");
    assert!(
        lone.len() == 2 && lone.iter().all(Result::is_ok),
        "{lone:?}"
    );
    let runs: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, token FROM drover_runs WHERE key LIKE 'y-%' ORDER BY key")
            .fetch_all(store.pool())
            .await
            .expect("the runs are read");
    let expected: Vec<(String, i64)> = y.iter().map(|l| (l.key.clone(), l.token.0)).collect();
    assert_eq!(runs, expected, "one run per lease of the lone batch");
    store.close().await;
}
