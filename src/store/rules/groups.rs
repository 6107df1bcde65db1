//! Error groups and bulk actions, decided once for both engines.
//!
//! An error's **signature** is the error with the key replaced by `<key>` and
//! every run of ASCII digits by `<n>` ([`error_signature`]), so "machine-7:
//! timeout after 30s" and "machine-9: timeout after 31s" group together. It is
//! computed in Rust, one function for both engines, wherever the store writes
//! an item's last error, and kept beside it (`error_signature`; migration 0009
//! filled it for the errors stored before). The groups count that column and
//! the bulk actions by signature match that column, so a group and the keys
//! an action by its signature changes can never disagree. Each engine counts
//! the failing keys per signature straight from two partial indexes (parked
//! keys by signature; backing-off keys by when their backoff ends, carrying
//! the signature), reading no row per failing key, then one row per group for
//! its sample; [`merge`] adds up the parked and backing-off halves. That read
//! is bounded ([`MAX_TEXTS`] distinct signatures per state, most keys first);
//! only when more distinct signatures than that fail at once are the smallest
//! left out.
//!
//! A bulk action walks the process's keys in key order, one batch per short
//! transaction ([`BulkSteps`]): each engine reads a window of candidate rows
//! (narrowed in SQL by stored state and key prefix), [`window`] picks the rows
//! the whole filter matches, and the engine changes them and writes their
//! history rows in one statement per batch, never touching a running key. The
//! walk reads each key in the filter's stored states once (a filter by error
//! alone reads the parked and pending keys; by `parked`, only those), so its
//! cost grows with those keys, but no transaction holds more than one batch.

/// What replaces the key in a signature.
const KEY_MARK: &str = "<key>";
/// What replaces each run of ASCII digits in a signature.
const NUMBER_MARK: &str = "<n>";

/// The signature of `key`'s error `error`: the key replaced by `<key>` where
/// it stands on its own (not inside a longer word; a key of digits alone is
/// left to the numbers), then every run of ASCII digits by `<n>`. Errors that differ only by their key or their numbers
/// have the same signature.
///
/// A signature is at most [`MAX_SIGNATURE_BYTES`]: a longer one keeps its
/// start and ends in `…#` and a hash of the whole, so long errors that differ
/// only past the cut still group apart. (The signature is indexed, and
/// PostgreSQL refuses an index entry past about 2.7 KB; the error itself is
/// stored whole.)
///
/// ```
/// use drover::store::error_signature;
/// assert_eq!(
///     error_signature("vm-12", "vm-12: timeout after 30s (attempt 4)"),
///     "<key>: timeout after <n>s (attempt <n>)"
/// );
/// ```
#[must_use]
pub fn error_signature(key: &str, error: &str) -> String {
    bounded(numbers(&without_key(key, error)))
}

/// `error` with `key` replaced by `<key>` where it stands on its own, not
/// inside a longer word: where the key starts (ends) with a letter, a digit
/// or `_`, the character before (after) it must not be one. Replaced
/// everywhere, key `a` made "killed (signal: 13)" read "killed
/// (sign<key>l: <n>)", a group of its own. A key of digits alone is left to
/// [`numbers`], which replaces it with every other number.
fn without_key(key: &str, error: &str) -> String {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    if key.is_empty() || key.bytes().all(|b| b.is_ascii_digit()) {
        return error.to_owned();
    }
    let opens = key.chars().next().is_some_and(word);
    let closes = key.chars().next_back().is_some_and(word);
    let mut out = String::with_capacity(error.len());
    let mut at = 0;
    while let Some(found) = error[at..].find(key).map(|i| at + i) {
        let end = found + key.len();
        let before = error[..found].chars().next_back().is_some_and(word);
        let after = error[end..].chars().next().is_some_and(word);
        if opens && before {
            // Inside a longer word: no match starts before the word ends
            // (skipping it keeps the walk linear in the error's length).
            let next = error[found..]
                .char_indices()
                .find(|&(_, c)| !word(c))
                .map_or(error.len(), |(i, _)| found + i);
            out.push_str(&error[at..next]);
            at = next;
        } else if closes && after {
            // Runs on into a longer word: look again one character on.
            let next = found + error[found..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&error[at..next]);
            at = next;
        } else {
            out.push_str(&error[at..found]);
            out.push_str(KEY_MARK);
            at = end;
        }
    }
    out.push_str(&error[at..]);
    out
}

/// The longest [`error_signature`], in bytes.
pub const MAX_SIGNATURE_BYTES: usize = 1024;

/// `signature` cut to [`MAX_SIGNATURE_BYTES`] (at a character boundary) with
/// `…#` and the 64-bit FNV-1a hash of the whole in hex, if it is longer.
fn bounded(signature: String) -> String {
    if signature.len() <= MAX_SIGNATURE_BYTES {
        return signature;
    }
    // "…" (3 bytes), "#" and 16 hex digits.
    let mut cut = MAX_SIGNATURE_BYTES - 20;
    while !signature.is_char_boundary(cut) {
        cut -= 1;
    }
    let hash = signature
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    format!("{}…#{hash:016x}", &signature[..cut])
}

/// `text` with every run of ASCII digits replaced by `<n>`.
fn numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push_str(NUMBER_MARK);
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

#[cfg(feature = "_engine")]
pub(crate) use engine::*;

#[cfg(feature = "_engine")]
mod engine {
    use std::collections::HashMap;
    use std::future::Future;

    use crate::store::StoreError;
    use crate::store::error_signature;
    use crate::store::key::{validate_key_prefix, validate_process};
    use crate::store::params::{ItemFilter, ItemsDelete, ItemsPark, ItemsRetry};
    use crate::store::rules::decode::item_state;
    use crate::store::rules::rows::{Lossy, Stamp};
    use crate::store::text::clean_text;
    use crate::store::types::{ErrorGroup, ItemState, RunOutcome};

    /// The states an item's stored state and backoff show as, in the order groups
    /// list them.
    fn state_rank(state: ItemState) -> u8 {
        match state {
            ItemState::Parked => 0,
            ItemState::Backoff => 1,
            ItemState::Pending => 2,
            ItemState::Running => 3,
            ItemState::Idle => 4,
        }
    }

    /// The most distinct signatures per state an engine reads for
    /// [`error_groups`](crate::store::StoreEngine::error_groups).
    pub(crate) const MAX_TEXTS: u32 = 10_000;

    /// One row of an engine's grouping: the failing keys (`state` is `parked`
    /// or `backoff`) whose stored signature is `signature` (`''` for a key
    /// with no error), and the error of the first of them (by id).
    #[derive(Debug, sqlx::FromRow)]
    pub(crate) struct SignatureCount {
        pub(crate) signature: String,
        pub(crate) state: String,
        pub(crate) count: i64,
        pub(crate) sample: String,
    }

    /// Adds up the engine's rows per signature into groups, most keys first
    /// (then by signature), at most `limit`.
    pub(crate) fn merge(rows: Vec<SignatureCount>, limit: u32) -> Vec<ErrorGroup> {
        let mut groups: HashMap<String, ErrorGroup> = HashMap::new();
        for row in rows {
            let state = match row.state.as_str() {
                "parked" => ItemState::Parked,
                _ => ItemState::Backoff,
            };
            let signature = row.signature;
            let group = groups
                .entry(signature.clone())
                .or_insert_with(|| ErrorGroup {
                    signature,
                    sample: row.sample,
                    count: 0,
                    states: Vec::new(),
                });
            group.count += u64::try_from(row.count).unwrap_or(0);
            if !group.states.contains(&state) {
                group.states.push(state);
                group.states.sort_by_key(|s| state_rank(*s));
            }
        }
        let mut groups: Vec<_> = groups.into_values().collect();
        groups.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.signature.cmp(&b.signature))
        });
        groups.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        groups
    }

    /// An operator's action on every key a filter matches.
    #[derive(Debug, Clone)]
    pub(crate) struct Bulk {
        pub(crate) filter: ItemFilter,
        pub(crate) outcome: RunOutcome,
        /// The park reason (the keys' new last error).
        pub(crate) reason: Option<String>,
        pub(crate) actor: String,
        pub(crate) batch: u32,
    }

    impl From<ItemsRetry> for Bulk {
        fn from(p: ItemsRetry) -> Self {
            Self {
                filter: p.filter,
                outcome: RunOutcome::Retried,
                reason: None,
                actor: p.actor,
                batch: p.batch,
            }
        }
    }

    impl From<ItemsPark> for Bulk {
        fn from(p: ItemsPark) -> Self {
            Self {
                filter: p.filter,
                outcome: RunOutcome::Parked,
                reason: Some(clean_text(&p.reason).into_owned()),
                actor: p.actor,
                batch: p.batch,
            }
        }
    }

    impl From<ItemsDelete> for Bulk {
        fn from(p: ItemsDelete) -> Self {
            Self {
                filter: p.filter,
                outcome: RunOutcome::Deleted,
                reason: None,
                actor: p.actor,
                batch: p.batch,
            }
        }
    }

    /// The filter with empty conditions dropped; refused when no condition is
    /// left, when it asks for running keys, or when a text holds a NUL (no
    /// stored key or error does).
    fn checked(mut filter: ItemFilter) -> Result<ItemFilter, StoreError> {
        validate_process(&filter.process)?;
        if let Some(prefix) = &filter.key_prefix {
            validate_key_prefix(prefix)?;
        }
        if filter
            .error_signature
            .as_ref()
            .is_some_and(|t| t.contains('\0'))
        {
            return Err(StoreError::InvalidArgument(
                "an error signature cannot hold a NUL".into(),
            ));
        }
        filter.error_signature = filter.error_signature.filter(|s| !s.is_empty());
        filter.key_prefix = filter.key_prefix.filter(|s| !s.is_empty());
        if filter.state == Some(ItemState::Running) {
            return Err(StoreError::InvalidArgument(
                "running keys cannot be acted on: only their lease holder may end the run".into(),
            ));
        }
        if filter.state.is_none() && filter.error_signature.is_none() && filter.key_prefix.is_none()
        {
            return Err(StoreError::InvalidArgument(
                "give a state, an error signature or a key prefix: an action on every key \
                 of a process is refused"
                    .into(),
            ));
        }
        Ok(filter)
    }

    /// The stored states the filter's keys can be in (`backoff` is stored as
    /// `pending`), for the engine's window query.
    pub(crate) fn stored_states(filter: &ItemFilter) -> Vec<&'static str> {
        match (filter.state, &filter.error_signature) {
            (Some(ItemState::Parked), _) => vec!["parked"],
            (Some(ItemState::Pending | ItemState::Backoff), _) => vec!["pending"],
            (Some(ItemState::Idle), _) => vec!["idle"],
            (Some(ItemState::Running), _) => vec![],
            (None, Some(_)) => vec!["parked", "pending"],
            (None, None) => vec!["pending", "parked", "idle"],
        }
    }

    /// A candidate row of a bulk action's window; `id` is how the engine
    /// finds the locked row again (SQLite's `id`, PostgreSQL's `ctid`).
    #[derive(Debug, sqlx::FromRow)]
    pub(crate) struct CandidateRow<T, I = i64> {
        id: I,
        key: Lossy,
        error_signature: Option<String>,
        state: String,
        backoff_until: Option<T>,
    }

    /// What one window of the walk gave.
    #[derive(Debug)]
    pub(crate) struct Window<I = i64> {
        /// The rows the whole filter matches.
        pub(crate) ids: Vec<I>,
        /// Where the next window starts; `None` when the walk is over.
        pub(crate) next: Option<String>,
        /// For a park: the chosen rows' new error signatures (of the reason,
        /// per key), as a JSON object by id (as text).
        pub(crate) signatures: String,
    }

    /// Whether `row`, seen at `now`, matches the whole filter.
    fn matches<T: Stamp, I>(filter: &ItemFilter, row: &CandidateRow<T, I>, now: T) -> bool {
        let backing_off = row.backoff_until.is_some_and(|b| b > now);
        let Ok(seen) = item_state(&row.state, backing_off) else {
            return false;
        };
        let failing = matches!(seen, ItemState::Parked | ItemState::Backoff);
        seen != ItemState::Running
            && filter.state.is_none_or(|s| s == seen)
            && filter
                .key_prefix
                .as_deref()
                .is_none_or(|p| row.key.0.starts_with(p))
            && filter.error_signature.as_deref().is_none_or(|sig| {
                (filter.state.is_some() || failing)
                    && row.error_signature.as_deref().unwrap_or("") == sig
            })
    }

    /// Picks the rows of one window (read in key order, at most `batch`) the
    /// filter matches, and where the walk goes on: after the window's last
    /// key, unless the window was short or ran past the key prefix.
    pub(crate) fn window<T: Stamp, I: Copy + std::fmt::Display>(
        bulk: &Bulk,
        rows: &[CandidateRow<T, I>],
        now: T,
    ) -> Window<I> {
        let chosen: Vec<_> = rows
            .iter()
            .filter(|r| matches(&bulk.filter, r, now))
            .collect();
        let ids = chosen.iter().map(|r| r.id).collect();
        let signatures: serde_json::Map<String, serde_json::Value> = bulk
            .reason
            .as_deref()
            .map(|reason| {
                chosen
                    .iter()
                    .map(|r| (r.id.to_string(), error_signature(&r.key.0, reason).into()))
                    .collect()
            })
            .unwrap_or_default();
        let signatures = serde_json::Value::Object(signatures).to_string();
        let full = rows.len() >= usize::try_from(bulk.batch).unwrap_or(usize::MAX);
        let next = rows
            .last()
            .filter(|last| {
                full && bulk
                    .filter
                    .key_prefix
                    .as_deref()
                    .is_none_or(|p| last.key.0.starts_with(p))
            })
            .map(|last| last.key.0.clone());
        Window {
            ids,
            next,
            signatures,
        }
    }

    /// One batch of a bulk action, each engine with its own SQL.
    pub(crate) trait BulkSteps: Sync {
        /// `UnknownProcess` unless the process is known.
        fn known(&self, process: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

        /// In one transaction: reads the window of up to `bulk.batch` rows
        /// after `after` (key order, from the key prefix on, in the filter's
        /// [`stored_states`], never running), picks the matching ones with
        /// [`window`], applies the action to them and writes a history row
        /// for each changed key. The keys changed and where the walk goes on:
        /// a cursor of the engine's own, which only comes back as `after`
        /// (the last key on PostgreSQL, its bytes in hex on SQLite).
        fn bulk_batch(
            &self,
            bulk: &Bulk,
            after: Option<&str>,
        ) -> impl Future<Output = Result<(u64, Option<String>), StoreError>> + Send;
    }

    /// Applies `bulk` to every matching key, a batch at a time; how many keys
    /// changed. Batches committed before an error stay committed.
    pub(crate) async fn act_where<S: BulkSteps>(store: &S, bulk: Bulk) -> Result<u64, StoreError> {
        let bulk = Bulk {
            filter: checked(bulk.filter)?,
            batch: bulk.batch.max(1),
            ..bulk
        };
        store.known(&bulk.filter.process).await?;
        let mut changed = 0;
        let mut after: Option<String> = None;
        loop {
            let (n, next) = store.bulk_batch(&bulk, after.as_deref()).await?;
            changed += n;
            match next {
                Some(next) => after = Some(next),
                None => return Ok(changed),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_and_every_run_of_digits_are_replaced() {
        assert_eq!(
            error_signature("ns/a1", "ns/a1 failed: 503 after 12.5s"),
            "<key> failed: <n> after <n>.<n>s"
        );
        assert_eq!(error_signature("k", "no digits here"), "no digits here");
        assert_eq!(error_signature("x", ""), "");
    }

    #[test]
    fn a_long_signature_is_cut_with_a_hash_of_the_whole() {
        let long = "é".repeat(1500);
        let signature = error_signature("k", &long);
        assert!(
            signature.len() <= MAX_SIGNATURE_BYTES,
            "{}",
            signature.len()
        );
        assert!(long.starts_with(signature.split('…').next().expect("a start")));
        let other = format!("{long}!");
        assert_ne!(
            error_signature("k", &other),
            signature,
            "differs past the cut"
        );
        assert_eq!(error_signature("k", &long), signature, "stable");
        let fits = "a".repeat(MAX_SIGNATURE_BYTES);
        assert_eq!(error_signature("k", &fits), fits);
        assert_eq!(numbers("a123b4"), "a<n>b<n>");
        assert_eq!(numbers("٣ is not ASCII"), "٣ is not ASCII");
    }

    #[test]
    fn the_key_is_replaced_only_where_it_stands_on_its_own() {
        let signal = "killed (signal: 13): a failed";
        assert_eq!(
            error_signature("a", signal),
            "killed (signal: <n>): <key> failed"
        );
        assert_eq!(
            error_signature("b", "killed (signal: 9): b failed"),
            error_signature("a", signal),
            "one group for both keys"
        );
        assert_eq!(error_signature("ns/a", "ns/ab, ns/a."), "ns/ab, <key>.");
        assert_eq!(error_signature("-x-", "a-x-b"), "a<key>b");
        assert_eq!(error_signature("é", "café é"), "café <key>");
        assert_eq!(error_signature("aa", "aaa aa"), "aaa <key>");
        assert_eq!(error_signature("ab", "abab ab.ab"), "abab <key>.<key>");
        // Linear: a key that recurs inside one long word is not looked for
        // again at every character of it.
        let long = "a".repeat(200_000);
        let key = "a".repeat(1000);
        let signature = error_signature(&key, &long);
        assert!(!signature.contains(KEY_MARK), "the key stands in no word");
        assert_eq!(signature, error_signature("b", &long));
        assert_eq!(
            error_signature("7", "exit 7 after 17s"),
            error_signature("8", "exit 8 after 17s"),
            "a number for a key is a number"
        );
    }

    #[test]
    fn a_key_with_digits_is_replaced_before_the_numbers() {
        assert_eq!(
            error_signature("vm-42", "vm-42 down, vm-43 up"),
            "<key> down, vm-<n> up"
        );
    }
}
