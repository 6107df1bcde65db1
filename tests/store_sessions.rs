//! The store's contract for sessions (DESIGN.md rules 1 and 6): heartbeats,
//! expiry, reclaim and close, and fencing of the leases a session lost, on every
//! engine via `support::each_engine`.
//!
//! No test sleeps: TTLs pass by advancing the store's clock offset.

mod support;

use drover::store::{
    EventKind, ItemState, Lease, LeaseClaim, LeaseRelease, Outcome, SessionClose, SessionHeartbeat,
    StoreEngine as _, StoreError,
};
use support::each_engine;
use support::store::{P, claim, complete, enqueue, events, item, keys, secs};

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
