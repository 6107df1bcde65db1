//! The store's contract for leases (DESIGN.md rules 1, 4, 5 and 7): claims in
//! order, completions and their outcomes, backoff, release, lock, the
//! candidate filter and a retry's trace link, on every engine, and on SQLite through the view `drover_enqueue` too, via
//! `support::each_enqueue_path_and_pooler`.
//!
//! No test sleeps: TTLs and backoffs pass by advancing the store's clock offset.

mod support;

use std::time::Duration;

use drover::backoff::Backoff;
use drover::store::{
    ErrorGroups, FencingToken, ItemEnqueue, ItemPark, ItemState, Lease, LeaseClaim, LeaseComplete,
    LeaseLock, LeaseRelease, MAX_NAME_BYTES, MAX_TEXT_BYTES, Outcome, ProcessConfigure, RunOutcome,
    SessionHeartbeat, SessionId, StoreEngine as _, StoreError, TraceContext,
};
use support::each_enqueue_path_and_pooler;
use support::store::{
    P, batch, claim, complete, configure, enqueue, events, history, item, keys, p_counts, secs,
    write_key_not_utf8,
};

#[tokio::test]
async fn enqueued_key_is_claimed_once_and_idle_after_done() {
    each_enqueue_path_and_pooler(|db| async move {
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
        let a = item(&db.store, "a")
            .await
            .expect("a known, converged key stays");
        assert_eq!(
            (a.state, a.last_outcome, a.lease_token, a.started_at),
            (ItemState::Idle, Some(RunOutcome::Done), None, None)
        );
        assert!(a.last_ended_at.is_some());
        assert!(
            claim(&db.store, s.id, 10).await.is_empty(),
            "an idle key is not claimed"
        );
        enqueue(&db.store, &["a"]).await;
        let again = claim(&db.store, s.id, 10).await;
        assert_eq!((keys(&again), again[0].attempt), (vec!["a"], 1));
    })
    .await;
}

#[tokio::test]
async fn claims_follow_priority_then_ready_time_then_fifo() {
    each_enqueue_path_and_pooler(|db| async move {
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
async fn small_claims_take_the_highest_priority_first_past_keys_not_yet_ready() {
    each_enqueue_path_and_pooler(|db| async move {
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
async fn transient_failures_back_off_exponentially_up_to_the_cap() {
    each_enqueue_path_and_pooler(|db| async move {
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
            // The delay from the stored times, not from how long the test
            // took: a loaded machine may spend any time between two steps.
            let until = it.backoff_until.expect("backing off");
            let ended = it.last_ended_at.expect("the run ended");
            let delay_ms = i64::try_from(secs(delay).as_millis()).expect("seconds");
            assert_eq!((until - ended).num_milliseconds(), delay_ms, "{attempt}");
            db.store.clock().advance(secs(delay) / 2);
            assert!(claim(&db.store, s.id, 1).await.is_empty(), "backing off");
            db.store
                .clock()
                .advance(secs(delay) / 2 + Duration::from_millis(100));
            db.store
                .session_heartbeat(SessionHeartbeat { session: s.id })
                .await
                .expect("heartbeat");
        }
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Done)
            .await
            .expect("done");
        let a = item(&db.store, "a").await.expect("idle");
        assert_eq!(
            (a.state, a.failures, a.backoff_until, a.last_error),
            (ItemState::Idle, 0, None, None),
            "done resets everything"
        );
    })
    .await;
}

#[tokio::test]
async fn backoff_survives_a_reconnect() {
    each_enqueue_path_and_pooler(|db| async move {
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
            .session_start(drover::store::SessionStart::new("restarted", secs(60)))
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
async fn a_jittered_backoff_stays_between_the_delay_and_its_spread() {
    each_enqueue_path_and_pooler(|db| async move {
        let policy = Backoff::new(secs(10), 2.0, secs(100))
            .and_then(|b| b.with_jitter(0.5))
            .expect("valid policy");
        let configure = ProcessConfigure::new(P).backoff(policy);
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
async fn requeue_after_resets_failures_and_delays_the_key() {
    each_enqueue_path_and_pooler(|db| async move {
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
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let leases = claim(&db.store, s.id, 1).await;
        complete(&db.store, &leases[0], Outcome::Permanent("bad spec".into()))
            .await
            .expect("park");
        let it = item(&db.store, "a").await.expect("item");
        assert_eq!(it.state, ItemState::Parked);
        assert_eq!(it.last_error.as_deref(), Some("bad spec"));
        assert_eq!(
            (it.failures, it.last_outcome),
            (1, Some(RunOutcome::Parked)),
            "a permanent failure is a failed attempt too"
        );
        db.store.clock().advance(secs(3600));
        let s = db.session().await;
        assert!(
            claim(&db.store, s.id, 1).await.is_empty(),
            "never runs on its own"
        );
        enqueue(&db.store, &["a"]).await;
        let revived = claim(&db.store, s.id, 1).await;
        assert_eq!(
            (keys(&revived), revived[0].attempt),
            (vec!["a"], 2),
            "the revived run is the second consecutive attempt"
        );
    })
    .await;
}

#[tokio::test]
async fn a_permanent_failure_of_a_dirty_key_runs_it_again_instead_of_parking() {
    each_enqueue_path_and_pooler(|db| async move {
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
async fn release_makes_the_key_pending_without_counting_a_failure() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        db.store
            .lease_release(LeaseRelease { lease: &lease })
            .await
            .expect("release");
        let again = claim(&db.store, s.id, 1).await;
        assert_eq!((keys(&again), again[0].attempt), (vec!["a"], 1));
        assert_eq!(events(&db.store, "a").await, [RunOutcome::Canceled]);
        let canceled = history(&db.store, "a", 1).await.remove(0);
        assert_eq!(
            (canceled.attempt, canceled.token, canceled.failed()),
            (Some(1), Some(lease.token), false)
        );
    })
    .await;
}

/// Fencing (DESIGN.md rule 9) needs every new lease's token above every token
/// handed out before it, and a claim's tokens distinct, whichever items it
/// takes: here keys far apart in the table, claimed out of their insertion
/// order (by priority), beside a lock, and a claim again.
#[tokio::test]
async fn tokens_are_distinct_and_only_grow_across_claims_and_locks_of_scattered_keys() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        let names: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        enqueue(&db.store, &all).await;
        let mut issued = Vec::new();
        for lease in claim(&db.store, s.id, 40).await {
            issued.push(lease.token.0);
            complete(&db.store, &lease, Outcome::Done)
                .await
                .expect("done");
        }
        // The last key first (by priority), then two from the front.
        let urgent = ItemEnqueue::new(P, ["k39"]).priority(5);
        db.store.item_enqueue(urgent).await.expect("enqueue");
        enqueue(&db.store, &["k00", "k20"]).await;
        let mut batches = vec![claim(&db.store, s.id, 3).await];
        let lock = LeaseLock {
            session: s.id,
            process: P.into(),
            key: "k10".into(),
        };
        batches.push(vec![db.store.lease_lock(lock).await.expect("lock")]);
        enqueue(&db.store, &["k05", "k30"]).await;
        batches.push(claim(&db.store, s.id, 3).await);
        let claimed: Vec<Vec<&str>> = batches.iter().map(|b| keys(b)).collect();
        assert_eq!(
            claimed,
            [vec!["k39", "k00", "k20"], vec!["k10"], vec!["k05", "k30"]]
        );
        for batch in &batches {
            let before = issued.iter().copied().max().unwrap_or(0);
            let mut tokens: Vec<i64> = batch.iter().map(|l| l.token.0).collect();
            assert!(
                tokens.iter().all(|&t| t > before),
                "{tokens:?} after {before}"
            );
            tokens.sort_unstable();
            tokens.dedup();
            assert_eq!(tokens.len(), batch.len(), "distinct tokens in {batch:?}");
            issued.extend(tokens);
        }
        // Each lease is the item's: the token the row holds.
        for lease in batches.iter().flatten() {
            let row = item(&db.store, &lease.key).await.expect("a running key");
            assert_eq!(row.lease_token, Some(lease.token), "{}", lease.key);
        }
    })
    .await;
}

#[tokio::test]
async fn lock_takes_a_chosen_key_and_refuses_leased_backing_off_and_parked_keys() {
    each_enqueue_path_and_pooler(|db| async move {
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
async fn the_candidate_filter_skips_leased_parked_and_backing_off_keys() {
    each_enqueue_path_and_pooler(|db| async move {
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
            let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
            let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(P);
            q.fetch_all(&pool).await.expect("user query")
        } else {
            let pool = sqlx::SqlitePool::connect(&db.sql_url)
                .await
                .expect("connect");
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
    each_enqueue_path_and_pooler(|db| async move {
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
                trace_id: None,
            },
            LeaseComplete {
                lease: &lost,
                outcome: &done,
                trace_id: None,
            },
            LeaseComplete {
                lease: &leases[2],
                outcome: &failed,
                trace_id: None,
            },
        ];
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(
            matches!(results[1], Err(StoreError::LeaseLost { .. })),
            "{results:?}"
        );
        assert_eq!(
            item(&db.store, "a").await.expect("a").state,
            ItemState::Idle
        );
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
    each_enqueue_path_and_pooler(|db| async move {
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
                trace_id: None,
            },
            LeaseComplete {
                lease: &retried,
                outcome: &done,
                trace_id: None,
            },
            LeaseComplete {
                lease: &first[2],
                outcome: &later,
                trace_id: None,
            },
            LeaseComplete {
                lease: &first[3],
                outcome: &parked,
                trace_id: None,
            },
        ];
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        // One row per run, written when it ends: no row for enqueues or starts.
        use RunOutcome::*;
        assert_eq!(events(&db.store, "a").await, [Done]);
        assert_eq!(events(&db.store, "b").await, [Retry, Done]);
        assert_eq!(events(&db.store, "c").await, [Requeued]);
        assert_eq!(events(&db.store, "d").await, [Parked]);
        for (key, lease) in [
            ("a", &first[0]),
            ("b", &retried),
            ("c", &first[2]),
            ("d", &first[3]),
        ] {
            let run = history(&db.store, key, 1).await.remove(0);
            assert_eq!(
                (run.session, run.token, run.attempt, run.started_at),
                (
                    Some(s.id),
                    Some(lease.token),
                    Some(lease.attempt),
                    Some(lease.started_at)
                ),
                "{key}: {run:?}"
            );
            assert_eq!(run.pending_since, Some(lease.enqueued_at), "{key}");
            assert!(run.ended_at >= lease.started_at, "{key}: {run:?}");
            assert_eq!(run.actor, None);
        }
        let b = history(&db.store, "b", 2).await;
        assert_eq!((b[0].error.as_deref(), b[0].failed()), (None, false));
        assert_eq!(
            (b[1].error.as_deref(), b[1].failed()),
            (Some("flaky"), true)
        );
        let d = history(&db.store, "d", 1).await.remove(0);
        assert_eq!((d.error.as_deref(), d.failed()), (Some("broken"), true));
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_clean_dones_settles_each_lease_once_and_refuses_repeats_and_forgeries() {
    // On SQLite a clean `done` is settled without reading its row; everything
    // else in the batch (a repeat, a re-enqueued key, a lease naming another
    // key) must still be answered as if each lease were completed alone.
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        let leases = claimed(&db, &["a", "b", "c"]).await;
        let (a, b, c) = (&leases[0], &leases[1], &leases[2]);
        enqueue(&db.store, &["b"]).await; // b is running: dirty
        let forged = Lease {
            key: "a".into(),
            ..c.clone()
        };
        let done = Outcome::Done;
        let results = db
            .store
            .lease_complete_batch(&batch([a, a, b, &forged], &done))
            .await
            .expect("batch");
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        for refused in [1, 3] {
            assert!(
                matches!(results[refused], Err(StoreError::LeaseLost { .. })),
                "{refused}: {results:?}"
            );
        }
        use RunOutcome::Done;
        assert_eq!(events(&db.store, "a").await, [Done], "one run for a repeat");
        assert_eq!(
            item(&db.store, "a").await.expect("a").state,
            ItemState::Idle
        );
        assert_eq!(events(&db.store, "b").await, [Done]);
        assert_eq!(
            item(&db.store, "b").await.expect("b").state,
            ItemState::Pending,
            "enqueued during its run: runs again"
        );
        assert!(
            events(&db.store, "c").await.is_empty(),
            "the forgery wrote nothing"
        );
        assert_eq!(
            item(&db.store, "c").await.expect("c").state,
            ItemState::Running
        );
        complete(&db.store, c, Outcome::Done)
            .await
            .expect("c's own lease still holds");
        assert_eq!(events(&db.store, "c").await, [Done]);
        let again = claim(&db.store, s.id, 10).await;
        assert_eq!(keys(&again), ["b"]);
    })
    .await;
}

#[tokio::test]
async fn a_clean_done_repeated_in_one_batch_is_settled_once() {
    // Every lease of the batch is clean and the same: PostgreSQL's one
    // statement must not settle it twice, nor answer both as settled.
    each_enqueue_path_and_pooler(|db| async move {
        let leases = claimed(&db, &["a", "b"]).await;
        let (a, b) = (&leases[0], &leases[1]);
        let results = db
            .store
            .lease_complete_batch(&batch([a, b, a], &Outcome::Done))
            .await
            .expect("batch");
        assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
        assert!(
            matches!(results[2], Err(StoreError::LeaseLost { .. })),
            "{results:?}"
        );
        assert_eq!(events(&db.store, "a").await, [RunOutcome::Done]);
        assert_eq!(events(&db.store, "b").await, [RunOutcome::Done]);
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_clean_dones_records_each_run_as_its_lease_ran() {
    // The common batch, which PostgreSQL settles in one statement of its
    // own: each run's row must carry what the general path writes, its
    // lease's session, token, attempt (a second one included), start and
    // wait.
    each_enqueue_path_and_pooler(|db| async move {
        let first = claimed(&db, &["a", "b"]).await;
        complete(&db.store, &first[0], Outcome::Transient("flaky".into()))
            .await
            .expect("a fails once");
        db.store.clock().advance(secs(5));
        let again = claim(&db.store, first[0].session, 10).await;
        assert_eq!(keys(&again), ["a"]);
        let (a, b) = (&again[0], &first[1]);
        assert_eq!(a.attempt, 2);
        let results = db
            .store
            .lease_complete_batch(&batch([a, b], &Outcome::Done))
            .await
            .expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        for lease in [a, b] {
            let run = history(&db.store, &lease.key, 1).await.remove(0);
            assert_eq!(
                (
                    run.outcome,
                    run.session,
                    run.token,
                    run.attempt,
                    run.started_at,
                    run.pending_since
                ),
                (
                    RunOutcome::Done,
                    Some(lease.session),
                    Some(lease.token),
                    Some(lease.attempt),
                    Some(lease.started_at),
                    Some(lease.enqueued_at)
                ),
                "{}: {run:?}",
                lease.key
            );
            assert_eq!(
                item(&db.store, &lease.key).await.expect("item").state,
                ItemState::Idle
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_distinct_clean_dones_answers_the_odd_ones_as_if_each_were_alone() {
    // On SQLite a batch of clean `done`s of one session and process, no lease
    // twice, is written in one trip that settles only the leases it can; the
    // rest (re-enqueued during the run, lost, naming another key) go the
    // general way after it, and each must be answered as if completed alone.
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        let leases = claimed(&db, &["a", "b", "c", "d"]).await;
        let (a, b, c, d) = (&leases[0], &leases[1], &leases[2], &leases[3]);
        enqueue(&db.store, &["b"]).await; // b is running: dirty
        let forged = Lease {
            key: "a".into(),
            ..c.clone()
        };
        let lost = Lease {
            token: drover::store::FencingToken(d.token.0 + 1000),
            ..d.clone()
        };
        let done = Outcome::Done;
        let results = db
            .store
            .lease_complete_batch(&batch([&forged, a, &lost, b], &done))
            .await
            .expect("batch");
        assert!(results[1].is_ok() && results[3].is_ok(), "{results:?}");
        for refused in [0, 2] {
            assert!(
                matches!(results[refused], Err(StoreError::LeaseLost { .. })),
                "{refused}: {results:?}"
            );
        }
        use RunOutcome::Done;
        assert_eq!(events(&db.store, "a").await, [Done]);
        assert_eq!(events(&db.store, "b").await, [Done]);
        for (key, state) in [
            ("a", ItemState::Idle),
            ("b", ItemState::Pending),
            ("c", ItemState::Running),
            ("d", ItemState::Running),
        ] {
            assert_eq!(item(&db.store, key).await.expect(key).state, state, "{key}");
        }
        for key in ["c", "d"] {
            assert!(events(&db.store, key).await.is_empty(), "{key}: no run");
        }
        let counts = p_counts(&db.store).await;
        assert_eq!(
            (counts.pending, counts.running, counts.idle),
            (1, 2, 1),
            "the counts moved with the rows"
        );
        let results = db
            .store
            .lease_complete_batch(&batch([c, d], &done))
            .await
            .expect("the rest");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(keys(&claim(&db.store, s.id, 10).await), ["b"]);
    })
    .await;
}

#[tokio::test]
async fn keys_json_has_to_escape_are_claimed_and_completed_exactly_as_written() {
    // SQLite returns a claim's rows and a completion's quick rows as one JSON
    // text (`json_group_array`): every character a key may hold must come back
    // as it went in.
    let written: Vec<String> = [
        "quote\"d",
        "back\\slash",
        "new\nline\r\ttab",
        "\u{1}control\u{1f}\u{7f}",
        "ünïcødé ∑ 🦀",
        "[1, 2]",
        "{\"a\": 1}",
        "null",
        "  spaced  ",
        "\u{2028}\u{2029}\u{feff}",
        &"k".repeat(MAX_NAME_BYTES),
    ]
    .map(String::from)
    .to_vec();
    each_enqueue_path_and_pooler(|db| {
        let written = written.clone();
        async move {
            let written: Vec<&str> = written.iter().map(String::as_str).collect();
            let s = db.session().await;
            enqueue(&db.store, &written).await;
            let leases = claim(&db.store, s.id, 100).await;
            let mut claimed = keys(&leases);
            claimed.sort_unstable();
            let mut expected = written.clone();
            expected.sort_unstable();
            assert_eq!(claimed, expected, "every key, as written");
            let done = Outcome::Done;
            let results = db
                .store
                .lease_complete_batch(&batch(&leases, &done))
                .await
                .expect("batch");
            assert!(results.iter().all(Result::is_ok), "{results:?}");
            for key in &written {
                let it = item(&db.store, key).await.expect("known");
                assert_eq!((it.state, it.key.as_str()), (ItemState::Idle, *key));
                assert_eq!(events(&db.store, key).await, [RunOutcome::Done], "{key:?}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_key_sql_wrote_as_invalid_utf8_is_parked_and_the_keys_behind_it_still_run() {
    // SQLite takes any bytes as text from SQL. The `drover_enqueue` view
    // refuses them since migration 0014, but a key written before it, or into
    // the table directly, used to fail every claim of its process, so no key
    // of it ran again. Ready before the good key, it is met first.
    let (db, _dir) = support::sqlite().await;
    enqueue(&db.store, &["after"]).await;
    write_key_not_utf8(&db, None).await;
    let s = db.session().await;
    let leases = claim(&db.store, s.id, 10).await;
    assert_eq!(keys(&leases), ["after"], "the key behind the poison runs");
    complete(&db.store, &leases[0], Outcome::Done)
        .await
        .expect("done");
    assert!(claim(&db.store, s.id, 10).await.is_empty(), "nothing left");
    let counts = p_counts(&db.store).await;
    assert_eq!((counts.pending, counts.parked, counts.idle), (0, 1, 1));
    let groups = db
        .store
        .error_groups(ErrorGroups {
            process: P.into(),
            limit: 10,
        })
        .await
        .expect("groups");
    let [group] = groups.as_slice() else {
        panic!("one group: {groups:?}")
    };
    assert!(
        group.sample.contains("not valid Unicode text")
            && group
                .sample
                .contains("DELETE FROM drover_items WHERE id = 2"),
        "{}",
        group.sample
    );
    db.execute("DELETE FROM drover_items WHERE id = 2").await;
    let counts = p_counts(&db.store).await;
    assert_eq!(
        (counts.parked, counts.idle),
        (0, 1),
        "the SQL it names removes it"
    );
}

#[tokio::test]
async fn a_claim_that_meets_only_an_invalid_utf8_key_parks_it_for_good() {
    // Behind a good key this time: the claim that meets it starts nothing, and
    // rolling that claim back undid the parking, so the key stayed pending
    // and every claim of its process met it again.
    let (db, _dir) = support::sqlite().await;
    enqueue(&db.store, &["first"]).await;
    write_key_not_utf8(&db, Some("first")).await;
    let s = db.session().await;
    assert_eq!(keys(&claim(&db.store, s.id, 1).await), ["first"]);
    assert!(claim(&db.store, s.id, 10).await.is_empty());
    let counts = p_counts(&db.store).await;
    assert_eq!(
        (counts.pending, counts.parked),
        (0, 1),
        "parked, and it stays"
    );
}

/// SQL straight into SQLite's `drover_items` (which checks no types) may
/// leave numbers no drover write makes: text, a fraction, a REAL, a priority
/// past an `i32`. No claim fails on them, on the quick path or the general
/// one (a process with a fleet control goes that way), and every key runs,
/// its numbers read as SQLite reads a value as an integer. They failed the
/// claim, on the quick path after it had committed its leases, and on the
/// general one every claim of the process, for good.
#[tokio::test]
async fn numbers_sql_wrote_straight_into_the_items_fail_no_claim() {
    let (db, _dir) = support::sqlite().await;
    let keys_of = ["a", "b", "c", "d", "e"];
    enqueue(&db.store, &keys_of).await;
    let gated = ItemEnqueue::new("gated", keys_of.iter().map(|k| (*k).to_owned()));
    db.store.item_enqueue(gated).await.expect("enqueue");
    db.store
        .process_configure(ProcessConfigure::new("gated").concurrency(Some(100)))
        .await
        .expect("a fleet control");
    for sql in [
        "UPDATE drover_items SET priority = 'high' WHERE key = 'b'",
        "UPDATE drover_items SET priority = 1e12 WHERE key = 'c'",
        "UPDATE drover_items SET failures = 2.5 WHERE key = 'd'",
        "UPDATE drover_items SET enqueued_at = 'then', ready_at = 1.5 WHERE key = 'e'",
    ] {
        db.execute(sql).await;
    }
    let s = db.session().await;
    for process in [P, "gated"] {
        let mut leases = Vec::new();
        // Each claim makes progress; a few take them all.
        for _ in 0..keys_of.len() {
            let params = LeaseClaim {
                session: s.id,
                process: process.into(),
                max: 10,
                trace_links: false,
            };
            let claimed = db.store.lease_claim(params).await;
            let claimed = claimed.unwrap_or_else(|e| panic!("{process}: {e}"));
            leases.extend(claimed.leases);
        }
        leases.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(keys(&leases), keys_of, "{process}");
        let numbers: Vec<_> = leases.iter().map(|l| (l.priority, l.attempt)).collect();
        assert_eq!(
            numbers,
            [(0, 1), (0, 1), (i32::MAX, 1), (0, 3), (0, 1)],
            "{process}: priority 'high' is 0, 1e12 the most an i32 holds, failures 2.5 two"
        );
        let done = batch(&leases, &Outcome::Done);
        let written = db.store.lease_complete_batch(&done).await.expect("batch");
        assert!(written.iter().all(Result::is_ok), "{process}: {written:?}");
    }
}

/// Claims `keys` (enqueued first) for a fresh session, in key order.
async fn claimed(db: &support::TestDb, keys: &[&str]) -> Vec<Lease> {
    let s = db.session().await;
    enqueue(&db.store, keys).await;
    let mut leases = claim(&db.store, s.id, 100).await;
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    leases
}

#[tokio::test]
async fn error_text_with_nul_bytes_or_a_megabyte_is_stored_cleaned_with_the_rest_of_its_batch() {
    each_enqueue_path_and_pooler(|db| async move {
        let leases = claimed(&db, &["a", "b", "c"]).await;
        let nul = Outcome::Transient("exit 1: \0boom\0".into());
        let huge = Outcome::Permanent(format!("{}é", "x".repeat(1 << 20)));
        let outcomes = [&Outcome::Done, &nul, &huge];
        let batch: Vec<_> = leases
            .iter()
            .zip(outcomes)
            .map(|(lease, outcome)| LeaseComplete {
                lease,
                outcome,
                trace_id: None,
            })
            .collect();
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(
            item(&db.store, "a").await.map(|a| a.state),
            Some(ItemState::Idle)
        );
        let b = item(&db.store, "b").await.expect("b");
        assert_eq!(b.state, ItemState::Backoff);
        assert_eq!(
            b.last_error.as_deref(),
            Some("exit 1: \u{FFFD}boom\u{FFFD}")
        );
        let c = item(&db.store, "c").await.expect("c");
        assert_eq!(c.state, ItemState::Parked);
        let error = c.last_error.expect("c's error");
        assert!(error.len() <= MAX_TEXT_BYTES, "{}", error.len());
        assert!(error.starts_with("xxxx") && error.ends_with(" bytes cut]"));
        let logged = history(&db.store, "c", 1).await.remove(0);
        assert_eq!(logged.error.as_deref(), Some(error.as_str()));
        let park = ItemPark {
            process: P.into(),
            key: "b".into(),
            reason: "by\0hand".into(),
            actor: "test".into(),
        };
        let parked = db.store.item_park(park).await.expect("park").expect("b");
        assert_eq!(parked.last_error.as_deref(), Some("by\u{FFFD}hand"));
    })
    .await;
}

/// Refuses, in the database itself, any history row whose error is `poison`:
/// an outcome that no cleaning makes storable.
async fn refuse_poison(db: &support::TestDb) {
    db.execute(if db.engine == "postgres" {
        "ALTER TABLE drover_runs ADD CONSTRAINT drover_test_poison
             CHECK (error IS DISTINCT FROM 'poison')"
    } else {
        "CREATE TRIGGER drover_test_poison BEFORE INSERT ON drover_runs
             WHEN NEW.error = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
    })
    .await;
}

#[tokio::test]
async fn an_outcome_the_database_refuses_fails_neither_its_batch_nor_its_key() {
    each_enqueue_path_and_pooler(|db| async move {
        refuse_poison(&db).await;
        let keys = ["a", "b", "c", "d", "e"];
        let leases = claimed(&db, &keys).await;
        let (poison, bad) = (
            Outcome::Transient("poison".into()),
            Outcome::Permanent("bad".into()),
        );
        let outcomes = [&Outcome::Done, &bad, &poison, &Outcome::Done, &bad];
        let batch: Vec<_> = leases
            .iter()
            .zip(outcomes)
            .map(|(lease, outcome)| LeaseComplete {
                lease,
                outcome,
                trace_id: None,
            })
            .collect();
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        for key in ["a", "d"] {
            let it = item(&db.store, key).await.expect(key);
            assert_eq!(it.state, ItemState::Idle, "{key} landed");
        }
        for key in ["b", "e"] {
            let it = item(&db.store, key).await.expect(key);
            assert_eq!(it.state, ItemState::Parked, "{key} landed");
        }
        let c = item(&db.store, "c").await.expect("c");
        assert_eq!(
            (c.state, c.failures),
            (ItemState::Backoff, 1),
            "as its outcome says"
        );
        let note = c.last_error.expect("a note instead of the error");
        assert!(note.starts_with("[drover could not store"), "{note}");
        let alone = claimed(&db, &["f"]).await.remove(0);
        complete(&db.store, &alone, Outcome::Permanent("poison".into()))
            .await
            .expect("alone too");
        assert_eq!(
            item(&db.store, "f").await.expect("f").state,
            ItemState::Parked
        );
    })
    .await;
}

/// The keys among `candidates` that `db.store.candidate_filter` lets through.
async fn unfiltered(db: &support::TestDb, candidates: &[&str]) -> Vec<String> {
    let param = if db.engine == "postgres" { "$1" } else { "?1" };
    let filter = db.store.candidate_filter(param, "m.id");
    let rows = candidates
        .iter()
        .map(|k| format!("SELECT '{k}' AS id"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let sql = format!("SELECT m.id FROM ({rows}) m WHERE {filter} ORDER BY m.id");
    if db.engine == "postgres" {
        let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
        let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(P);
        q.fetch_all(&pool).await.expect("user query")
    } else {
        let pool = sqlx::SqlitePool::connect(&db.sql_url)
            .await
            .expect("connect");
        let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(P);
        q.fetch_all(&pool).await.expect("user query")
    }
}

#[tokio::test]
async fn lock_and_the_candidate_filter_wait_for_a_delayed_key_to_be_ready() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        let lock = |key: &str| LeaseLock {
            session: s.id,
            process: P.into(),
            key: key.into(),
        };
        let later = ItemEnqueue::new(P, ["delayed"]).after(secs(60));
        db.store.item_enqueue(later).await.expect("enqueue");
        let again = db.store.lease_lock(lock("requeued")).await.expect("lock");
        complete(&db.store, &again, Outcome::RequeueAfter(secs(30)))
            .await
            .expect("requeue after");
        let candidates = ["delayed", "requeued", "new"];
        assert_eq!(unfiltered(&db, &candidates).await, ["new"]);
        for key in ["delayed", "requeued"] {
            let err = db.store.lease_lock(lock(key)).await.expect_err("not ready");
            assert!(matches!(err, StoreError::InBackoff { .. }), "{key}: {err}");
        }
        db.store.clock().advance(secs(30));
        assert_eq!(unfiltered(&db, &candidates).await, ["new", "requeued"]);
        db.store.clock().advance(secs(30));
        let s2 = db.session().await;
        let lock = |key: &str| LeaseLock {
            session: s2.id,
            process: P.into(),
            key: key.into(),
        };
        assert_eq!(
            unfiltered(&db, &candidates).await,
            ["delayed", "new", "requeued"]
        );
        for key in candidates {
            db.store.lease_lock(lock(key)).await.expect("ready now");
        }
    })
    .await;
}

/// The id of `key`'s item row.
async fn item_id(db: &support::TestDb, key: &str) -> i64 {
    let sql = if db.engine == "postgres" {
        "SELECT id FROM drover_items WHERE key = $1"
    } else {
        "SELECT id FROM drover_items WHERE key = ?1"
    };
    if db.engine == "postgres" {
        let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
        let q = sqlx::query_scalar(sql).bind(key);
        q.fetch_one(&pool).await.expect("id")
    } else {
        let pool = sqlx::SqlitePool::connect(&db.sql_url)
            .await
            .expect("connect");
        let q = sqlx::query_scalar(sql).bind(key);
        q.fetch_one(&pool).await.expect("id")
    }
}

/// A completion, an enqueue and a heartbeat that each wait for a lock a test
/// transaction holds store times measured from after the wait: the clock is
/// read when they write (on PostgreSQL `clock_timestamp()` after the locking
/// statement, not `now()`, the transaction's start). `released` is read after
/// the operation is seen waiting and before the lock is let go. (On
/// PostgreSQL a completion waits for a held row 100 ms at most, and is then
/// answered `KeyBusy` and sent again: its time is measured from that write.)
#[tokio::test]
async fn writes_that_waited_for_a_lock_measure_their_times_from_after_the_wait() {
    use support::locks::Blocker;
    const ROW: &str = "SELECT 1 FROM drover_items WHERE id = $1 FOR UPDATE";
    const SESSION: &str = "SELECT 1 FROM drover_sessions WHERE id = $1 FOR UPDATE";
    each_enqueue_path_and_pooler(|db| async move {
        let leases = claimed(&db, &["done", "parked"]).await;
        complete(&db.store, &leases[1], Outcome::Permanent("x".into()))
            .await
            .expect("park");
        let blocker = Blocker::hold(&db, ROW, item_id(&db, "done").await).await;
        let (store, lease) = (db.store.clone(), leases[0].clone());
        let waiter =
            tokio::spawn(
                async move { complete(&store, &lease, Outcome::RequeueAfter(secs(30))).await },
            );
        let released = if db.engine == "postgres" {
            let busy = waiter.await.expect("joined");
            assert!(matches!(busy, Err(StoreError::KeyBusy { .. })), "{busy:?}");
            let released = db.store.clock_now().await.expect("now");
            blocker.release().await;
            complete(&db.store, &leases[0], Outcome::RequeueAfter(secs(30)))
                .await
                .expect("requeue after, sent again");
            released
        } else {
            blocker.wait_for_a_waiter().await;
            let released = db.store.clock_now().await.expect("now");
            blocker.release().await;
            waiter.await.expect("joined").expect("requeue after");
            released
        };
        let ready_at = item(&db.store, "done").await.expect("item").ready_at;
        assert!(
            ready_at >= released + chrono::Duration::seconds(30),
            "completion"
        );

        let blocker = Blocker::hold(&db, ROW, item_id(&db, "parked").await).await;
        let store = db.store.clone();
        let waiter = tokio::spawn(async move {
            store
                .item_enqueue(ItemEnqueue::new(P, ["parked"]).after(secs(30)))
                .await
        });
        blocker.wait_for_a_waiter().await;
        let released = db.store.clock_now().await.expect("now");
        blocker.release().await;
        waiter.await.expect("joined").expect("enqueue");
        let ready_at = item(&db.store, "parked").await.expect("item").ready_at;
        assert!(
            ready_at >= released + chrono::Duration::seconds(30),
            "enqueue"
        );

        let session = leases[0].session;
        let blocker = Blocker::hold(&db, SESSION, session.0).await;
        let store = db.store.clone();
        let waiter =
            tokio::spawn(
                async move { store.session_heartbeat(SessionHeartbeat { session }).await },
            );
        blocker.wait_for_a_waiter().await;
        let released = db.store.clock_now().await.expect("now");
        blocker.release().await;
        let deadline = waiter.await.expect("joined").expect("heartbeat");
        assert!(
            deadline >= released + chrono::Duration::seconds(30),
            "heartbeat"
        );
    })
    .await;
}

/// SQLite claims the top priority in one trip and the rest in a transaction
/// of its own. When that second one fails, what the first committed is the
/// session's: the claim answers with those leases (an error would leave them
/// running, unknown to the worker, until the session expires), and the rest
/// stays pending for the next claim.
#[tokio::test]
async fn a_sqlite_claim_whose_rest_fails_answers_with_what_it_committed() {
    let (db, _dir) = support::sqlite().await;
    let s = db.session().await;
    let urgent = ItemEnqueue::new(P, ["urgent-1", "urgent-2"]).priority(10);
    db.store.item_enqueue(urgent).await.expect("enqueue");
    enqueue(&db.store, &["later"]).await;
    db.execute(
        "CREATE TRIGGER drover_test_refuse_later BEFORE UPDATE OF state ON drover_items
             WHEN NEW.state = 'running' AND NEW.priority < 10
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .await;
    let leases = claim(&db.store, s.id, 10).await;
    assert_eq!(keys(&leases), ["urgent-1", "urgent-2"]);
    for lease in &leases {
        complete(&db.store, lease, Outcome::Done)
            .await
            .expect("a lease the claim answered with is the session's");
    }
    let later = item(&db.store, "later").await.expect("later");
    assert_eq!((later.state, later.lease_token), (ItemState::Pending, None));
    db.execute("DROP TRIGGER drover_test_refuse_later").await;
    assert_eq!(keys(&claim(&db.store, s.id, 10).await), ["later"]);
}

/// A retry's trace link (DESIGN.md rule 14) is written only while the lease
/// that asks for it holds its key: a lease that no longer holds it (another
/// token, another session) gets `LeaseLost` and links nothing, so a worker
/// whose lease was lost cannot tie its attempt to the run after another
/// worker's. The holder's link reaches the key's next run.
#[tokio::test]
async fn a_trace_link_needs_the_lease_that_holds_the_key() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let held = claim(&db.store, s.id, 10).await.remove(0);
        let context = |trace: &str| {
            TraceContext::new(&format!("00-{trace}-00f067aa0ba902b7-01"), None)
                .expect("a valid context")
        };
        let mine = context("4bf92f3577b34da6a3ce929d0e0e4736");
        let stale = context("0af7651916cd43dd8448eb211c80319c");
        let other_token = Lease {
            token: FencingToken(held.token.0 + 1),
            ..held.clone()
        };
        let other_session = Lease {
            session: SessionId(held.session.0 + 1),
            ..held.clone()
        };
        for lease in [&other_token, &other_session] {
            let refused = db.store.item_trace_link(lease, &stale).await;
            assert!(
                matches!(refused, Err(StoreError::LeaseLost { .. })),
                "{lease:?}: {refused:?}"
            );
        }
        // Past its session's deadline (a TTL of 30 s), not reclaimed yet:
        // the lease's completion would be refused, so is its link.
        let late = db.reconnect().await;
        late.clock().advance(Duration::from_secs(31));
        let refused = late.item_trace_link(&held, &stale).await;
        assert!(
            matches!(refused, Err(StoreError::LeaseLost { .. })),
            "an expired session's lease: {refused:?}"
        );
        db.store
            .item_trace_link(&held, &mine)
            .await
            .expect("the holder links");
        complete(&db.store, &held, Outcome::RequeueAfter(Duration::ZERO))
            .await
            .expect("requeued");
        let next = db
            .store
            .lease_claim(LeaseClaim {
                session: s.id,
                process: P.into(),
                max: 1,
                trace_links: true,
            })
            .await
            .expect("claim")
            .leases;
        let links = next[0].trace_links.as_ref().expect("links asked for");
        assert_eq!(
            links.links,
            [mine],
            "only the holder's link reached the retry"
        );
    })
    .await;
}

/// A completion retried after its first try committed (its answer lost: a
/// `CommitUnknown`, a cut link, an HTTP timeout) is answered `Ok` and
/// changes nothing: its outcome is recorded once, even when the session has
/// expired since. A retry with another outcome and the completion of a lease
/// given back are still refused; a repeat within one batch is too (see
/// `a_clean_done_repeated_in_one_batch_is_settled_once`).
#[tokio::test]
async fn a_completion_retried_after_its_commit_is_answered_as_written_and_changes_nothing() {
    each_enqueue_path_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a", "b", "c"]).await;
        let leases = claim(&db.store, s.id, 3).await;
        let (a, b, c) = (&leases[0], &leases[1], &leases[2]);
        let failed = Outcome::Transient("flaky".into());
        let first = [
            LeaseComplete {
                lease: a,
                outcome: &Outcome::Done,
                trace_id: None,
            },
            LeaseComplete {
                lease: b,
                outcome: &failed,
                trace_id: None,
            },
        ];
        let results = db.store.lease_complete_batch(&first).await.expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let b_before = item(&db.store, "b").await.expect("b");
        let retried = db.store.lease_complete_batch(&first).await.expect("batch");
        assert!(retried.iter().all(Result::is_ok), "{retried:?}");
        assert_eq!(events(&db.store, "a").await, [RunOutcome::Done]);
        assert_eq!(events(&db.store, "b").await, [RunOutcome::Retry]);
        let b_after = item(&db.store, "b").await.expect("b");
        assert_eq!(
            (b_after.state, b_after.failures, b_after.ready_at),
            (b_before.state, 1, b_before.ready_at),
            "the retry changed nothing"
        );
        let other = complete(&db.store, a, Outcome::Permanent("no".into())).await;
        assert!(
            matches!(other, Err(StoreError::LeaseLost { .. })),
            "another outcome: {other:?}"
        );
        // Another session naming a's recorded run is not told it was its own.
        let stranger = db.session().await;
        let named = Lease {
            session: stranger.id,
            ..a.clone()
        };
        let named = complete(&db.store, &named, Outcome::Done).await;
        assert!(
            matches!(named, Err(StoreError::LeaseLost { .. })),
            "another session's lease: {named:?}"
        );
        db.store
            .lease_release(LeaseRelease { lease: c })
            .await
            .expect("release");
        let given_back = complete(&db.store, c, Outcome::Done).await;
        assert!(
            matches!(given_back, Err(StoreError::LeaseLost { .. })),
            "a lease given back: {given_back:?}"
        );
        assert_eq!(events(&db.store, "c").await, [RunOutcome::Canceled]);
        let late = db.reconnect().await;
        late.clock().advance(Duration::from_secs(31));
        let late_retry = late
            .lease_complete(LeaseComplete {
                lease: a,
                outcome: &Outcome::Done,
                trace_id: None,
            })
            .await;
        assert!(
            late_retry.is_ok(),
            "past the session's deadline: {late_retry:?}"
        );
        assert_eq!(events(&db.store, "a").await, [RunOutcome::Done]);
    })
    .await;
}
