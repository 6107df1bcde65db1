//! Running a command for one key: the reconciler behind `drover work --exec`.
//!
//! The command is started without a shell (its words are split like a shell
//! would, then executed directly), with the key as its last argument and in
//! `DROVER_KEY`, plus `DROVER_PROCESS` and `DROVER_ATTEMPT`. Exit 0 is done, 75
//! (`EX_TEMPFAIL`) transient, any other code permanent; death by a signal is
//! transient (an OOM kill or a shutdown says nothing about the key). The tail of
//! its stderr becomes the history's error.
//!
//! A command outlives neither its lease nor its worker: it runs in its own
//! process group, which is killed when the run ends or is cancelled (lease lost,
//! shutdown deadline), and on Linux it gets `SIGKILL` from the kernel the moment
//! the worker dies, even by `SIGKILL` (`PR_SET_PDEATHSIG`).

use std::collections::VecDeque;
use std::process::Stdio;

use anyhow::Context as _;
use drover::runner::{Action, BoxError, Task, permanent, transient};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{ChildStderr, Command};

/// Exit code that asks for a retry with backoff (`EX_TEMPFAIL` from sysexits.h).
pub(crate) const EXIT_TRANSIENT: i32 = 75;

/// How much of the command's stderr the history keeps.
const TAIL_BYTES: usize = 2048;

/// One key to run the command for, from a local lease or one claimed over HTTP.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) key: String,
    pub(crate) process: String,
    pub(crate) attempt: u32,
}

impl From<&Task> for Job {
    fn from(task: &Task) -> Self {
        Self {
            key: task.key().to_owned(),
            process: task.process().to_owned(),
            attempt: task.attempt(),
        }
    }
}

/// A command line to run per key.
#[derive(Debug, Clone)]
pub(crate) struct Exec {
    program: String,
    args: Vec<String>,
}

/// A failed run: the exit status and the tail of stderr.
#[derive(Debug, thiserror::Error)]
#[error("{status}{}", tail.as_deref().map(|t| format!(": {t}")).unwrap_or_default())]
struct Failed {
    status: String,
    tail: Option<String>,
}

impl Exec {
    /// Splits `command` into words (quotes as in a shell, no expansion).
    pub(crate) fn parse(command: &str) -> anyhow::Result<Self> {
        let words = shell_words::split(command)
            .with_context(|| format!("cannot parse --exec {command:?}"))?;
        let mut words = words.into_iter();
        let program = words.next().context("--exec needs a command")?;
        Ok(Self {
            program,
            args: words.collect(),
        })
    }

    /// Runs the command for `job`'s key and maps its exit status to an outcome.
    pub(crate) async fn run(&self, job: Job) -> Result<Action, BoxError> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .arg(&job.key)
            .env("DROVER_KEY", &job.key)
            .env("DROVER_PROCESS", &job.process)
            .env("DROVER_ATTEMPT", job.attempt.to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        die_with_worker(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| transient(format!("cannot start {}: {e}", self.program)))?;
        // Kills the whole group when the run ends, however it ends (a dropped
        // future included), so nothing the command started outlives the run.
        let _group = child.id().map(GroupKill);
        let tail = tokio::spawn(tail(child.stderr.take(), job.key.clone()));
        let status = child.wait().await?;
        let tail = tail.await.unwrap_or_default();
        let failed = |status: String| Failed {
            status,
            tail: (!tail.is_empty()).then(|| tail.clone()),
        };
        match status.code() {
            Some(0) => Ok(Action::Done),
            Some(EXIT_TRANSIENT) => Err(transient(failed(format!("exit {EXIT_TRANSIENT}"))).into()),
            Some(code) => Err(permanent(failed(format!("exit {code}"))).into()),
            None => Err(transient(failed(format!("killed ({status})"))).into()),
        }
    }
}

/// Copies the command's stderr to ours, prefixed with the key, and returns its
/// last [`TAIL_BYTES`] as one line.
async fn tail(stderr: Option<ChildStderr>, key: String) -> String {
    let Some(stderr) = stderr else {
        return String::new();
    };
    let mut lines = BufReader::new(stderr).lines();
    let mut kept: VecDeque<String> = VecDeque::new();
    let mut size = 0;
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("[{key}] {line}");
        size += line.len() + 1;
        kept.push_back(line);
        while size > TAIL_BYTES && kept.len() > 1 {
            size -= kept.pop_front().map_or(0, |l| l.len() + 1);
        }
    }
    let joined = Vec::from(kept).join(" | ");
    let start = joined.len().saturating_sub(TAIL_BYTES);
    let start = (start..joined.len())
        .find(|&i| joined.is_char_boundary(i))
        .unwrap_or(0);
    joined[start..].to_owned()
}

/// Kills a process group when dropped.
struct GroupKill(u32);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0) {
            // ESRCH (the group is gone already) is the normal case.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Asks the kernel to `SIGKILL` the command when this worker dies (Linux).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // pre_exec is unsafe by contract; see SAFETY below.
fn die_with_worker(command: &mut Command) {
    let worker = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes two
    // async-signal-safe system calls (prctl, getppid); it allocates nothing and
    // touches no lock. The getppid check closes the race where the worker died
    // between fork and prctl: the command is then not started at all.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != worker {
                return Err(std::io::Error::other(
                    "the worker died before the command started",
                ));
            }
            Ok(())
        });
    }
}

/// Elsewhere only the process group protects: a worker killed with `SIGKILL`
/// leaves its command running.
#[cfg(not(target_os = "linux"))]
fn die_with_worker(_command: &mut Command) {}
