//! The item counts the overview, `/v1/processes` and `/metrics` read are kept
//! by the database in the transactions that change items (migration 0007):
//! after random sequences of every operation that moves an item between
//! states, they equal a real count of the items, on both engines; with
//! several writers at once, at every quiescent point.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use drover::store::{
    ItemDelete, ItemEnqueue, ItemFilter, ItemList, ItemPark, ItemRetry, ItemState, ItemsDelete,
    ItemsPark, ItemsRetry, Lease, LeaseClaim, LeaseComplete, LeaseLock, LeaseRelease, Outcome,
    ProcessConfigure, PruneCursor, RetentionPrune, SessionClose, SessionStart, Store,
    StoreEngine as _,
};
use support::store::{P, claim};
use support::{each_engine_and_pooler, each_enqueue_path_and_pooler};

/// A small deterministic generator (xorshift), so a failing seed replays.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The keys the operations pick from: few, so they collide often.
fn key(dice: &mut Dice) -> String {
    format!("k{}", dice.roll(12))
}

/// Every item of [`P`], counted by state the way the counts report them.
async fn real_counts(store: &Store) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store
            .item_list(ItemList {
                process: P.into(),
                state: None,
                after_key: after.take(),
                limit: 100,
            })
            .await
            .expect("list");
        for item in &page {
            *out.entry(item.state.as_str()).or_insert(0) += 1;
        }
        match page.last() {
            Some(last) if page.len() == 100 => after = Some(last.key.clone()),
            _ => return out,
        }
    }
}

/// What the store's counts say for [`P`], in the same shape.
async fn stored_counts(store: &Store) -> BTreeMap<&'static str, u64> {
    let counts = store.process_counts_all().await.expect("counts");
    let c = counts.iter().find(|c| c.process == P).expect("P is known");
    [
        ("pending", c.pending),
        ("backoff", c.backoff),
        ("running", c.running),
        ("parked", c.parked),
        ("idle", c.idle),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect()
}

/// One random operation; `leases` are the runs in flight.
async fn step(store: &Store, dice: &mut Dice, leases: &mut Vec<Lease>, session: &mut i64) {
    let admin = "test".to_owned();
    let s = drover::store::SessionId(*session);
    match dice.roll(15) {
        0 | 1 => {
            let keys = [key(dice), key(dice), key(dice)];
            let delay = Duration::from_millis(dice.roll(3) * 500);
            let e = ItemEnqueue::new(P, keys).after(delay);
            store.item_enqueue(e).await.expect("enqueue");
        }
        2 | 3 => {
            let max = u32::try_from(dice.roll(4)).expect("small") + 1;
            leases.extend(claim(store, s, max).await);
        }
        4 | 5 if !leases.is_empty() => {
            let lease =
                leases.remove(usize::try_from(dice.roll(leases.len() as u64)).expect("small"));
            let outcome = match dice.roll(4) {
                0 => Outcome::Done,
                1 => Outcome::RequeueAfter(Duration::from_secs(1)),
                2 => Outcome::Transient(format!("flaky {}", lease.key)),
                _ => Outcome::Permanent("broken".into()),
            };
            let done = LeaseComplete {
                lease: &lease,
                outcome: &outcome,
                trace_id: None,
            };
            // A lease reclaimed meanwhile is refused and changes nothing.
            let _ = store.lease_complete(done).await;
        }
        6 if !leases.is_empty() => {
            let lease = leases.pop().expect("a lease");
            let _ = store.lease_release(LeaseRelease { lease: &lease }).await;
        }
        7 => {
            let lock = LeaseLock {
                session: s,
                process: P.into(),
                key: key(dice),
            };
            if let Ok(lease) = store.lease_lock(lock).await {
                leases.push(lease);
            }
        }
        8 => {
            let (process, key) = (P.to_owned(), key(dice));
            let _ = match dice.roll(3) {
                0 => store
                    .item_retry(ItemRetry {
                        process,
                        key,
                        actor: admin,
                    })
                    .await
                    .map(|_| ()),
                1 => {
                    let reason = "held".to_owned();
                    store
                        .item_park(ItemPark {
                            process,
                            key,
                            reason,
                            actor: admin,
                        })
                        .await
                        .map(|_| ())
                }
                _ => store
                    .item_delete(ItemDelete {
                        process,
                        key,
                        actor: admin,
                    })
                    .await
                    .map(|_| ()),
            };
        }
        9 => {
            let filter = ItemFilter::new(P).key_prefix(format!("k{}", dice.roll(2)));
            match dice.roll(3) {
                0 => {
                    store
                        .items_retry_where(ItemsRetry::new(filter, admin))
                        .await
                }
                1 => {
                    store
                        .items_park_where(ItemsPark::new(filter, admin, "bulk"))
                        .await
                }
                _ => {
                    store
                        .items_delete_where(ItemsDelete::new(filter, admin))
                        .await
                }
            }
            .expect("bulk action");
        }
        10 => {
            // The session expires and is reclaimed: its runs are pending again.
            store.clock().advance(Duration::from_secs(31));
            store.session_reclaim().await.expect("reclaim");
            leases.clear();
            *session = new_session(store).await;
        }
        11 => {
            store
                .session_close(SessionClose { session: s })
                .await
                .expect("close");
            leases.clear();
            *session = new_session(store).await;
        }
        12 => {
            let prune = RetentionPrune {
                process: P.into(),
                cursor: PruneCursor::default(),
                batch: 5,
            };
            store.retention_prune(prune).await.expect("prune");
        }
        13 if !leases.is_empty() => {
            // Every run in flight ends in one batch, the first twice: claims and
            // completions of many keys count them once per statement.
            let outcomes: Vec<Outcome> = leases
                .iter()
                .map(|_| match dice.roll(3) {
                    0 => Outcome::Transient("flaky".into()),
                    _ => Outcome::Done,
                })
                .collect();
            let mut batch: Vec<LeaseComplete<'_>> = leases
                .iter()
                .zip(&outcomes)
                .map(|(lease, outcome)| LeaseComplete {
                    lease,
                    outcome,
                    trace_id: None,
                })
                .collect();
            batch.push(batch[0]);
            let _ = store.lease_complete_batch(&batch).await.expect("batch");
            drop(batch);
            leases.clear();
        }
        _ => store.clock().advance(Duration::from_millis(700)),
    }
}

async fn new_session(store: &Store) -> i64 {
    let start = SessionStart::new("test", Duration::from_secs(30));
    store.session_start(start).await.expect("session").id.0
}

#[tokio::test]
async fn counts_equal_a_real_count_after_random_operations() {
    each_enqueue_path_and_pooler(|db| async move {
        let store = &db.store;
        let forget = ProcessConfigure::new(P).forget_idle_after(Some(Duration::from_secs(2)));
        store.process_configure(forget).await.expect("configure");
        for seed in [1_u64, 7, 42, 1234] {
            let mut dice = Dice(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut leases = Vec::new();
            let mut session = new_session(store).await;
            for n in 0..120 {
                step(store, &mut dice, &mut leases, &mut session).await;
                if n % 10 == 9 {
                    let (stored, real) = (stored_counts(store).await, real_counts(store).await);
                    assert_eq!(stored, real, "seed {seed}, after step {n}");
                }
            }
        }
    })
    .await;
}

#[tokio::test]
async fn counts_of_a_state_no_item_is_in_are_zero_not_missing() {
    each_enqueue_path_and_pooler(|db| async move {
        let store = &db.store;
        store
            .item_enqueue(ItemEnqueue::new(P, ["a"]))
            .await
            .expect("enqueue");
        let filter = ItemFilter::new(P).state(ItemState::Pending);
        store
            .items_delete_where(ItemsDelete::new(filter, "test"))
            .await
            .expect("delete");
        let counts = store.process_counts_all().await.expect("counts");
        let c = &counts[0];
        assert_eq!(
            (c.pending, c.backoff, c.running, c.parked, c.idle),
            (0, 0, 0, 0, 0)
        );
    })
    .await;
}

#[tokio::test]
async fn a_batch_over_two_processes_counts_each_process_once_per_key() {
    each_engine_and_pooler(|db| async move {
        let store = &db.store;
        let session = drover::store::SessionId(new_session(store).await);
        let mut leases = Vec::new();
        for (process, n) in [("a", 30), ("b", 20)] {
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            store
                .item_enqueue(ItemEnqueue::new(process, keys))
                .await
                .expect("enqueue");
            let claim = LeaseClaim {
                session,
                process: process.into(),
                max: 25,
                trace_links: false,
            };
            leases.extend(store.lease_claim(claim).await.expect("claim").leases);
        }
        let counts = |c: &drover::store::ProcessCounts| (c.pending, c.running, c.idle);
        let now: Vec<_> = store.process_counts_all().await.expect("counts");
        assert_eq!(
            now.iter().map(counts).collect::<Vec<_>>(),
            [(5, 25, 0), (0, 20, 0)]
        );
        let done = Outcome::Done;
        let mut batch: Vec<LeaseComplete<'_>> = leases
            .iter()
            .map(|lease| LeaseComplete {
                lease,
                outcome: &done,
                trace_id: None,
            })
            .collect();
        batch.push(batch[3]);
        let results = store.lease_complete_batch(&batch).await.expect("batch");
        assert!(results[..45].iter().all(Result::is_ok));
        assert!(results[45].is_err(), "a lease completed twice in one batch");
        let now: Vec<_> = store.process_counts_all().await.expect("counts");
        assert_eq!(
            now.iter().map(counts).collect::<Vec<_>>(),
            [(5, 0, 25), (0, 0, 20)]
        );
    })
    .await;
}

/// One writer of [`counts_stay_exact_under_concurrent_writers`]: `steps`
/// random enqueues, claims, completions and releases under a session of its
/// own, on the same few keys as the other writers; it hands its runs in
/// flight back at the end, so the round ends quiescent.
async fn writer(store: Store, seed: u64, steps: usize) {
    let mut dice = Dice(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let session = drover::store::SessionId(new_session(&store).await);
    let mut leases: Vec<Lease> = Vec::new();
    for _ in 0..steps {
        match dice.roll(6) {
            0 | 1 => {
                let keys = [key(&mut dice), key(&mut dice)];
                let e = ItemEnqueue::new(P, keys);
                store.item_enqueue(e).await.expect("enqueue");
            }
            2 | 3 => {
                let max = u32::try_from(dice.roll(3)).expect("small") + 1;
                leases.extend(claim(&store, session, max).await);
            }
            4 if !leases.is_empty() => {
                let i = usize::try_from(dice.roll(leases.len() as u64)).expect("small");
                let lease = leases.remove(i);
                let outcome = match dice.roll(4) {
                    0 | 1 => Outcome::Done,
                    2 => Outcome::Transient("flaky".into()),
                    _ => Outcome::Permanent("broken".into()),
                };
                let done = LeaseComplete {
                    lease: &lease,
                    outcome: &outcome,
                    trace_id: None,
                };
                let answers = support::store::complete_batch_as_a_worker(&store, &[done]).await;
                answers[0].as_ref().expect("complete");
            }
            _ => {
                if let Some(lease) = leases.pop() {
                    let release = LeaseRelease { lease: &lease };
                    store.lease_release(release).await.expect("release");
                }
            }
        }
    }
    let close = SessionClose { session };
    store.session_close(close).await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_stay_exact_under_concurrent_writers() {
    each_engine_and_pooler(|db| async move {
        const WRITERS: u64 = 4;
        // 12 keys (see `key`): a sum of stored counts above it at any moment
        // is a count gone wrong (a negative one reads as zero, and shows at
        // the next quiescent comparison).
        const KEYS: u64 = 12;
        // Failed keys back off for an hour: none leaves backoff between the
        // stored counts and the recount, which split pending by the clock.
        support::store::configure(&db.store, 3600, 3600).await;
        let sampling = tokio_util::sync::CancellationToken::new();
        let sampler = tokio::spawn({
            let (store, stop) = (db.store.clone(), sampling.clone());
            async move {
                let mut samples = 0_u32;
                while !stop.is_cancelled() {
                    let counts = store.process_counts_all().await.expect("counts");
                    if let Some(c) = counts.iter().find(|c| c.process == P) {
                        let sum = c.pending + c.backoff + c.running + c.parked + c.idle;
                        assert!(sum <= KEYS, "{c:?}: more items counted than keys");
                        samples += 1;
                    }
                    tokio::task::yield_now().await;
                }
                samples
            }
        });
        for round in 0..6_u64 {
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| tokio::spawn(writer(db.store.clone(), round * WRITERS + w + 1, 25)))
                .collect();
            for w in writers {
                w.await.expect("a writer");
            }
            // Quiescent: every writer has ended and closed its session.
            let (stored, real) = (stored_counts(&db.store).await, real_counts(&db.store).await);
            assert_eq!(stored, real, "after round {round}");
        }
        sampling.cancel();
        let samples = sampler.await.expect("the sampler");
        assert!(samples > 0, "the counts were read while the writers ran");
    })
    .await;
}
