//! The keeper: a small process `drover work --exec` starts beside itself, so
//! that a command's whole process group dies with the worker, not only the
//! command.
//!
//! `PR_SET_PDEATHSIG` kills the command the worker started when the worker
//! dies, but not what the command started in turn (the tool a script runs,
//! in the command's process group). Killed by `SIGKILL` (the OOM killer, an
//! operator) or ended by a second signal (`std::process::exit`, no
//! destructor runs), the worker left that tool running, and after the TTL
//! another worker ran the key beside it: twice at once.
//!
//! The keeper learns of every group a command leads (one line each, `+PGID`,
//! on the keeper's stdin: a Unix socket) and of every group the worker has
//! killed (`-PGID`). The worker holds the only other end of that socket, so
//! the keeper reads end of file exactly when the worker is gone, however it
//! went; it then kills every group it was told of and not told is gone, and
//! exits. It lives in a process group of its own and ignores the signals a
//! terminal or a supervisor sends the worker's group, so it outlives the
//! worker; it holds no other file of the worker's. A process that leaves its
//! command's group (`setsid`) is out of its reach.
//!
//! Each command tells the keeper of its group itself, in its forked child
//! before `exec` ([`announce_from_child`]): before it can start anything,
//! and so before a worker killed at any moment after could leave a tool of
//! it behind. The worker's own lines go through a thread of its own, so a
//! keeper that stops reading blocks no runtime thread; they arrived a
//! thread's wake-up after the command started, and a worker killed in that
//! window (a loaded machine: the command had logged, started its tool and
//! logged again) left the tool running. The worker still sends `+PGID` too,
//! in case the child's own line found the socket full.

use std::collections::HashSet;
use std::io::{BufRead as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{ExitCode, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, Sender};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::say::errln;

/// The hidden subcommand that runs a keeper (`drover keeper`).
pub(crate) const SUBCOMMAND: &str = "keeper";

/// This worker's end of its keeper's socket, and the line to the thread that
/// writes the worker's own lines to it.
struct Keeper {
    /// Never closed (it lives in a static): a command's child writes to its
    /// file descriptor by number, which must not name another file later.
    socket: UnixStream,
    line: Sender<String>,
    /// A socket pair of this process's own: each command's child writes its
    /// line to the first end too, and the spawner reads it back from the
    /// second once the spawn returned (see [`announced`]). A command whose
    /// `exec` failed was announced to the keeper all the same, and that line
    /// is the only way the worker learns which group to take back. Never
    /// closed, as `socket`. `None`: no pair could be made.
    births: Option<(UnixStream, UnixStream)>,
}

/// [`Keeper::births`], the second end not blocking.
fn births() -> Option<(UnixStream, UnixStream)> {
    let (written, read) = UnixStream::pair().ok()?;
    read.set_nonblocking(true).ok()?;
    Some((written, read))
}

/// This worker's keeper, once started (`None`: no keeper).
static KEEPER: OnceLock<Option<Keeper>> = OnceLock::new();

/// Starts this worker's keeper (once). Without one (the binary cannot be
/// started again), a worker killed by `SIGKILL` leaves what its commands
/// started running: said once, on stderr.
pub(crate) fn start() {
    let mut lines = None;
    let keeper = KEEPER.get_or_init(|| match spawn() {
        Ok(socket) => {
            let (line, receiver) = std::sync::mpsc::channel();
            lines = Some(receiver);
            Some(Keeper {
                socket,
                line,
                births: births(),
            })
        }
        Err(e) => {
            errln!("warning: cannot start the keeper process ({e}): {UNKEPT}");
            None
        }
    });
    if let (Some(keeper), Some(lines)) = (keeper, lines) {
        let socket = &keeper.socket;
        let writer = std::thread::Builder::new()
            .name("drover-keeper-pipe".into())
            .spawn(move || write_lines(socket, &lines));
        if let Err(e) = writer {
            // Commands still tell the keeper of their groups themselves.
            errln!("warning: cannot start the keeper's writer ({e}): {UNKEPT_LATE}");
        }
    }
}

/// What a worker without a keeper cannot promise.
const UNKEPT: &str = "what a command starts outlives a worker killed by SIGKILL";

/// What a worker whose keeper hears only the commands themselves cannot.
const UNKEPT_LATE: &str =
    "what a command starts may outlive a worker killed by SIGKILL while the socket is full";

/// Writes each line to the keeper, on a thread of its own: a keeper that
/// stops reading (stopped, frozen) fills the socket and blocks this thread
/// only, never a runtime thread that starts or ends a command. Stops at the
/// first failed write (the keeper is gone), saying so once.
fn write_lines(mut socket: &UnixStream, lines: &Receiver<String>) {
    for line in lines {
        if let Err(e) = socket.write_all(line.as_bytes()) {
            errln!("warning: the keeper process is gone ({e}): {UNKEPT}");
            return;
        }
    }
}

#[allow(unsafe_code)] // pre_exec is unsafe by contract; see SAFETY below.
fn spawn() -> std::io::Result<UnixStream> {
    use std::os::unix::process::CommandExt as _;
    // Both ends close on exec: no command inherits either.
    let (ours, theirs) = UnixStream::pair()?;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        .arg(SUBCOMMAND)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls
    // sigaction (async-signal-safe); it allocates nothing and takes no lock.
    // An ignored signal stays ignored across exec.
    unsafe {
        command.pre_exec(|| {
            use nix::sys::signal::{SigHandler, signal};
            for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                signal(sig, SigHandler::SigIgn).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    // The child is not waited for: it outlives this process by design, and
    // exits on its own once this process is gone. The command's copy of
    // the keeper's end is closed when it is dropped here.
    command.spawn()?;
    Ok(ours)
}

/// Tells the keeper of the process group this process leads: called in a
/// command's forked child, after `setpgid` and before `exec`, so the keeper
/// knows the group before the command can start anything in it.
///
/// Async-signal-safe, as code between `fork` and `exec` must be: an atomic
/// load, `getpid`, digits written into a stack buffer, and `send`s that
/// neither wait (a full socket: the worker's own line follows) nor raise
/// `SIGPIPE` (the keeper is gone): one to the keeper, one to the spawner
/// (see [`Keeper::births`]). A line this short is never split.
pub(crate) fn announce_from_child() {
    use nix::sys::socket::{MsgFlags, send};
    let Some(Some(keeper)) = KEEPER.get() else {
        return;
    };
    let mut line = [0_u8; 24];
    let len = group_line(nix::unistd::getpid().as_raw(), &mut line);
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    let _ = send(keeper.socket.as_raw_fd(), &line[..len], flags);
    if let Some((births, _)) = &keeper.births {
        let _ = send(births.as_raw_fd(), &line[..len], flags);
    }
}

/// The group the command just spawned announced from its child (see
/// [`announce_from_child`]), if it got that far; the lines of earlier ones
/// are read and passed over. Called by the spawner after each spawn (one
/// at a time), so the last line is that command's.
pub(crate) fn announced() -> Option<u32> {
    use std::io::Read as _;
    let Some(Some(Keeper {
        births: Some((_, read)),
        ..
    })) = KEEPER.get()
    else {
        return None;
    };
    let mut read: &UnixStream = read;
    let mut last = None;
    let mut buf = [0_u8; 512];
    // Lines are never split (one short `send` each); a full read leaves
    // more to read.
    while let Ok(n @ 1..) = read.read(&mut buf) {
        let text = String::from_utf8_lossy(&buf[..n]);
        if let Some(group) = text
            .lines()
            .filter_map(|line| line.strip_prefix('+')?.parse().ok())
            .next_back()
        {
            last = Some(group);
        }
    }
    last
}

/// Writes `+PID\n` into `line` without allocating; returns its length.
fn group_line(pid: i32, line: &mut [u8; 24]) -> usize {
    let mut digits = [0_u8; 20];
    let mut n = 0;
    let mut rest = pid.unsigned_abs();
    loop {
        digits[n] = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        n += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    line[0] = b'+';
    for i in 0..n {
        line[1 + i] = digits[n - 1 - i];
    }
    line[1 + n] = b'\n';
    n + 2
}

/// Tells the keeper of a command's process group (`+`) or that it is gone
/// (`-`), through its writer thread: never waits.
fn tell(sign: char, group: u32) {
    let Some(Some(keeper)) = KEEPER.get() else {
        return;
    };
    // A writer that stopped (the keeper is gone) said so already.
    let _ = keeper.line.send(format!("{sign}{group}\n"));
}

/// A command's process group started: killed if this worker dies.
pub(crate) fn watch(group: u32) {
    tell('+', group);
}

/// A command's process group was killed and its leader reaped.
pub(crate) fn forget(group: u32) {
    tell('-', group);
}

/// The keeper's own `main`: reads the worker's lines until end of file,
/// then kills every group still listed.
pub(crate) fn run() -> ExitCode {
    let mut groups = HashSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (sign, group) = line.split_at(line.len().min(1));
        let Ok(group) = group.parse::<i32>() else {
            continue;
        };
        match sign {
            "+" => {
                groups.insert(group);
            }
            "-" => {
                groups.remove(&group);
            }
            _ => {}
        }
    }
    for group in groups {
        // ESRCH (the group is gone already) is the normal case.
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
    ExitCode::SUCCESS
}

/// Makes `socket` this process's keeper, with its writer thread, as
/// [`start`] does. `false` if a keeper was set.
#[cfg(test)]
pub(crate) fn install_for_test(socket: UnixStream) -> bool {
    let (line, lines) = std::sync::mpsc::channel();
    let keeper = Keeper {
        socket,
        line,
        births: births(),
    };
    if KEEPER.set(Some(keeper)).is_err() {
        return false;
    }
    if let Some(Some(keeper)) = KEEPER.get() {
        let socket = &keeper.socket;
        std::thread::spawn(move || write_lines(socket, &lines));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_line_is_a_plus_the_pid_in_decimal_and_a_newline() {
        let mut line = [0_u8; 24];
        for (pid, text) in [(0, "+0\n"), (7, "+7\n"), (4_194_304, "+4194304\n")] {
            let len = group_line(pid, &mut line);
            assert_eq!(&line[..len], text.as_bytes());
        }
        let len = group_line(i32::MAX, &mut line);
        assert_eq!(&line[..len], format!("+{}\n", i32::MAX).as_bytes());
    }
}
