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
    Command::new(super::process::drover_bin())
        .arg("work")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn drover work")
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
