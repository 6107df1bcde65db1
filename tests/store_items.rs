//! The store's contract for items (DESIGN.md rules 2, 4 and 5 as an enqueue and an
//! operator see them): coalescing, dirty re-runs, bulk batches, listing, counts,
//! and the admin actions, on every engine, and on SQLite through the view
//! `drover_enqueue` too, via `support::each_enqueue_path_and_pooler`.
//!
//! No test sleeps: TTLs and backoffs pass by advancing the store's clock offset.

mod support;

use std::time::Duration;

use drover::store::{
    ItemDelete, ItemEnqueue, ItemList, ItemPark, ItemRetry, ItemState, LeaseLock, Outcome,
    StoreEngine as _, StoreError,
};
use support::each_enqueue_path_and_pooler;
use support::store::{
    P, claim, complete, configure, enqueue, events, filler, first_page, item, keys, secs,
};

#[tokio::test]
async fn enqueueing_a_pending_key_again_keeps_one_entry_with_the_earlier_ready_time() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        let later = ItemEnqueue::new(P, ["a"]).after(secs(60));
        db.store.item_enqueue(later.clone()).await.expect("enqueue");
        enqueue(&db.store, &["a", "a"]).await;
        db.store.item_enqueue(later).await.expect("enqueue");
        assert_eq!(keys(&claim(&db.store, s.id, 10).await), ["a"]);
        assert!(claim(&db.store, s.id, 10).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn an_enqueue_of_a_pending_key_that_asks_for_nothing_new_only_counts_it() {
    // The view takes a shortcut for exactly this case (migration 0010): it
    // must leave every field but the last enqueue and the count as the full
    // coalescing rule would, and must not take the shortcut otherwise.
    each_enqueue_path_and_pooler(|db| async move {
        let first = ItemEnqueue::new(P, ["a"]).priority(3).after(secs(60));
        db.store.item_enqueue(first).await.expect("enqueue");
        let before = item(&db.store, "a").await.expect("item");
        db.store.clock().advance(secs(1));
        let nothing_new = ItemEnqueue::new(P, ["a"]).priority(1).after(secs(120));
        db.store.item_enqueue(nothing_new).await.expect("enqueue");
        let counted = item(&db.store, "a").await.expect("item");
        assert_eq!(counted.state, ItemState::Pending);
        assert_eq!(counted.priority, 3);
        assert_eq!(counted.ready_at, before.ready_at);
        assert_eq!(counted.enqueued_at, before.enqueued_at);
        assert_eq!(counted.first_enqueued_at, before.first_enqueued_at);
        assert!(counted.last_enqueued_at > before.last_enqueued_at);
        assert_eq!(counted.enqueue_count, 2);
        assert!(!counted.dirty && counted.backoff_until.is_none());

        let sooner = ItemEnqueue::new(P, ["a"]).priority(1);
        db.store.item_enqueue(sooner).await.expect("enqueue");
        let sooner = item(&db.store, "a").await.expect("item");
        assert!(sooner.ready_at < before.ready_at, "brought forward");
        assert_eq!((sooner.priority, sooner.enqueue_count), (3, 3));
        let higher = ItemEnqueue::new(P, ["a"]).priority(7);
        db.store.item_enqueue(higher).await.expect("enqueue");
        let higher = item(&db.store, "a").await.expect("item");
        assert_eq!((higher.priority, higher.enqueue_count), (7, 4));
        assert_eq!(higher.ready_at, sooner.ready_at);
        assert_eq!(higher.enqueued_at, before.enqueued_at);
    })
    .await;
}

#[tokio::test]
async fn coalescing_keeps_the_higher_priority() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["low", "raised"]).await;
        let raise = ItemEnqueue::new(P, ["raised"]).priority(5);
        db.store.item_enqueue(raise).await.expect("enqueue");
        enqueue(&db.store, &["raised"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        assert_eq!(keys(&leases), ["raised"]);
        assert_eq!(leases[0].priority, 5);
    })
    .await;
}

#[tokio::test]
async fn dirty_key_runs_once_more_after_done() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let first = claim(&db.store, s.id, 10).await;
        for _ in 0..3 {
            let report = db
                .store
                .item_enqueue(ItemEnqueue::new(P, ["a"]))
                .await
                .expect("enqueue");
            assert_eq!(report.dirty, 1);
        }
        assert!(item(&db.store, "a").await.expect("item").dirty);
        assert!(claim(&db.store, s.id, 10).await.is_empty(), "still running");
        complete(&db.store, &first[0], Outcome::Done)
            .await
            .expect("done");
        let second = claim(&db.store, s.id, 10).await;
        assert_eq!(keys(&second), ["a"]);
        assert!(second[0].token > first[0].token, "fencing tokens increase");
        complete(&db.store, &second[0], Outcome::Done)
            .await
            .expect("done");
        let a = item(&db.store, "a").await.expect("a");
        assert_eq!(
            (a.state, a.dirty, a.enqueue_count),
            (ItemState::Idle, false, 4),
            "exactly one more run"
        );
        assert!(claim(&db.store, s.id, 10).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_new_keys_is_all_pending_with_one_enqueue_counted_each() {
    each_enqueue_path_and_pooler(|db| async move {
        // Small and bulk batches, each both for an idle process and with keys
        // past every existing key, so an engine's all-new path is taken if it
        // has one.
        let small: [Vec<String>; 2] = [
            ["k1", "k2", "k3", "k2"].map(String::from).to_vec(),
            ["k4", "k6", "k5"].map(String::from).to_vec(),
        ];
        let bulk = [
            [filler("m", 1000), vec!["m0001".into()]].concat(),
            filler("n", 1000),
        ];
        for (batch, new) in small
            .iter()
            .map(|b| (b, 3))
            .chain(bulk.iter().map(|b| (b, 1000)))
        {
            let report = db
                .store
                .item_enqueue(ItemEnqueue::new(P, batch.iter().cloned()))
                .await
                .expect("enqueue");
            assert_eq!((report.pending, report.dirty), (new, 0), "{}", batch[0]);
        }
        for key in [
            "k1", "k2", "k3", "k4", "k5", "k6", "m0000", "m0999", "n0500",
        ] {
            assert_eq!(
                item(&db.store, key).await.expect(key).state,
                ItemState::Pending
            );
        }
        for key in ["k1", "k2", "m0001", "n0999"] {
            let it = item(&db.store, key).await.expect(key);
            assert_eq!(it.enqueue_count, 1, "{key}: once per batch");
            assert_eq!(it.first_enqueued_at, it.last_enqueued_at, "{key}");
            assert!(it.first_enqueued_at.is_some(), "{key}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_batch_mixing_new_pending_running_parked_and_idle_keys_coalesces_each() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["idle", "parked", "running"]).await;
        let mut leases = claim(&db.store, s.id, 3).await;
        leases.sort_by(|a, b| a.key.cmp(&b.key));
        complete(&db.store, &leases[0], Outcome::Done)
            .await
            .expect("idle");
        complete(&db.store, &leases[1], Outcome::Permanent("bad".into()))
            .await
            .expect("park");
        let later = ItemEnqueue::new(P, ["pending"]).after(secs(60)).priority(3);
        db.store.item_enqueue(later).await.expect("enqueue");
        // Later than the keys' first enqueue, so their last enqueue is too.
        db.store.clock().advance(Duration::from_millis(10));
        let batch = ["new", "pending", "running", "parked", "idle", "new"].map(String::from);
        // With fillers after it, the same batch again on the bulk path.
        let report = db
            .store
            .item_enqueue(ItemEnqueue::new(P, batch.clone()))
            .await
            .expect("enqueue");
        assert_eq!((report.pending, report.dirty), (4, 1));
        let bulk = [batch.to_vec(), filler("z", 1000)].concat();
        let report = db
            .store
            .item_enqueue(ItemEnqueue::new(P, bulk))
            .await
            .expect("bulk enqueue");
        assert_eq!((report.pending, report.dirty), (1004, 1));
        let pending = item(&db.store, "pending").await.expect("pending");
        assert_eq!(pending.priority, 3, "the higher priority stays");
        assert!(item(&db.store, "running").await.expect("running").dirty);
        for key in ["new", "parked", "idle"] {
            let it = item(&db.store, key).await.expect(key);
            assert_eq!(it.state, ItemState::Pending, "{key}");
            assert!(
                it.last_enqueued_at > it.first_enqueued_at || key == "new",
                "{key}"
            );
        }
        let idle = item(&db.store, "idle").await.expect("idle");
        assert_eq!(
            (idle.enqueue_count, idle.last_outcome),
            (3, Some(drover::store::RunOutcome::Done)),
            "an idle key made pending keeps its last outcome until it runs"
        );
        assert_eq!(
            item(&db.store, "new").await.expect("new").enqueue_count,
            2,
            "a key twice in one batch counts once per batch"
        );
        let s2 = db.session().await;
        let claimed = claim(&db.store, s2.id, 4).await;
        let mut ready = keys(&claimed);
        assert_eq!(
            ready[0], "pending",
            "the higher priority and earlier ready time won"
        );
        ready.sort_unstable();
        assert_eq!(
            ready,
            ["idle", "new", "parked", "pending"],
            "the parked and idle keys are pending again (and the fillers, enqueued later, wait)"
        );
    })
    .await;
}

#[tokio::test]
async fn enqueue_never_shortens_a_backoff_unless_asked() {
    each_enqueue_path_and_pooler(|db| async move {
        configure(&db.store, 30, 60).await;
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Transient("boom".into()))
            .await
            .expect("fail");
        enqueue(&db.store, &["a"]).await;
        assert!(
            claim(&db.store, s.id, 1).await.is_empty(),
            "an enqueue respects the backoff"
        );
        let it = item(&db.store, "a").await.expect("item");
        assert_eq!(
            (it.state, it.failures),
            (ItemState::Backoff, 1),
            "and never bumps it"
        );
        let bypass = ItemEnqueue::new(P, ["a"]).bypass_backoff(true);
        db.store.item_enqueue(bypass).await.expect("enqueue");
        let leases = claim(&db.store, s.id, 1).await;
        assert_eq!(leases.len(), 1, "bypass_backoff runs it now");
        assert_eq!(leases[0].attempt, 2, "the failure count is kept");
    })
    .await;
}

#[tokio::test]
async fn counts_report_each_state_and_the_oldest_pending_age() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["run", "fail", "park", "wait1", "wait2"]).await;
        let mut leases = claim(&db.store, s.id, 3).await;
        let park = leases.pop().expect("3 leases");
        let fail = leases.pop().expect("2 leases");
        complete(&db.store, &fail, Outcome::Transient("x".into()))
            .await
            .expect("fail");
        complete(&db.store, &park, Outcome::Permanent("x".into()))
            .await
            .expect("park");
        db.store.clock().advance(Duration::from_millis(500));
        let later = ItemEnqueue::new(P, ["later"]).after(secs(60));
        db.store.item_enqueue(later).await.expect("enqueue");
        let counts = db.store.process_counts_all().await.expect("counts");
        let c = counts
            .iter()
            .find(|c| c.process == P)
            .expect("known process");
        assert_eq!((c.pending, c.backoff, c.running, c.parked), (3, 1, 1, 1));
        let age = c.oldest_pending_age.expect("ready items");
        assert!(
            age >= Duration::from_millis(500) && age < secs(5),
            "{age:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn items_are_listed_in_key_order_a_page_at_a_time_and_by_state() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["c", "a", "d", "b"]).await;
        let lease = db
            .store
            .lease_lock(LeaseLock {
                session: s.id,
                process: P.into(),
                key: "d".into(),
            })
            .await
            .expect("lock");
        let page = |after: Option<&str>, state| ItemList {
            process: P.into(),
            state,
            after_key: after.map(str::to_owned),
            limit: 2,
        };
        let list =
            |items: Vec<drover::store::Item>| items.into_iter().map(|i| i.key).collect::<Vec<_>>();
        let first = db.store.item_list(page(None, None)).await.expect("list");
        assert_eq!(list(first), ["a", "b"]);
        let second = db
            .store
            .item_list(page(Some("b"), None))
            .await
            .expect("list");
        assert_eq!(list(second), ["c", "d"]);
        let running = db
            .store
            .item_list(page(None, Some(ItemState::Running)))
            .await;
        assert_eq!(list(running.expect("list")), ["d"]);
        complete(&db.store, &lease, Outcome::Transient("x".into()))
            .await
            .expect("fail");
        let backoff = db
            .store
            .item_list(page(None, Some(ItemState::Backoff)))
            .await;
        assert_eq!(list(backoff.expect("list")), ["d"]);
        let pending = db
            .store
            .item_list(page(Some("a"), Some(ItemState::Pending)))
            .await;
        assert_eq!(list(pending.expect("list")), ["b", "c"]);
        let parked = db
            .store
            .item_list(page(None, Some(ItemState::Parked)))
            .await;
        assert!(parked.expect("list").is_empty());
    })
    .await;
}

#[tokio::test]
async fn bad_keys_and_unknown_processes_are_rejected_and_nothing_is_written() {
    each_enqueue_path_and_pooler(|db| async move {
        let long = "k".repeat(1025);
        for bad in ["", "nul\0key", long.as_str()] {
            let batch = ItemEnqueue::new(P, ["fine", bad]);
            let err = db.store.item_enqueue(batch).await.expect_err("bad key");
            assert!(matches!(err, StoreError::InvalidKey { .. }), "{err}");
        }
        assert!(
            db.store
                .process_counts_all()
                .await
                .expect("counts")
                .is_empty(),
            "nothing written"
        );
        let query = drover::store::RunList {
            process: Some("nope".into()),
            limit: 10,
            ..drover::store::RunList::default()
        };
        let err = db.store.run_list(query).await.expect_err("unknown");
        assert!(matches!(err, StoreError::UnknownProcess(_)), "{err}");
        let list = ItemList {
            process: "nope".into(),
            state: None,
            after_key: None,
            limit: 1,
        };
        let err = db.store.item_list(list).await.expect_err("unknown");
        assert!(matches!(err, StoreError::UnknownProcess(_)), "{err}");
    })
    .await;
}

#[tokio::test]
async fn retrying_a_backing_off_item_makes_it_claimable_at_once_and_keeps_its_failures() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        complete(&db.store, &lease, Outcome::Transient("boom".into()))
            .await
            .expect("transient");
        assert_eq!(
            item(&db.store, "a").await.expect("item").state,
            ItemState::Backoff
        );
        let retry = ItemRetry {
            process: P.into(),
            key: "a".into(),
            actor: "test".into(),
        };
        let retried = db
            .store
            .item_retry(retry)
            .await
            .expect("retry")
            .expect("item");
        assert_eq!(retried.state, ItemState::Pending);
        assert_eq!(retried.failures, 1);
        let again = claim(&db.store, s.id, 1).await;
        assert_eq!(keys(&again), ["a"]);
        assert_eq!(again[0].attempt, 2);
        assert!(
            events(&db.store, "a")
                .await
                .contains(&drover::store::RunOutcome::Retried)
        );
    })
    .await;
}

#[tokio::test]
async fn parking_an_item_stops_it_until_a_retry_revives_it() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let park = ItemPark {
            process: P.into(),
            key: "a".into(),
            reason: "by hand".into(),
            actor: "test".into(),
        };
        let parked = db.store.item_park(park).await.expect("park").expect("item");
        assert_eq!(parked.state, ItemState::Parked);
        assert_eq!(parked.last_error.as_deref(), Some("by hand"));
        assert!(claim(&db.store, s.id, 1).await.is_empty());
        let retry = ItemRetry {
            process: P.into(),
            key: "a".into(),
            actor: "test".into(),
        };
        db.store.item_retry(retry).await.expect("retry");
        assert_eq!(keys(&claim(&db.store, s.id, 1).await), ["a"]);
    })
    .await;
}

#[tokio::test]
async fn deleting_an_item_forgets_the_key_and_keeps_its_history() {
    each_enqueue_path_and_pooler(|db| async move {
        enqueue(&db.store, &["a"]).await;
        let delete = ItemDelete {
            process: P.into(),
            key: "a".into(),
            actor: "test".into(),
        };
        assert!(db.store.item_delete(delete.clone()).await.expect("delete"));
        assert_eq!(item(&db.store, "a").await, None);
        assert!(!db.store.item_delete(delete).await.expect("delete again"));
        assert_eq!(
            events(&db.store, "a").await,
            [drover::store::RunOutcome::Deleted]
        );
    })
    .await;
}

#[tokio::test]
async fn operator_actions_on_a_running_item_are_refused_and_change_nothing() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        let (process, key) = (P.to_owned(), "a".to_owned());
        let retry = ItemRetry {
            process: process.clone(),
            key: key.clone(),
            actor: "test".into(),
        };
        let park = ItemPark {
            process: process.clone(),
            key: key.clone(),
            reason: "x".into(),
            actor: "test".into(),
        };
        let delete = ItemDelete {
            process,
            key,
            actor: "test".into(),
        };
        let refused = |r: Result<_, StoreError>| matches!(r, Err(StoreError::AlreadyLeased { .. }));
        assert!(refused(db.store.item_retry(retry).await.map(|_| ())));
        assert!(refused(db.store.item_park(park).await.map(|_| ())));
        assert!(refused(db.store.item_delete(delete).await.map(|_| ())));
        complete(&db.store, &lease, Outcome::Done)
            .await
            .expect("lease intact");
    })
    .await;
}

#[tokio::test]
async fn operator_actions_on_unknown_items_report_nothing_to_do() {
    each_enqueue_path_and_pooler(|db| async move {
        let retry = ItemRetry {
            process: P.into(),
            key: "nope".into(),
            actor: "test".into(),
        };
        assert_eq!(db.store.item_retry(retry).await.expect("retry"), None);
        let park = ItemPark {
            process: P.into(),
            key: "".into(),
            reason: "x".into(),
            actor: "test".into(),
        };
        assert!(matches!(
            db.store.item_park(park).await,
            Err(StoreError::InvalidKey { .. })
        ));
    })
    .await;
}

/// Whether the item row `id` is free to lock this instant (`NOWAIT`).
async fn row_is_free(pool: &sqlx::PgPool, id: i64) -> bool {
    let mut tx = pool.begin().await.expect("begin");
    let locked = sqlx::query("SELECT 1 FROM drover_items WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(id)
        .execute(&mut *tx)
        .await;
    tx.rollback().await.expect("rollback");
    locked.is_ok()
}

/// Enqueues lock item rows in one order, key order, and completions wait for
/// no row lock, so none can deadlock another (PostgreSQL; SQLite has one
/// writer and no row locks). Shown with keys whose ids run the other way:
/// while a test transaction holds `a`, an enqueue of `[b, a]` waits for `a`
/// holding nothing, so `b` stays free; a completion of `[b, a]` skips `a`
/// (answered `KeyBusy`, sent again once `a` is let go) and settles `b` at
/// once. (Before: the enqueue locked in input order and the completion in id
/// order, each taking `b` first; then the completion waited for `a` in key
/// order.)
#[tokio::test]
async fn enqueues_lock_rows_in_key_order_and_completions_wait_for_none_on_postgres() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    enqueue(&db.store, &["b"]).await;
    enqueue(&db.store, &["a"]).await;
    let s = db.session().await;
    let mut leases = claim(&db.store, s.id, 2).await;
    leases.sort_by(|x, y| y.key.cmp(&x.key)); // [b, a]
    let id = |key: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT id FROM drover_items WHERE key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .expect("id")
        }
    };
    let (a, b) = (id("a").await, id("b").await);
    assert!(b < a, "b's row is older");
    const LOCK: &str = "SELECT 1 FROM drover_items WHERE id = $1 FOR UPDATE";
    let holder = support::locks::Holder::lock(&pool, LOCK, a).await;
    let store = db.store.clone();
    let enqueue = tokio::spawn(async move {
        let batch = ItemEnqueue::new(P, ["b", "a"]);
        store.item_enqueue(batch).await
    });
    holder.wait_for_waiters(&pool, 1).await;
    assert!(row_is_free(&pool, b).await, "the enqueue took b before a");
    holder.release().await;
    let report = enqueue.await.expect("joined").expect("enqueue");
    assert_eq!(report.dirty, 2);
    let holder = support::locks::Holder::lock(&pool, LOCK, a).await;
    let done = Outcome::Done;
    let batch: Vec<_> = leases
        .iter()
        .map(|lease| drover::store::LeaseComplete {
            lease,
            outcome: &done,
            trace_id: None,
        })
        .collect();
    let results = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        db.store.lease_complete_batch(&batch),
    )
    .await
    .expect("the completion waits for no row")
    .expect("batch");
    assert!(results[0].is_ok(), "b: {results:?}");
    assert!(
        matches!(&results[1], Err(StoreError::KeyBusy { key, .. }) if key == "a"),
        "a: {results:?}"
    );
    assert!(row_is_free(&pool, b).await, "the completion let b go");
    holder.release().await;
    let results = db
        .store
        .lease_complete_batch(&batch[1..])
        .await
        .expect("a's outcome, sent again");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

#[tokio::test]
async fn an_enqueue_that_bypasses_the_backoff_clears_it_for_status_and_lock() {
    each_enqueue_path_and_pooler(|db| async move {
        configure(&db.store, 30, 60).await;
        let s = db.session().await;
        let lock = || LeaseLock {
            session: s.id,
            process: P.into(),
            key: "a".into(),
        };
        let lease = db.store.lease_lock(lock()).await.expect("lock");
        complete(&db.store, &lease, Outcome::Transient("boom".into()))
            .await
            .expect("fail");
        let bypass = ItemEnqueue::new(P, ["a"]).bypass_backoff(true);
        db.store.item_enqueue(bypass).await.expect("enqueue");
        let it = item(&db.store, "a").await.expect("item");
        assert_eq!(
            (it.state, it.backoff_until, it.failures),
            (ItemState::Pending, None, 1),
            "no longer backing off; the failure count is kept"
        );
        let counts = db.store.process_counts_all().await.expect("counts");
        assert_eq!((counts[0].pending, counts[0].backoff), (1, 0));
        let again = db.store.lease_lock(lock()).await.expect("lock takes it");
        assert_eq!(again.attempt, 2);
    })
    .await;
}

/// SQL straight into SQLite's `drover_items` checks no types, so an item's
/// numbers may be fractions: a time, a priority, a failure count. Read as
/// they were stored, one such row failed the process's item list, its
/// listing on the process page, its own read and the operator's park and
/// retry of it with a `ColumnDecode` error, so the operator could neither
/// see the key nor act on it. Now each is read as SQLite reads a value as an
/// integer (cut toward zero), as the claim reads them.
#[tokio::test]
async fn fractions_sql_wrote_into_an_item_fail_no_read_of_it() {
    let (db, _dir) = support::sqlite().await;
    enqueue(&db.store, &["a", "b"]).await;
    let s = db.session().await;
    let lease = claim(&db.store, s.id, 1).await.remove(0);
    assert_eq!(lease.key, "a");
    complete(&db.store, &lease, Outcome::Done)
        .await
        .expect("done");
    for sql in [
        "UPDATE drover_items SET last_ended_at = last_ended_at + 0.5, enqueue_count = 1.5
         WHERE key = 'a'",
        "UPDATE drover_items SET backoff_until = 1.5, priority = 2.5, failures = 1.5,
             ready_at = ready_at + 0.5 WHERE key = 'b'",
    ] {
        db.execute(sql).await;
    }
    let list = ItemList {
        process: P.into(),
        state: None,
        after_key: None,
        limit: 10,
    };
    let listed = db.store.item_list(list).await.expect("the item list");
    assert_eq!(keys_of(&listed), ["a", "b"]);
    let page = first_page(&db.store).await;
    assert_eq!(keys_of(&page), ["b", "a"], "pending, then idle");
    let a = item(&db.store, "a").await.expect("a");
    assert_eq!((a.state, a.enqueue_count), (ItemState::Idle, 1));
    let b = item(&db.store, "b").await.expect("b");
    let at_1_ms = chrono::DateTime::from_timestamp_millis(1);
    assert_eq!(
        (b.state, b.priority, b.failures, b.backoff_until),
        (ItemState::Pending, 2, 1, at_1_ms)
    );
    let park = ItemPark {
        process: P.into(),
        key: "b".into(),
        reason: "by hand".into(),
        actor: "test".into(),
    };
    let parked = db.store.item_park(park).await.expect("park").expect("b");
    assert_eq!(parked.state, ItemState::Parked);
    let retry = ItemRetry {
        process: P.into(),
        key: "b".into(),
        actor: "test".into(),
    };
    let retried = db.store.item_retry(retry).await.expect("retry").expect("b");
    assert_eq!(retried.state, ItemState::Pending);
}

fn keys_of(items: &[drover::store::Item]) -> Vec<&str> {
    items.iter().map(|i| i.key.as_str()).collect()
}
