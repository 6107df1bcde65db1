//! The store's contract for error groups and bulk actions: failing keys grouped
//! by their error with the key and numbers replaced, and retry, park and delete
//! of every key a filter matches, in batches, audited, never touching a running
//! key; on every engine via `support::each_engine`.
//!
//! No test sleeps: backoffs end by advancing the store's clock offset.

mod support;

use drover::store::{
    ErrorGroup, ErrorGroups, ItemFilter, ItemList, ItemPark, ItemState, ItemsDelete, ItemsPark,
    ItemsRetry, MAX_NAME_BYTES, Outcome, RunList, RunOutcome, Store, StoreEngine as _, StoreError,
};
use support::store::{
    P, claim, complete, configure, enqueue, events, first_page, history, item, p_counts, secs,
    write_key_not_utf8,
};
use support::{TestDb, each_engine_and_pooler};

/// Enqueues `keys`, runs each once and ends it with the outcome `outcome`
/// gives for its key. Nothing else of `P` may be ready.
async fn fail(db: &TestDb, keys: &[&str], outcome: impl Fn(&str) -> Outcome) {
    enqueue(&db.store, keys).await;
    let s = db.session().await;
    let leases = claim(&db.store, s.id, 1000).await;
    assert_eq!(leases.len(), keys.len(), "only these keys were ready");
    for lease in &leases {
        complete(&db.store, lease, outcome(&lease.key))
            .await
            .expect("complete");
    }
}

/// A timeout naming the key, with numbers that differ per key.
fn timeout(key: &str) -> Outcome {
    Outcome::Permanent(format!("{key}: timeout after {}s", key.len() * 7))
}

async fn groups(store: &Store, limit: u32) -> Vec<ErrorGroup> {
    store
        .error_groups(ErrorGroups {
            process: P.into(),
            limit,
        })
        .await
        .expect("error_groups")
}

async fn state(store: &Store, key: &str) -> Option<ItemState> {
    item(store, key).await.map(|i| i.state)
}

#[tokio::test]
async fn failing_keys_group_by_their_error_with_the_key_and_numbers_replaced() {
    each_engine_and_pooler(|db| async move {
        configure(&db.store, 60, 600).await;
        fail(&db, &["vm-1", "vm-22", "vm-333"], timeout).await;
        fail(&db, &["db-1", "db-2"], |_| {
            Outcome::Transient("connection refused".into())
        })
        .await;
        fail(&db, &["disk-a"], |_| {
            Outcome::Permanent("disk 7 full".into())
        })
        .await;
        fail(&db, &["disk-b"], |_| {
            Outcome::Transient("disk 9 full".into())
        })
        .await;
        fail(&db, &["ok"], |_| Outcome::Done).await;
        enqueue(&db.store, &["waiting"]).await;
        let all = groups(&db.store, 10).await;
        let summary: Vec<_> = all
            .iter()
            .map(|g| (g.signature.as_str(), g.count, g.states.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                ("<key>: timeout after <n>s", 3, vec![ItemState::Parked]),
                ("connection refused", 2, vec![ItemState::Backoff]),
                (
                    "disk <n> full",
                    2,
                    vec![ItemState::Parked, ItemState::Backoff]
                ),
            ],
            "most keys first, then by signature; idle and pending keys are not failing"
        );
        assert!(
            all[0].sample.ends_with(": timeout after 35s")
                || all[0].sample.ends_with(": timeout after 42s")
                || all[0].sample.ends_with(": timeout after 28s"),
            "a sample is a stored error: {}",
            all[0].sample
        );
        assert_eq!(
            groups(&db.store, 1).await,
            all[..1],
            "at most `limit` groups"
        );
        db.store.clock().advance(secs(3600));
        let later = groups(&db.store, 10).await;
        assert_eq!(
            later.iter().map(|g| g.count).collect::<Vec<_>>(),
            [3, 1],
            "a key whose backoff ended is no longer failing"
        );
    })
    .await;
}

#[tokio::test]
async fn bulk_retry_by_error_group_retries_exactly_the_keys_of_that_group() {
    each_engine_and_pooler(|db| async move {
        configure(&db.store, 1, 1).await;
        fail(&db, &["vm-1", "vm-22", "vm-333"], timeout).await;
        fail(&db, &["db-1", "db-2"], |_| {
            Outcome::Permanent("connection refused".into())
        })
        .await;
        // Two keys with the same error that are not failing any more: one
        // pending again after its backoff, one running.
        fail(&db, &["vm-8", "vm-9"], |k| {
            Outcome::Transient(format!("{k}: timeout after 5s"))
        })
        .await;
        db.store.clock().advance(secs(10));
        let s = db.session().await;
        let running = claim(&db.store, s.id, 1).await.remove(0).key;
        let pending = if running == "vm-8" { "vm-9" } else { "vm-8" };
        let group = groups(&db.store, 10).await.remove(0);
        assert_eq!(
            (group.signature.as_str(), group.count),
            ("<key>: timeout after <n>s", 3)
        );

        let filter = ItemFilter::new(P).error_signature(&group.signature);
        let changed = db
            .store
            .items_retry_where(ItemsRetry::new(filter, "admin"))
            .await
            .expect("retry");
        assert_eq!(changed, 3);
        for key in ["vm-1", "vm-22", "vm-333"] {
            assert_eq!(
                state(&db.store, key).await,
                Some(ItemState::Pending),
                "{key}"
            );
            let last = history(&db.store, key, 1).await.remove(0);
            assert_eq!(
                (last.outcome, last.actor.as_deref()),
                (RunOutcome::Retried, Some("admin")),
                "{key}"
            );
        }
        for key in ["db-1", "db-2"] {
            assert_eq!(
                state(&db.store, key).await,
                Some(ItemState::Parked),
                "{key}"
            );
            assert_eq!(events(&db.store, key).await, [RunOutcome::Parked], "{key}");
        }
        assert_eq!(state(&db.store, &running).await, Some(ItemState::Running));
        assert_eq!(events(&db.store, &running).await, [RunOutcome::Retry]);
        assert_eq!(events(&db.store, pending).await, [RunOutcome::Retry]);
        let left: Vec<_> = groups(&db.store, 10)
            .await
            .into_iter()
            .map(|g| g.signature)
            .collect();
        assert_eq!(left, ["connection refused"]);
    })
    .await;
}

/// The groups' signatures and how many keys each has, in their order.
async fn counted(store: &Store) -> Vec<(String, u64)> {
    groups(store, 10)
        .await
        .into_iter()
        .map(|g| (g.signature, g.count))
        .collect()
}

/// The signature is kept on the item wherever its error is written: a failed
/// run (backing off or parked), an operator's park of one key, a bulk park
/// whose reason names one of its keys (so each key gets its own signature); a
/// clean run clears it. The groups count it and the bulk actions match it.
#[tokio::test]
async fn every_write_of_an_error_keeps_its_signature() {
    each_engine_and_pooler(|db| async move {
        configure(&db.store, 60, 600).await;
        fail(&db, &["n-1"], |k| Outcome::Transient(format!("{k} x 12"))).await;
        fail(&db, &["n-22"], |k| Outcome::Permanent(format!("{k} x 3"))).await;
        enqueue(&db.store, &["n-333", "m-4444", "m-5555"]).await;
        let park = ItemPark {
            process: P.into(),
            key: "n-333".into(),
            reason: "n-333 x 9".into(),
            actor: "admin".into(),
        };
        db.store.item_park(park).await.expect("park one");
        let reason = "held: m-4444 x 5";
        let bulk = ItemsPark::new(ItemFilter::new(P).key_prefix("m-"), "cli", reason);
        assert_eq!(db.store.items_park_where(bulk).await.expect("park"), 2);
        let n = |s: &str, c: u64| (s.to_owned(), c);
        assert_eq!(
            counted(&db.store).await,
            [
                n("<key> x <n>", 3),
                n("held: <key> x <n>", 1),
                n("held: m-<n> x <n>", 1)
            ]
        );

        let filter = ItemFilter::new(P).error_signature("held: m-<n> x <n>");
        let retry = ItemsRetry::new(filter, "admin");
        assert_eq!(db.store.items_retry_where(retry).await.expect("retry"), 1);
        assert_eq!(state(&db.store, "m-5555").await, Some(ItemState::Pending));
        db.store.clock().advance(secs(3600));
        let s = db.session().await;
        let mut ran = Vec::new();
        for lease in claim(&db.store, s.id, 10).await {
            complete(&db.store, &lease, Outcome::Done)
                .await
                .expect("done");
            ran.push(lease.key);
        }
        ran.sort();
        assert_eq!(ran, ["m-5555", "n-1"]);
        assert_eq!(
            counted(&db.store).await,
            [n("<key> x <n>", 2), n("held: <key> x <n>", 1)],
            "a clean run clears the error and its signature"
        );
        let delete = ItemsDelete::new(ItemFilter::new(P).error_signature("<key> x <n>"), "cli");
        assert_eq!(
            db.store.items_delete_where(delete).await.expect("delete"),
            2
        );
        assert_eq!(state(&db.store, "n-22").await, None);
        assert_eq!(state(&db.store, "n-333").await, None);
        assert_eq!(state(&db.store, "m-4444").await, Some(ItemState::Parked));
    })
    .await;
}

#[tokio::test]
async fn bulk_park_and_delete_act_on_the_keys_a_filter_matches() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, &["ns1/a", "ns1/b", "ns1/c", "ns2/a", "ns10/a"]).await;
        let s = db.session().await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        assert_eq!(lease.key, "ns1/a");
        let park = ItemsPark::new(
            ItemFilter::new(P).key_prefix("ns1/"),
            "cli",
            "provider down",
        );
        let parked = db.store.items_park_where(park).await.expect("park");
        assert_eq!(parked, 2, "the running key is not touched");
        let b = item(&db.store, "ns1/b").await.expect("ns1/b");
        assert_eq!(
            (b.state, b.last_error.as_deref()),
            (ItemState::Parked, Some("provider down"))
        );
        let row = history(&db.store, "ns1/c", 1).await.remove(0);
        assert_eq!(
            (row.outcome, row.actor.as_deref(), row.error.as_deref()),
            (RunOutcome::Parked, Some("cli"), Some("provider down"))
        );
        assert_eq!(state(&db.store, "ns1/a").await, Some(ItemState::Running));
        assert_eq!(state(&db.store, "ns10/a").await, Some(ItemState::Pending));

        let delete = ItemsDelete::new(ItemFilter::new(P).state(ItemState::Parked), "cli");
        assert_eq!(
            db.store.items_delete_where(delete).await.expect("delete"),
            2
        );
        assert_eq!(state(&db.store, "ns1/b").await, None);
        assert_eq!(
            events(&db.store, "ns1/b").await,
            [RunOutcome::Parked, RunOutcome::Deleted]
        );
        assert_eq!(state(&db.store, "ns2/a").await, Some(ItemState::Pending));
        assert_eq!(state(&db.store, "ns1/a").await, Some(ItemState::Running));
    })
    .await;
}

#[tokio::test]
async fn a_filter_matching_nothing_changes_nothing_and_an_empty_one_is_refused() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, &["a1", "a2"]).await;
        let none = ItemFilter::new(P).key_prefix("zz");
        let retry = ItemsRetry::new(none.clone(), "admin");
        assert_eq!(db.store.items_retry_where(retry).await.expect("retry"), 0);
        let signature = ItemFilter::new(P).error_signature("no such error");
        let delete = ItemsDelete::new(signature, "admin");
        assert_eq!(
            db.store.items_delete_where(delete).await.expect("delete"),
            0
        );
        for key in ["a1", "a2"] {
            assert_eq!(state(&db.store, key).await, Some(ItemState::Pending));
            assert!(history(&db.store, key, 10).await.is_empty(), "no row");
        }
        for filter in [
            ItemFilter::new(P),
            ItemFilter::new(P).key_prefix("").error_signature(""),
            ItemFilter::new(P).state(ItemState::Running),
            // Longer than any key, or with a NUL: no key could match.
            ItemFilter::new(P).key_prefix("a".repeat(MAX_NAME_BYTES + 1)),
            ItemFilter::new(P).key_prefix("a\0"),
        ] {
            let delete = ItemsDelete::new(filter.clone(), "admin");
            let refused = db.store.items_delete_where(delete).await;
            assert!(
                matches!(refused, Err(StoreError::InvalidArgument(_))),
                "{filter:?}: {refused:?}"
            );
        }
        assert_eq!(state(&db.store, "a1").await, Some(ItemState::Pending));
        let unknown = ItemsRetry::new(ItemFilter::new("nope").key_prefix("a"), "admin");
        assert!(matches!(
            db.store.items_retry_where(unknown).await,
            Err(StoreError::UnknownProcess(_))
        ));
    })
    .await;
}

#[tokio::test]
async fn bulk_actions_walk_every_batch_of_a_process() {
    each_engine_and_pooler(|db| async move {
        // Half the keys parked; the retry by their error walks windows that
        // also hold the pending half, which does not match.
        let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        enqueue(&db.store, &refs).await;
        let first = ItemFilter::new(P).key_prefix("k0");
        let park = ItemsPark::new(first, "admin", "first ten").batch(3);
        assert_eq!(db.store.items_park_where(park).await.expect("park"), 10);
        let group = ItemFilter::new(P).error_signature("first ten");
        let retry = ItemsRetry::new(group, "admin").batch(3);
        assert_eq!(db.store.items_retry_where(retry).await.expect("retry"), 10);
        for key in &refs[..10] {
            assert_eq!(
                events(&db.store, key).await,
                [RunOutcome::Parked, RunOutcome::Retried],
                "{key}"
            );
        }

        // More keys than one default batch.
        let many: Vec<String> = (0..2_345).map(|i| format!("m{i:05}")).collect();
        let process = drover::store::ItemEnqueue::new(P, many.iter().cloned());
        db.store.item_enqueue(process).await.expect("enqueue");
        let park = ItemsPark::new(ItemFilter::new(P).key_prefix("m"), "admin", "all of them");
        assert_eq!(db.store.items_park_where(park).await.expect("park"), 2_345);
        let delete = ItemsDelete::new(ItemFilter::new(P).error_signature("all of them"), "admin");
        assert_eq!(
            db.store.items_delete_where(delete).await.expect("delete"),
            2_345
        );
        assert_eq!(state(&db.store, "m02344").await, None);
        assert_eq!(state(&db.store, "k10").await, Some(ItemState::Pending));
    })
    .await;
}

#[tokio::test]
async fn a_bulk_retry_wakes_the_process_workers() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, &["a1", "a2"]).await;
        let park = ItemsPark::new(ItemFilter::new(P).key_prefix("a"), "admin", "held");
        assert_eq!(db.store.items_park_where(park).await.expect("park"), 2);
        let wakeup = db.store.subscribe(P);
        let woken = wakeup.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let retry = ItemsRetry::new(ItemFilter::new(P).state(ItemState::Parked), "admin");
        assert_eq!(db.store.items_retry_where(retry).await.expect("retry"), 2);
        tokio::time::timeout(secs(5), woken)
            .await
            .expect("a worker waiting on the process is woken");
    })
    .await;
}

/// SQLite keeps any bytes SQL writes as text. A key that is not UTF-8 (written
/// into the table by hand, or through `drover_enqueue` before migration 0014)
/// is parked by the claim that meets it; the operator must then be able to
/// see it and act on it. Every list that met it failed with an internal
/// error, and a bulk walk going on from it as read (U+FFFD sorts before its
/// bad byte) read it again forever.
#[tokio::test]
async fn a_key_that_is_not_utf8_is_listed_and_bulk_actions_walk_past_it() {
    let (db, _dir) = support::sqlite().await;
    fail(&db, &["g"], |_| Outcome::Permanent("g broke".into())).await;
    write_key_not_utf8(&db, None).await;
    let s = db.session().await;
    assert!(
        claim(&db.store, s.id, 10).await.is_empty(),
        "parked, not run"
    );
    let shown = "f\u{FFFD}";

    let listed = db
        .store
        .item_list(ItemList {
            process: P.into(),
            state: Some(ItemState::Parked),
            after_key: None,
            limit: 10,
        })
        .await
        .expect("the parked list");
    let listed: Vec<_> = listed.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(listed, [shown, "g"]);
    // As the README warns: the public cursor is the key as read, which sorts
    // before the stored bytes, so a page that ends on it shows it again.
    let next = db
        .store
        .item_list(ItemList {
            process: P.into(),
            state: Some(ItemState::Parked),
            after_key: Some(shown.into()),
            limit: 10,
        })
        .await
        .expect("the next page");
    assert_eq!(next.first().map(|i| i.key.as_str()), Some(shown));
    let page = first_page(&db.store).await;
    assert!(page.iter().any(|i| i.key == shown), "{page:?}");

    // One key per window: the walk must go on from the bad key's own bytes to
    // reach the key the filter matches behind it.
    let g = ItemFilter::new(P).error_signature("<key> broke");
    let retry = ItemsRetry::new(g, "admin").batch(1);
    let retried = tokio::time::timeout(secs(10), db.store.items_retry_where(retry))
        .await
        .expect("the walk ends")
        .expect("retry");
    assert_eq!(retried, 1);
    assert_eq!(state(&db.store, "g").await, Some(ItemState::Pending));

    let parked = ItemFilter::new(P).state(ItemState::Parked);
    let retry = ItemsRetry::new(parked, "admin").batch(1);
    assert_eq!(db.store.items_retry_where(retry).await.expect("retry"), 1);
    let runs = db
        .store
        .run_list(RunList {
            process: Some(P.into()),
            limit: 10,
            ..RunList::default()
        })
        .await
        .expect("the process's runs");
    assert_eq!(
        runs.iter()
            .filter(|r| r.outcome == RunOutcome::Retried)
            .map(|r| r.key.as_str())
            .collect::<Vec<_>>(),
        [shown, "g"],
        "newest first"
    );
    assert!(
        claim(&db.store, s.id, 10)
            .await
            .iter()
            .all(|l| l.key == "g")
    );
    let delete = ItemsDelete::new(ItemFilter::new(P).state(ItemState::Parked), "admin");
    assert_eq!(
        db.store.items_delete_where(delete).await.expect("delete"),
        1
    );
    let counts = p_counts(&db.store).await;
    assert_eq!((counts.parked, counts.running), (0, 1), "gone; g runs");
}

/// An error too long for an index entry (PostgreSQL refuses one past about
/// 2.7 KB) that does not compress: letters from a fixed pseudo-random walk.
fn incompressible(seed: u64, len: usize) -> String {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            char::from(b'a' + u8::try_from((x >> 33) % 26).expect("a letter"))
        })
        .collect()
}

#[tokio::test]
async fn a_long_error_is_stored_whole_and_groups_by_a_bounded_signature() {
    each_engine_and_pooler(|db| async move {
        configure(&db.store, 60, 600).await;
        let first = incompressible(7, 3500);
        // The same start, a different end: two groups, not one.
        let second = format!("{}{}", &first[..3000], incompressible(8, 500));
        let errors = [("long-1", first.clone()), ("long-2", second.clone())];
        fail(&db, &["long-1", "long-2"], |key| {
            let error = &errors.iter().find(|(k, _)| *k == key).expect("a key").1;
            Outcome::Permanent(error.clone())
        })
        .await;
        for (key, error) in &errors {
            let stored = item(&db.store, key).await.expect("the item");
            assert_eq!(stored.last_error.as_deref(), Some(error.as_str()), "{key}");
            let runs = history(&db.store, key, 5).await;
            assert_eq!(runs[0].error.as_deref(), Some(error.as_str()), "{key}");
        }
        let found = groups(&db.store, 10).await;
        assert_eq!(found.len(), 2, "{found:?}");
        for group in &found {
            assert!(group.signature.len() <= drover::store::MAX_SIGNATURE_BYTES);
            assert_eq!(group.count, 1);
        }
        let park = ItemFilter::new(P).error_signature(found[0].signature.clone());
        let parked = db
            .store
            .items_park_where(ItemsPark::new(park, "test", "parked"))
            .await
            .expect("park by signature");
        assert_eq!(parked, 1, "the action matches exactly its group");
    })
    .await;
}

/// SQL straight into SQLite's `drover_items` checks no types, so a key's
/// `backoff_until` may be a fraction. Read as it was stored, it failed every
/// batch of a bulk action whose window met the row with a `ColumnDecode`
/// error, so no bulk action could act on the process's keys behind it. Now
/// it is read as SQLite reads a value as an integer, and the action takes
/// every key its filter matches.
#[tokio::test]
async fn a_fraction_sql_wrote_into_a_backoff_stops_no_bulk_action() {
    let (db, _dir) = support::sqlite().await;
    fail(&db, &["a", "b"], timeout).await;
    db.execute("UPDATE drover_items SET backoff_until = 1.5 WHERE key = 'a'")
        .await;
    let parked = ItemFilter::new(P).state(ItemState::Parked);
    let retry = ItemsRetry::new(parked, "admin").batch(1);
    assert_eq!(db.store.items_retry_where(retry).await.expect("retry"), 2);
    for key in ["a", "b"] {
        assert_eq!(
            state(&db.store, key).await,
            Some(ItemState::Pending),
            "{key}"
        );
    }
}
