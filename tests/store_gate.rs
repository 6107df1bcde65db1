//! The claim of a limited process, on every engine and through PgBouncer: the
//! rate bucket's arithmetic at its edges (a clock behind the bucket's last
//! write, fractions of a token), the claim order under limits that do not
//! bind, and a gone session. On PostgreSQL this claim is the SQL function
//! `drover_claim_gated`, whose admission debug builds check against the one
//! SQLite uses (`GateRow::admit`) on every claim, so each claim here is also a
//! check that the two agree.

mod support;

use std::time::Duration;

use drover::store::{
    ItemEnqueue, LeaseClaim, ProcessConfigure, SessionClose, SessionId, Store, StoreEngine as _,
    StoreError,
};
use support::each_engine_and_pooler;

const P: &str = "gate";

fn claim(session: SessionId, max: u32) -> LeaseClaim {
    LeaseClaim {
        session,
        process: P.into(),
        max,
        trace_links: false,
    }
}

async fn claimed_keys(store: &Store, session: SessionId, max: u32) -> Vec<String> {
    let claimed = store.lease_claim(claim(session, max)).await.expect("claim");
    claimed.leases.into_iter().map(|l| l.key).collect()
}

#[tokio::test]
async fn a_clock_behind_the_buckets_last_write_adds_no_tokens_and_fractions_add_up() {
    each_engine_and_pooler(|db| async move {
        let keys = (0..20).map(|i| format!("k{i:02}"));
        db.store
            .item_enqueue(ItemEnqueue::new(P, keys))
            .await
            .expect("enqueue");
        db.store
            .process_configure(ProcessConfigure::new(P).rate(Some(1.0)).burst(3))
            .await
            .expect("configure");
        let session = db.session().await.id;
        let behind = db.store.clone();
        let ahead = db.reconnect().await;
        ahead.clock().advance(Duration::from_secs(10));

        let two = ahead.lease_claim(claim(session, 2)).await.expect("claim");
        assert_eq!(two.leases.len(), 2, "a full bucket of 3");
        assert_eq!(two.gate.next_token_in, None, "the claim's size bound it");
        let one = behind.lease_claim(claim(session, 10)).await.expect("claim");
        assert_eq!(
            one.leases.len(),
            1,
            "10 s before the bucket's write: the token left, no more and none fewer"
        );
        assert!(one.gate.next_token_in.is_some(), "the bucket ran dry");
        assert!(claimed_keys(&behind, session, 10).await.is_empty());
        assert_eq!(
            claimed_keys(&ahead, session, 10).await.len(),
            3,
            "10 s after the last write (by the clock behind): refilled to the burst"
        );

        behind.clock().advance(Duration::from_millis(10_400));
        let dry = behind.lease_claim(claim(session, 10)).await.expect("claim");
        assert!(dry.leases.is_empty(), "0.4 of a token is none");
        let wait = dry.gate.next_token_in.expect("the bucket is dry");
        assert!(
            wait <= Duration::from_millis(600),
            "the rest of the token: {wait:?}"
        );
        behind.clock().advance(Duration::from_millis(700));
        assert_eq!(
            claimed_keys(&behind, session, 10).await.len(),
            1,
            "1.1 tokens start one run"
        );
        ahead.close().await;
    })
    .await;
}

#[tokio::test]
async fn limits_that_do_not_bind_claim_in_the_order_no_limit_claims() {
    each_engine_and_pooler(|db| async move {
        let enqueue = |keys: &[&str], priority: i32, after: Duration| {
            let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
            let store = db.store.clone();
            async move {
                store
                    .item_enqueue(ItemEnqueue::new(P, keys).priority(priority).after(after))
                    .await
                    .expect("enqueue");
            }
        };
        // One key per enqueue: FIFO among keys enqueued together is each
        // engine's own.
        for key in ["a", "b", "c"] {
            enqueue(&[key], 0, Duration::ZERO).await;
        }
        enqueue(&["low-later"], 0, Duration::from_secs(3600)).await;
        for key in ["h1", "h2"] {
            enqueue(&[key], 5, Duration::ZERO).await;
        }
        enqueue(&["top"], 9, Duration::ZERO).await;
        db.store
            .process_configure(
                ProcessConfigure::new(P)
                    .concurrency(Some(1_000))
                    .rate(Some(1e6))
                    .burst(1_000),
            )
            .await
            .expect("configure");
        let session = db.session().await.id;
        let first = db
            .store
            .lease_claim(claim(session, 4))
            .await
            .expect("claim");
        let keys: Vec<_> = first.leases.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(
            keys,
            ["top", "h1", "h2", "a"],
            "highest priority first, then ready order"
        );
        assert_eq!(first.gate, Default::default(), "nothing held it back");
        assert_eq!(
            first.leases[0].attempt, 1,
            "a lease carries its attempt and priority"
        );
        assert_eq!(first.leases[0].priority, 9);
        let tokens: Vec<_> = first.leases.iter().map(|l| l.token).collect();
        assert!(
            tokens
                .iter()
                .all(|t| tokens.iter().filter(|u| *u == t).count() == 1),
            "fresh fencing tokens: {tokens:?}"
        );

        db.store
            .process_configure(ProcessConfigure::new(P).concurrency(None).rate(None))
            .await
            .expect("configure");
        assert_eq!(
            claimed_keys(&db.store, session, 1).await,
            ["b"],
            "the limits' removal is noticed at once"
        );
        assert_eq!(
            claimed_keys(&db.store, session, 10).await,
            ["c"],
            "a delayed key waits"
        );
    })
    .await;
}

#[tokio::test]
async fn a_limited_claim_by_a_gone_session_is_refused_and_takes_no_token() {
    each_engine_and_pooler(|db| async move {
        let keys = (0..5).map(|i| format!("k{i}"));
        db.store
            .item_enqueue(ItemEnqueue::new(P, keys))
            .await
            .expect("enqueue");
        db.store
            .process_configure(ProcessConfigure::new(P).rate(Some(0.001)).burst(2))
            .await
            .expect("configure");
        let gone = db.session().await.id;
        db.store
            .session_close(SessionClose { session: gone })
            .await
            .expect("close");
        for _ in 0..2 {
            // Twice: once found limited by the fast path, once known limited.
            let refused = db.store.lease_claim(claim(gone, 5)).await;
            assert!(
                matches!(refused, Err(StoreError::SessionExpired { session }) if session == gone),
                "{refused:?}"
            );
        }
        let live = db.session().await.id;
        assert_eq!(
            claimed_keys(&db.store, live, 5).await.len(),
            2,
            "the bucket is still full"
        );
    })
    .await;
}
