//! Retention, decided once for both engines: each engine does the steps with
//! its own SQL ([`PruneSteps`]); [`prune`] strings them into one batch and
//! keeps the pass's cursor, and [`runs_window`] reads a window of keys.

use std::future::Future;

use crate::store::StoreError;
use crate::store::params::RetentionPrune;
use crate::store::types::{PruneCursor, PruneReport};

/// A process's retention, as both engines store it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Rules {
    pub(crate) keep_runs_ms: i64,
    pub(crate) keep_runs_per_key: i32,
    pub(crate) forget_idle_ms: Option<i64>,
}

/// The steps of one retention batch, each its own short transaction, so a
/// claim never waits long behind pruning.
pub(crate) trait PruneSteps: Sync {
    /// The process's rules; `UnknownProcess` if it is not known.
    fn rules(&self, process: &str) -> impl Future<Output = Result<Rules, StoreError>> + Send;

    /// Deletes up to `batch` of the process's runs that ended before now −
    /// `keep_ms`; how many.
    fn prune_old(
        &self,
        process: &str,
        keep_ms: i64,
        batch: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Caps the runs of the keys in one window (see [`runs_window`]) after
    /// `after`, deleting at most `batch` of their runs over the cap, the
    /// oldest first; the runs deleted and where the next window starts
    /// (`None`: the walk reached the end). The window's last key may have
    /// any number of runs past the window, so the delete is bounded by
    /// itself: one step never holds the database for more than a batch.
    fn cap_window(
        &self,
        process: &str,
        after: Option<&str>,
        batch: u32,
        keep: u32,
    ) -> impl Future<Output = Result<(u64, Option<String>), StoreError>> + Send;

    /// Forgets the idle items untouched for `forget_ms` among one window of
    /// `batch` keys after `after`; how many, and where the next window starts.
    fn forget_window(
        &self,
        process: &str,
        after: Option<&str>,
        batch: u32,
        forget_ms: i64,
    ) -> impl Future<Output = Result<(u64, Option<String>), StoreError>> + Send;
}

/// One batch of a process's retention: runs past the period, then one window
/// of each walk that has not reached its end in this pass. The pass is done
/// when no old run is left and both walks have reached their end; the cursor
/// then starts over.
pub(crate) async fn prune<S: PruneSteps>(
    store: &S,
    params: RetentionPrune,
) -> Result<PruneReport, StoreError> {
    let process = params.process.as_str();
    let rules = store.rules(process).await?;
    let batch = batch(params.batch);
    let mut cursor = params.cursor;
    let aged = store.prune_old(process, rules.keep_runs_ms, batch).await?;
    let mut capped = 0;
    if !cursor.runs_finished {
        let keep = u32::try_from(rules.keep_runs_per_key.max(1)).unwrap_or(1);
        let (n, next) = store
            .cap_window(process, cursor.runs_key.as_deref(), batch, keep)
            .await?;
        capped = n;
        // A full delete may have left runs over the cap in this window (a
        // key with a long history): the next step reads it again.
        if n < u64::from(batch) {
            cursor.runs_finished = next.is_none();
            cursor.runs_key = next;
        }
    }
    let mut items = 0;
    match rules.forget_idle_ms {
        Some(ms) if !cursor.items_finished => {
            let (n, next) = store
                .forget_window(process, cursor.items_key.as_deref(), batch, ms)
                .await?;
            items = n;
            cursor.items_finished = next.is_none();
            cursor.items_key = next;
        }
        Some(_) => {}
        None => cursor.items_finished = true,
    }
    let done = aged < u64::from(batch) && cursor.runs_finished && cursor.items_finished;
    Ok(PruneReport {
        runs: aged + capped,
        items,
        cursor: if done { PruneCursor::default() } else { cursor },
        done,
    })
}

/// What a window of the runs' `(process, key)` index says: the keys whose runs
/// may exceed the per-key cap, and where to go on from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RunsWindow {
    /// Keys to cap: those with more runs in the window than the cap, and the
    /// window's last key when the window was full (its runs may go on past it).
    pub(crate) cap: Vec<String>,
    /// The next window starts after this key; `None` when the walk reached the
    /// end (the next one starts from the first key).
    pub(crate) next: Option<String>,
}

/// Reads a window of `(key, runs in the window)` in key order, read with at
/// most `batch` index entries: a window with fewer entries reached the end.
pub(crate) fn runs_window(window: Vec<(String, i64)>, batch: u32, keep: u32) -> RunsWindow {
    let entries: i64 = window.iter().map(|(_, n)| n).sum();
    let full = entries >= i64::from(batch);
    let last = window.len().saturating_sub(1);
    let mut cap = Vec::new();
    let mut next = None;
    for (i, (key, runs)) in window.into_iter().enumerate() {
        let ends_a_full_window = full && i == last;
        if runs > i64::from(keep) || ends_a_full_window {
            cap.push(key.clone());
        }
        if ends_a_full_window {
            next = Some(key);
        }
    }
    RunsWindow { cap, next }
}

/// The smallest batch a prune uses, so a step always moves forward.
fn batch(asked: u32) -> u32 {
    asked.max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(keys: &[(&str, i64)]) -> Vec<(String, i64)> {
        keys.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
    }

    #[test]
    fn a_short_window_ends_the_walk_and_caps_only_keys_over_the_limit() {
        let got = runs_window(w(&[("a", 3), ("b", 1), ("c", 2)]), 10, 2);
        assert_eq!(got.cap, ["a"]);
        assert_eq!(got.next, None);
    }

    #[test]
    fn a_full_window_goes_on_after_its_last_key_and_caps_it() {
        let got = runs_window(w(&[("a", 1), ("b", 3), ("c", 6)]), 10, 5);
        assert_eq!(got.cap, ["c"]);
        assert_eq!(got.next.as_deref(), Some("c"));
    }

    #[test]
    fn one_key_filling_the_window_is_capped_and_passed() {
        let got = runs_window(w(&[("a", 10)]), 10, 100);
        assert_eq!(got.cap, ["a"]);
        assert_eq!(got.next.as_deref(), Some("a"));
    }

    #[test]
    fn an_empty_window_ends_the_walk() {
        assert_eq!(
            runs_window(Vec::new(), 10, 1),
            RunsWindow {
                cap: Vec::new(),
                next: None
            }
        );
    }
}
