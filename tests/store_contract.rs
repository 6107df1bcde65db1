//! The store's contract (DESIGN.md "Semantics" 1–8, as far as the store owns them),
//! written once and run against every engine by `support::each_engine`.
//!
//! No test sleeps: TTLs and backoffs pass by advancing the store's clock offset.

mod support;

use std::time::Duration;

use drover::backoff::Backoff;
use drover::store::{
    EventKind, HistoryActivity, HistoryList, HistoryPrune, ItemDelete, ItemEnqueue, ItemGet,
    ItemList, ItemPark, ItemRetry, ItemState, Lease, LeaseClaim, LeaseComplete, LeaseLock,
    LeaseRelease, Outcome, ProcessConfigure, SessionClose, SessionHeartbeat, SessionId, Store,
    StoreEngine as _, StoreError,
};
use support::each_engine;

const P: &str = "provision";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

async fn enqueue(store: &Store, keys: &[&str]) {
    store
        .item_enqueue(ItemEnqueue::new(P, keys.iter().copied()))
        .await
        .expect("enqueue");
}

async fn claim(store: &Store, session: SessionId, max: u32) -> Vec<Lease> {
    store
        .lease_claim(LeaseClaim {
            session,
            process: P.into(),
            max,
        })
        .await
        .expect("claim")
}

fn keys(leases: &[Lease]) -> Vec<&str> {
    leases.iter().map(|l| l.key.as_str()).collect()
}

async fn complete(store: &Store, lease: &Lease, outcome: Outcome) -> Result<(), StoreError> {
    store
        .lease_complete(LeaseComplete {
            lease,
            outcome: &outcome,
        })
        .await
}

async fn item(store: &Store, key: &str) -> Option<drover::store::Item> {
    store
        .item_get(ItemGet {
            process: P.into(),
            key: key.into(),
            history_limit: 0,
        })
        .await
        .expect("item_get")
        .map(|d| d.item)
}

/// The newest `limit` events of `key`, newest first.
async fn history(store: &Store, key: &str, limit: u32) -> Vec<drover::store::HistoryEvent> {
    store
        .history_list(HistoryList {
            process: Some(P.into()),
            key: Some(key.into()),
            before_id: None,
            limit,
        })
        .await
        .expect("history")
}

async fn events(store: &Store, key: &str) -> Vec<EventKind> {
    let mut events: Vec<_> = history(store, key, 100)
        .await
        .into_iter()
        .map(|e| e.event)
        .collect();
    events.reverse();
    events
}

async fn configure(store: &Store, initial: u64, max: u64) {
    store
        .process_configure(ProcessConfigure {
            process: P.into(),
            backoff: Backoff::new(secs(initial), 2.0, secs(max)).expect("valid backoff"),
        })
        .await
        .expect("configure");
}

#[tokio::test]
async fn enqueued_key_is_claimed_once_and_gone_after_done() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 10).await;
        assert_eq!(keys(&leases), ["a"]);
        assert_eq!(leases[0].attempt, 1);
        assert!(
            claim(&db.store, s.id, 10).await.is_empty(),
            "held keys are not handed out"
        );
        complete(&db.store, &leases[0], Outcome::Done)
            .await
            .expect("done");
        assert_eq!(item(&db.store, "a").await, None);
        assert!(claim(&db.store, s.id, 10).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn enqueueing_a_pending_key_again_keeps_one_entry_with_the_earlier_ready_time() {
    each_engine(|db| async move {
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
async fn coalescing_keeps_the_higher_priority() {
    each_engine(|db| async move {
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
    each_engine(|db| async move {
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
        assert_eq!(item(&db.store, "a").await, None, "exactly one more run");
    })
    .await;
}

/// `n` keys `{prefix}0000`, `{prefix}0001`, …: enough of them push a batch
/// onto an engine's bulk path (PostgreSQL's `COPY`, from 1,000 keys).
fn filler(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

#[tokio::test]
async fn a_batch_of_new_keys_is_all_pending_with_one_enqueued_event_each() {
    each_engine(|db| async move {
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
            assert_eq!(
                events(&db.store, key).await,
                [EventKind::Enqueued],
                "{key}: once per batch"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_batch_mixing_new_pending_running_and_parked_keys_coalesces_each() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["parked", "running"]).await;
        let mut leases = claim(&db.store, s.id, 2).await;
        leases.sort_by(|a, b| a.key.cmp(&b.key));
        complete(&db.store, &leases[0], Outcome::Permanent("bad".into()))
            .await
            .expect("park");
        let later = ItemEnqueue::new(P, ["pending"]).after(secs(60)).priority(3);
        db.store.item_enqueue(later).await.expect("enqueue");
        let batch = ["new", "pending", "running", "parked", "new"].map(String::from);
        // With fillers after it, the same batch again on the bulk path.
        let report = db
            .store
            .item_enqueue(ItemEnqueue::new(P, batch.clone()))
            .await
            .expect("enqueue");
        assert_eq!((report.pending, report.dirty), (3, 1));
        let bulk = [batch.to_vec(), filler("z", 1000)].concat();
        let report = db
            .store
            .item_enqueue(ItemEnqueue::new(P, bulk))
            .await
            .expect("bulk enqueue");
        assert_eq!((report.pending, report.dirty), (1003, 1));
        let pending = item(&db.store, "pending").await.expect("pending");
        assert_eq!(pending.priority, 3, "the higher priority stays");
        assert!(item(&db.store, "running").await.expect("running").dirty);
        for key in ["new", "parked"] {
            assert_eq!(
                item(&db.store, key).await.expect(key).state,
                ItemState::Pending
            );
        }
        assert_eq!(
            events(&db.store, "new").await,
            [EventKind::Enqueued, EventKind::Enqueued]
        );
        let s2 = db.session().await;
        let claimed = claim(&db.store, s2.id, 3).await;
        let mut ready = keys(&claimed);
        assert_eq!(
            ready[0], "pending",
            "the higher priority and earlier ready time won"
        );
        ready.sort_unstable();
        assert_eq!(
            ready,
            ["new", "parked", "pending"],
            "the parked key is revived (and the fillers, enqueued later, wait)"
        );
    })
    .await;
}

#[tokio::test]
async fn claims_follow_priority_then_ready_time_then_fifo() {
    each_engine(|db| async move {
        let s = db.session().await;
        let delayed = ItemEnqueue::new(P, ["delayed"]).after(secs(5));
        db.store.item_enqueue(delayed).await.expect("enqueue");
        enqueue(&db.store, &["first", "second"]).await;
        db.store.clock().advance(secs(1));
        enqueue(&db.store, &["third"]).await;
        let urgent = ItemEnqueue::new(P, ["urgent"]).priority(10);
        db.store.item_enqueue(urgent).await.expect("enqueue");
        let resync = ItemEnqueue::new(P, ["resync"]).priority(-1);
        db.store.item_enqueue(resync).await.expect("enqueue");
        let order = keys(&claim(&db.store, s.id, 10).await)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        assert_eq!(order, ["urgent", "first", "second", "third", "resync"]);
        db.store.clock().advance(secs(5));
        assert_eq!(keys(&claim(&db.store, s.id, 10).await), ["delayed"]);
    })
    .await;
}

#[tokio::test]
async fn transient_failures_back_off_exponentially_up_to_the_cap() {
    each_engine(|db| async move {
        configure(&db.store, 2, 6).await;
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        for (attempt, delay) in [(1, 2), (2, 4), (3, 6), (4, 6)] {
            let leases = claim(&db.store, s.id, 1).await;
            assert_eq!(leases.len(), 1, "attempt {attempt} is ready");
            assert_eq!(leases[0].attempt, attempt);
            complete(&db.store, &leases[0], Outcome::Transient("boom".into()))
                .await
                .expect("fail");
            let it = item(&db.store, "a").await.expect("item");
            assert_eq!((it.state, it.failures), (ItemState::Backoff, attempt));
            db.store
                .clock()
                .advance(secs(delay) - Duration::from_millis(100));
            assert!(claim(&db.store, s.id, 1).await.is_empty(), "backing off");
            db.store.clock().advance(Duration::from_millis(200));
            db.store
                .session_heartbeat(SessionHeartbeat { session: s.id })
                .await
                .expect("heartbeat");
        }
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Done)
            .await
            .expect("done");
        assert_eq!(item(&db.store, "a").await, None, "done resets everything");
    })
    .await;
}

#[tokio::test]
async fn backoff_survives_a_reconnect() {
    each_engine(|db| async move {
        configure(&db.store, 10, 100).await;
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Transient("boom".into()))
            .await
            .expect("fail");
        db.store.close().await;
        let store = db.reconnect().await;
        let s = store
            .session_start(drover::store::SessionStart {
                component: "restarted".into(),
                ttl: secs(60),
            })
            .await
            .expect("session");
        assert!(
            claim(&store, s.id, 1).await.is_empty(),
            "backoff is durable"
        );
        store.clock().advance(secs(10));
        let leases = claim(&store, s.id, 1).await;
        assert_eq!((leases.len(), leases[0].attempt), (1, 2));
    })
    .await;
}

#[tokio::test]
async fn enqueue_never_shortens_a_backoff_unless_asked() {
    each_engine(|db| async move {
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
async fn requeue_after_resets_failures_and_delays_the_key() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Transient("x".into()))
            .await
            .expect("fail");
        db.store.clock().advance(secs(1));
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::RequeueAfter(secs(30)))
            .await
            .expect("requeue");
        let it = item(&db.store, "a").await.expect("item");
        assert_eq!((it.state, it.failures), (ItemState::Pending, 0));
        db.store.clock().advance(secs(29));
        let s = db.session().await;
        assert!(claim(&db.store, s.id, 1).await.is_empty());
        db.store.clock().advance(secs(1));
        assert_eq!(claim(&db.store, s.id, 1).await[0].attempt, 1);
    })
    .await;
}

#[tokio::test]
async fn permanent_failure_parks_the_key_until_an_enqueue_revives_it() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Permanent("bad spec".into()))
            .await
            .expect("park");
        let it = item(&db.store, "a").await.expect("item");
        assert_eq!(it.state, ItemState::Parked);
        assert_eq!(it.last_error.as_deref(), Some("bad spec"));
        db.store.clock().advance(secs(3600));
        let s = db.session().await;
        assert!(
            claim(&db.store, s.id, 1).await.is_empty(),
            "never runs on its own"
        );
        enqueue(&db.store, &["a"]).await;
        assert_eq!(keys(&claim(&db.store, s.id, 1).await), ["a"]);
    })
    .await;
}

#[tokio::test]
async fn a_permanent_failure_of_a_dirty_key_runs_it_again_instead_of_parking() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        enqueue(&db.store, &["a"]).await;
        complete(&db.store, &leases[0], Outcome::Permanent("bad".into()))
            .await
            .expect("fail");
        assert_eq!(keys(&claim(&db.store, s.id, 1).await), ["a"]);
    })
    .await;
}

#[tokio::test]
async fn stale_leases_are_rejected_after_expiry_and_reclaim_and_change_nothing() {
    each_engine(|db| async move {
        let old = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let stale = claim(&db.store, old.id, 1).await.remove(0);
        db.store.clock().advance(secs(31));
        let err = complete(&db.store, &stale, Outcome::Done)
            .await
            .expect_err("expired");
        assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
        let report = db.store.session_reclaim().await.expect("reclaim");
        assert_eq!((report.sessions, report.leases), (1, 1));
        let fresh = db.session().await;
        let current = claim(&db.store, fresh.id, 1).await.remove(0);
        assert!(current.token > stale.token);
        let before = item(&db.store, "a").await;
        for outcome in [Outcome::Done, Outcome::Permanent("x".into())] {
            let err = complete(&db.store, &stale, outcome)
                .await
                .expect_err("stale");
            assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
        }
        let forged = Lease {
            session: fresh.id,
            ..stale.clone()
        };
        let err = complete(&db.store, &forged, Outcome::Done)
            .await
            .expect_err("stale token");
        assert!(matches!(err, StoreError::LeaseLost { .. }), "{err}");
        let err = db
            .store
            .lease_release(LeaseRelease { lease: &forged })
            .await
            .expect_err("stale");
        assert!(matches!(err, StoreError::LeaseLost { .. }), "{err}");
        assert_eq!(item(&db.store, "a").await, before, "nothing changed");
        complete(&db.store, &current, Outcome::Done)
            .await
            .expect("the holder still can");
    })
    .await;
}

#[tokio::test]
async fn an_expired_session_cannot_heartbeat_or_claim_and_a_heartbeat_extends_a_live_one() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        db.store.clock().advance(secs(20));
        let deadline = db
            .store
            .session_heartbeat(SessionHeartbeat { session: s.id })
            .await
            .expect("heartbeat");
        assert!(deadline > s.deadline);
        db.store.clock().advance(secs(20));
        assert_eq!(
            claim(&db.store, s.id, 1).await.len(),
            1,
            "still alive after 40 s"
        );
        db.store.clock().advance(secs(31));
        let err = db
            .store
            .session_heartbeat(SessionHeartbeat { session: s.id })
            .await
            .expect_err("expired");
        assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
        let claim = LeaseClaim {
            session: s.id,
            process: P.into(),
            max: 1,
        };
        let err = db.store.lease_claim(claim).await.expect_err("expired");
        assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
    })
    .await;
}

#[tokio::test]
async fn reclaim_makes_expired_leases_pending_with_an_expired_event() {
    each_engine(|db| async move {
        let dead = db.session().await;
        db.store.clock().advance(secs(20));
        let live = db.session().await;
        enqueue(&db.store, &["a", "b"]).await;
        let a = claim(&db.store, dead.id, 1).await.remove(0);
        let b = claim(&db.store, live.id, 1).await.remove(0);
        enqueue(&db.store, &["a"]).await;
        db.store.clock().advance(secs(15));
        let report = db.store.session_reclaim().await.expect("reclaim");
        assert_eq!((report.sessions, report.leases), (1, 1));
        let it = item(&db.store, &a.key).await.expect("item");
        assert_eq!(
            (it.state, it.dirty, it.failures),
            (ItemState::Pending, false, 0)
        );
        assert_eq!(
            item(&db.store, &b.key).await.expect("item").state,
            ItemState::Running
        );
        assert_eq!(
            events(&db.store, &a.key).await.last(),
            Some(&EventKind::Expired)
        );
        assert_eq!(keys(&claim(&db.store, live.id, 5).await), [a.key.as_str()]);
        let again = db.store.session_reclaim().await.expect("reclaim");
        assert_eq!((again.sessions, again.leases), (0, 0), "idempotent");
    })
    .await;
}

#[tokio::test]
async fn release_makes_the_key_pending_without_counting_a_failure() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        db.store
            .lease_release(LeaseRelease { lease: &lease })
            .await
            .expect("release");
        let again = claim(&db.store, s.id, 1).await;
        assert_eq!((keys(&again), again[0].attempt), (vec!["a"], 1));
        assert_eq!(
            events(&db.store, "a").await[..3],
            [EventKind::Enqueued, EventKind::Started, EventKind::Canceled]
        );
    })
    .await;
}

#[tokio::test]
async fn closing_a_session_releases_its_leases() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a", "b"]).await;
        assert_eq!(claim(&db.store, s.id, 5).await.len(), 2);
        assert_eq!(
            db.store
                .session_close(SessionClose { session: s.id })
                .await
                .expect("close"),
            2
        );
        let err = db
            .store
            .session_heartbeat(SessionHeartbeat { session: s.id })
            .await
            .expect_err("closed");
        assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
        let other = db.session().await;
        assert_eq!(claim(&db.store, other.id, 5).await.len(), 2);
    })
    .await;
}

#[tokio::test]
async fn lock_takes_a_chosen_key_and_refuses_leased_backing_off_and_parked_keys() {
    each_engine(|db| async move {
        let s = db.session().await;
        let lock = |key: &str| LeaseLock {
            session: s.id,
            process: P.into(),
            key: key.into(),
        };
        let held = db
            .store
            .lease_lock(lock("m1"))
            .await
            .expect("lock an unknown key");
        let err = db.store.lease_lock(lock("m1")).await.expect_err("held");
        assert!(matches!(err, StoreError::AlreadyLeased { .. }), "{err}");
        complete(&db.store, &held, Outcome::Transient("x".into()))
            .await
            .expect("fail");
        let err = db.store.lease_lock(lock("m1")).await.expect_err("backoff");
        assert!(matches!(err, StoreError::InBackoff { .. }), "{err}");
        db.store.clock().advance(secs(1));
        let again = db.store.lease_lock(lock("m1")).await.expect("backoff over");
        assert_eq!(again.attempt, 2);
        complete(&db.store, &again, Outcome::Permanent("x".into()))
            .await
            .expect("park");
        let err = db.store.lease_lock(lock("m1")).await.expect_err("parked");
        assert!(matches!(err, StoreError::Parked { .. }), "{err}");
        enqueue(&db.store, &["m2"]).await;
        assert_eq!(
            db.store.lease_lock(lock("m2")).await.expect("pending").key,
            "m2"
        );
        assert!(claim(&db.store, s.id, 5).await.is_empty());
    })
    .await;
}

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
async fn counts_report_each_state_and_the_oldest_pending_age() {
    each_engine(|db| async move {
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
        let counts = db.store.process_counts().await.expect("counts");
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
    each_engine(|db| async move {
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
    each_engine(|db| async move {
        let long = "k".repeat(1025);
        for bad in ["", "nul\0key", long.as_str()] {
            let batch = ItemEnqueue::new(P, ["fine", bad]);
            let err = db.store.item_enqueue(batch).await.expect_err("bad key");
            assert!(matches!(err, StoreError::InvalidKey { .. }), "{err}");
        }
        assert!(
            db.store.process_counts().await.expect("counts").is_empty(),
            "nothing written"
        );
        let query = HistoryList {
            process: Some("nope".into()),
            limit: 10,
            ..HistoryList::default()
        };
        let err = db.store.history_list(query).await.expect_err("unknown");
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
async fn migrating_again_is_a_no_op_and_a_newer_schema_is_refused() {
    each_engine(|db| async move {
        enqueue(&db.store, &["a"]).await;
        db.store.migrate().await.expect("migrate again");
        db.reconnect()
            .await
            .migrate()
            .await
            .expect("migrate from another node");
        assert!(item(&db.store, "a").await.is_some(), "data kept");
        sqlx_insert_future_migration(&db).await;
        let err = Store::connect(&db.url).await.expect_err("newer schema");
        assert!(
            matches!(err, StoreError::SchemaTooNew { found: 99_999, .. }),
            "{err}"
        );
    })
    .await;
}

/// Pretends a newer drover migrated the database.
async fn sqlx_insert_future_migration(db: &support::TestDb) {
    let sql =
        "INSERT INTO drover_migrations (version, description, success, checksum, execution_time)
               VALUES (99999, 'from the future', true, x'00', 0)";
    let sql = if db.engine == "postgres" {
        sql.replace("x'00'", "'\\x00'::bytea")
    } else {
        sql.to_owned()
    };
    match db.engine {
        "postgres" => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("insert");
        }
        _ => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("insert");
        }
    }
}

#[tokio::test]
async fn the_candidate_filter_skips_leased_parked_and_backing_off_keys() {
    each_engine(|db| async move {
        let s = db.session().await;
        let lock = |key: &str| LeaseLock {
            session: s.id,
            process: P.into(),
            key: key.into(),
        };
        db.store.lease_lock(lock("leased")).await.expect("lock");
        let failing = db.store.lease_lock(lock("backoff")).await.expect("lock");
        complete(&db.store, &failing, Outcome::Transient("x".into()))
            .await
            .expect("fail");
        let broken = db.store.lease_lock(lock("parked")).await.expect("lock");
        complete(&db.store, &broken, Outcome::Permanent("x".into()))
            .await
            .expect("park");
        enqueue(&db.store, &["pending"]).await;
        let param = if db.engine == "postgres" { "$1" } else { "?1" };
        let filter = db.store.candidate_filter(param, "m.id");
        let sql = format!(
            "SELECT m.id FROM (SELECT 'leased' AS id UNION ALL SELECT 'backoff' \
             UNION ALL SELECT 'parked' UNION ALL SELECT 'pending' UNION ALL SELECT 'new') m \
             WHERE {filter} ORDER BY m.id"
        );
        let free: Vec<String> = if db.engine == "postgres" {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(P);
            q.fetch_all(&pool).await.expect("user query")
        } else {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(P);
            q.fetch_all(&pool).await.expect("user query")
        };
        assert_eq!(free, ["new", "pending"]);
        for key in &free {
            db.store
                .lease_lock(lock(key))
                .await
                .expect("the filter agrees with lock");
        }
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_completions_commits_the_held_leases_and_rejects_only_the_lost_one() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a", "b", "c"]).await;
        let leases = claim(&db.store, s.id, 3).await;
        let lost = Lease {
            token: drover::store::FencingToken(leases[1].token.0 + 1000),
            ..leases[1].clone()
        };
        let (done, failed) = (Outcome::Done, Outcome::Transient("x".into()));
        let batch = [
            LeaseComplete {
                lease: &leases[0],
                outcome: &done,
            },
            LeaseComplete {
                lease: &lost,
                outcome: &done,
            },
            LeaseComplete {
                lease: &leases[2],
                outcome: &failed,
            },
        ];
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(
            matches!(results[1], Err(StoreError::LeaseLost { .. })),
            "{results:?}"
        );
        assert_eq!(item(&db.store, "a").await, None);
        assert_eq!(
            item(&db.store, "b").await.expect("b").state,
            ItemState::Running
        );
        assert_eq!(
            item(&db.store, "c").await.expect("c").state,
            ItemState::Backoff
        );
    })
    .await;
}

#[tokio::test]
async fn a_mixed_batch_logs_each_outcome_with_its_lease() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a", "b", "c", "d"]).await;
        let first = claim(&db.store, s.id, 4).await;
        let failed = Outcome::Transient("flaky".into());
        complete(&db.store, &first[1], failed.clone())
            .await
            .expect("b fails once");
        db.store.clock().advance(secs(2));
        let retried = claim(&db.store, s.id, 1).await.remove(0);
        assert_eq!((retried.key.as_str(), retried.attempt), ("b", 2));
        enqueue(&db.store, &["c"]).await; // c is running: dirty
        let (done, later) = (Outcome::Done, Outcome::RequeueAfter(secs(60)));
        let parked = Outcome::Permanent("broken".into());
        let batch = [
            LeaseComplete {
                lease: &first[0],
                outcome: &done,
            },
            LeaseComplete {
                lease: &retried,
                outcome: &done,
            },
            LeaseComplete {
                lease: &first[2],
                outcome: &later,
            },
            LeaseComplete {
                lease: &first[3],
                outcome: &parked,
            },
        ];
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        use EventKind::*;
        assert_eq!(events(&db.store, "a").await, [Enqueued, Started, Finished]);
        assert_eq!(
            events(&db.store, "b").await,
            [Enqueued, Started, Failed, Started, Finished]
        );
        assert_eq!(
            events(&db.store, "c").await,
            [Enqueued, Started, Enqueued, Finished]
        );
        assert_eq!(
            events(&db.store, "d").await,
            [Enqueued, Started, Failed, Parked]
        );
        for (key, attempt) in [("a", 1), ("b", 2), ("c", 1), ("d", 1)] {
            let event = history(&db.store, key, 1).await.remove(0);
            assert_eq!(
                (event.session, event.attempt),
                (Some(s.id), Some(attempt)),
                "{key}: {event:?}"
            );
        }
        let b = history(&db.store, "b", 1).await.remove(0);
        assert_eq!((b.error, b.transient), (None, None));
        let d = history(&db.store, "d", 2).await;
        assert_eq!(d[1].error.as_deref(), Some("broken"));
        assert_eq!(d[1].transient, Some(false));
    })
    .await;
}

#[tokio::test]
async fn a_jittered_backoff_stays_between_the_delay_and_its_spread() {
    each_engine(|db| async move {
        let policy = Backoff::new(secs(10), 2.0, secs(100))
            .and_then(|b| b.with_jitter(0.5))
            .expect("valid policy");
        let configure = ProcessConfigure {
            process: P.into(),
            backoff: policy,
        };
        db.store
            .process_configure(configure)
            .await
            .expect("configure");
        let s = db.session().await;
        for i in 0..10 {
            let key = format!("k{i}");
            enqueue(&db.store, &[key.as_str()]).await;
            let lease = claim(&db.store, s.id, 1).await.remove(0);
            let before = db.store.clock_now().await.expect("now");
            complete(&db.store, &lease, Outcome::Transient("x".into()))
                .await
                .expect("fail");
            let after = db.store.clock_now().await.expect("now");
            let until = item(&db.store, &key).await.expect("item").backoff_until;
            let until = until.expect("backing off");
            assert!(
                until >= before + chrono::Duration::seconds(10),
                "{until} vs {before}"
            );
            assert!(
                until <= after + chrono::Duration::seconds(15),
                "{until} vs {after}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn small_claims_take_the_highest_priority_first_past_keys_not_yet_ready() {
    each_engine(|db| async move {
        let s = db.session().await;
        let waiting = ItemEnqueue::new(P, ["w1", "w2"])
            .priority(9)
            .after(secs(60));
        db.store.item_enqueue(waiting).await.expect("enqueue");
        for (key, priority) in [("low", -1), ("mid", 0), ("high", 5), ("mid2", 0)] {
            let e = ItemEnqueue::new(P, [key]).priority(priority);
            db.store.item_enqueue(e).await.expect("enqueue");
        }
        let mut order = Vec::new();
        for _ in 0..5 {
            order.extend(claim(&db.store, s.id, 1).await.into_iter().map(|l| l.key));
        }
        assert_eq!(order, ["high", "mid", "mid2", "low"]);
        db.store.clock().advance(secs(60));
        let s = db.session().await;
        assert_eq!(keys(&claim(&db.store, s.id, 1).await), ["w1"]);
    })
    .await;
}

#[tokio::test]
async fn retrying_a_backing_off_item_makes_it_claimable_at_once_and_keeps_its_failures() {
    each_engine(|db| async move {
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
        assert!(events(&db.store, "a").await.contains(&EventKind::Retried));
    })
    .await;
}

#[tokio::test]
async fn parking_an_item_stops_it_until_a_retry_revives_it() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let park = ItemPark {
            process: P.into(),
            key: "a".into(),
            reason: "by hand".into(),
        };
        let parked = db.store.item_park(park).await.expect("park").expect("item");
        assert_eq!(parked.state, ItemState::Parked);
        assert_eq!(parked.last_error.as_deref(), Some("by hand"));
        assert!(claim(&db.store, s.id, 1).await.is_empty());
        let retry = ItemRetry {
            process: P.into(),
            key: "a".into(),
        };
        db.store.item_retry(retry).await.expect("retry");
        assert_eq!(keys(&claim(&db.store, s.id, 1).await), ["a"]);
    })
    .await;
}

#[tokio::test]
async fn deleting_an_item_removes_it_and_keeps_its_history() {
    each_engine(|db| async move {
        enqueue(&db.store, &["a"]).await;
        let delete = ItemDelete {
            process: P.into(),
            key: "a".into(),
        };
        assert!(db.store.item_delete(delete.clone()).await.expect("delete"));
        assert_eq!(item(&db.store, "a").await, None);
        assert!(!db.store.item_delete(delete).await.expect("delete again"));
        assert_eq!(
            events(&db.store, "a").await,
            [EventKind::Enqueued, EventKind::Deleted]
        );
    })
    .await;
}

#[tokio::test]
async fn operator_actions_on_a_running_item_are_refused_and_change_nothing() {
    each_engine(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        let (process, key) = (P.to_owned(), "a".to_owned());
        let retry = ItemRetry {
            process: process.clone(),
            key: key.clone(),
        };
        let park = ItemPark {
            process: process.clone(),
            key: key.clone(),
            reason: "x".into(),
        };
        let delete = ItemDelete { process, key };
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
    each_engine(|db| async move {
        let retry = ItemRetry {
            process: P.into(),
            key: "nope".into(),
        };
        assert_eq!(db.store.item_retry(retry).await.expect("retry"), None);
        let park = ItemPark {
            process: P.into(),
            key: "".into(),
            reason: "x".into(),
        };
        assert!(matches!(
            db.store.item_park(park).await,
            Err(StoreError::InvalidKey { .. })
        ));
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
