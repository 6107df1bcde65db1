//! Tick logs: the work of each run appends `TAG NANOS` lines (its tag and the
//! wall clock in nanoseconds since the epoch) every few milliseconds while it
//! runs, so a test can tell from the log alone whether two runs of a key
//! overlapped. The work writes them itself (a reconciler, or the command of
//! `drover work --exec`), not drover: what is checked is what the work did.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// A tick log in a fresh temporary file; removed with the last clone.
#[derive(Debug, Clone)]
pub(crate) struct TickLog {
    path: PathBuf,
    _dir: std::sync::Arc<tempfile::TempDir>,
}

impl TickLog {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            path: dir.path().join("ticks.log"),
            _dir: std::sync::Arc::new(dir),
        }
    }

    /// Where the log is, for commands to append to.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// A shell command line that ticks as `tag` every 20 ms until killed (the
    /// key, appended by `drover work`, is ignored).
    pub(crate) fn command(&self, tag: &str) -> String {
        format!(
            r#"sh -c 'echo pid {tag} $$ >> {log}; while :; do echo {tag} $(date +%s%N) >> {log}; sleep 0.02; done' sh"#,
            log = self.path.display()
        )
    }

    /// Appends one tick as `tag`, stamped now.
    pub(crate) fn tick(&self, tag: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .expect("open the tick log");
        // One write of the whole line: the file is opened to append, so
        // concurrent writers' lines never interleave (`writeln!` would
        // write the pieces separately).
        let line = format!("{tag} {}\n", now_nanos());
        file.write_all(line.as_bytes()).expect("write a tick");
    }

    /// Every tick of `tag`, in the order written.
    pub(crate) fn ticks(&self, tag: &str) -> Vec<u128> {
        self.lines()
            .into_iter()
            .filter(|(t, _)| t == tag)
            .filter_map(|(_, v)| v.parse().ok())
            .collect()
    }

    /// The pid a command logged with `pid TAG PID`.
    pub(crate) fn pid(&self, tag: &str) -> Option<i32> {
        self.lines()
            .into_iter()
            .filter(|(t, _)| t == "pid")
            .find_map(|(_, rest)| {
                let (t, pid) = rest.split_once(' ')?;
                (t == tag).then(|| pid.parse().ok()).flatten()
            })
    }

    /// Fails if any tick of `old` is later than the first tick of `new`.
    pub(crate) fn assert_no_overlap(&self, old: &str, new: &str, round: &str) {
        let old_ticks = self.ticks(old);
        let first_new = *self
            .ticks(new)
            .first()
            .unwrap_or_else(|| panic!("{round}: {new} never ticked"));
        assert!(!old_ticks.is_empty(), "{round}: {old} never ticked");
        let late: Vec<f64> = old_ticks
            .iter()
            .filter(|t| **t >= first_new)
            .map(|t| (t - first_new) as f64 / 1e6)
            .collect();
        assert!(
            late.is_empty(),
            "{round}: {old}'s run was still ticking after {new}'s started: {} ticks, the last {:.1} ms after",
            late.len(),
            late.last().copied().unwrap_or_default()
        );
    }

    /// Milliseconds from the last tick of `old` to the first tick of `new`:
    /// positive when `old`'s run had stopped before `new`'s started, negative
    /// (by as much as they overlapped) otherwise.
    pub(crate) fn gap_ms(&self, old: &str, new: &str, round: &str) -> f64 {
        let last_old = *self
            .ticks(old)
            .iter()
            .max()
            .unwrap_or_else(|| panic!("{round}: {old} never ticked"));
        let first_new = *self
            .ticks(new)
            .iter()
            .min()
            .unwrap_or_else(|| panic!("{round}: {new} never ticked"));
        (first_new as f64 - last_old as f64) / 1e6
    }

    fn lines(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect()
    }
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_nanos()
}
