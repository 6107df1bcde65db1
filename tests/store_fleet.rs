//! Fleet controls in the store, on every engine: pause, the cluster-wide
//! concurrency limit (with the worst interleaving forced on PostgreSQL, and a
//! stress of many claimers) and the rate limit's token bucket on the database
//! clock. What decides a claim of a limited process runs through PgBouncer
//! too. On PostgreSQL, a query source's lock that waits for its key's row
//! obeys what changed meanwhile and holds no other claim back.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use drover::store::{
    ItemEnqueue, ItemGet, ItemState, LeaseClaim, LeaseComplete, LeaseLock, Outcome,
    ProcessConfigure, ProcessPage, ProcessPause, RunList, RunOutcome, SessionId, Store,
    StoreEngine as _, StoreError,
};
use support::locks::Holder;
use support::{TestDb, each_engine, each_engine_and_pooler};

const P: &str = "fleet";

async fn enqueue(store: &Store, n: usize) {
    let keys = (0..n).map(|i| format!("k{i:04}"));
    store
        .item_enqueue(ItemEnqueue::new(P, keys))
        .await
        .expect("enqueue");
}

async fn configure(store: &Store, params: ProcessConfigure) {
    store.process_configure(params).await.expect("configure");
}

async fn pause(store: &Store, paused: bool) -> bool {
    store
        .process_pause(ProcessPause {
            process: P.into(),
            paused,
            actor: "test".into(),
        })
        .await
        .expect("pause")
}

/// The leases one claim of up to `max` keys of [`P`] hands `session`.
async fn claim_leases(store: &Store, session: SessionId, max: u32) -> Vec<drover::store::Lease> {
    store
        .lease_claim(claim(session, max))
        .await
        .expect("claim")
        .leases
}

fn claim(session: SessionId, max: u32) -> LeaseClaim {
    LeaseClaim {
        session,
        process: P.into(),
        max,
        trace_links: false,
    }
}

fn lock(session: SessionId, key: &str) -> LeaseLock {
    LeaseLock {
        session,
        process: P.into(),
        key: key.into(),
    }
}

async fn pending(store: &Store) -> u64 {
    let counts = store.process_counts_all().await.expect("counts");
    counts
        .iter()
        .find(|c| c.process == P)
        .map_or(0, |c| c.pending)
}

#[tokio::test]
async fn a_paused_process_is_not_claimed_and_keeps_its_enqueues_until_resumed() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, 3).await;
        let session = db.session().await;
        assert!(pause(&db.store, true).await, "pausing changes it");
        assert!(
            !pause(&db.store, true).await,
            "pausing again changes nothing"
        );
        let claimed = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert!(claimed.leases.is_empty(), "a paused process is not claimed");
        assert!(claimed.gate.paused);
        let refused = db.store.lease_lock(lock(session.id, "k0000")).await;
        assert!(
            matches!(refused, Err(StoreError::Held { why: "paused", .. })),
            "{refused:?}"
        );
        enqueue(&db.store, 5).await;
        assert_eq!(
            pending(&db.store).await,
            5,
            "enqueues coalesce and are kept"
        );
        let settings = db.store.process_list().await.expect("list");
        assert!(settings[0].limits.paused);

        assert!(pause(&db.store, false).await);
        let claimed = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(claimed.leases.len(), 5, "resumed: everything runs");
        assert!(!claimed.gate.paused);

        let rows = db
            .store
            .run_list(RunList {
                process: Some(P.into()),
                key: Some(String::new()),
                limit: 10,
                ..RunList::default()
            })
            .await
            .expect("runs");
        let actions: Vec<_> = rows
            .iter()
            .map(|r| (r.outcome, r.actor.as_deref()))
            .collect();
        assert_eq!(
            actions,
            [
                (RunOutcome::Resumed, Some("test")),
                (RunOutcome::Paused, Some("test"))
            ],
            "one history row per change, key \"\", newest first"
        );
    })
    .await;
}

#[tokio::test]
async fn a_run_in_progress_finishes_normally_while_its_process_is_paused() {
    each_engine(|db| async move {
        enqueue(&db.store, 1).await;
        let session = db.session().await;
        let leases = db
            .store
            .lease_claim(claim(session.id, 1))
            .await
            .expect("claim")
            .leases;
        pause(&db.store, true).await;
        let done = LeaseComplete {
            lease: &leases[0],
            outcome: &Outcome::Done,
            trace_id: None,
        };
        db.store
            .lease_complete(done)
            .await
            .expect("a paused process's run completes");
        let key = &leases[0].key;
        let item = db
            .store
            .item_get(ItemGet {
                process: P.into(),
                key: key.clone(),
                runs_limit: 0,
            })
            .await
            .expect("item_get")
            .expect("the key is known")
            .item;
        assert_eq!(item.state, ItemState::Idle, "the run's key converged");
        let runs = db
            .store
            .run_list(RunList {
                process: Some(P.into()),
                key: Some(key.clone()),
                limit: 10,
                ..RunList::default()
            })
            .await
            .expect("runs");
        let outcomes: Vec<_> = runs.iter().map(|r| r.outcome).collect();
        assert_eq!(outcomes, [RunOutcome::Done], "one run, ended done");
    })
    .await;
}

#[tokio::test]
async fn the_concurrency_limit_caps_running_keys_and_frees_a_slot_when_a_run_ends() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, 10).await;
        configure(&db.store, ProcessConfigure::new(P).concurrency(Some(2))).await;
        let session = db.session().await;
        let first = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(first.leases.len(), 2, "at most the limit");
        // The first two in claim order, of the ten ready ones the claim read.
        let keys: Vec<&str> = first.leases.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["k0000", "k0001"]);
        assert!(first.gate.concurrency_limited);
        assert_eq!(first.gate.next_token_in, None);
        let full = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert!(full.leases.is_empty(), "no slot is free");
        let refused = db.store.lease_lock(lock(session.id, "k0009")).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::Held {
                    why: "at its concurrency limit",
                    ..
                })
            ),
            "a lock counts against the limit: {refused:?}"
        );
        let done = LeaseComplete {
            lease: &first.leases[0],
            outcome: &Outcome::Done,
            trace_id: None,
        };
        db.store.lease_complete(done).await.expect("complete");
        let next = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(next.leases.len(), 1, "one slot came free");

        configure(&db.store, ProcessConfigure::new(P).concurrency(None)).await;
        let open = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(open.leases.len(), 7, "the limit is gone at the next claim");
        assert!(!open.gate.concurrency_limited);
    })
    .await;
}

/// The limit counts the process's own running keys, and counts all of them
/// wherever the count stands: PostgreSQL reads it from the item counts, the
/// folded figure plus the deltas appended since (migration 0016), so each
/// step below needs one half or the other. Another process's runs beside it
/// count for nothing.
#[tokio::test]
async fn the_concurrency_limit_counts_its_own_runs_folded_or_not() {
    each_engine(|db| async move {
        let session = db.session().await;
        db.store
            .item_enqueue(ItemEnqueue::new("other", (0..40).map(|i| format!("o{i}"))))
            .await
            .expect("enqueue");
        let other = LeaseClaim {
            session: session.id,
            process: "other".into(),
            max: 40,
            trace_links: false,
        };
        let others = db.store.lease_claim(other).await.expect("claim");
        assert_eq!(others.leases.len(), 40, "another process's runs");
        enqueue(&db.store, 10).await;
        configure(&db.store, ProcessConfigure::new(P).concurrency(Some(3))).await;
        let take = |max| claim_leases(&db.store, session.id, max);
        let first = take(2).await;
        assert_eq!(
            first.len(),
            2,
            "two of three slots, the other process's runs aside"
        );
        // Two running as deltas only: one slot is left.
        assert_eq!(take(10).await.len(), 1, "the unfolded runs count");
        // Reading the counts folds the deltas in: three running, folded.
        db.store.process_counts_all().await.expect("counts");
        assert!(take(10).await.is_empty(), "the folded runs count");
        let refused = db.store.lease_lock(lock(session.id, "k0009")).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::Held {
                    why: "at its concurrency limit",
                    ..
                })
            ),
            "a lock reads the same count: {refused:?}"
        );
        // One run ends: folded three, a delta of minus one.
        let done = LeaseComplete {
            lease: &first[0],
            outcome: &Outcome::Done,
            trace_id: None,
        };
        db.store.lease_complete(done).await.expect("complete");
        assert_eq!(take(10).await.len(), 1, "folded and unfolded add up");
        assert!(take(10).await.is_empty(), "and the limit holds again");
    })
    .await;
}

#[tokio::test]
async fn the_counts_and_the_limit_follow_a_table_emptied_by_hand() {
    each_engine(|db| async move {
        let session = db.session().await;
        enqueue(&db.store, 10).await;
        configure(&db.store, ProcessConfigure::new(P).concurrency(Some(3))).await;
        let take = |max| claim_leases(&db.store, session.id, max);
        assert_eq!(take(10).await.len(), 3, "up to the limit");
        // Folded, so the counts table (not only its deltas) holds the runs.
        db.store.process_counts_all().await.expect("counts");
        assert!(take(10).await.is_empty(), "at the limit");
        // An operator empties the items in SQL: PostgreSQL's TRUNCATE fires
        // no row or statement trigger of the counted kind; SQLite has none.
        db.execute(if db.engine == "postgres" {
            "TRUNCATE drover_items"
        } else {
            "DELETE FROM drover_items"
        })
        .await;
        let counts = db.store.process_counts_all().await.expect("counts");
        let fleet = counts.iter().find(|c| c.process == P);
        assert!(
            fleet.is_none_or(|c| c.running == 0 && c.pending == 0),
            "nothing counted once the items are gone: {fleet:?}"
        );
        enqueue(&db.store, 10).await;
        assert_eq!(
            take(10).await.len(),
            3,
            "the runs that were emptied away do not hold the limit"
        );
    })
    .await;
}

/// Claims and completes until the process is drained, counting its own
/// leases in `running` and recording the highest count seen.
async fn drain(store: Store, running: Arc<AtomicI64>, peak: Arc<AtomicI64>) {
    let session = store
        .session_start(drover::store::SessionStart::new(
            "claimer",
            Duration::from_secs(60),
        ))
        .await
        .expect("session");
    loop {
        let leases = store
            .lease_claim(claim(session.id, 3))
            .await
            .expect("claim")
            .leases;
        if leases.is_empty() {
            if pending(&store).await == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let now = running.fetch_add(leases.len() as i64, Ordering::SeqCst) + leases.len() as i64;
        peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        // Counted down before the completion commits: a claim that sees the
        // slot free can only come after the commit, so the count never lags.
        running.fetch_sub(leases.len() as i64, Ordering::SeqCst);
        for lease in &leases {
            let done = LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            };
            store.lease_complete(done).await.expect("complete");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_claimers_on_many_connections_never_exceed_the_concurrency_limit() {
    each_engine(|db| async move {
        enqueue(&db.store, 300).await;
        configure(&db.store, ProcessConfigure::new(P).concurrency(Some(5))).await;
        let running = Arc::new(AtomicI64::new(0));
        let peak = Arc::new(AtomicI64::new(0));
        let mut stores = vec![db.store.clone()];
        for _ in 0..3 {
            stores.push(db.reconnect().await);
        }
        let claimers: Vec<_> = (0..16)
            .map(|i| tokio::spawn(drain(stores[i % 4].clone(), running.clone(), peak.clone())))
            .collect();
        for claimer in claimers {
            claimer.await.expect("claimer");
        }
        assert_eq!(pending(&db.store).await, 0, "everything ran");
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= 5, "{peak} leases held at once under a limit of 5");
        assert!(peak >= 2, "the claimers did overlap ({peak})");
    })
    .await;
}

/// A rate so small that a claim's refill (the time since the bucket's last
/// write times the rate) underflows a float: PostgreSQL's gated claim failed
/// with "value out of range: underflow" on every claim after the first, so
/// the process never ran again. Such rates are refused; the smallest accepted
/// one is claimed through and hints at its next token.
#[tokio::test]
async fn a_rate_too_small_to_refill_is_refused_and_the_smallest_accepted_one_claims() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, 5).await;
        for tiny in [5e-324, 1e-300, drover::store::MIN_RATE_PER_S / 2.0] {
            let err = db
                .store
                .process_configure(ProcessConfigure::new(P).rate(Some(tiny)))
                .await;
            assert!(
                matches!(err, Err(StoreError::InvalidArgument(_))),
                "{tiny:e}: {err:?}"
            );
        }
        configure(
            &db.store,
            ProcessConfigure::new(P).rate(Some(drover::store::MIN_RATE_PER_S)),
        )
        .await;
        let session = db.session().await;
        assert_eq!(
            claim_leases(&db.store, session.id, 5).await.len(),
            1,
            "the burst"
        );
        db.store.clock().advance(Duration::from_secs(1));
        let dry = db
            .store
            .lease_claim(claim(session.id, 5))
            .await
            .expect("a claim after the bucket's refill");
        assert!(dry.leases.is_empty(), "a second's refill is no token");
        assert!(dry.gate.next_token_in.is_some(), "{dry:?}");
    })
    .await;
}

/// The interleaving that over-admits when the count is read by the statement
/// that waits for the process row's lock: a claim holds the lock and starts
/// the last free run, two more claims queue behind it; when it commits, both
/// must see its run. Run twice: claims from a store that has not claimed the
/// process yet (the fast path reports it limited, then the limited claim
/// runs) and from one that knows it is limited (the limited claim at once).
#[tokio::test]
async fn claims_queued_behind_a_claim_holding_the_process_lock_see_its_runs() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    for known in [false, true] {
        let (db, schema) = support::postgres(&base).await;
        queued_claims(&db, known).await;
        db.store.close().await;
        support::drop_schema(&base, &schema).await;
    }
}

/// A database or role whose default isolation is REPEATABLE READ (chosen
/// for other applications) does not change drover's: its connections set
/// READ COMMITTED at startup, which the limited claim's lock-then-count is
/// written for, and the limit holds. Before, they took the default: claims
/// queued behind the holder of the process row would have counted from
/// their snapshot of before the wait; PostgreSQL failed them with
/// serialization errors instead, which the store retried (a few times, so
/// under contention a claim could fail).
#[tokio::test]
async fn a_repeatable_read_default_does_not_loosen_the_concurrency_limit() {
    const REPEATABLE_READ: &str = "%20-c%20default_transaction_isolation%3Drepeatable%5C%20read";
    let Some(base) = support::postgres_url() else {
        return;
    };
    for known in [false, true] {
        let (db, schema) = support::postgres_with(&base, REPEATABLE_READ).await;
        let own = sqlx::PgPool::connect(&db.url).await.expect("connect");
        let isolation = "SHOW transaction_isolation";
        let default: String = sqlx::query_scalar(isolation)
            .fetch_one(&own)
            .await
            .expect("show");
        assert_eq!(default, "repeatable read", "the URL sets the default");
        let pool = db.store.postgres_pool().expect("postgres");
        let drovers: String = sqlx::query_scalar(isolation)
            .fetch_one(pool)
            .await
            .expect("show");
        assert_eq!(drovers, "read committed");
        queued_claims(&db, known).await;
        own.close().await;
        db.store.close().await;
        support::drop_schema(&base, &schema).await;
    }
}

async fn queued_claims(db: &TestDb, known: bool) {
    enqueue(&db.store, 5).await;
    configure(&db.store, ProcessConfigure::new(P).concurrency(Some(1))).await;
    let session = db.session().await;
    if known {
        let none = db.store.lease_claim(claim(session.id, 0)).await;
        assert!(none.expect("claim").leases.is_empty());
    }
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let mut holder = Holder::lock(
        &pool,
        "SELECT 1 FROM drover_processes WHERE process = 'fleet' AND $1 = $1 FOR UPDATE",
        0,
    )
    .await;
    sqlx::query(
        "UPDATE drover_items SET state = 'running', lease_session = $1, lease_token = 1,
             started_at = now() WHERE process = 'fleet' AND key = 'k0000'",
    )
    .bind(session.id.0)
    .execute(&mut *holder.tx)
    .await
    .expect("the holder starts a run");
    let claims: Vec<_> = (0..2)
        .map(|_| {
            let store = db.store.clone();
            tokio::spawn(async move { store.lease_claim(claim(session.id, 5)).await })
        })
        .collect();
    holder.wait_for_waiters(&pool, 2).await;
    holder.tx.commit().await.expect("the holder commits");
    for c in claims {
        let claimed = c.await.expect("join").expect("claim");
        assert!(
            claimed.leases.is_empty(),
            "a queued claim over-admitted: {:?}",
            claimed.leases
        );
    }
}

#[tokio::test]
async fn the_rate_limit_admits_its_burst_then_one_run_per_token_on_the_database_clock() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, 20).await;
        configure(&db.store, ProcessConfigure::new(P).rate(Some(1.0)).burst(3)).await;
        let session = db.session().await;
        let burst = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(burst.leases.len(), 3, "a full bucket: the burst");
        let wait = burst.gate.next_token_in.expect("the bucket ran dry");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        let dry = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert!(dry.leases.is_empty());
        assert!(
            dry.gate
                .next_token_in
                .is_some_and(|w| w <= Duration::from_secs(1))
        );
        let refused = db.store.lease_lock(lock(session.id, "k0019")).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::Held {
                    why: "out of rate-limit tokens",
                    ..
                })
            ),
            "{refused:?}"
        );

        db.store.clock().advance(Duration::from_millis(2_500));
        let refilled = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(refilled.leases.len(), 2, "2.5 tokens flowed in over 2.5 s");
        db.store.clock().advance(Duration::from_secs(10));
        let capped = db
            .store
            .lease_claim(claim(session.id, 10))
            .await
            .expect("claim");
        assert_eq!(capped.leases.len(), 3, "never more than the burst at once");
        let few = db.store.lease_claim(claim(session.id, 1)).await;
        assert!(few.expect("claim").leases.is_empty());

        configure(&db.store, ProcessConfigure::new(P).rate(None)).await;
        let open = db
            .store
            .lease_claim(claim(session.id, 100))
            .await
            .expect("claim");
        assert_eq!(open.leases.len(), 12, "no limit: the rest at once");
        assert_eq!(open.gate.next_token_in, None);
    })
    .await;
}

#[tokio::test]
async fn limits_no_process_can_run_with_are_refused_and_change_nothing() {
    each_engine(|db| async move {
        let bad = [
            ProcessConfigure::new(P).concurrency(Some(0)),
            ProcessConfigure::new(P).rate(Some(0.0)),
            ProcessConfigure::new(P).rate(Some(-1.0)),
            ProcessConfigure::new(P).rate(Some(f64::NAN)),
            ProcessConfigure::new(P).rate(Some(f64::INFINITY)),
            ProcessConfigure::new(P).burst(0),
            // Past the engines' 32-bit columns: refused, not stored as another value.
            ProcessConfigure::new(P).concurrency(Some(2_147_483_648)),
            ProcessConfigure::new(P).burst(u32::MAX),
        ];
        for params in bad {
            let err = db.store.process_configure(params.clone()).await;
            assert!(
                matches!(err, Err(StoreError::InvalidArgument(_))),
                "{params:?}: {err:?}"
            );
        }
        assert!(
            db.store.process_list().await.expect("list").is_empty(),
            "nothing written"
        );
        configure(
            &db.store,
            ProcessConfigure::new(P)
                .concurrency(Some(7))
                .rate(Some(2.5))
                .burst(4),
        )
        .await;
        configure(&db.store, ProcessConfigure::new(P).keep_runs_per_key(5)).await;
        let limits = db.store.process_list().await.expect("list")[0].limits;
        assert_eq!(
            limits.concurrency,
            Some(7),
            "other settings keep the limits"
        );
        let rate = limits.rate.expect("a rate");
        assert!(
            (rate.per_second - 2.5).abs() < 1e-9 && rate.burst == 4,
            "{rate:?}"
        );
    })
    .await;
}

/// A test transaction holding key `k`'s row of [`P`], as a caller's
/// transaction that enqueued the key does until it commits (or a watched
/// table's trigger in it), with its pool: one of the test's own, since the
/// store's connections end a transaction idle for 5 s.
async fn holding_k(db: &TestDb) -> (Holder, sqlx::PgPool) {
    const LOCK: &str =
        "SELECT 1 FROM drover_items WHERE process = 'fleet' AND key = 'k' AND $1 = $1 FOR UPDATE";
    let pool = sqlx::PgPool::connect(&db.sql_url)
        .await
        .expect("the test's pool");
    (Holder::lock(&pool, LOCK, 0).await, pool)
}

/// A `lease_lock` of `key` by `session`, started on its own task.
fn lock_in_flight(
    store: &Store,
    session: SessionId,
    key: &str,
) -> tokio::task::JoinHandle<Result<drover::store::Lease, StoreError>> {
    let (store, params) = (store.clone(), lock(session, key));
    tokio::spawn(async move { store.lease_lock(params).await })
}

/// On PostgreSQL, fresh schema each run of `test`.
async fn on_postgres<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let store = db.store.clone();
    test(db).await;
    store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A query source's `lease_lock` waits for its key's row while a caller's
/// transaction holds it; meanwhile the process, which had no fleet control,
/// is paused, and the pause returns. The lock, let go, is refused: before,
/// it had read the process's controls before its wait, and leased a key of
/// a paused process after the pause had returned.
#[tokio::test]
async fn a_lock_waiting_for_its_keys_row_obeys_a_pause_committed_meanwhile() {
    on_postgres(|db| async move {
        db.store
            .item_enqueue(ItemEnqueue::new(P, ["k"]))
            .await
            .expect("enqueue");
        let session = db.session().await;
        let (holder, pool) = holding_k(&db).await;
        let locking = lock_in_flight(&db.store, session.id, "k");
        holder.wait_for_waiters(&pool, 1).await;
        pause(&db.store, true).await;
        holder.release().await;
        let locked = locking.await.expect("join");
        assert!(
            matches!(locked, Err(StoreError::Held { .. })),
            "a key of a paused process was leased after the pause returned: {locked:?}"
        );
        assert_eq!(pending(&db.store).await, 1, "the key is still pending");
    })
    .await;
}

/// The same with a concurrency limit of 1 set while the lock waits and
/// another key runs: the lock is refused. Before, it was let through, and
/// two keys ran under a limit of one.
#[tokio::test]
async fn a_lock_waiting_for_its_keys_row_obeys_a_limit_set_meanwhile() {
    on_postgres(|db| async move {
        db.store
            .item_enqueue(ItemEnqueue::new(P, ["a", "k"]))
            .await
            .expect("enqueue");
        let session = db.session().await;
        db.store
            .lease_lock(lock(session.id, "a"))
            .await
            .expect("a runs");
        let (holder, pool) = holding_k(&db).await;
        let locking = lock_in_flight(&db.store, session.id, "k");
        holder.wait_for_waiters(&pool, 1).await;
        configure(&db.store, ProcessConfigure::new(P).concurrency(Some(1))).await;
        holder.release().await;
        let locked = locking.await.expect("join");
        assert!(
            matches!(locked, Err(StoreError::Held { .. })),
            "a second key was leased under a limit of 1: {locked:?}"
        );
    })
    .await;
}

/// Under a fleet control, a `lease_lock` waiting for its key's row holds no
/// lock that other keys' claims, or the operator's pause, wait for: both
/// are answered while the caller's transaction still holds the row. Before,
/// the lock held the process row while it waited, and every claim of the
/// process on every node (and the pause) waited as long as the caller's
/// transaction lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waiting_for_its_keys_row_holds_no_other_claim_back() {
    on_postgres(|db| async move {
        configure(&db.store, ProcessConfigure::new(P).concurrency(Some(10))).await;
        db.store
            .item_enqueue(ItemEnqueue::new(P, ["k", "x", "y"]))
            .await
            .expect("enqueue");
        let (a, b) = (db.session().await, db.session().await);
        let (holder, pool) = holding_k(&db).await;
        let locking = lock_in_flight(&db.store, a.id, "k");
        holder.wait_for_waiters(&pool, 1).await;
        // Bounded only so that a failure ends: the answers must come while
        // the row is still held, which it is until the end.
        let bound = Duration::from_secs(20);
        let claimed = tokio::time::timeout(bound, claim_leases(&db.store, b.id, 2))
            .await
            .expect("another node's claim of ready keys waited for the lock");
        let mut keys: Vec<_> = claimed.iter().map(|l| l.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["x", "y"]);
        tokio::time::timeout(bound, pause(&db.store, true))
            .await
            .expect("the pause waited for the lock");
        assert!(!locking.is_finished(), "the lock still waits for its row");
        holder.release().await;
        let locked = locking.await.expect("join");
        assert!(
            matches!(locked, Err(StoreError::Held { .. })),
            "paused meanwhile: {locked:?}"
        );
    })
    .await;
}

/// Processes' settings are read a page or one process at a time (DESIGN.md
/// rule 13): a database may hold any number of processes (a store or
/// `drover enqueue` creates them without a server's cap), and every reader
/// read them all, about 6 MB of settings for 100,000 names, to show one
/// process's settings, its dashboard page, or the resync column of one
/// overview page. A page holds at most its limit, a read by name holds one,
/// and the walk over all of them still finds each once, in name order.
#[tokio::test]
async fn process_settings_are_read_a_page_or_one_process_at_a_time() {
    each_engine(|db| async move {
        const MANY: usize = 2050;
        let name = if db.engine == "postgres" {
            "'p-' || lpad(i::text, 5, '0'), now()"
        } else {
            "printf('p-%05d', i), 0"
        };
        db.execute(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {MANY}) \
             INSERT INTO drover_processes (process, created_at) SELECT {name} FROM n"
        ))
        .await;
        configure(
            &db.store,
            ProcessConfigure::new("p-01234").concurrency(Some(7)),
        )
        .await;
        let first = db
            .store
            .process_settings(ProcessPage::first(100))
            .await
            .expect("a page");
        assert_eq!(first.items.len(), 100, "a page holds its limit");
        assert_eq!(first.items[0].process, "p-00001");
        assert_eq!(first.next.as_deref(), Some("p-00100"));
        let second = db
            .store
            .process_settings(ProcessPage {
                after: first.next,
                limit: 100,
            })
            .await
            .expect("the next page");
        assert_eq!(
            second.items[0].process, "p-00101",
            "it goes on after the first"
        );
        let one = db.store.process_get("p-01234").await.expect("one process");
        let one = one.expect("it is known");
        assert_eq!(
            (one.process.as_str(), one.limits.concurrency),
            ("p-01234", Some(7))
        );
        assert!(
            db.store
                .process_get("unknown")
                .await
                .expect("read")
                .is_none(),
            "an unknown process is None"
        );
        let all = db.store.process_list().await.expect("every process");
        let names: Vec<&str> = all.iter().map(|s| s.process.as_str()).collect();
        let expected: Vec<String> = (1..=MANY).map(|i| format!("p-{i:05}")).collect();
        assert_eq!(names, expected, "the walk finds each once, in order");
    })
    .await;
}
