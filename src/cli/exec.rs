//! Running a command for one key: the reconciler behind `drover work --exec`.
//!
//! The command is started without a shell (its words are split like a shell
//! would, then executed directly), with the key as its last argument and in
//! `DROVER_KEY`, plus `DROVER_PROCESS`, `DROVER_ATTEMPT` and, when the lease
//! has one, `DROVER_FENCING_TOKEN` (for downstream systems that refuse a stale
//! writer). Exit 0 is done, 75
//! (`EX_TEMPFAIL`) transient, any other code permanent; death by a signal is
//! transient (an OOM kill or a shutdown says nothing about the key). The tail of
//! its stderr becomes the history's error.
//!
//! A command outlives neither its lease nor its worker: it runs in its own
//! process group. When the run is cancelled (lease lost, timeout, shutdown
//! deadline) the group is killed and the command reaped before the run returns,
//! so nothing of an old run is alive once its session is given up; the group is
//! killed too whenever the run's future is dropped. On Linux the command gets
//! `SIGKILL` from the kernel the moment the worker dies, even by `SIGKILL`
//! (`PR_SET_PDEATHSIG`), and the rest of its group from the worker's keeper
//! (`keeper.rs`).

use std::collections::VecDeque;
use std::future::Future;
use std::io::IsTerminal as _;
use std::process::Stdio;
use std::time::Duration;

use super::say::errln;
use super::shown::shown;
use anyhow::Context as _;
use drover::runner::{Action, BoxError, Task, permanent, transient};
use drover::store::{TraceContext, text_from_bytes};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

/// Exit code that asks for a retry with backoff (`EX_TEMPFAIL` from sysexits.h).
pub(crate) const EXIT_TRANSIENT: i32 = 75;

/// How much of the command's stderr the history keeps.
const TAIL_BYTES: usize = 2048;

/// One key to run the command for: its run's task, as the command sees it.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) key: String,
    pub(crate) process: String,
    pub(crate) attempt: u32,
    /// The lease's fencing token, as `DROVER_FENCING_TOKEN`.
    pub(crate) fencing_token: i64,
    /// The run span's W3C context, as `TRACEPARENT`/`TRACESTATE`, when
    /// traces are exported: a command that uses an OpenTelemetry SDK
    /// continues the run's trace.
    pub(crate) trace: Option<TraceContext>,
}

impl From<&Task> for Job {
    fn from(task: &Task) -> Self {
        Self {
            key: task.key().to_owned(),
            process: task.process().to_owned(),
            attempt: task.attempt(),
            fencing_token: task.fencing_token().0,
            // Built inside the run's span, so this is the run's context.
            trace: TraceContext::current(),
        }
    }
}

/// A command line to run per key.
#[derive(Debug, Clone)]
pub(crate) struct Exec {
    program: String,
    args: Vec<String>,
    /// Whether the key is appended as the last argument (else it is only in
    /// `DROVER_KEY`; see [`Exec::key_in_env_only`]).
    key_arg: bool,
    /// Whether the command writes straight to drover's stdout, a terminal
    /// (see [`relay`]).
    stdout_inherited: bool,
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
            key_arg: true,
            stdout_inherited: std::io::stdout().is_terminal(),
        })
    }

    /// The program the command runs (its first word).
    pub(crate) fn program(&self) -> &str {
        &self.program
    }

    /// This command with the key only in `DROVER_KEY`, not as its last
    /// argument: for a program whose own option parser would take a key that
    /// starts with `-` for an option (a key `--checkpoint-action=exec=sh`
    /// reaching `tar`). Ending the command with `--` is the other way, for
    /// programs that honour it.
    pub(crate) fn key_in_env_only(self) -> Self {
        Self {
            key_arg: false,
            ..self
        }
    }

    /// Runs the command for `job`'s key and maps its exit status to an outcome,
    /// until `cancelled` completes: then the command's process group is killed
    /// and the command reaped before this returns (a transient error, which
    /// the runner discards or counts as a timeout).
    pub(crate) async fn run_until(
        &self,
        job: Job,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Action, BoxError> {
        // Started on the worker's spawner thread, not this runtime thread
        // (see `spawner.rs`).
        let child = super::spawner::spawn(self.command(&job)).await;
        let mut child =
            child.map_err(|e| transient(format!("cannot start {}: {e}", self.program)))?;
        // Kills the whole group when the run ends, however it ends (a dropped
        // future included), so nothing the command started outlives the run.
        let group = child.id().map(GroupKill::new);
        let tail = tokio::spawn(tail(child.stderr.take(), job.key.clone()));
        let relayed = tokio::spawn(relay(child.stdout.take()));
        let status = tokio::select! {
            status = child.wait() => status?,
            () = cancelled => {
                if let Some(group) = &group {
                    group.kill_and_reap(&mut child).await;
                }
                return Err(transient("cancelled: the command was killed").into());
            }
        };
        let tail = tail.await.unwrap_or_default();
        let _ = relayed.await;
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

    /// The command for `job`: its own process group, stdin closed, stderr
    /// piped (stdout too, but to a terminal), the job in its arguments and
    /// environment.
    fn command(&self, job: &Job) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        if self.key_arg {
            command.arg(&job.key);
        }
        command
            .env("DROVER_KEY", &job.key)
            .env("DROVER_PROCESS", &job.process)
            .env("DROVER_ATTEMPT", job.attempt.to_string())
            .stdin(Stdio::null())
            .stdout(if self.stdout_inherited {
                Stdio::inherit()
            } else {
                Stdio::piped()
            })
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        command.env("DROVER_FENCING_TOKEN", job.fencing_token.to_string());
        // The worker's own context, if it was started with one, is not the run's.
        command.env_remove("TRACEPARENT").env_remove("TRACESTATE");
        if let Some(trace) = &job.trace {
            command.env("TRACEPARENT", trace.traceparent());
            if let Some(state) = trace.tracestate() {
                command.env("TRACESTATE", state);
            }
        }
        die_with_worker(&mut command);
        command
    }
}

/// The longest stderr line kept whole: a longer one (binary output with no
/// newline) is cut into pieces of this size, so memory stays bounded.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Copies the command's stdout to ours, and reads it to the end whatever
/// becomes of ours: a reader of ours that has gone (`drover work … | tee
/// log`, and `tee` died) must not kill the command with SIGPIPE, a transient
/// failure retried for ever. Whole lines are passed on (see
/// [`whole_lines`]), so the lines of commands run side by side never mix. A
/// slow reader makes the relay wait for room (see
/// [`streams`](super::streams)), and the command for its pipe, as it would
/// writing to ours itself; the run ends once the relay has passed
/// everything on. A terminal cannot go away, so there the command keeps
/// drover's stdout, and sees a terminal.
async fn relay(stdout: Option<ChildStdout>) {
    let Some(mut stdout) = stdout else {
        return;
    };
    let mut buf = vec![0; 8192];
    let mut pending = Vec::new();
    while let Ok(n @ 1..) = stdout.read(&mut buf).await {
        pending.extend_from_slice(&buf[..n]);
        if let Some(lines) = whole_lines(&mut pending) {
            super::streams::stdout().send(lines).await;
        }
    }
    if !pending.is_empty() {
        super::streams::stdout().send(pending).await;
    }
}

/// The complete lines at the start of `pending`, taken out of it; or, when
/// it holds a line longer than [`MAX_LINE_BYTES`] with no end yet, all of
/// it (memory stays bounded).
fn whole_lines(pending: &mut Vec<u8>) -> Option<Vec<u8>> {
    let cut = match pending.iter().rposition(|&b| b == b'\n') {
        Some(end) => end + 1,
        None if pending.len() >= MAX_LINE_BYTES => pending.len(),
        None => return None,
    };
    let rest = pending.split_off(cut);
    Some(std::mem::replace(pending, rest))
}

/// Copies the command's stderr to ours, prefixed with the key, and returns its
/// last [`TAIL_BYTES`] as one line. Whatever the command writes is read to the
/// end: invalid UTF-8 and NUL bytes become U+FFFD ([`text_from_bytes`]).
async fn tail(stderr: Option<ChildStderr>, key: String) -> String {
    let Some(mut stderr) = stderr else {
        return String::new();
    };
    let key = shown(&key);
    let mut tail = Tail::default();
    let mut buf = vec![0; 8192];
    while let Ok(n @ 1..) = stderr.read(&mut buf).await {
        tail.push(&buf[..n], &key);
    }
    tail.finish(&key)
}

/// The last lines of a byte stream, as text.
#[derive(Debug, Default)]
struct Tail {
    /// The line being read (no newline yet).
    partial: Vec<u8>,
    kept: VecDeque<String>,
    /// The bytes of `kept`, one separator each included.
    size: usize,
}

impl Tail {
    /// Takes the next bytes of the stream; complete lines are echoed with the
    /// key and kept.
    fn push(&mut self, mut bytes: &[u8], key: &str) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&bytes[..end]);
            self.line(key);
            bytes = &bytes[end + 1..];
        }
        self.partial.extend_from_slice(bytes);
        if self.partial.len() >= MAX_LINE_BYTES {
            self.line(key);
        }
    }

    /// Ends the line being read.
    fn line(&mut self, key: &str) {
        let bytes = std::mem::take(&mut self.partial);
        let line = text_from_bytes(bytes.strip_suffix(b"\r").unwrap_or(&bytes));
        errln!("[{key}] {line}");
        self.size += line.len() + 1;
        self.kept.push_back(line);
        while self.size > TAIL_BYTES && self.kept.len() > 1 {
            self.size -= self.kept.pop_front().map_or(0, |l| l.len() + 1);
        }
    }

    /// The kept lines joined with ` | `, cut to their last [`TAIL_BYTES`].
    fn finish(mut self, key: &str) -> String {
        if !self.partial.is_empty() {
            self.line(key);
        }
        let joined = Vec::from(self.kept).join(" | ");
        let start = joined.len().saturating_sub(TAIL_BYTES);
        let start = (start..joined.len())
            .find(|&i| joined.is_char_boundary(i))
            .unwrap_or(0);
        joined[start..].to_owned()
    }
}

/// How long a killed command's other processes may take to disappear once the
/// command itself is reaped (they are reaped by init or a subreaper, which a
/// container may lack: then they stay zombies, which cannot run either).
const GROUP_GONE_WITHIN: Duration = Duration::from_millis(50);

/// Kills a process group when dropped.
struct GroupKill(u32);

impl GroupKill {
    /// The group led by `leader`, made known to the keeper (see `keeper.rs`)
    /// until it is killed.
    fn new(leader: u32) -> Self {
        super::keeper::watch(leader);
        Self(leader)
    }

    fn kill(&self) {
        if let Ok(pid) = i32::try_from(self.0) {
            // ESRCH (the group is gone already) is the normal case.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    /// Kills the group, reaps `leader` (the command), then waits a little for
    /// the rest of the group to be gone.
    async fn kill_and_reap(&self, leader: &mut Child) {
        self.kill();
        if let Err(e) = leader.wait().await {
            tracing::warn!(pid = self.0, error = %e, "cannot reap a killed command");
        }
        let Ok(pid) = i32::try_from(self.0) else {
            return;
        };
        let gone = async {
            // Signal 0 only checks that some process of the group exists.
            while killpg(Pid::from_raw(pid), None).is_ok() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        if tokio::time::timeout(GROUP_GONE_WITHIN, gone).await.is_err() {
            tracing::warn!(
                pid,
                "a killed command's process group is still there (unreaped zombies?)"
            );
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
        super::keeper::forget(self.0);
    }
}

/// Asks the kernel to `SIGKILL` the command when this worker dies (Linux).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // pre_exec is unsafe by contract; see SAFETY below.
fn die_with_worker(command: &mut Command) {
    use nix::sys::resource::{Resource, setrlimit};
    let worker = nix::unistd::getpid();
    let found = super::open_files::found();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, setrlimit, getppid, and the
    // keeper's getpid and send); it allocates nothing and touches no lock. The getppid check closes the race where the worker died
    // between fork and prctl: the command is then not started at all.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The open-file limit the worker found, not the one it raised.
            if let Some((soft, hard)) = found {
                setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
            }
            if nix::unistd::getppid() != worker {
                return Err(std::io::Error::other(
                    "the worker died before the command started",
                ));
            }
            // The keeper knows the group before the command can start
            // anything in it (see `keeper.rs`).
            super::keeper::announce_from_child();
            Ok(())
        });
    }
}

/// Elsewhere only the process group protects: a worker killed with `SIGKILL`
/// leaves its command running.
#[cfg(not(target_os = "linux"))]
fn die_with_worker(_command: &mut Command) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keeper's end of this test binary's keeper socket (installed on
    /// first use), one test at a time.
    #[cfg(target_os = "linux")]
    async fn keepers_end()
    -> tokio::sync::MutexGuard<'static, std::io::BufReader<std::os::unix::net::UnixStream>> {
        static END: std::sync::OnceLock<
            tokio::sync::Mutex<std::io::BufReader<std::os::unix::net::UnixStream>>,
        > = std::sync::OnceLock::new();
        END.get_or_init(|| {
            let (ours, keepers_end) = std::os::unix::net::UnixStream::pair().expect("socket pair");
            assert!(super::super::keeper::install_for_test(ours));
            keepers_end
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            tokio::sync::Mutex::new(std::io::BufReader::new(keepers_end))
        })
        .lock()
        .await
    }

    /// A command tells the keeper of its group itself, from its child
    /// before `exec`: the worker's own line, sent by a thread of its own,
    /// came a wake-up later, and a worker killed meanwhile left what the
    /// command had started running.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_command_tells_the_keeper_of_its_group_itself() {
        use std::io::BufRead as _;
        let mut keeper = keepers_end().await;
        let mut command = Command::new("true");
        command.process_group(0);
        die_with_worker(&mut command);
        let mut child = command.spawn().expect("start true");
        let pid = child.id().expect("a pid");
        child.wait().await.expect("reap true");
        let mut line = String::new();
        keeper.read_line(&mut line).expect("a line within 5 s");
        assert_eq!(line, format!("+{pid}\n"));
    }

    /// A command that cannot start (its `exec` fails: a misspelled program,
    /// retried at every backoff) told the keeper of its group from its child
    /// all the same, and the worker, which never learns the pid of a child
    /// whose `exec` failed, never took it back: the keeper killed that
    /// process group when the worker went, shut down or killed, by then
    /// another program's once the pid was reused (`pid_max` is 32,768 on
    /// many hosts, this one included).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_command_that_cannot_start_leaves_the_keeper_no_group_to_kill() {
        use std::io::BufRead as _;
        let mut keeper = keepers_end().await;
        let mut command = Command::new("/nonexistent/drover-no-such-command");
        command.process_group(0);
        die_with_worker(&mut command);
        let spawned = super::super::spawner::spawn(command).await;
        assert!(spawned.is_err(), "a command that does not exist started");
        // Every group the keeper is told of, until it is told each is gone
        // (or 5 s pass with a line missing).
        let mut told = std::collections::HashSet::new();
        loop {
            let mut line = String::new();
            if keeper.read_line(&mut line).is_err() {
                break;
            }
            let line = line.trim_end();
            if let Some(group) = line.strip_prefix('+') {
                told.insert(group.to_owned());
            } else if let Some(group) = line.strip_prefix('-') {
                told.remove(group);
                if told.is_empty() {
                    break;
                }
            }
        }
        assert!(
            told.is_empty(),
            "the keeper would kill groups {told:?} when the worker goes: a command that never \
             started, whose pid another process may have by then"
        );
    }

    /// A run that stops waiting while its command waits for the spawner
    /// thread (its deadline, a shutdown) drops the child the thread then
    /// starts. The child had told the keeper of its group, and nothing took
    /// that back: the keeper killed the group's number when the worker went,
    /// by then maybe another program's; and `kill_on_drop` killed the
    /// command alone, not what it had forked.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_command_started_for_a_run_gone_meanwhile_leaves_the_keeper_no_group_to_kill() {
        use std::io::BufRead as _;
        use std::os::unix::process::CommandExt as _;
        let mut keeper = keepers_end().await;
        // Holds the spawner thread for 300 ms (in its child, before `exec`).
        let mut slow = std::process::Command::new("true");
        #[allow(unsafe_code)]
        // SAFETY: `nanosleep` is async-signal-safe.
        unsafe {
            slow.pre_exec(|| {
                std::thread::sleep(Duration::from_millis(300));
                Ok(())
            });
        }
        let mut slow = Command::from(slow);
        slow.process_group(0);
        die_with_worker(&mut slow);
        let slow = super::super::spawner::spawn(slow);
        tokio::pin!(slow);
        // Queued first: polled once, it hands its command to the thread.
        tokio::select! {
            biased;
            _ = &mut slow => panic!("started before its 300 ms"),
            () = std::future::ready(()) => {}
        }
        let mut gone = Command::new("true");
        gone.process_group(0).kill_on_drop(true);
        die_with_worker(&mut gone);
        let waited = tokio::time::timeout(
            Duration::from_millis(50),
            super::super::spawner::spawn(gone),
        )
        .await;
        assert!(waited.is_err(), "started while the thread was held");
        let slow = slow.await.expect("the slow command starts");
        let slow = slow.id().expect("a pid").to_string();
        // Every group the keeper is told of but the slow one's, until each
        // is taken back (or 5 s pass with a line missing).
        let (mut told, mut started) = (std::collections::HashSet::new(), 0);
        while started < 2 || !told.is_empty() {
            let mut line = String::new();
            if keeper.read_line(&mut line).is_err() {
                break;
            }
            let line = line.trim_end();
            if let Some(group) = line.strip_prefix('+') {
                started += 1;
                if group != slow {
                    told.insert(group.to_owned());
                }
            } else if let Some(group) = line.strip_prefix('-') {
                told.remove(group);
            }
        }
        assert_eq!(started, 2, "both commands told the keeper of their groups");
        assert!(
            told.is_empty(),
            "the keeper would kill groups {told:?} when the worker goes: a command whose run \
             had gone, whose pid another process may have by then"
        );
    }

    fn tail_of(chunks: &[&[u8]]) -> String {
        let mut tail = Tail::default();
        for chunk in chunks {
            tail.push(chunk, "k");
        }
        tail.finish("k")
    }

    #[test]
    fn only_whole_lines_are_passed_on_but_a_line_past_the_bound_is() {
        let mut pending = b"one\ntwo\nthr".to_vec();
        assert_eq!(
            whole_lines(&mut pending).as_deref(),
            Some(&b"one\ntwo\n"[..])
        );
        assert_eq!(pending, b"thr");
        assert_eq!(whole_lines(&mut pending), None);
        pending.extend_from_slice(b"ee\n");
        assert_eq!(whole_lines(&mut pending).as_deref(), Some(&b"three\n"[..]));
        assert!(pending.is_empty());
        let mut long = vec![b'x'; MAX_LINE_BYTES];
        assert_eq!(
            whole_lines(&mut long).map(|l| l.len()),
            Some(MAX_LINE_BYTES)
        );
        assert!(long.is_empty());
    }

    #[test]
    fn invalid_utf8_and_nul_become_replacement_characters_and_reading_goes_on() {
        let got = tail_of(&[b"bad \xff\0 byte\r\nnext", b" line\nlast"]);
        assert_eq!(got, "bad \u{FFFD}\u{FFFD} byte | next line | last");
    }

    #[test]
    fn only_the_last_tail_bytes_are_kept() {
        let line = [b'x'; 1000];
        let mut chunks: Vec<&[u8]> = vec![];
        for _ in 0..10 {
            chunks.extend([&line[..], b"\n"]);
        }
        chunks.push(b"end\n");
        let got = tail_of(&chunks);
        assert!(got.len() <= TAIL_BYTES, "{}", got.len());
        assert!(got.ends_with("x | end"), "{got}");
    }

    #[test]
    fn a_line_without_a_newline_is_cut_into_pieces() {
        let long = vec![b'y'; MAX_LINE_BYTES * 3];
        let mut tail = Tail::default();
        for chunk in long.chunks(8192) {
            tail.push(chunk, "k");
            assert!(tail.partial.len() < MAX_LINE_BYTES);
        }
        assert_eq!(tail.finish("k").len(), TAIL_BYTES);
    }
}
