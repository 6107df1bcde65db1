//! The store's contract for history and known keys: one row per run, written
//! when it ends, and per operator action; retention by each process's stored
//! rules; activity counts recent runs; on every engine via
//! `support::each_engine`.
//!
//! No test sleeps: time passes by advancing the store's clock offset.

mod support;

use std::time::Duration;

use drover::store::{
    DepthSample, HistoryActivity, ItemDelete, ItemEnqueue, ItemGet, ItemPark, ItemRetry, ItemState,
    LeaseComplete, Outcome, ProcessConfigure, ProcessPage, PruneCursor, Retention, RetentionPrune,
    RunList, RunOutcome, Store, StoreEngine as _, StoreError,
};
use support::store::{P, claim, complete, enqueue, events, history, item, secs};
use support::{each_engine, each_engine_and_pooler};

/// Runs every batch of `P`'s retention until a pass is done; the runs and
/// idle keys removed.
async fn prune(store: &Store, batch: u32) -> (u64, u64) {
    let (runs, items, _) = prune_counting(store, batch).await;
    (runs, items)
}

/// [`prune`], with the number of batches the pass took.
async fn prune_counting(store: &Store, batch: u32) -> (u64, u64, u32) {
    let (mut runs, mut items, mut cursor) = (0, 0, PruneCursor::default());
    for batches in 1..10_000 {
        let report = store
            .retention_prune(RetentionPrune {
                process: P.into(),
                cursor,
                batch,
            })
            .await
            .expect("prune");
        runs += report.runs;
        items += report.items;
        if report.done {
            assert_eq!(
                report.cursor,
                PruneCursor::default(),
                "the next pass starts over"
            );
            return (runs, items, batches);
        }
        cursor = report.cursor;
    }
    panic!("retention never finished a pass");
}

/// Runs `key` once to the outcome given.
async fn run(db: &support::TestDb, key: &str, outcome: Outcome) {
    let s = db.session().await;
    enqueue(&db.store, &[key]).await;
    let lease = claim(&db.store, s.id, 1).await.remove(0);
    assert_eq!(lease.key, key);
    complete(&db.store, &lease, outcome)
        .await
        .expect("complete");
}

#[tokio::test]
async fn history_has_one_row_per_run_written_when_it_ends() {
    each_engine_and_pooler(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        db.store.clock().advance(secs(1));
        enqueue(&db.store, &["a"]).await;
        let lease = claim(&db.store, s.id, 1).await.remove(0);
        assert!(
            history(&db.store, "a", 10).await.is_empty(),
            "no row for enqueues or a start"
        );
        let running = item(&db.store, "a").await.expect("a");
        assert_eq!(
            (running.state, running.lease_token, running.started_at),
            (
                ItemState::Running,
                Some(lease.token),
                Some(lease.started_at)
            ),
            "a running item shows its current run"
        );
        assert_eq!(running.enqueue_count, 2);
        assert!(running.first_enqueued_at < running.last_enqueued_at);
        db.store.clock().advance(secs(3));
        complete(&db.store, &lease, Outcome::Transient("flaky".into()))
            .await
            .expect("fail");
        db.store.clock().advance(secs(2));
        let second = claim(&db.store, s.id, 1).await.remove(0);
        complete(&db.store, &second, Outcome::Permanent("broken".into()))
            .await
            .expect("park");
        assert_eq!(
            events(&db.store, "a").await,
            [RunOutcome::Retry, RunOutcome::Parked]
        );
        let detail = db
            .store
            .item_get(ItemGet {
                process: P.into(),
                key: "a".into(),
                runs_limit: 1,
            })
            .await
            .expect("get")
            .expect("parked item");
        assert_eq!(detail.item.failures, 2, "both failed attempts count");
        assert_eq!(detail.runs.len(), 1);
        let last = &detail.runs[0];
        assert_eq!(
            (last.outcome, last.attempt, last.error.as_deref()),
            (RunOutcome::Parked, Some(2), Some("broken"))
        );
        let first = history(&db.store, "a", 2).await.remove(1);
        assert_eq!(first.attempt, Some(1));
        assert_eq!(first.pending_since, Some(lease.enqueued_at));
        assert_eq!(first.started_at, Some(lease.started_at));
        assert!(first.duration().expect("duration") >= secs(3));
        assert!(first.queue_wait().is_some());
        assert!(first.failed() && last.failed());
    })
    .await;
}

/// A requeue is the handler's own enqueue: the next run is pending since
/// the requeue, so its queue wait is its own (the delay and the wait for a
/// worker), not every earlier run of the key and its delay added up.
#[tokio::test]
async fn a_key_that_requeues_itself_is_pending_since_each_requeue() {
    each_engine_and_pooler(|db| async move {
        enqueue(&db.store, &["a"]).await;
        let mut requeued_at = None;
        for _ in 0..3 {
            db.store.clock().advance(secs(5)); // waiting for a worker
            let s = db.session().await;
            let lease = claim(&db.store, s.id, 1).await.remove(0);
            if let Some(requeued_at) = requeued_at {
                assert_eq!(lease.enqueued_at, requeued_at, "attempt {}", lease.attempt);
            }
            db.store.clock().advance(secs(2)); // running
            complete(&db.store, &lease, Outcome::RequeueAfter(secs(60)))
                .await
                .expect("requeue");
            let run = history(&db.store, "a", 1).await.remove(0);
            assert_eq!(run.pending_since, Some(lease.enqueued_at));
            let wait = run.queue_wait().expect("a queue wait");
            assert!(wait < secs(70), "{wait:?}: earlier runs counted");
            let requeued = item(&db.store, "a").await.expect("a");
            assert_eq!(
                requeued.enqueued_at, run.ended_at,
                "pending since the requeue"
            );
            requeued_at = Some(run.ended_at);
            db.store.clock().advance(secs(60));
        }
    })
    .await;
}

#[tokio::test]
async fn operator_actions_are_rows_with_their_actor_and_a_delete_forgets_only_the_key() {
    each_engine_and_pooler(|db| async move {
        run(&db, "a", Outcome::Done).await;
        let idle = item(&db.store, "a").await.expect("known");
        assert_eq!(idle.state, ItemState::Idle);
        let park = ItemPark {
            process: P.into(),
            key: "a".into(),
            reason: "provider down".into(),
            actor: "admin".into(),
        };
        db.store.item_park(park).await.expect("park").expect("a");
        let retry = ItemRetry {
            process: P.into(),
            key: "a".into(),
            actor: "cli".into(),
        };
        let retried = db.store.item_retry(retry).await.expect("retry").expect("a");
        assert_eq!(retried.state, ItemState::Pending);
        let delete = ItemDelete {
            process: P.into(),
            key: "a".into(),
            actor: "admin".into(),
        };
        assert!(db.store.item_delete(delete).await.expect("delete"));
        assert_eq!(item(&db.store, "a").await, None, "forgotten");
        let rows: Vec<_> = history(&db.store, "a", 10)
            .await
            .into_iter()
            .map(|r| (r.outcome, r.actor, r.error))
            .collect();
        assert_eq!(
            rows,
            [
                (RunOutcome::Deleted, Some("admin".into()), None),
                (RunOutcome::Retried, Some("cli".into()), None),
                (
                    RunOutcome::Parked,
                    Some("admin".into()),
                    Some("provider down".into())
                ),
                (RunOutcome::Done, None, None),
            ],
            "the runs stay after the key is forgotten"
        );
        enqueue(&db.store, &["a"]).await;
        let fresh = item(&db.store, "a").await.expect("known again");
        assert_eq!((fresh.enqueue_count, fresh.last_outcome), (1, None));
    })
    .await;
}

/// The runs one batch ends are written in their leases' order (the order
/// of their tokens), whatever their outcomes, on every engine: they end at
/// the same instant, and the history's order (by id) is all that tells them
/// apart. SQLite wrote them by outcome, those without an error first (in
/// the order of a hash map): below, tokens 4, 1, 3, 6, 2, 5 oldest first,
/// where PostgreSQL wrote 1 to 6.
#[tokio::test]
async fn the_runs_of_one_batch_are_in_the_history_in_their_leases_order() {
    each_engine_and_pooler(|db| async move {
        let s = db.session().await;
        let keys = ["a", "b", "c", "d", "e", "f"];
        enqueue(&db.store, &keys).await;
        let mut leases = claim(&db.store, s.id, 10).await;
        leases.sort_by_key(|l| l.token);
        let outcomes = [
            Outcome::Done,
            Outcome::Transient("flaky".into()),
            Outcome::Done,
            Outcome::RequeueAfter(secs(1)),
            Outcome::Permanent("broken".into()),
            Outcome::Done,
        ];
        let batch: Vec<_> = leases
            .iter()
            .zip(&outcomes)
            .map(|(lease, outcome)| LeaseComplete {
                lease,
                outcome,
                trace_id: None,
            })
            .collect();
        let results = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let page = RunList {
            process: Some(P.into()),
            limit: 10,
            ..RunList::default()
        };
        let mut written = db.store.run_list(page).await.expect("history");
        written.reverse();
        let written: Vec<_> = written.iter().map(|r| r.token).collect();
        let leased: Vec<_> = leases.iter().map(|l| Some(l.token)).collect();
        assert_eq!(written, leased, "oldest first");
    })
    .await;
}

#[tokio::test]
async fn run_list_pages_newest_first_by_id_and_filters_by_key_and_outcome() {
    each_engine_and_pooler(|db| async move {
        for (key, outcome) in [
            ("a", Outcome::Done),
            ("b", Outcome::Transient("x".into())),
            ("c", Outcome::Done),
            ("a", Outcome::RequeueAfter(secs(1))),
        ] {
            run(&db, key, outcome).await;
        }
        let page = |before: Option<i64>, limit: u32| RunList {
            process: Some(P.into()),
            before,
            limit,
            ..RunList::default()
        };
        let first = db.store.run_list(page(None, 3)).await.expect("page");
        let keys: Vec<_> = first.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["a", "c", "b"]);
        let rest = db
            .store
            .run_list(page(Some(first[2].id), 3))
            .await
            .expect("page");
        assert_eq!(rest.len(), 1);
        assert_eq!(
            (rest[0].key.as_str(), rest[0].outcome),
            ("a", RunOutcome::Done)
        );
        let requeued = RunList {
            outcome: Some(RunOutcome::Requeued),
            ..page(None, 10)
        };
        let requeued = db.store.run_list(requeued).await.expect("filter");
        assert_eq!(requeued.len(), 1);
        let unknown = RunList {
            process: Some("nope".into()),
            ..page(None, 10)
        };
        assert!(matches!(
            db.store.run_list(unknown).await,
            Err(StoreError::UnknownProcess(_))
        ));
    })
    .await;
}

#[tokio::test]
async fn settings_are_stored_per_process_and_a_partial_change_keeps_the_rest() {
    each_engine_and_pooler(|db| async move {
        let configure = ProcessConfigure::new(P)
            .keep_runs_for(Duration::from_secs(3600))
            .keep_runs_per_key(5);
        db.store.process_configure(configure).await.expect("set");
        let forget = ProcessConfigure::new(P).forget_idle_after(Some(secs(60)));
        db.store.process_configure(forget).await.expect("set");
        let settings = db.store.process_list().await.expect("list");
        assert_eq!(settings.len(), 1);
        assert_eq!(
            settings[0].retention,
            Retention {
                keep_runs_for: secs(3600),
                keep_runs_per_key: 5,
                forget_idle_after: Some(secs(60)),
            }
        );
        let never = ProcessConfigure::new(P).forget_idle_after(None);
        db.store.process_configure(never).await.expect("set");
        let settings = db.store.process_list().await.expect("list");
        assert_eq!(settings[0].retention.forget_idle_after, None);
        assert_eq!(settings[0].retention.keep_runs_per_key, 5);
        for bad in [
            ProcessConfigure::new(P).keep_runs_per_key(0),
            // More than the column holds: refused, not stored unreadable.
            ProcessConfigure::new(P).keep_runs_per_key(u32::MAX),
            ProcessConfigure::new(P).keep_runs_for(Duration::ZERO),
            ProcessConfigure::new("bad\0name").keep_runs_per_key(3),
        ] {
            let err = db.store.process_configure(bad).await.expect_err("refused");
            assert!(
                matches!(
                    err,
                    StoreError::InvalidArgument(_) | StoreError::InvalidProcess { .. }
                ),
                "{err}"
            );
        }
        let fresh = db.store.process_list().await.expect("list");
        assert_eq!(fresh[0].retention.keep_runs_per_key, 5, "nothing written");
        enqueue(&db.store, &["x"]).await;
        let other = ProcessConfigure::new("other");
        db.store.process_configure(other).await.expect("create");
        let settings = db.store.process_list().await.expect("list");
        assert_eq!(settings[0].retention, Retention::default(), "{settings:?}");
    })
    .await;
}

#[tokio::test]
async fn retention_drops_runs_older_than_the_period_on_the_database_clock() {
    each_engine_and_pooler(|db| async move {
        let keep = ProcessConfigure::new(P).keep_runs_for(Duration::from_secs(3600));
        db.store.process_configure(keep).await.expect("set");
        for key in ["a", "b", "c"] {
            run(&db, key, Outcome::Done).await;
        }
        assert_eq!(prune(&db.store, 100).await, (0, 0), "nothing is old yet");
        db.store.clock().advance(secs(3601));
        run(&db, "a", Outcome::Done).await;
        assert_eq!(prune(&db.store, 2).await, (3, 0), "in batches of 2");
        assert_eq!(events(&db.store, "a").await, [RunOutcome::Done]);
        assert!(history(&db.store, "b", 10).await.is_empty());
        assert_eq!(
            item(&db.store, "b").await.map(|b| b.state),
            Some(ItemState::Idle),
            "pruning runs never forgets a key"
        );
    })
    .await;
}

#[tokio::test]
async fn retention_keeps_the_newest_runs_of_each_key_up_to_the_cap() {
    each_engine_and_pooler(|db| async move {
        let cap = ProcessConfigure::new(P).keep_runs_per_key(3);
        db.store.process_configure(cap).await.expect("set");
        for _ in 0..6 {
            run(&db, "many", Outcome::Done).await;
        }
        for key in ["few", "many2"] {
            run(&db, key, Outcome::Done).await;
        }
        for _ in 0..4 {
            run(&db, "many2", Outcome::Done).await;
        }
        let newest: Vec<i64> = history(&db.store, "many", 3)
            .await
            .iter()
            .map(|r| r.id)
            .collect();
        // A batch smaller than one key's runs still moves on.
        assert_eq!(prune(&db.store, 2).await, (5, 0));
        let kept: Vec<i64> = history(&db.store, "many", 10)
            .await
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(kept, newest, "the newest three stay");
        assert_eq!(history(&db.store, "many2", 10).await.len(), 3);
        assert_eq!(history(&db.store, "few", 10).await.len(), 1);
        assert_eq!(prune(&db.store, 100).await, (0, 0), "idempotent");
    })
    .await;
}

/// Capping a key's runs deletes at most about one batch per step, however
/// many runs the key has over its cap: a key with thousands of runs over it
/// (the cap lowered on a long history) was capped by one `DELETE` of all of
/// them, holding the database (SQLite's one writer) for as long as that took,
/// whatever the pruner's batch.
#[tokio::test]
async fn capping_a_key_with_a_long_history_deletes_a_batch_at_a_time() {
    each_engine(|db| async move {
        const RUNS: usize = 5_000;
        let cap = ProcessConfigure::new(P).keep_runs_per_key(10);
        db.store.process_configure(cap).await.expect("set");
        run(&db, "hot", Outcome::Done).await;
        let now = if db.engine == "postgres" {
            "now()"
        } else {
            "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
        };
        db.execute(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {RUNS}) \
             INSERT INTO drover_runs (process, key, outcome, ended_at) \
             SELECT '{P}', 'hot', 'done', {now} FROM n"
        ))
        .await;
        let newest: Vec<i64> = history(&db.store, "hot", 10)
            .await
            .iter()
            .map(|r| r.id)
            .collect();
        let (mut cursor, mut removed, mut steps) = (PruneCursor::default(), 0, 0);
        loop {
            let report = db
                .store
                .retention_prune(RetentionPrune {
                    process: P.into(),
                    cursor,
                    batch: 100,
                })
                .await
                .expect("prune");
            assert!(
                report.runs <= 200,
                "one step of batch 100 deleted {} runs",
                report.runs
            );
            removed += report.runs;
            steps += 1;
            if report.done {
                break;
            }
            assert!(steps < 1_000, "the pass never ends");
            cursor = report.cursor;
        }
        assert_eq!(removed, RUNS as u64 + 1 - 10);
        let kept: Vec<i64> = history(&db.store, "hot", 20)
            .await
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(kept, newest, "the newest ten stay");
    })
    .await;
}

#[tokio::test]
async fn retention_forgets_only_idle_keys_untouched_for_the_period() {
    each_engine_and_pooler(|db| async move {
        run(&db, "old-idle", Outcome::Done).await;
        run(&db, "old-parked", Outcome::Permanent("x".into())).await;
        let s = db.session().await;
        enqueue(&db.store, &["old-running"]).await;
        assert_eq!(claim(&db.store, s.id, 5).await.len(), 1);
        // Pending, but not before the test ends (so `run` claims its own keys).
        let later = drover::store::ItemEnqueue::new(P, ["old-pending"]).after(secs(864_000));
        db.store.item_enqueue(later).await.expect("enqueue");
        db.store.clock().advance(secs(3600));
        assert_eq!(prune(&db.store, 100).await, (0, 0), "never, by default");
        let forget = ProcessConfigure::new(P).forget_idle_after(Some(secs(600)));
        db.store.process_configure(forget).await.expect("set");
        run(&db, "young-idle", Outcome::Done).await;
        // Windows of 2: the items' walk (5 keys) takes 3, the runs' walk (3
        // keys) 2; each walk ends on its own, so the pass takes 3 batches.
        assert_eq!(prune_counting(&db.store, 2).await, (0, 1, 3));
        assert_eq!(item(&db.store, "old-idle").await, None);
        for key in ["old-parked", "old-pending", "old-running", "young-idle"] {
            assert!(item(&db.store, key).await.is_some(), "{key} kept");
        }
        assert_eq!(
            events(&db.store, "old-idle").await,
            [RunOutcome::Done],
            "its runs stay until their own retention"
        );
    })
    .await;
}

/// Retention's forgetting of idle keys skips a row a caller's open
/// transaction holds (PostgreSQL: an enqueue of that idle key, not committed
/// yet) and forgets the rest of its window at once. Before, its range delete
/// waited for the caller's row while holding the rows it had deleted, so a
/// producer's enqueue of one of those keys waited for the caller's commit
/// too, and so did the pass.
#[tokio::test]
async fn forgetting_idle_keys_skips_a_row_a_callers_transaction_holds() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    for key in ["a", "b", "c"] {
        run(&db, key, Outcome::Done).await;
    }
    db.store.clock().advance(secs(3600));
    let forget = ProcessConfigure::new(P).forget_idle_after(Some(secs(600)));
    db.store.process_configure(forget).await.expect("set");
    let mut caller = support::caller_tx::CallerTx::begin(&db.store).await;
    let report = caller.enqueue(ItemEnqueue::new(P, ["b"])).await;
    assert_eq!(report.expect("the caller's enqueue").pending, 1);
    let within = Duration::from_secs(3);
    let pass = tokio::time::timeout(within, prune(&db.store, 100))
        .await
        .expect("the pass does not wait for the caller's transaction");
    assert_eq!(pass, (0, 2), "a and c forgotten, b left to the next pass");
    let enqueued = tokio::time::timeout(within, db.store.item_enqueue(ItemEnqueue::new(P, ["a"])))
        .await
        .expect("an enqueue of a forgotten key waits for no one")
        .expect("enqueue");
    assert_eq!(enqueued.pending, 1, "a is pending again");
    caller.commit().await;
    let b = item(&db.store, "b").await.expect("b is kept");
    assert_eq!(b.state, ItemState::Pending, "the caller's enqueue stands");
    assert_eq!(item(&db.store, "c").await, None);
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// Retention periods longer than 180 days are kept as set, and periods are
/// bounded at 100 years with an error, not cut. Before, every period went
/// through the 180-day clamp of a delay: a year's retention was stored as 180
/// days, and runs and idle keys went at half the age asked for.
#[tokio::test]
async fn retention_periods_over_180_days_are_kept_as_set() {
    each_engine_and_pooler(|db| async move {
        let year = secs(365 * 24 * 3600);
        let keep = ProcessConfigure::new(P)
            .keep_runs_for(year)
            .forget_idle_after(Some(year));
        db.store.process_configure(keep).await.expect("set");
        run(&db, "a", Outcome::Done).await;
        let stored = db.store.process_list().await.expect("list");
        let stored = stored
            .iter()
            .find(|p| p.process == P)
            .expect("P's settings");
        assert_eq!(stored.retention.keep_runs_for, year);
        assert_eq!(stored.retention.forget_idle_after, Some(year));
        db.store.clock().advance(secs(200 * 24 * 3600));
        assert_eq!(
            prune(&db.store, 100).await,
            (0, 0),
            "200 days is not a year"
        );
        db.store.clock().advance(secs(166 * 24 * 3600));
        assert_eq!(prune(&db.store, 100).await, (1, 1), "past a year");
        // 100 years as the CLI counts them (`100y`: years of 365.25 days).
        let century = secs(36_525 * 24 * 3600);
        let fits = ProcessConfigure::new(P).keep_runs_for(century);
        db.store.process_configure(fits).await.expect("100 years");
        let too_long = century + secs(1);
        for too_long in [
            ProcessConfigure::new(P).keep_runs_for(too_long),
            ProcessConfigure::new(P).forget_idle_after(Some(too_long)),
            ProcessConfigure::new(P).resync_every(Some(too_long)),
        ] {
            match db.store.process_configure(too_long).await {
                Err(StoreError::InvalidArgument(why)) => {
                    assert!(why.contains("at most 100 years"), "{why}")
                }
                other => panic!("a period over 100 years: {other:?}"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn activity_counts_the_runs_that_ended_within_the_window() {
    each_engine_and_pooler(|db| async move {
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
        let window = HistoryActivity {
            window: secs(60),
            page: ProcessPage::first(10),
        };
        let activity = db.store.history_activity(window.clone()).await;
        let activity = activity.expect("activity").items;
        assert_eq!(activity.len(), 1);
        assert_eq!((activity[0].finished, activity[0].failed), (2, 1));
        db.store.clock().advance(secs(120));
        let activity = db.store.history_activity(window).await;
        let activity = activity.expect("activity").items;
        assert_eq!((activity[0].finished, activity[0].failed), (0, 0));
    })
    .await;
}

/// SQLite: sampling the queue depth of many processes lets the write lock go
/// between small groups of them, so an enqueue meanwhile waits for one group,
/// not for the whole sample. With 30,000 processes the sample held the lock
/// in one transaction for about 3 s, every minute `drover serve` runs. Judged
/// from what a reader sees, not from how long an enqueue took: an enqueue
/// that got its turn while the sample was under way is followed by a read
/// of part of the sample, which one transaction for all never shows.
#[tokio::test]
async fn sampling_many_processes_depth_lets_writers_in_between_groups() {
    const PROCESSES: usize = 5_000;
    let (db, _dir) = support::sqlite().await;
    db.execute(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {PROCESSES}) \
         INSERT INTO drover_processes (process, created_at) SELECT printf('p-%05d', i), 0 FROM n"
    ))
    .await;
    enqueue(&db.store, &["warm"]).await;
    let reader = sqlx::SqlitePool::connect(&db.sql_url)
        .await
        .expect("a reader");
    let store = db.store.clone();
    let sample = tokio::spawn(async move {
        let every_minute = DepthSample {
            keep: Duration::from_secs(86_400),
            min_gap: Duration::from_secs(30),
        };
        store.depth_sample(every_minute).await.expect("sample")
    });
    let all = i64::try_from(PROCESSES).expect("small") + 1;
    let mut seen = Vec::new();
    while !sample.is_finished() {
        enqueue(&db.store, &["meanwhile"]).await;
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM drover_depth_samples")
            .fetch_one(&reader)
            .await
            .expect("count");
        seen.push(written);
    }
    assert_eq!(sample.await.expect("sampled"), PROCESSES as u64 + 1);
    assert!(
        seen.iter().any(|&n| n > 0 && n < all),
        "no enqueue got in while the sample was part written: it held the write lock \
         throughout (samples seen after each enqueue: {:?})",
        seen.iter().fold(Vec::<i64>::new(), |mut kinds, &n| {
            if kinds.last() != Some(&n) {
                kinds.push(n);
            }
            kinds
        })
    );
}
