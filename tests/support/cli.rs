//! Checking what the `drover` binary printed, and starting `drover work`
//! children: what the command-line tests share.

use std::process::{Output, Stdio};

use tokio::process::{Child, Command};

/// The command's stdout, after asserting it succeeded (its stderr in the
/// message otherwise).
pub(crate) fn ok(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "drover failed: {stderr}");
    String::from_utf8(output.stdout.clone()).expect("utf-8 output")
}

/// Asserts a failure whose stderr starts with exactly one `error: …` line
/// mentioning `needle`: bad input gets one clear line, never a panic or a
/// cascade of messages.
pub(crate) fn fails_with(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "expected a failure, got: {stderr}"
    );
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: "),
        "first line is the error: {stderr}"
    );
    assert!(first.contains(needle), "{needle:?} not in: {stderr}");
    let errors = stderr.lines().filter(|l| l.starts_with("error")).count();
    assert_eq!(errors, 1, "one error line: {stderr}");
}

/// Starts `drover work ARGS`, its output discarded, killed if the test
/// drops it: every command-line test's worker child.
pub(crate) fn work<'a>(args: impl IntoIterator<Item = &'a str>) -> Child {
    work_logging(args, Stdio::null())
}

/// [`work`], its stderr (drover's log) going to `stderr`.
fn work_logging<'a>(args: impl IntoIterator<Item = &'a str>, stderr: Stdio) -> Child {
    work_command(args)
        .stderr(stderr)
        .spawn()
        .expect("spawn drover work")
}

/// The command `drover work ARGS`, its input and output closed and killed
/// if the test drops it, not yet started: for [`with_metrics`].
pub(crate) fn work_command<'a>(args: impl IntoIterator<Item = &'a str>) -> Command {
    let mut command = Command::new(super::process::drover_bin());
    command
        .arg("work")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Starts `drover work PROCESS --db URL --exec EXEC` with extra `flags`
/// (see [`work`]).
pub(crate) fn worker(url: &str, process: &str, exec: &str, flags: &[&str]) -> Child {
    work(
        [process, "--db", url, "--exec", exec]
            .into_iter()
            .chain(flags.iter().copied()),
    )
}

/// [`worker`], its stderr (drover's log) written to `log` instead of
/// discarded: for tests that print it when they fail.
pub(crate) fn worker_logged(
    url: &str,
    process: &str,
    exec: &str,
    flags: &[&str],
    log: &std::path::Path,
) -> Child {
    let file = std::fs::File::create(log).expect("the worker's log file");
    let args = [process, "--db", url, "--exec", exec];
    work_logging(
        args.into_iter().chain(flags.iter().copied()),
        Stdio::from(file),
    )
}

/// Spawns `command` (a `drover work …`) with `--metrics-listen 127.0.0.1:0`
/// and returns it with the address its metrics listener bound, read from the
/// line its stderr names it on. No port is picked before the child binds
/// it, so no other socket can take it first. The rest of its stderr is read
/// and dropped (a full pipe would stall it). When no such line comes (the
/// child failed, or hangs), the test fails with what it printed.
pub(crate) async fn with_metrics(mut command: Command) -> (Child, String) {
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    let mut child = command
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn drover work");
    let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let mut printed = Vec::new();
    let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let addr = line
                .strip_prefix("drover work: metrics on http://")
                .and_then(|rest| rest.strip_suffix("/metrics"))
                .map(str::to_owned);
            if addr.is_some() {
                return addr;
            }
            printed.push(line);
        }
        None
    })
    .await;
    let Ok(Some(addr)) = found else {
        panic!(
            "the worker never named its metrics address; it printed:\n{}",
            printed.join("\n")
        );
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}
