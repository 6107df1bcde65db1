//! The charts' series as both engines assemble them: runs bucketed by whole
//! minutes from a window's start (which is itself a whole minute, so a chart
//! does not shift between refreshes), and depth samples as read.

use chrono::{DateTime, Duration as Span, DurationRound as _, Utc};

use super::decode::run_outcome;
use crate::store::StoreError;
use crate::store::types::{DepthPoint, RunBucket, Series};

/// The start of a window of `window` ending at `now`: the whole minute at or
/// before `now - window`.
pub(crate) fn window_start(now: DateTime<Utc>, window: std::time::Duration) -> DateTime<Utc> {
    let back = Span::from_std(window).unwrap_or(Span::MAX);
    let start = now
        .checked_sub_signed(back)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    start.duration_trunc(Span::minutes(1)).unwrap_or(start)
}

/// A depth sample as both engines read it: (at, pending, backoff, running,
/// parked).
pub(crate) type SampleRow<T> = (T, i64, i64, i64, i64);

/// The series from the engines' rows: `(minute index, outcome, count)` and
/// the samples.
pub(crate) fn assemble<T: super::rows::Stamp>(
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    runs: Vec<(i64, String, i64)>,
    samples: Vec<SampleRow<T>>,
) -> Result<Series, StoreError> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let runs = runs
        .into_iter()
        .map(|(minute, outcome, n)| {
            Ok(RunBucket {
                at: start + Span::minutes(minute),
                outcome: run_outcome(&outcome)?,
                count: count(n),
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let depth = samples
        .into_iter()
        .map(|(at, pending, backoff, running, parked)| DepthPoint {
            at: at.time(),
            pending: count(pending),
            backoff: count(backoff),
            running: count(running),
            parked: count(parked),
        })
        .collect();
    Ok(Series {
        start,
        end,
        runs,
        depth,
    })
}
