//! A reclaim racing a completion or a release of the same lease, forced on
//! PostgreSQL (issue 36): what the atomic model of `tests/differential/`
//! cannot see, since there every call is one step. A test transaction holds
//! the item's row; the lease's holder and a reaper (whose clock stands past
//! the session's deadline) queue behind it in a chosen order, then it
//! commits. Whichever takes the row first wins, and only it: the run ends
//! once, with one history row, and the item is left as the winner left it.
//! A reclaim that requeued the item without locking it would write over a
//! completion that committed while it waited (a `done` and an `expired` row
//! for one run, and a converged key pending again).
//!
//! A completion waits for no row: it skips one another transaction holds
//! and answers `KeyBusy`. So a completion queues behind a reclaim only by
//! being sent again after it, and it takes the row first by locking it
//! before the reclaim comes: the test then holds the runs table instead,
//! which the completion writes after it locked the row (an outcome that is
//! not a clean `done`, settled statement by statement).

mod support;

use drover::store::{
    ItemState, Lease, LeaseRelease, Outcome, ReclaimReport, RunOutcome, Store, StoreEngine as _,
    StoreError,
};
use support::locks::Holder;
use support::store::{claim, complete, enqueue, events, item, secs};

/// What the holder of the lease does while the reaper reclaims it.
#[derive(Debug, Clone, Copy)]
enum Rival {
    Complete,
    Release,
}

impl Rival {
    async fn run(self, store: Store, lease: Lease) -> Result<(), StoreError> {
        match self {
            Self::Complete => complete(&store, &lease, Outcome::Transient("flaky".into())).await,
            Self::Release => store.lease_release(LeaseRelease { lease: &lease }).await,
        }
    }

    /// The history row and the item's state when this rival wins.
    fn wins_with(self) -> (RunOutcome, ItemState) {
        match self {
            Self::Complete => (RunOutcome::Retry, ItemState::Backoff),
            Self::Release => (RunOutcome::Canceled, ItemState::Pending),
        }
    }
}

/// Queues `rival` (on the worker's store) and a reclaim (on a reaper's store
/// whose clock stands past the session's 30 s deadline) behind a test
/// transaction that holds `a`'s row, in the order given, then lets them go.
async fn race(
    db: &support::TestDb,
    rival: Rival,
    rival_first: bool,
) -> (Result<(), StoreError>, ReclaimReport, Lease) {
    let s = db.session().await;
    enqueue(&db.store, &["a"]).await;
    let lease = claim(&db.store, s.id, 1).await.remove(0);
    let reaper = db.reconnect().await;
    reaper.clock().advance(secs(31));
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let id: i64 = sqlx::query_scalar("SELECT id FROM drover_items WHERE key = 'a'")
        .fetch_one(&pool)
        .await
        .expect("the item's id");
    let holder = match (rival, rival_first) {
        // The completion locks the row, then waits to write its run.
        (Rival::Complete, true) => Holder::lock_table(&pool, "drover_runs").await,
        _ => {
            Holder::lock(
                &pool,
                "SELECT 1 FROM drover_items WHERE id = $1 FOR UPDATE",
                id,
            )
            .await
        }
    };
    let (worker, held) = (db.store.clone(), lease.clone());
    let rival_task = || tokio::spawn(rival.run(worker, held));
    let reclaim_task = || tokio::spawn(async move { reaper.session_reclaim().await });
    let (rival_done, reclaim) = if rival_first {
        let r = rival_task();
        holder.wait_for_waiters(&pool, 1).await;
        let c = reclaim_task();
        holder.wait_for_waiters(&pool, 2).await;
        (r, c)
    } else {
        let c = reclaim_task();
        holder.wait_for_waiters(&pool, 1).await;
        let r = rival_task();
        if matches!(rival, Rival::Complete) {
            // It waits 100 ms for the held row, then skips it, writes nothing
            // and is sent again once the reclaim has taken the row.
            let busy = r.await.expect("the rival joined");
            assert!(matches!(busy, Err(StoreError::KeyBusy { .. })), "{busy:?}");
            holder.release().await;
            let report = c.await.expect("the reclaim joined").expect("reclaim");
            let again = rival.run(db.store.clone(), lease.clone()).await;
            return (again, report, lease);
        }
        holder.wait_for_waiters(&pool, 2).await;
        (r, c)
    };
    holder.release().await;
    let rival_done = rival_done.await.expect("the rival joined");
    let report = reclaim.await.expect("the reclaim joined").expect("reclaim");
    (rival_done, report, lease)
}

/// Runs the race in one order and judges it by its outcomes.
async fn judge(rival: Rival, rival_first: bool) {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let (result, report, lease) = race(&db, rival, rival_first).await;
    let context = format!("{rival:?}, rival first: {rival_first}");
    assert_eq!(
        report.sessions, 1,
        "the session expired either way ({context})"
    );
    let history = events(&db.store, "a").await;
    let it = item(&db.store, "a").await.expect("item");
    if rival_first {
        result.unwrap_or_else(|e| panic!("the rival took the row first: {e} ({context})"));
        let (row, state) = rival.wins_with();
        assert_eq!(history, [row], "one row for the run ({context})");
        assert_eq!(report.leases, 0, "nothing left to reclaim ({context})");
        assert_eq!(it.state, state, "as the rival left it ({context})");
    } else {
        let err = result.expect_err("the reclaim took the row first");
        assert!(
            matches!(
                err,
                StoreError::LeaseLost { .. } | StoreError::SessionExpired { .. }
            ),
            "{err} ({context})"
        );
        assert_eq!(report.leases, 1, "the reclaim requeued it ({context})");
        assert_eq!(
            history,
            [RunOutcome::Expired],
            "one row for the run ({context})"
        );
        assert_eq!(it.state, ItemState::Pending, "{context}");
    }
    assert_eq!(it.lease_token, None, "no one holds {lease:?} ({context})");
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

#[tokio::test]
async fn a_completion_that_takes_the_row_first_is_not_undone_by_a_reclaim_waiting_behind_it() {
    judge(Rival::Complete, true).await;
}

#[tokio::test]
async fn a_reclaim_that_takes_the_row_first_refuses_the_completion_waiting_behind_it() {
    judge(Rival::Complete, false).await;
}

#[tokio::test]
async fn a_release_that_takes_the_row_first_is_not_undone_by_a_reclaim_waiting_behind_it() {
    judge(Rival::Release, true).await;
}

#[tokio::test]
async fn a_reclaim_that_takes_the_row_first_refuses_the_release_waiting_behind_it() {
    judge(Rival::Release, false).await;
}
