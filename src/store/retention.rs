//! Retention's walks, decided once for both engines: each engine reads a
//! window of keys with its own SQL and hands it here to learn which keys to
//! cap and where the next window starts.

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
pub(crate) fn batch(asked: u32) -> u32 {
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
