//! Recent activity per process (the overview's finished and failed columns),
//! as both engines assemble it from their rows: one page of processes, each
//! with its counts of runs ended within the window.

use super::pages;
use crate::store::types::{Page, ProcessActivity};

/// A process's counts as both engines read them: (process, runs that
/// converged, runs that failed).
pub(crate) type ActivityRow = (String, i64, i64);

/// `rows`, read in process order with [`pages::read_limit`], as a page of
/// `limit` processes' activity (a negative count, which no query produces,
/// as zero).
pub(crate) fn activity_page(rows: Vec<ActivityRow>, limit: u32) -> Page<ProcessActivity> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let rows = pages::cut(rows, limit, |(process, ..)| process.clone());
    Page {
        items: rows
            .items
            .into_iter()
            .map(|(process, finished, failed)| ProcessActivity {
                process,
                finished: count(finished),
                failed: count(failed),
            })
            .collect(),
        next: rows.next,
    }
}
