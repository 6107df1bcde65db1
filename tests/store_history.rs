//! The store's contract for history: every step is an event, prune drops old
//! ones, activity counts recent runs; on every engine via `support::each_engine`.
//!
//! No test sleeps: time passes by advancing the store's clock offset.

mod support;

use drover::store::{EventKind, HistoryActivity, HistoryPrune, ItemGet, Outcome, StoreEngine as _};
use support::each_engine;
use support::store::{P, claim, complete, enqueue, events, secs};

#[tokio::test]
async fn history_records_every_step_and_prune_drops_old_events() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        complete(&db.store, &lease, Outcome::Transient("flaky".into()))
            .await
            .expect("fail");
        db.store.clock().advance(secs(2));
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        complete(&db.store, &lease, Outcome::Permanent("broken".into()))
            .await
            .expect("park");
        use EventKind::*;
        assert_eq!(
            events(&db.store, "a").await,
            [Enqueued, Started, Failed, Started, Failed, Parked]
        );
        let detail = db
            .store
            .item_get(ItemGet {
                process: P.into(),
                key: "a".into(),
                history_limit: 3,
            })
            .await
            .expect("get")
            .expect("parked item");
        assert_eq!(detail.history.len(), 3);
        assert_eq!(detail.history[1].transient, Some(false));
        assert_eq!(detail.history[1].error.as_deref(), Some("broken"));
        db.store.clock().advance(secs(3600));
        enqueue(&db.store, &["b"]).await;
        let pruned = db
            .store
            .history_prune(HistoryPrune {
                retention: secs(60),
            })
            .await;
        assert_eq!(pruned.expect("prune"), 6);
        assert_eq!(events(&db.store, "b").await, [Enqueued]);
    })
    .await;
}

#[tokio::test]
async fn activity_counts_the_runs_that_ended_within_the_window() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a", "b", "c"]).await;
        let leases = claim(&db.store, s.id, 3).await;
        complete(&db.store, &leases[0], Outcome::Done)
            .await
            .expect("done");
        complete(&db.store, &leases[1], Outcome::Done)
            .await
            .expect("done");
        complete(&db.store, &leases[2], Outcome::Transient("x".into()))
            .await
            .expect("failed");
        let window = HistoryActivity { window: secs(60) };
        let activity = db.store.history_activity(window).await.expect("activity");
        assert_eq!(activity.len(), 1);
        assert_eq!((activity[0].finished, activity[0].failed), (2, 1));
        db.store.clock().advance(secs(120));
        let activity = db.store.history_activity(window).await.expect("activity");
        assert_eq!((activity[0].finished, activity[0].failed), (0, 0));
    })
    .await;
}
