//! Lists read a page at a time (DESIGN.md rule 13), as both engines page them:
//! a range of an index in key order (`WHERE key > after ORDER BY key LIMIT
//! n + 1`, never `OFFSET`, so the last page costs what the first does), one
//! row more than the page shows, so that a page knows whether another
//! follows and a caller walking the pages is never sent to an empty one.

use std::future::Future;

use crate::store::StoreError;
use crate::store::params::ProcessPage;
use crate::store::types::Page;

/// The page size of a walk over a whole list ([`every`]): large enough that
/// a list of a few thousand rows takes a handful of reads, small enough that
/// one read stays short.
pub(crate) const WALK: u32 = 1000;

/// How many rows to read for a page of `limit`: one more than it shows (a
/// `limit` of 0 shows one row, as a page of nothing would never move on).
#[cfg(feature = "_engine")]
pub(crate) fn read_limit(limit: u32) -> i64 {
    i64::from(limit.max(1)) + 1
}

/// `rows`, read in key order with [`read_limit`], as a page of `limit`:
/// `next` is the key of its last row when the read found one more.
#[cfg(feature = "_engine")]
pub(crate) fn cut<T, A>(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> A) -> Page<T, A> {
    let shown = usize::try_from(limit.max(1)).unwrap_or(usize::MAX);
    let next = rows.get(shown).and(rows.get(shown - 1)).map(key);
    rows.truncate(shown);
    Page { items: rows, next }
}

/// Every row of a list, `read` a page at a time from the start, following
/// each page's `next`: for a caller that needs the whole list (`/metrics`,
/// `drover status`, the depth samples), which still reads it in bounded
/// steps.
pub(crate) async fn every<T, A, R, F>(mut read: R) -> Result<Vec<T>, StoreError>
where
    R: FnMut(Option<A>) -> F,
    F: Future<Output = Result<Page<T, A>, StoreError>>,
{
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = read(after).await?;
        all.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(all),
        }
    }
}

/// Every known process's rows of a per-process list (their counts), `read`
/// a page of [`WALK`] processes at a time: what `/metrics`, `drover status`
/// and the depth samples need of each process.
pub(crate) async fn every_process<T, R, F>(mut read: R) -> Result<Vec<T>, StoreError>
where
    R: FnMut(ProcessPage) -> F,
    F: Future<Output = Result<Page<T, String>, StoreError>>,
{
    every(|after| read(ProcessPage { after, limit: WALK })).await
}

/// The rows of at most the first `max` known processes of a per-process
/// list, `read` a page of at most [`WALK`] processes at a time, and whether
/// more processes follow: for a reader that must stay bounded whatever the
/// database holds (`/metrics`).
#[cfg(feature = "server")]
pub(crate) async fn first_processes<T, R, F>(
    mut read: R,
    max: usize,
) -> Result<(Vec<T>, bool), StoreError>
where
    R: FnMut(ProcessPage) -> F,
    F: Future<Output = Result<Page<T, String>, StoreError>>,
{
    let mut rows = Vec::new();
    let mut after = None;
    let mut seen = 0;
    while seen < max {
        let limit = u32::try_from(max - seen).map_or(WALK, |left| left.min(WALK));
        let page = read(ProcessPage { after, limit }).await?;
        seen += page.items.len().max(1);
        rows.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok((rows, false)),
        }
    }
    Ok((rows, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_walk_follows_every_next_and_stops_at_the_last_page() {
        let rows = ["a", "b", "c", "d", "e"];
        let mut asked = Vec::new();
        let all = every(|after: Option<usize>| {
            asked.push(after);
            let from = after.map_or(0, |a| a + 1);
            let items: Vec<&str> = rows.iter().skip(from).take(2).copied().collect();
            let next = (from + 2 < rows.len()).then_some(from + 1);
            async move { Ok(Page { items, next }) }
        })
        .await
        .expect("no read fails");
        assert_eq!(all, rows);
        assert_eq!(asked, [None, Some(1), Some(3)]);
    }

    #[cfg(feature = "_engine")]
    #[test]
    fn a_page_has_a_next_only_when_a_row_follows_it() {
        let full = cut(vec!["a", "b", "c"], 2, |r| r.to_string());
        assert_eq!(full.items, ["a", "b"]);
        assert_eq!(full.next.as_deref(), Some("b"));
        let last = cut(vec!["a", "b"], 2, |r| r.to_string());
        assert_eq!(last.items, ["a", "b"]);
        assert_eq!(last.next, None, "exactly full, nothing after it");
        let zero = cut(vec!["a", "b"], 0, |r| r.to_string());
        assert_eq!(zero.items, ["a"]);
        assert_eq!(zero.next.as_deref(), Some("a"));
        assert_eq!(read_limit(2), 3);
        assert_eq!(read_limit(0), 2);
    }
}
