//! How a run's outcome changes its item: the one state machine behind
//! `lease_complete`, shared by every engine so they cannot drift apart.
//!
//! Engines read the running row, call [`settle`], then write what it returns.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::text::clean_text;
use super::types::{EventKind, Outcome};
use crate::backoff::{Backoff, clamp_delay};

/// `at + delay`, with the delay clamped to [`crate::backoff::MAX_DELAY`] so the sum
/// can never overflow.
pub(crate) fn later(at: DateTime<Utc>, delay: Duration) -> DateTime<Utc> {
    let delay = chrono::Duration::from_std(clamp_delay(delay)).unwrap_or(chrono::Duration::MAX);
    at.checked_add_signed(delay)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at - delay`, clamped like [`later`].
#[cfg(feature = "postgres")] // only the PostgreSQL engine uses it
pub(crate) fn earlier(at: DateTime<Utc>, delay: Duration) -> DateTime<Utc> {
    let delay = chrono::Duration::from_std(clamp_delay(delay)).unwrap_or(chrono::Duration::MAX);
    at.checked_sub_signed(delay)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The dirty mark left by enqueues that arrived while the item was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dirty {
    /// When the first such enqueue arrived.
    pub(crate) since: DateTime<Utc>,
    /// The earliest ready time they asked for.
    pub(crate) ready_at: DateTime<Utc>,
    /// The highest priority they asked for.
    pub(crate) priority: i32,
}

/// The parts of a running item that its outcome depends on.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) priority: i32,
    pub(crate) failures: u32,
    pub(crate) enqueued_at: DateTime<Utc>,
    pub(crate) dirty: Option<Dirty>,
    pub(crate) backoff: Backoff,
}

/// The item's next row, when it stays.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NextRow {
    /// `true` = parked, `false` = pending.
    pub(crate) parked: bool,
    pub(crate) priority: i32,
    pub(crate) ready_at: DateTime<Utc>,
    pub(crate) enqueued_at: DateTime<Utc>,
    pub(crate) failures: u32,
    pub(crate) backoff_until: Option<DateTime<Utc>>,
    pub(crate) backoff: Option<Duration>,
    pub(crate) last_error: Option<String>,
}

impl NextRow {
    /// Whether the key is pending and ready by `now`: a re-run that idle
    /// controllers should be woken for (a key enqueued during its run).
    pub(crate) fn ready_by(&self, now: DateTime<Utc>) -> bool {
        !self.parked && self.ready_at <= now
    }
}

/// A history event to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) kind: EventKind,
    pub(crate) error: Option<String>,
    pub(crate) transient: Option<bool>,
}

/// What to write after a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    /// `None` = delete the row.
    pub(crate) next: Option<NextRow>,
    pub(crate) events: Vec<Event>,
}

/// An event; its error text is stored as [`clean_text`] makes it.
fn event(kind: EventKind, error: Option<&str>, transient: Option<bool>) -> Event {
    Event {
        kind,
        error: error.map(|e| clean_text(e).into_owned()),
        transient,
    }
}

/// The pending row a dirty re-run gets, given the ready time and priority the
/// outcome itself asks for (earliest ready time and highest priority win).
fn pending(run: &Running, ready_at: DateTime<Utc>, failures: u32) -> NextRow {
    let (ready_at, priority, enqueued_at) = match run.dirty {
        Some(d) => (
            ready_at.min(d.ready_at),
            run.priority.max(d.priority),
            d.since,
        ),
        None => (ready_at, run.priority, run.enqueued_at),
    };
    NextRow {
        parked: false,
        priority,
        ready_at,
        enqueued_at,
        failures,
        backoff_until: None,
        backoff: None,
        last_error: None,
    }
}

/// Applies DESIGN.md rule 4 (outcomes) with rules 2 (dirty re-run) and 5 (backoff).
pub(crate) fn settle(now: DateTime<Utc>, run: &Running, outcome: &Outcome) -> Settled {
    match outcome {
        Outcome::Done => Settled {
            next: run.dirty.map(|d| pending(run, d.ready_at, 0)),
            events: vec![event(EventKind::Finished, None, None)],
        },
        Outcome::RequeueAfter(delay) => Settled {
            next: Some(pending(run, later(now, *delay), 0)),
            events: vec![event(EventKind::Finished, None, None)],
        },
        Outcome::Transient(error) => {
            let failures = run.failures.saturating_add(1);
            let delay = run.backoff.delay(failures);
            let until = later(now, delay);
            let mut next = pending(run, until, failures);
            next.ready_at = until;
            next.backoff_until = Some(until);
            next.backoff = Some(delay);
            let failed = event(EventKind::Failed, Some(error), Some(true));
            next.last_error.clone_from(&failed.error);
            Settled {
                next: Some(next),
                events: vec![failed],
            }
        }
        Outcome::Permanent(error) => settle_permanent(now, run, error),
    }
}

/// A permanent error parks the item, unless an enqueue arrived during the run: that
/// change deserves a run of its own, so the item is pending again instead.
fn settle_permanent(now: DateTime<Utc>, run: &Running, error: &str) -> Settled {
    let failed = event(EventKind::Failed, Some(error), Some(false));
    let mut next = match run.dirty {
        Some(d) => pending(run, d.ready_at, 0),
        None => NextRow {
            parked: true,
            ..pending(run, now, 0)
        },
    };
    next.last_error.clone_from(&failed.error);
    let events = if next.parked {
        let parked = Event {
            kind: EventKind::Parked,
            error: failed.error.clone(),
            transient: None,
        };
        vec![failed, parked]
    } else {
        vec![failed]
    };
    Settled {
        next: Some(next),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).expect("in range")
    }

    fn running(failures: u32, dirty: Option<Dirty>) -> Running {
        Running {
            priority: 1,
            failures,
            enqueued_at: at(10),
            dirty,
            backoff: Backoff::default(),
        }
    }

    fn dirty(ready: i64, priority: i32) -> Option<Dirty> {
        Some(Dirty {
            since: at(50),
            ready_at: at(ready),
            priority,
        })
    }

    #[test]
    fn done_deletes_a_clean_item() {
        let s = settle(at(100), &running(3, None), &Outcome::Done);
        assert_eq!(s.next, None);
        assert_eq!(s.events[0].kind, EventKind::Finished);
    }

    #[test]
    fn done_on_a_dirty_item_makes_it_pending_once_with_a_reset_count() {
        let s = settle(at(100), &running(3, dirty(60, 5)), &Outcome::Done);
        let next = s.next.expect("pending again");
        assert!(!next.parked);
        assert_eq!(
            (next.ready_at, next.priority, next.failures),
            (at(60), 5, 0)
        );
        assert_eq!(next.enqueued_at, at(50));
    }

    #[test]
    fn requeue_after_takes_the_earlier_of_its_delay_and_the_dirty_ready_time() {
        let d = Outcome::RequeueAfter(Duration::from_secs(30));
        let clean = settle(at(100), &running(2, None), &d).next.expect("stays");
        assert_eq!((clean.ready_at, clean.failures), (at(130), 0));
        let early = settle(at(100), &running(2, dirty(110, 0)), &d)
            .next
            .expect("stays");
        assert_eq!((early.ready_at, early.priority), (at(110), 1));
    }

    #[test]
    fn transient_failures_back_off_exponentially_even_when_dirty() {
        let e = Outcome::Transient("boom".into());
        let first = settle(at(100), &running(0, None), &e).next.expect("stays");
        assert_eq!((first.failures, first.ready_at), (1, at(101)));
        let fourth = settle(at(100), &running(3, dirty(0, 0)), &e)
            .next
            .expect("stays");
        assert_eq!((fourth.failures, fourth.ready_at), (4, at(108)));
        assert_eq!(fourth.backoff_until, Some(at(108)));
        assert_eq!(fourth.last_error.as_deref(), Some("boom"));
    }

    #[test]
    fn permanent_parks_a_clean_item_and_requeues_a_dirty_one() {
        let e = Outcome::Permanent("bad spec".into());
        let parked = settle(at(100), &running(2, None), &e);
        let next = parked.next.expect("stays");
        assert!(next.parked);
        assert_eq!(next.failures, 0);
        let kinds: Vec<_> = parked.events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Failed, EventKind::Parked]);
        let revived = settle(at(100), &running(2, dirty(90, 0)), &e)
            .next
            .expect("stays");
        assert!(!revived.parked);
        assert_eq!(revived.ready_at, at(90));
    }

    #[test]
    fn huge_delays_do_not_overflow() {
        assert!(later(at(0), Duration::MAX) > at(0));
    }
}
