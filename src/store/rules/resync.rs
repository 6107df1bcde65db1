//! Resync, decided once for both engines: when a process's next pass is due,
//! which idle keys of a window are due, and where the walk goes on. Each
//! engine reads and writes the rows with its own SQL (one short transaction
//! per batch) and asks these functions what to do.
//!
//! A key's resync is measured from its **last run's end** (its enqueue, for a
//! key that never ran): an idle key is due `every × (1 + jitter × h)` after
//! it, where `h` in `[0, 1)` comes from a stable hash of the key. So a key is
//! looked at again at least `every` and at most `every × (1 + jitter)` after
//! it last converged, each key at its own point of that span (keys that
//! converged together do not come back together), and a key that ran for an
//! event meanwhile is not resynced on top of it.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::StoreError;
use crate::store::key::validate_process;
use crate::store::params::ResyncBatch;
use crate::store::types::ResyncReport;

/// The shortest gap between two passes, as a fraction of the interval: a key
/// is resynced at most this late after it is due (plus the walk's own time),
/// and a process whose keys are due one after another is walked at most
/// twenty times per interval.
const PASS_GAP: f64 = 0.05;

/// A process's resync as both engines store it.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub(crate) struct Rules {
    pub(crate) resync_every_ms: Option<i64>,
    pub(crate) resync_jitter: f64,
    pub(crate) resync_priority: i32,
}

impl Rules {
    /// The interval, `None` when the process never resyncs.
    pub(crate) fn every(&self) -> Option<Duration> {
        let ms = u64::try_from(self.resync_every_ms?).ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    }
}

/// The shared walk of one process, between two batches.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Walk {
    /// The pass in progress is past this key; `None` between passes.
    pub(crate) walk_key: Option<String>,
    /// When the current (or last) pass started.
    pub(crate) pass_started_at: Option<DateTime<Utc>>,
    /// The earliest due time among the keys this pass saw and left idle.
    pub(crate) pass_next_due: Option<DateTime<Utc>>,
    /// Keys this pass resynced so far.
    pub(crate) pass_resynced: i64,
    /// The last finished pass's earliest due time: when the next key is due.
    pub(crate) next_due_at: Option<DateTime<Utc>>,
}

impl Walk {
    /// Whether a pass is under way (a batch then always goes on with it).
    pub(crate) fn in_pass(&self) -> bool {
        self.walk_key.is_some()
    }
}

/// When the pass after the one that started at `started` should start: when
/// the earliest key it left idle is due, and at the latest one interval
/// later (a key that converged after the pass read its place is due no
/// sooner), never sooner than [`PASS_GAP`] of the interval after `started`.
pub(crate) fn next_pass(
    started: Option<DateTime<Utc>>,
    next_due: Option<DateTime<Utc>>,
    every: Duration,
) -> Option<DateTime<Utc>> {
    let started = started?;
    let latest = after(started, every);
    let earliest = after(started, every.mul_f64(PASS_GAP));
    Some(next_due.map_or(latest, |due| due.min(latest)).max(earliest))
}

/// Whether a batch at `now` should walk: a pass is under way, or the next
/// one is due (or `start` asks for one now).
pub(crate) fn walks(walk: &Walk, every: Duration, now: DateTime<Utc>, start: bool) -> bool {
    start
        || walk.in_pass()
        || next_pass(walk.pass_started_at, walk.next_due_at, every).is_none_or(|at| at <= now)
}

/// `h(key)` in `[0, 1)`: FNV-1a, stable across builds and platforms (unlike
/// std's hasher), so every node puts a key at the same point of its span;
/// then MurmurHash3's finaliser, since FNV leaves the top bits of keys that
/// differ only at the end (`key-1`, `key-2`) nearly equal.
pub(crate) fn spread(key: &str) -> f64 {
    let mut hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    // The top 53 bits fit an f64 exactly: a fraction below 1.
    const TWO_53: f64 = 9_007_199_254_740_992.0;
    (hash >> 11) as f64 / TWO_53
}

/// When an idle `key` whose last run ended at `base` is due.
pub(crate) fn due(key: &str, base: DateTime<Utc>, every: Duration, jitter: f64) -> DateTime<Utc> {
    let stretch = 1.0 + jitter.clamp(0.0, 1.0) * spread(key);
    after(base, every.mul_f64(stretch))
}

/// `at + span`, the span as the process set it: a resync interval may be up
/// to 100 years, not clamped to the 180 days a delay is ([`later`](super::settle::later)), which
/// made a longer interval's keys due, and its passes follow, at 180 days
/// (and those keys come back late: they are resynced only once they did not
/// run for the whole interval). Saturates at the latest time there is.
fn after(at: DateTime<Utc>, span: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(span)
        .ok()
        .and_then(|span| at.checked_add_signed(span))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A row of a window: its key, whether it is idle, and when its last run
/// ended (its enqueue, if it never ran). Rows that are not idle only move the
/// walk on, so a window reads exactly `batch` rows whatever their states.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) key: String,
    /// How the engine names this row's place in key order: where the next
    /// window starts after it, and what [`ResyncSteps::resync`] is given for
    /// it. The key itself on PostgreSQL; on SQLite its bytes in hex, since a
    /// key SQL wrote as text that is not UTF-8 is read with U+FFFD, which
    /// neither sorts nor matches as the stored bytes do.
    pub(crate) cursor: String,
    pub(crate) idle: bool,
    pub(crate) base: DateTime<Utc>,
}

/// What one window of idle keys gave.
#[derive(Debug, PartialEq)]
pub(crate) struct Window {
    /// The keys due now, in key order, as their cursors ([`Seen::cursor`]).
    pub(crate) due: Vec<String>,
    /// The earliest due time of the keys left idle.
    pub(crate) next_due: Option<DateTime<Utc>>,
    /// Where the walk goes on (a cursor); `None` when the window was short
    /// (the pass ends with this batch).
    pub(crate) next: Option<String>,
}

/// Picks the due keys of a window read in key order with at most `batch`
/// rows.
pub(crate) fn window(rows: &[Seen], rules: &Rules, now: DateTime<Utc>, batch: u32) -> Window {
    let every = rules.every().unwrap_or(Duration::MAX);
    let mut due_keys = Vec::new();
    let mut next_due: Option<DateTime<Utc>> = None;
    for row in rows.iter().filter(|r| r.idle) {
        let at = due(&row.key, row.base, every, rules.resync_jitter);
        if at <= now {
            due_keys.push(row.cursor.clone());
        } else {
            next_due = Some(next_due.map_or(at, |n| n.min(at)));
        }
    }
    let full = rows.len() >= usize::try_from(batch).unwrap_or(usize::MAX);
    Window {
        due: due_keys,
        next_due,
        next: rows.last().filter(|_| full).map(|r| r.cursor.clone()),
    }
}

/// The walk after a batch that read `window` and resynced `resynced` keys
/// (a pass that was not under way starts at `now`), whether the pass ended
/// with it (its figures then become the published ones), and how many keys
/// the pass resynced so far.
pub(crate) fn advance(
    walk: &Walk,
    window: &Window,
    resynced: u64,
    now: DateTime<Utc>,
) -> (Walk, bool, i64) {
    let fresh = !walk.in_pass();
    let (started, next_due, count) = if fresh {
        (Some(now), None, 0)
    } else {
        (walk.pass_started_at, walk.pass_next_due, walk.pass_resynced)
    };
    let next_due = match (next_due, window.next_due) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let count = count.saturating_add(i64::try_from(resynced).unwrap_or(i64::MAX));
    let finished = window.next.is_none();
    let next = Walk {
        walk_key: window.next.clone(),
        pass_started_at: started,
        pass_next_due: if finished { None } else { next_due },
        pass_resynced: if finished { 0 } else { count },
        next_due_at: if finished { next_due } else { walk.next_due_at },
    };
    (next, finished, count)
}

/// The steps of one resync batch, each engine with its own SQL, all in one
/// transaction (`Tx`) that [`batch`] strings together.
pub(crate) trait ResyncSteps: Sync {
    /// The engine's transaction.
    type Tx: Send;

    /// Starts the batch's transaction and reads the clock in it.
    fn begin(&self) -> impl Future<Output = Result<(Self::Tx, DateTime<Utc>), StoreError>> + Send;

    /// The process's resync; `None` if the process is not known.
    fn rules(
        &self,
        tx: &mut Self::Tx,
        process: &str,
    ) -> impl Future<Output = Result<Option<Rules>, StoreError>> + Send;

    /// The process's walk, its row created if missing and locked for the
    /// transaction; `None` when another node holds it (it is walking now).
    fn walk(
        &self,
        tx: &mut Self::Tx,
        process: &str,
    ) -> impl Future<Output = Result<Option<Walk>, StoreError>> + Send;

    /// The next `batch` items of the process after `after`, in key order,
    /// whatever their state, unlocked.
    fn window(
        &self,
        tx: &mut Self::Tx,
        process: &str,
        after: &str,
        batch: u32,
    ) -> impl Future<Output = Result<Vec<Seen>, StoreError>> + Send;

    /// Makes the `keys` that are still idle, and did not run since `since`,
    /// pending at `priority`, pending since `now` (`change` is `(priority,
    /// now, since)`); how many.
    fn resync(
        &self,
        tx: &mut Self::Tx,
        process: &str,
        keys: &[String],
        change: (i32, DateTime<Utc>, DateTime<Utc>),
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Stores the walk; when the pass `finished`, also when it ended (`now`)
    /// and how many keys it resynced (`total`); `end` is `(finished, total,
    /// now)`.
    fn save(
        &self,
        tx: &mut Self::Tx,
        process: &str,
        walk: &Walk,
        end: (bool, i64, DateTime<Utc>),
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Commits; `wake` asks to wake the process's workers on every node.
    fn commit(
        &self,
        tx: Self::Tx,
        process: &str,
        wake: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// One batch of a process's resync
/// ([`resync_batch`](crate::store::StoreEngine::resync_batch)) in one transaction.
pub(crate) async fn batch<S: ResyncSteps>(
    store: &S,
    params: &ResyncBatch,
) -> Result<ResyncReport, StoreError> {
    validate_process(&params.process)?;
    let process = params.process.as_str();
    let done = ResyncReport {
        resynced: 0,
        done: true,
    };
    let (mut tx, now) = store.begin().await?;
    let rules = store
        .rules(&mut tx, process)
        .await?
        .ok_or_else(|| StoreError::UnknownProcess(process.to_owned()))?;
    let Some(every) = rules.every() else {
        return Ok(done);
    };
    let Some(walk) = store.walk(&mut tx, process).await? else {
        return Ok(done);
    };
    if !walks(&walk, every, now, params.start) {
        store.commit(tx, process, false).await?;
        return Ok(done);
    }
    let size = params.batch.max(1);
    let after = walk.walk_key.as_deref().unwrap_or("");
    let rows = store.window(&mut tx, process, after, size).await?;
    let window = window(&rows, &rules, now, size);
    let resynced = if window.due.is_empty() {
        0
    } else {
        let since = now
            .checked_sub_signed(chrono::Duration::from_std(every).unwrap_or(chrono::Duration::MAX))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let change = (rules.resync_priority, now, since);
        store.resync(&mut tx, process, &window.due, change).await?
    };
    let (next, finished, total) = advance(&walk, &window, resynced, now);
    store
        .save(&mut tx, process, &next, (finished, total, now))
        .await?;
    store.commit(tx, process, resynced > 0).await?;
    Ok(ResyncReport {
        resynced,
        done: finished,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).expect("a valid time")
    }

    fn rules(every_s: i64, jitter: f64) -> Rules {
        Rules {
            resync_every_ms: Some(every_s * 1000),
            resync_jitter: jitter,
            resync_priority: -100,
        }
    }

    #[test]
    fn spread_is_stable_below_one_and_spreads_keys() {
        assert_eq!(spread("a/b"), spread("a/b"));
        let values: Vec<f64> = (0..1000).map(|i| spread(&format!("key-{i}"))).collect();
        assert!(values.iter().all(|v| (0.0..1.0).contains(v)));
        let low = values.iter().filter(|v| **v < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 below one half");
    }

    #[test]
    fn a_key_is_due_between_one_interval_and_one_plus_jitter() {
        let every = Duration::from_secs(3600);
        for i in 0..100 {
            let key = format!("k{i}");
            let d = due(&key, at(0), every, 0.1);
            assert!(d >= at(3600) && d < at(3960), "{key}: {d}");
        }
        assert_eq!(due("k", at(10), every, 0.0), at(3610));
    }

    #[test]
    fn a_window_resyncs_only_due_keys_and_keeps_the_earliest_other() {
        let seen = |key: &str, idle, base| Seen {
            key: key.into(),
            cursor: key.into(),
            idle,
            base: at(base),
        };
        let rows = [
            seen("a", true, 0),
            seen("b", true, 50),
            seen("c", true, 20),
            seen("d", false, 0),
        ];
        let got = window(&rows, &rules(100, 0.0), at(110), 10);
        assert_eq!(got.due, ["a"]);
        assert_eq!(got.next_due, Some(at(120)));
        assert_eq!(got.next, None);
        let got = window(&rows, &rules(100, 0.0), at(110), 4);
        assert_eq!(got.next.as_deref(), Some("d"), "a full window goes on");
    }

    #[test]
    fn a_pass_publishes_its_earliest_due_time_when_it_ends() {
        let first = Window {
            due: vec!["a".into()],
            next_due: Some(at(500)),
            next: Some("m".into()),
        };
        let (walk, finished, total) = advance(&Walk::default(), &first, 1, at(100));
        assert_eq!(total, 1);
        assert!(!finished);
        assert_eq!(walk.walk_key.as_deref(), Some("m"));
        assert_eq!(walk.pass_started_at, Some(at(100)));
        let last = Window {
            due: vec![],
            next_due: Some(at(300)),
            next: None,
        };
        let (walk, finished, total) = advance(&walk, &last, 2, at(101));
        assert_eq!(total, 3);
        assert!(finished);
        assert_eq!(walk.walk_key, None);
        assert_eq!(walk.next_due_at, Some(at(300)));
        assert_eq!(walk.pass_started_at, Some(at(100)));
    }

    #[test]
    fn the_next_pass_waits_for_the_next_due_key_within_bounds() {
        let every = Duration::from_secs(1000);
        // The next key is due before the interval ends.
        assert_eq!(next_pass(Some(at(0)), Some(at(300)), every), Some(at(300)));
        // None seen: one interval after the pass started.
        assert_eq!(next_pass(Some(at(0)), None, every), Some(at(1000)));
        // Never sooner than the gap.
        assert_eq!(next_pass(Some(at(0)), Some(at(1)), every), Some(at(50)));
        // Never walked: now.
        assert!(walks(&Walk::default(), every, at(0), false));
        let walk = Walk {
            pass_started_at: Some(at(0)),
            next_due_at: Some(at(300)),
            ..Walk::default()
        };
        assert!(!walks(&walk, every, at(299), false));
        assert!(walks(&walk, every, at(300), false));
        assert!(walks(&walk, every, at(10), true));
    }
}
