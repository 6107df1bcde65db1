//! One thread that starts every `--exec` command, for the life of the worker.
//!
//! `spawn` waits until the child has called `exec` (it reports an exec
//! failure through a pipe). On the runtime's threads that wait, with a
//! thousand commands starting at once on two cores, kept heartbeats and the
//! lapse timer from running: sessions were given up and keys ran again. On
//! tokio's blocking pool it would be worse: a command's `PR_SET_PDEATHSIG`
//! (see `exec.rs`) fires when the *thread* that forked it exits, and the
//! pool's idle threads exit after ten seconds, killing the long commands they
//! started. So one thread of the worker's own, which never exits, starts
//! them all, one after another.

use std::sync::OnceLock;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// A command to start, and where its child (or the error) goes.
type Request = (Command, oneshot::Sender<std::io::Result<Child>>);

/// The spawner thread's queue, started on first use (`None`: the thread
/// could not be started).
static SPAWNER: OnceLock<Option<mpsc::Sender<Request>>> = OnceLock::new();

/// Starts `command` on the spawner thread. Must be called inside the Tokio
/// runtime the child is then awaited on (the thread registers children with
/// it). A caller that stops waiting drops the child when it comes back,
/// which kills it (`kill_on_drop`).
pub(crate) async fn spawn(command: Command) -> std::io::Result<Child> {
    let gone = || std::io::Error::other("the command spawner thread could not start or is gone");
    let queue = SPAWNER.get_or_init(start).as_ref().ok_or_else(gone)?;
    let (answer, child) = oneshot::channel();
    queue.send((command, answer)).map_err(|_| gone())?;
    child.await.map_err(|_| gone())?
}

/// Starts the spawner thread in the current runtime's context.
fn start() -> Option<mpsc::Sender<Request>> {
    let (queue, requests) = mpsc::channel::<Request>();
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("drover-spawner".into())
        .spawn(move || {
            let _context = runtime.enter();
            for (mut command, answer) in requests {
                let spawned = command.spawn();
                let group = super::keeper::announced();
                if spawned.is_err()
                    && let Some(group) = group
                {
                    // Its child told the keeper of its group before its
                    // `exec` failed, and was reaped: no run will take the
                    // group back, and its number may soon be another's.
                    super::keeper::forget(group);
                }
                if let Err(Ok(child)) = answer.send(spawned) {
                    abandoned(child);
                }
            }
        })
        .ok()?;
    Some(queue)
}

/// A command started for a caller that stopped waiting meanwhile (its run's
/// deadline, a shutdown): `kill_on_drop` would kill the command alone, so its
/// process group (each command leads its own) is killed first, and the
/// keeper forgets it. Left, what the command forked in the microseconds it
/// ran went on beside the key's next run, and the keeper kept the group's
/// number to kill when the worker went, by then maybe another program's.
fn abandoned(child: Child) {
    if let Some(pid) = child.id() {
        if let Ok(group) = i32::try_from(pid) {
            // ESRCH: not a group leader (no `process_group(0)`), or gone.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        super::keeper::forget(pid);
    }
    drop(child);
}
