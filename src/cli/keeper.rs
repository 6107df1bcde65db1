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
//! The worker tells the keeper every group it starts and every group it has
//! killed (one line each, `+PGID` and `-PGID`, on the keeper's stdin, written
//! by a thread of its own so a keeper that stops reading blocks no runtime
//! thread). The
//! keeper holds the only other end of that pipe, so it reads end of file
//! exactly when the worker is gone, however it went; it then kills every
//! group it was told of and not told is gone, and exits. It lives in a
//! process group of its own and ignores the signals a terminal or a
//! supervisor sends the worker's group, so it outlives the worker; it holds
//! no other file of the worker's. A process that leaves its command's group
//! (`setsid`) is out of its reach.

use std::collections::HashSet;
use std::io::{BufRead as _, Write as _};
use std::process::{ChildStdin, ExitCode, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, Sender};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::say::errln;

/// The hidden subcommand that runs a keeper (`drover keeper`).
pub(crate) const SUBCOMMAND: &str = "keeper";

/// The line to the thread that writes to this worker's keeper, once
/// started (`None`: no keeper).
static LINE: OnceLock<Option<Sender<String>>> = OnceLock::new();

/// Starts this worker's keeper (once). Without one (the binary cannot be
/// started again), a worker killed by `SIGKILL` leaves what its commands
/// started running: said once, on stderr.
pub(crate) fn start() {
    LINE.get_or_init(|| match spawn() {
        Ok(stdin) => {
            let (line, lines) = std::sync::mpsc::channel();
            let writer = std::thread::Builder::new()
                .name("drover-keeper-pipe".into())
                .spawn(move || write_lines(stdin, &lines));
            match writer {
                Ok(_) => Some(line),
                Err(e) => {
                    errln!("warning: cannot start the keeper's writer ({e}): {UNKEPT}");
                    None
                }
            }
        }
        Err(e) => {
            errln!("warning: cannot start the keeper process ({e}): {UNKEPT}");
            None
        }
    });
}

/// What a worker without a keeper cannot promise.
const UNKEPT: &str = "what a command starts outlives a worker killed by SIGKILL";

/// Writes each line to the keeper, on a thread of its own: a keeper that
/// stops reading (stopped, frozen) fills the pipe and blocks this thread
/// only, never a runtime thread that starts or ends a command. Stops at the
/// first failed write (the keeper is gone), saying so once.
fn write_lines(mut stdin: ChildStdin, lines: &Receiver<String>) {
    for line in lines {
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            errln!("warning: the keeper process is gone ({e}): {UNKEPT}");
            return;
        }
    }
}

#[allow(unsafe_code)] // pre_exec is unsafe by contract; see SAFETY below.
fn spawn() -> std::io::Result<ChildStdin> {
    use std::os::unix::process::CommandExt as _;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        .arg(SUBCOMMAND)
        .stdin(Stdio::piped())
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
    let mut child = command.spawn()?;
    // The child is not waited for: it outlives this process by design, and
    // exits on its own once this process is gone.
    child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no pipe to the keeper"))
}

/// Tells the keeper of a command's process group (`+`) or that it is gone
/// (`-`), through its writer thread: never waits.
fn tell(sign: char, group: u32) {
    let Some(Some(line)) = LINE.get() else { return };
    // A writer that stopped (the keeper is gone) said so already.
    let _ = line.send(format!("{sign}{group}\n"));
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
