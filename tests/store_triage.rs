//! The process page's listing ([`StoreEngine::item_triage`]): parked keys
//! first, then backing off, then pending in claim order, then running and
//! idle; keyset pages that together list every key once; filters by state
//! and key prefix; on every engine.

mod support;

use std::time::Duration;

use drover::store::{
    ItemEnqueue, ItemState, ItemTriage, MAX_NAME_BYTES, Outcome, Store, StoreEngine as _,
    StoreError, TriageCursor,
};
use support::each_engine_and_pooler;
use support::store::{P, claim, complete, configure, secs};

/// Every page of the listing, `limit` items at a time: (state, key) in order.
async fn walk(
    store: &Store,
    state: Option<ItemState>,
    prefix: Option<&str>,
    limit: u32,
) -> Vec<(ItemState, String)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .item_triage(ItemTriage {
                process: P.into(),
                state,
                key_prefix: prefix.map(str::to_owned),
                after,
                limit,
            })
            .await
            .expect("page");
        assert!(page.items.len() <= limit as usize);
        out.extend(page.items.into_iter().map(|i| (i.state, i.key)));
        match page.next {
            // The cursor goes through its text form, as a link carries it.
            Some(next) => after = Some(next.to_string().parse().expect("cursor")),
            None => return out,
        }
    }
}

/// One process with keys in every state: parked `p1`, `p2`; backing off
/// `b1` (failed first, so retried sooner) and `b2`; pending `hi` (priority 5), then `w1`, `w2`,
/// `w3` by age; running `r1`; idle `i1`.
async fn every_state(store: &Store, session: drover::store::SessionId) {
    configure(store, 10_000, 60_000).await;
    let e = |keys: &[&str]| ItemEnqueue::new(P, keys.iter().copied());
    // b1 is ready first, so claimed (and failed) first.
    store.item_enqueue(e(&["b1"])).await.expect("enqueue");
    store.clock().advance(Duration::from_millis(10));
    store
        .item_enqueue(e(&["b2", "p1", "p2", "i1"]))
        .await
        .expect("enqueue");
    for _ in 0..5 {
        // One key at a time, so each fails at its own time.
        let lease = claim(store, session, 1).await.pop().expect("a lease");
        let outcome = match lease.key.as_str() {
            "p1" | "p2" => Outcome::Permanent("broken".into()),
            "i1" => Outcome::Done,
            _ => Outcome::Transient("flaky".into()),
        };
        complete(store, &lease, outcome).await.expect("complete");
        store.clock().advance(Duration::from_millis(10));
    }
    for key in ["w1", "w2", "w3", "r1"] {
        store.item_enqueue(e(&[key])).await.expect("enqueue");
        store.clock().advance(Duration::from_millis(10));
    }
    store
        .item_enqueue(e(&["hi"]).priority(5))
        .await
        .expect("enqueue");
    let r1 = drover::store::LeaseLock {
        session,
        process: P.into(),
        key: "r1".into(),
    };
    store.lease_lock(r1).await.expect("lock r1");
}

fn names(list: &[(ItemState, String)]) -> Vec<String> {
    list.iter().map(|(s, k)| format!("{s}:{k}")).collect()
}

#[tokio::test]
async fn pages_list_parked_then_backoff_then_pending_in_claim_order_then_running_and_idle() {
    each_engine_and_pooler(|db| async move {
        let s = db.session().await;
        every_state(&db.store, s.id).await;
        let expected = [
            "parked:p1",
            "parked:p2",
            "backoff:b1",
            "backoff:b2",
            "pending:hi",
            "pending:w1",
            "pending:w2",
            "pending:w3",
            "running:r1",
            "idle:i1",
        ];
        for limit in [1, 2, 3, 100] {
            let all = walk(&db.store, None, None, limit).await;
            assert_eq!(names(&all), expected, "limit {limit}");
        }
        let pending = walk(&db.store, Some(ItemState::Pending), None, 2).await;
        assert_eq!(
            names(&pending),
            ["pending:hi", "pending:w1", "pending:w2", "pending:w3"]
        );
        let backoff = walk(&db.store, Some(ItemState::Backoff), None, 1).await;
        assert_eq!(names(&backoff), ["backoff:b1", "backoff:b2"]);
    })
    .await;
}

#[tokio::test]
async fn a_key_prefix_narrows_every_section_to_its_keys_in_key_order() {
    each_engine_and_pooler(|db| async move {
        let s = db.session().await;
        every_state(&db.store, s.id).await;
        let w = walk(&db.store, None, Some("w"), 2).await;
        assert_eq!(names(&w), ["pending:w1", "pending:w2", "pending:w3"]);
        let b = walk(&db.store, None, Some("b"), 1).await;
        assert_eq!(
            names(&b),
            ["backoff:b1", "backoff:b2"],
            "by key under a prefix"
        );
        let none = walk(&db.store, Some(ItemState::Parked), Some("w"), 5).await;
        assert!(none.is_empty(), "{none:?}");
        let exact = walk(&db.store, None, Some("p2"), 5).await;
        assert_eq!(names(&exact), ["parked:p2"]);
        // A prefix no key could start with is refused, not searched for.
        for prefix in ["w".repeat(MAX_NAME_BYTES + 1), "w\0".to_owned()] {
            let refused = db
                .store
                .item_triage(ItemTriage {
                    process: P.into(),
                    state: None,
                    key_prefix: Some(prefix),
                    after: None,
                    limit: 5,
                })
                .await;
            assert!(
                matches!(refused, Err(StoreError::InvalidArgument(_))),
                "{refused:?}"
            );
        }
        let longest = walk(&db.store, None, Some(&"w".repeat(MAX_NAME_BYTES)), 5).await;
        assert!(longest.is_empty(), "{longest:?}");
    })
    .await;
}

#[tokio::test]
async fn deep_pages_of_a_large_backlog_follow_the_claim_order_across_priorities() {
    each_engine_and_pooler(|db| async move {
        let keys: Vec<String> = (0..300).map(|n| format!("k{n:03}")).collect();
        for (n, chunk) in keys.chunks(100).enumerate() {
            let e = ItemEnqueue::new(P, chunk.iter().cloned())
                .priority(i32::try_from(n).expect("small"));
            db.store.item_enqueue(e).await.expect("enqueue");
            db.store.clock().advance(secs(1));
        }
        let all = walk(&db.store, None, None, 7).await;
        let got: Vec<&str> = all.iter().map(|(_, k)| k.as_str()).collect();
        // Highest priority (the last hundred) first; within one, by age, then id.
        let want: Vec<&str> = keys
            .chunks(100)
            .rev()
            .flatten()
            .map(String::as_str)
            .collect();
        assert_eq!(got, want);
    })
    .await;
}

#[tokio::test]
async fn a_cursor_of_another_listing_or_garbage_is_refused() {
    each_engine_and_pooler(|db| async move {
        let s = db.session().await;
        every_state(&db.store, s.id).await;
        let page = |state, after| ItemTriage {
            process: P.into(),
            state,
            key_prefix: None,
            after,
            limit: 1,
        };
        let first = db.store.item_triage(page(None, None)).await.expect("page");
        let parked: TriageCursor = first.next.expect("more pages");
        let err = db
            .store
            .item_triage(page(Some(ItemState::Idle), Some(parked)))
            .await
            .expect_err("a parked cursor for the idle listing");
        assert!(matches!(err, StoreError::InvalidArgument(_)), "{err}");
        assert!("pending:c:x".parse::<TriageCursor>().is_err());
        let unknown = ItemTriage {
            process: "nope".into(),
            ..page(None, None)
        };
        let err = db
            .store
            .item_triage(unknown)
            .await
            .expect_err("unknown process");
        assert!(matches!(err, StoreError::UnknownProcess(_)), "{err}");
    })
    .await;
}

/// Running keys started in an order other than their keys' (claim order is
/// the order they became ready), and parked keys parked in such an order:
/// both lists, the triage's and the API's, give them in key order a page at
/// a time, with no key of another state or process among them. SQLite keeps
/// no index of running keys by key (migration 0013): it sorts them.
#[tokio::test]
async fn running_and_parked_keys_are_listed_in_key_order_whatever_order_they_started_in() {
    each_engine_and_pooler(|db| async move {
        let s = db.session().await;
        let store = &db.store;
        for key in ["r3", "x2", "r1", "x1", "r4", "x3", "r2"] {
            store
                .item_enqueue(ItemEnqueue::new(P, [key]))
                .await
                .expect("enqueue");
            store.clock().advance(Duration::from_millis(10));
        }
        // Another process's running keys sort among this one's.
        store
            .item_enqueue(ItemEnqueue::new("other", ["r0", "r25", "r5"]))
            .await
            .expect("enqueue another process");
        let other = drover::store::LeaseClaim {
            session: s.id,
            process: "other".into(),
            max: 3,
            trace_links: false,
        };
        let others = store.lease_claim(other).await.expect("claim").leases;
        assert_eq!(others.len(), 3);
        let leases = claim(store, s.id, 7).await;
        for lease in &leases {
            if lease.key.starts_with('x') {
                let outcome = Outcome::Permanent("broken".into());
                complete(store, lease, outcome).await.expect("park");
            }
        }
        store
            .item_enqueue(ItemEnqueue::new(P, ["idle-or-pending"]))
            .await
            .expect("enqueue");
        let running = walk(store, Some(ItemState::Running), None, 2).await;
        let expected = ["running:r1", "running:r2", "running:r3", "running:r4"];
        assert_eq!(names(&running), expected);
        let parked = walk(store, Some(ItemState::Parked), None, 2).await;
        assert_eq!(names(&parked), ["parked:x1", "parked:x2", "parked:x3"]);
        for (state, keys) in [
            (ItemState::Running, ["r1", "r2", "r3", "r4"].as_slice()),
            (ItemState::Parked, ["x1", "x2", "x3"].as_slice()),
        ] {
            let mut listed = Vec::new();
            let mut after = None;
            loop {
                let page = store
                    .item_list(drover::store::ItemList {
                        process: P.into(),
                        state: Some(state),
                        after_key: after.clone(),
                        limit: 2,
                    })
                    .await
                    .expect("list");
                let Some(last) = page.last() else { break };
                after = Some(last.key.clone());
                assert!(page.iter().all(|i| i.state == state), "{page:?}");
                listed.extend(page.into_iter().map(|i| i.key));
            }
            assert_eq!(listed, keys, "{state}");
        }
    })
    .await;
}
