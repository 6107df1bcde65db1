//! `--exec`'s program, looked for once as `drover work` starts: a misspelled
//! or missing program, or one without its executable bit, fails the command
//! with one line, instead of every key's run failing to start (retried with
//! backoff for good, the reason only in each run's history).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::bail;

use super::shown::shown;

/// Where `program` will run from, found as the spawn finds it: itself when it
/// names a path (holds a `/`, relative to the current directory), else the
/// first file of that name on `PATH` that may be executed. A program that
/// appears after the start is not waited for: a worker's configuration is
/// checked when it starts, as a service manager checks its command.
pub(crate) fn find(program: &str) -> anyhow::Result<PathBuf> {
    if program.contains('/') {
        let path = Path::new(program);
        if let Err(why) = runnable(path) {
            bail!("--exec {}: {why}", shown(program));
        }
        return Ok(path.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        if runnable(&candidate).is_ok() {
            return Ok(candidate);
        }
    }
    bail!(
        "--exec {}: no such program on PATH: give its path, or install it",
        shown(program)
    )
}

/// Why `path` cannot be run, if it cannot: missing, a directory, or without
/// an executable bit.
fn runnable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        _ => e.to_string(),
    })?;
    if meta.is_dir() {
        return Err("a directory, not a program".to_owned());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("not executable: chmod +x it".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn a_program_is_found_on_path_or_by_its_path_and_a_missing_one_is_refused() {
        assert!(find("sh").expect("sh is on PATH").is_absolute());
        assert!(find("/bin/sh").is_ok());
        let missing = find("drover-no-such-program").expect_err("missing");
        assert!(
            missing.to_string().contains("no such program on PATH"),
            "{missing}"
        );
        let gone = find("/nonexistent/drover-no-such-program").expect_err("gone");
        assert!(gone.to_string().contains("no such file"), "{gone}");
        let dir = find("/tmp").expect_err("a directory");
        assert!(dir.to_string().contains("a directory"), "{dir}");
        let file = tempfile::NamedTempFile::new().expect("a file");
        let plain = find(&file.path().display().to_string()).expect_err("no x bit");
        assert!(plain.to_string().contains("not executable"), "{plain}");
    }
}
