//! Resync on both engines, with the database clock moved instead of waiting:
//! only idle keys come back, at the resync priority, once per interval
//! measured from their last run's end; parked, backing-off, delayed and
//! running keys are left as they are; the walk goes in batches.

mod support;

use std::time::Duration;

use drover::backoff::Backoff;
use drover::metrics::ResyncMetrics;
use drover::runner::Resyncer;
use drover::store::{
    ItemEnqueue, ItemState, Outcome, ProcessConfigure, ResyncBatch, SessionStart, StoreEngine as _,
};
use support::store::{P, claim, complete, enqueue, item, keys, run_ready, secs};
use support::{TestDb, each_engine, each_engine_and_pooler};
use tokio_util::sync::CancellationToken;

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

/// Resyncs [`P`] every hour, without jitter (each key exactly one hour after
/// its last run), at priority −5; backoff 10 h, so a failed key is still
/// backing off when idle keys come back.
async fn hourly(db: &TestDb) {
    let backoff = Backoff::new(secs(36_000), 2.0, secs(36_000)).expect("valid backoff");
    db.store
        .process_configure(
            ProcessConfigure::new(P)
                .backoff(backoff)
                .resync_every(Some(HOUR))
                .resync_jitter(0.0)
                .resync_priority(-5),
        )
        .await
        .expect("configure");
}

/// One complete pass now.
async fn pass(db: &TestDb) -> u64 {
    Resyncer::new(db.store.clone())
        .resync_process(P)
        .await
        .expect("resync")
}

/// One pass walked by hand, `batch` keys per window: each window's report
/// (at most ten windows, so a walk that goes round fails).
async fn windows(db: &TestDb, batch: u32) -> Vec<drover::store::ResyncReport> {
    let window = |start| ResyncBatch {
        process: P.into(),
        batch,
        start,
    };
    let mut reports = vec![db.store.resync_batch(window(true)).await.expect("batch")];
    while !reports.last().expect("one").done {
        assert!(reports.len() < 10, "the walk goes round: {reports:?}");
        reports.push(db.store.resync_batch(window(false)).await.expect("batch"));
    }
    reports
}

async fn state(db: &TestDb, key: &str) -> ItemState {
    item(&db.store, key).await.expect("a known key").state
}

#[tokio::test]
async fn only_idle_keys_come_back_at_low_priority_once_per_interval() {
    each_engine_and_pooler(|db| async move {
        hourly(&db).await;
        enqueue(
            &db.store,
            &["idle-a", "idle-b", "parked", "failing", "running"],
        )
        .await;
        // A session that outlives the moved clock.
        let session = db
            .store
            .session_start(SessionStart::new("test", 10 * HOUR))
            .await
            .expect("session");
        let leases = claim(&db.store, session.id, 10).await;
        for lease in &leases {
            let outcome = match lease.key.as_str() {
                "parked" => Outcome::Permanent("gone".into()),
                "failing" => Outcome::Transient("flaky".into()),
                "running" => continue,
                _ => Outcome::Done,
            };
            complete(&db.store, lease, outcome).await.expect("complete");
        }
        let running = leases.iter().find(|l| l.key == "running").expect("claimed");
        db.store
            .item_enqueue(ItemEnqueue::new(P, ["delayed"]).after(5 * HOUR).priority(3))
            .await
            .expect("enqueue a delayed key");
        let delayed = item(&db.store, "delayed").await.expect("known");
        let backoff = item(&db.store, "failing")
            .await
            .expect("known")
            .backoff_until;

        db.store.clock().advance(59 * MINUTE);
        assert_eq!(pass(&db).await, 0, "nothing is due before the interval");
        db.store.clock().advance(2 * MINUTE);
        assert_eq!(pass(&db).await, 2, "the two idle keys come back");

        for key in ["idle-a", "idle-b"] {
            let it = item(&db.store, key).await.expect("known");
            assert_eq!((it.state, it.priority), (ItemState::Pending, -5), "{key}");
        }
        assert_eq!(
            state(&db, "parked").await,
            ItemState::Parked,
            "resync is no retry"
        );
        let failing = item(&db.store, "failing").await.expect("known");
        assert_eq!(failing.state, ItemState::Backoff);
        assert_eq!(failing.backoff_until, backoff, "the backoff is untouched");
        assert_eq!(
            item(&db.store, "delayed").await,
            Some(delayed),
            "a pending key keeps its time"
        );
        let held = item(&db.store, "running").await.expect("known");
        assert_eq!(held.state, ItemState::Running);
        assert!(!held.dirty, "a running key is not marked for another run");

        // The running key's run ends: it converges, and is not run again.
        complete(&db.store, running, Outcome::Done)
            .await
            .expect("complete");
        assert_eq!(state(&db, "running").await, ItemState::Idle);

        // Resynced keys wait behind enqueued ones.
        enqueue(&db.store, &["fresh"]).await;
        let first = claim(&db.store, session.id, 1).await;
        assert_eq!(keys(&first), ["fresh"]);
        complete(&db.store, &first[0], Outcome::Done)
            .await
            .expect("complete");
        let mut ran = run_ready(&db.store, P, 10, &Outcome::Done).await;
        ran.sort();
        assert_eq!(ran, ["idle-a", "idle-b"]);

        // Once per interval, from each key's last run: not again at once,
        // nor half an hour later; an hour after those runs, again.
        assert_eq!(pass(&db).await, 0);
        db.store.clock().advance(30 * MINUTE);
        assert_eq!(pass(&db).await, 0);
        db.store.clock().advance(31 * MINUTE);
        // idle-a and idle-b (resynced runs), running and fresh (their own runs).
        assert_eq!(pass(&db).await, 4);
        assert_eq!(state(&db, "parked").await, ItemState::Parked);
        assert_eq!(state(&db, "failing").await, ItemState::Backoff);
    })
    .await;
}

#[tokio::test]
async fn the_walk_goes_in_batches_and_resumes_where_it_stopped() {
    each_engine_and_pooler(|db| async move {
        hourly(&db).await;
        let names: Vec<String> = (0..25).map(|i| format!("k{i:02}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(P, names.iter().cloned()))
            .await
            .expect("enqueue");
        assert_eq!(run_ready(&db.store, P, 100, &Outcome::Done).await.len(), 25);
        db.store.clock().advance(HOUR + MINUTE);
        let reports = windows(&db, 4).await;
        let counts: Vec<u64> = reports.iter().map(|r| r.resynced).collect();
        assert_eq!(
            counts,
            [4, 4, 4, 4, 4, 4, 1],
            "seven windows of at most 4 keys"
        );
        // The pass is over and none is due: a batch walks nothing.
        let next = ResyncBatch {
            process: P.into(),
            batch: 4,
            start: false,
        };
        let idle = db.store.resync_batch(next).await.expect("batch");
        assert_eq!((idle.resynced, idle.done), (0, true));
        let settings = db.store.process_list().await.expect("list");
        let settings = settings.iter().find(|s| s.process == P).expect("known");
        assert!(settings.next_resync.is_some(), "{settings:?}");
    })
    .await;
}

/// A resync interval longer than 180 days (the clamp of a delay) is kept
/// as set when a key's due time and the next pass are reckoned: a key
/// resyncing every 300 days comes back at the first batch after 300 days.
/// Before, its due time was clamped to 180 days, the statement that resyncs
/// it refused it then (it ran within the interval), and the pass after that
/// was put 180 days on, so the key came back up to 180 days late.
#[tokio::test]
async fn an_interval_over_180_days_resyncs_a_key_when_it_is_due() {
    each_engine(|db| async move {
        const DAY: Duration = Duration::from_secs(86_400);
        db.store
            .process_configure(
                ProcessConfigure::new(P)
                    .resync_every(Some(300 * DAY))
                    .resync_jitter(0.0),
            )
            .await
            .expect("configure");
        enqueue(&db.store, &["k"]).await;
        assert_eq!(run_ready(&db.store, P, 10, &Outcome::Done).await.len(), 1);
        let tick = ResyncBatch {
            process: P.into(),
            batch: 100,
            start: false,
        };
        let resynced = async || {
            let batch = db.store.resync_batch(tick.clone()).await;
            batch.expect("batch").resynced
        };
        // The resyncer's ticks: one now, one after 181 days, one once due.
        assert_eq!(resynced().await, 0);
        db.store.clock().advance(181 * DAY);
        assert_eq!(resynced().await, 0);
        assert_eq!(state(&db, "k").await, ItemState::Idle, "not due yet");
        db.store.clock().advance(119 * DAY + MINUTE);
        assert_eq!(resynced().await, 1, "due after 300 days");
        assert_eq!(state(&db, "k").await, ItemState::Pending);
    })
    .await;
}

#[tokio::test]
async fn jitter_spreads_keys_over_the_span_and_each_comes_back_once() {
    each_engine_and_pooler(|db| async move {
        db.store
            .process_configure(
                ProcessConfigure::new(P)
                    .resync_every(Some(HOUR))
                    .resync_jitter(1.0),
            )
            .await
            .expect("configure");
        let names: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(P, names.iter().cloned()))
            .await
            .expect("enqueue");
        assert_eq!(run_ready(&db.store, P, 100, &Outcome::Done).await.len(), 40);
        // Half-way through the span some keys are due, not all.
        db.store.clock().advance(HOUR + 30 * MINUTE);
        let early = pass(&db).await;
        assert!(early > 0 && early < 40, "{early} of 40 keys due half-way");
        // At the span's end the others, and the early ones only once.
        db.store.clock().advance(31 * MINUTE);
        assert_eq!(pass(&db).await, 40 - early);
    })
    .await;
}

#[tokio::test]
async fn bad_resync_settings_are_refused_and_never_turns_it_off() {
    each_engine_and_pooler(|db| async move {
        for bad in [
            ProcessConfigure::new(P).resync_jitter(1.5),
            ProcessConfigure::new(P).resync_every(Some(Duration::from_millis(10))),
        ] {
            let err = db.store.process_configure(bad).await.expect_err("refused");
            assert!(err.to_string().contains("resync"), "{err}");
        }
        hourly(&db).await;
        enqueue(&db.store, &["a"]).await;
        run_ready(&db.store, P, 1, &Outcome::Done).await;
        db.store
            .process_configure(ProcessConfigure::new(P).resync_every(None))
            .await
            .expect("configure");
        db.store.clock().advance(2 * HOUR);
        assert_eq!(pass(&db).await, 0);
        let settings = db.store.process_list().await.expect("list");
        assert_eq!(settings[0].resync, None);
    })
    .await;
}

#[tokio::test]
async fn the_resyncer_runs_on_its_timer_wakes_workers_and_counts_what_it_resynced() {
    each_engine_and_pooler(|db| async move {
        hourly(&db).await;
        enqueue(&db.store, &["a", "b", "c"]).await;
        run_ready(&db.store, P, 10, &Outcome::Done).await;
        db.store.clock().advance(HOUR + MINUTE);
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ResyncMetrics::new(&mut registry);
        let wake = db.store.wakeup(P);
        let stop = CancellationToken::new();
        let resyncer = Resyncer::new(db.store.clone())
            .every(Duration::from_millis(20))
            .metrics(metrics);
        let task = tokio::spawn(resyncer.run(stop.clone()));
        // Wake-ups are per process name across the test binary, and other
        // tests use the same name: wait for wake-ups until one finds every
        // key pending (armed before each look, so the resync's own is never
        // missed).
        let resynced = async {
            loop {
                let woken = wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let mut pending = 0;
                for key in ["a", "b", "c"] {
                    if state(&db, key).await == ItemState::Pending {
                        pending += 1;
                    }
                }
                if pending == 3 {
                    return;
                }
                woken.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), resynced)
            .await
            .expect("the resync woke the process's workers");
        stop.cancel();
        task.await.expect("join");
        for key in ["a", "b", "c"] {
            assert_eq!(state(&db, key).await, ItemState::Pending, "{key}");
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains(&format!(
                "drover_resync_enqueued_total{{process=\"{P}\"}} 3"
            )),
            "{text}"
        );
    })
    .await;
}

/// SQLite keeps any bytes SQL writes as text. An idle key that is not UTF-8
/// (written by hand) once failed every resync tick of its process ("invalid
/// utf-8 sequence") and every retention pass; now both walk past it by its
/// exact bytes, in windows of one key so that it is a window's cursor, and
/// the resync makes it pending like the others.
#[tokio::test]
async fn a_key_that_is_not_utf8_neither_stops_the_resync_nor_retention() {
    let (db, _dir) = support::sqlite().await;
    hourly(&db).await;
    db.store
        .process_configure(
            ProcessConfigure::new(P)
                .keep_runs_per_key(1)
                .forget_idle_after(Some(secs(7200))),
        )
        .await
        .expect("configure retention");
    enqueue(&db.store, &["e", "g"]).await;
    assert_eq!(run_ready(&db.store, P, 10, &Outcome::Done).await.len(), 2);
    db.execute(&format!(
        "INSERT INTO drover_items (process, key, state, ready_at, enqueued_at)
         VALUES ('{P}', CAST(X'66FF' AS TEXT), 'idle', 0, 0)"
    ))
    .await;
    db.execute(
        "INSERT INTO drover_runs (process, key, outcome, ended_at)
         SELECT process, CAST(X'66FF' AS TEXT), 'done', ended_at + n
         FROM drover_runs, (SELECT 0 AS n UNION ALL SELECT 1) WHERE key = 'e'",
    )
    .await;
    db.store.clock().advance(HOUR + MINUTE);
    let reports = windows(&db, 1).await;
    let resynced: u64 = reports.iter().map(|r| r.resynced).sum();
    assert_eq!(
        resynced, 3,
        "e, the key that is not UTF-8, and g: {reports:?}"
    );

    let mut cursor = drover::store::PruneCursor::default();
    for round in 0.. {
        assert!(round < 10, "the retention pass goes round");
        let report = db
            .store
            .retention_prune(drover::store::RetentionPrune {
                process: P.into(),
                cursor,
                batch: 2,
            })
            .await
            .expect("prune");
        if report.done {
            break;
        }
        cursor = report.cursor;
    }
    let runs = db
        .store
        .run_list(drover::store::RunList {
            process: Some(P.into()),
            limit: 100,
            ..drover::store::RunList::default()
        })
        .await
        .expect("runs");
    let bad = runs.iter().filter(|r| r.key == "f\u{FFFD}").count();
    assert_eq!(bad, 1, "its runs capped to one like the others': {runs:?}");
}

/// SQL straight into SQLite's `drover_items` checks no types, so a key's
/// last run may end at a fraction of a millisecond. Read as it was stored,
/// that failed the window with a `ColumnDecode` error: every batch of the
/// process's resync failed at that window, for good, and no key of it came
/// back. Now the time is read as SQLite reads a value as an integer (cut
/// toward zero), the walk goes on past it, and the key comes back with the
/// others.
#[tokio::test]
async fn a_fraction_sql_wrote_into_a_keys_last_run_stops_no_resync() {
    let (db, _dir) = support::sqlite().await;
    hourly(&db).await;
    enqueue(&db.store, &["a", "b", "c"]).await;
    assert_eq!(run_ready(&db.store, P, 10, &Outcome::Done).await.len(), 3);
    db.execute("UPDATE drover_items SET last_ended_at = last_ended_at + 0.5 WHERE key = 'b'")
        .await;
    db.store.clock().advance(HOUR + MINUTE);
    let reports = windows(&db, 1).await;
    let resynced: u64 = reports.iter().map(|r| r.resynced).sum();
    assert_eq!(resynced, 3, "a, b and c: {reports:?}");
    for key in ["a", "b", "c"] {
        assert_eq!(state(&db, key).await, ItemState::Pending, "{key}");
    }
}
