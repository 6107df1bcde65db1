//! [`SlowReads`]: the process page's expensive reads (error groups over every
//! failing key, the hour of runs behind the chart) kept for a few seconds,
//! but only once they proved slow. On a small process every request reads
//! afresh, so what an operator just did shows at once; on one with tens of
//! thousands of failing keys a page that refreshes every five seconds stops
//! paying for the same grouping again and again, and says how old it is.
//! An operator's bulk action from the dashboard drops the process's entries.
//! Any viewer can ask for a page of any process name, known or not: the
//! entries are bounded ([`MOST`]), stale ones dropped first, then the
//! oldest, so names asked for cannot grow the server's memory.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::store::{ErrorGroup, Series, StoreError};

/// A read slower than this is kept.
const SLOW: Duration = Duration::from_millis(25);
/// For this long.
const KEEP: Duration = Duration::from_secs(10);
/// The most processes kept at once: many more than a dashboard's viewers
/// look at within [`KEEP`].
const MOST: usize = 64;

/// What a read returned and when, for one process.
#[derive(Debug, Clone, Default)]
struct Entry {
    groups: Option<(Instant, Vec<ErrorGroup>)>,
    series: Option<(Instant, Series)>,
}

impl Entry {
    /// When its latest read was kept.
    fn newest(&self) -> Option<Instant> {
        let groups = self.groups.as_ref().map(|(at, _)| *at);
        let series = self.series.as_ref().map(|(at, _)| *at);
        groups.max(series)
    }
}

/// The kept reads, per process; cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlowReads {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

/// A value and, when it was kept from an earlier request, its age.
pub(super) type Aged<T> = (T, Option<Duration>);

impl SlowReads {
    /// The error groups of `process`, kept or read by `read`.
    pub(super) async fn groups<F>(
        &self,
        process: &str,
        read: F,
    ) -> Result<Aged<Vec<ErrorGroup>>, StoreError>
    where
        F: Future<Output = Result<Vec<ErrorGroup>, StoreError>>,
    {
        self.through(process, read, |e| &mut e.groups).await
    }

    /// The chart series of `process`, kept or read by `read`.
    pub(super) async fn series<F>(&self, process: &str, read: F) -> Result<Aged<Series>, StoreError>
    where
        F: Future<Output = Result<Series, StoreError>>,
    {
        self.through(process, read, |e| &mut e.series).await
    }

    /// Forgets what was kept for `process` (after an action changed it).
    pub(super) fn forget(&self, process: &str) {
        self.entries.lock().remove(process);
    }

    /// What `slot` of `process`'s entry keeps, while it is fresh; otherwise
    /// what `read` returns, kept in `slot` when the read was slow. What every
    /// kept read does; only where its value is kept differs.
    async fn through<T: Clone, F>(
        &self,
        process: &str,
        read: F,
        slot: fn(&mut Entry) -> &mut Option<(Instant, T)>,
    ) -> Result<Aged<T>, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let kept = self
            .entries
            .lock()
            .get_mut(process)
            .and_then(|e| slot(e).clone());
        if let Some((at, value)) = kept.filter(|(at, _)| at.elapsed() < KEEP) {
            return Ok((value, Some(at.elapsed())));
        }
        let started = Instant::now();
        let value = read.await?;
        if started.elapsed() >= SLOW {
            let mut entries = self.entries.lock();
            if !entries.contains_key(process) {
                make_room(&mut entries);
            }
            *slot(entries.entry(process.to_owned()).or_default()) = Some((started, value.clone()));
        }
        Ok((value, None))
    }

    /// How many processes have kept reads.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

/// Room for one more process within [`MOST`]: stale entries go first, then,
/// if every entry is fresh, the one kept longest ago.
fn make_room(entries: &mut HashMap<String, Entry>) {
    if entries.len() < MOST {
        return;
    }
    entries.retain(|_, e| e.newest().is_some_and(|at| at.elapsed() < KEEP));
    if entries.len() < MOST {
        return;
    }
    let oldest = entries
        .iter()
        .min_by_key(|(_, e)| e.newest())
        .map(|(name, _)| name.clone());
    if let Some(oldest) = oldest {
        entries.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that takes [`SLOW`] on the (paused) clock, so it is kept.
    async fn slow() -> Result<Vec<ErrorGroup>, StoreError> {
        tokio::time::sleep(SLOW).await;
        Ok(Vec::new())
    }

    #[tokio::test(start_paused = true)]
    async fn reads_of_many_process_names_keep_a_bounded_number_and_the_newest() {
        let reads = SlowReads::default();
        for n in 0..1000 {
            reads.groups(&format!("p{n}"), slow()).await.expect("read");
        }
        assert!(reads.len() <= MOST, "{} processes kept", reads.len());
        // The latest read is kept: asked again at once, it is not read.
        let again = async { Err(StoreError::InvalidArgument("p999 read again".into())) };
        let (_, age) = reads.groups("p999", again).await.expect("kept");
        assert!(age.is_some());
    }
}
