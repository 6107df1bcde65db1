//! How a run's outcome changes its item: the one state machine behind
//! `lease_complete`, shared by every engine so they cannot drift apart.
//!
//! Engines read the running row, call [`settle`], then write what it returns.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backoff::{Backoff, clamp_delay};
use crate::store::text::clean_text;
use crate::store::types::{Outcome, RunOutcome};

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

/// The state an item is left in after its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextState {
    /// Waiting to run again (a dirty re-run, a requeue, a retry after backoff).
    Pending,
    /// Stopped after a permanent error.
    Parked,
    /// Converged: known, nothing to do.
    Idle,
}

impl NextState {
    /// The stored name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Parked => "parked",
            Self::Idle => "idle",
        }
    }
}

/// The item's next row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NextRow {
    pub(crate) state: NextState,
    pub(crate) priority: i32,
    pub(crate) ready_at: DateTime<Utc>,
    pub(crate) enqueued_at: DateTime<Utc>,
    pub(crate) failures: u32,
    pub(crate) backoff_until: Option<DateTime<Utc>>,
    pub(crate) backoff: Option<Duration>,
    pub(crate) last_error: Option<String>,
    /// `last_error`'s [`error_signature`](crate::store::error_signature) for
    /// the key, set by [`NextRow::sign`] (the key is not known here).
    pub(crate) error_signature: Option<String>,
}

impl NextRow {
    /// Sets the error signature from the last error and `key`: what the error
    /// groups count and the bulk actions by signature match.
    pub(crate) fn sign(&mut self, key: &str) {
        self.error_signature = self
            .last_error
            .as_deref()
            .map(|e| crate::store::error_signature(key, e));
    }

    /// Whether the key is pending and ready by `now`: a re-run that idle
    /// controllers should be woken for (a key enqueued during its run).
    pub(crate) fn ready_by(&self, now: DateTime<Utc>) -> bool {
        self.state == NextState::Pending && self.ready_at <= now
    }
}

/// What to write after a run: the item's next row and the run's history row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    pub(crate) next: NextRow,
    /// How the run ended.
    pub(crate) outcome: RunOutcome,
    /// The run's error, as stored ([`clean_text`]).
    pub(crate) error: Option<String>,
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
        state: NextState::Pending,
        priority,
        ready_at,
        enqueued_at,
        failures,
        backoff_until: None,
        backoff: None,
        last_error: None,
        error_signature: None,
    }
}

/// Applies DESIGN.md rule 4 (outcomes) with rules 2 (dirty re-run) and 5 (backoff).
pub(crate) fn settle(now: DateTime<Utc>, run: &Running, outcome: &Outcome) -> Settled {
    let kind = RunOutcome::of(outcome);
    match outcome {
        Outcome::Done => {
            let next = match run.dirty {
                Some(d) => pending(run, d.ready_at, 0),
                None => NextRow {
                    state: NextState::Idle,
                    ..pending(run, now, 0)
                },
            };
            settled(next, kind, None)
        }
        Outcome::RequeueAfter(delay) => {
            // A requeue is the handler's own enqueue, made now: the next run
            // is pending since now, as after an enqueue with a delay. Kept
            // from the run's own enqueue, each run of a key that requeues
            // itself counted every earlier run and delay as its queue wait
            // (the 100th run of a key requeued hourly had waited 100 h).
            let mut next = pending(run, later(now, *delay), 0);
            if run.dirty.is_none() {
                next.enqueued_at = now;
            }
            settled(next, kind, None)
        }
        Outcome::Transient(error) => {
            let failures = run.failures.saturating_add(1);
            let delay = run.backoff.delay(failures);
            let until = later(now, delay);
            let mut next = pending(run, until, failures);
            next.ready_at = until;
            next.backoff_until = Some(until);
            next.backoff = Some(delay);
            settled(next, kind, Some(error))
        }
        Outcome::Permanent(error) => {
            // A permanent failure counts as a failed attempt like any other (the
            // item shows it), but parks instead of backing off, unless an
            // enqueue arrived during the run: that change deserves a run of
            // its own, so the item is pending again instead.
            let failures = run.failures.saturating_add(1);
            let next = match run.dirty {
                Some(d) => pending(run, d.ready_at, failures),
                None => NextRow {
                    state: NextState::Parked,
                    ..pending(run, now, failures)
                },
            };
            settled(next, kind, Some(error))
        }
    }
}

/// The settled run; its error text is stored as [`clean_text`] makes it, and
/// kept as the item's last error.
fn settled(mut next: NextRow, outcome: RunOutcome, error: Option<&str>) -> Settled {
    let error = error.map(|e| clean_text(e).into_owned());
    next.last_error.clone_from(&error);
    Settled {
        next,
        outcome,
        error,
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
    fn done_leaves_a_clean_item_idle_with_a_reset_count() {
        let s = settle(at(100), &running(3, None), &Outcome::Done);
        assert_eq!(s.next.state, NextState::Idle);
        assert!(!s.next.ready_by(at(100)), "an idle key is not woken for");
        assert_eq!((s.next.failures, s.next.last_error), (0, None));
        assert_eq!((s.outcome, s.error), (RunOutcome::Done, None));
    }

    #[test]
    fn done_on_a_dirty_item_makes_it_pending_once_with_a_reset_count() {
        let s = settle(at(100), &running(3, dirty(60, 5)), &Outcome::Done);
        let next = s.next;
        assert_eq!(next.state, NextState::Pending);
        assert_eq!(
            (next.ready_at, next.priority, next.failures),
            (at(60), 5, 0)
        );
        assert_eq!(next.enqueued_at, at(50));
    }

    #[test]
    fn requeue_after_takes_the_earlier_of_its_delay_and_the_dirty_ready_time() {
        let d = Outcome::RequeueAfter(Duration::from_secs(30));
        let clean = settle(at(100), &running(2, None), &d);
        assert_eq!(clean.outcome, RunOutcome::Requeued);
        let clean = clean.next;
        assert_eq!((clean.ready_at, clean.failures), (at(130), 0));
        assert_eq!(clean.enqueued_at, at(100), "pending since the requeue");
        let early = settle(at(100), &running(2, dirty(110, 0)), &d).next;
        assert_eq!((early.ready_at, early.priority), (at(110), 1));
        assert_eq!(
            early.enqueued_at,
            at(50),
            "pending since the enqueue during the run"
        );
    }

    #[test]
    fn transient_failures_back_off_exponentially_even_when_dirty() {
        let e = Outcome::Transient("boom".into());
        let first = settle(at(100), &running(0, None), &e);
        assert_eq!(
            (first.outcome, first.error.as_deref()),
            (RunOutcome::Retry, Some("boom"))
        );
        let first = first.next;
        assert_eq!((first.failures, first.ready_at), (1, at(101)));
        let fourth = settle(at(100), &running(3, dirty(0, 0)), &e).next;
        assert_eq!((fourth.failures, fourth.ready_at), (4, at(108)));
        assert_eq!(fourth.backoff_until, Some(at(108)));
        assert_eq!(fourth.last_error.as_deref(), Some("boom"));
    }

    #[test]
    fn permanent_counts_a_failure_parks_a_clean_item_and_requeues_a_dirty_one() {
        let e = Outcome::Permanent("bad spec".into());
        let parked = settle(at(100), &running(2, None), &e);
        assert_eq!(parked.outcome, RunOutcome::Parked);
        let next = parked.next;
        assert_eq!(next.state, NextState::Parked);
        assert_eq!(
            next.failures, 3,
            "a permanent failure is a failed attempt too"
        );
        assert_eq!(next.last_error.as_deref(), Some("bad spec"));
        let revived = settle(at(100), &running(2, dirty(90, 0)), &e).next;
        assert_eq!(revived.state, NextState::Pending);
        assert_eq!((revived.ready_at, revived.failures), (at(90), 3));
        assert_eq!(
            revived.backoff_until, None,
            "a permanent failure never backs off"
        );
    }

    #[test]
    fn huge_delays_do_not_overflow() {
        assert!(later(at(0), Duration::MAX) > at(0));
    }
}
