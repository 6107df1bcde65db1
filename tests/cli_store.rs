//! The store commands (`migrate`, `enqueue`, `status`, `history`, `process`,
//! `retry`, `park`, `delete`) run as a user would run them: the built `drover`
//! binary against each engine (the newer commands on SQLite).

mod support;

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use drover::store::Outcome;
use serde_json::Value;
use support::cli::{fails_with, ok};
use support::each_engine;

/// Runs `drover ARGS…` against `url` (through `DROVER_DATABASE_URL`), feeding
/// `stdin` when given.
fn drover(
    url: Option<&str>,
    dir: Option<&std::path::Path>,
    args: &[&str],
    stdin: impl AsRef<[u8]>,
) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.args(args)
        .env_remove("DROVER_DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = url {
        cmd.env("DROVER_DATABASE_URL", url);
    }
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().expect("spawn drover");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_ref()).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("drover runs")
}

fn json(output: &Output) -> Value {
    serde_json::from_str(&ok(output)).expect("valid JSON")
}

#[tokio::test]
async fn enqueue_status_and_history_work_end_to_end() {
    each_engine(|db| async move {
        let url = Some(db.url.as_str());
        ok(&drover(url, None, &["migrate"], ""));
        ok(&drover(url, None, &["migrate"], ""));
        let out = ok(&drover(
            url,
            None,
            &["enqueue", "provision", "m1", "m2", "--priority", "5"],
            "",
        ));
        assert!(out.contains("2 key(s)"), "{out}");
        ok(&drover(
            url,
            None,
            &["enqueue", "provision", "m3", "--after", "10m"],
            "",
        ));
        ok(&drover(
            url,
            None,
            &["enqueue", "persist", "-"],
            "ns/a\r\n\nns/b\nns/a\n",
        ));
        let status = json(&drover(url, None, &["status", "--json"], ""));
        let rows = status.as_array().expect("array");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["process"], "persist");
        assert_eq!(rows[0]["pending"], 2);
        assert_eq!(rows[1]["process"], "provision");
        assert_eq!(rows[1]["pending"], 3);
        assert_eq!(rows[1]["running"], 0);
        let table = ok(&drover(url, None, &["status"], ""));
        assert!(table.lines().any(|l| l.starts_with("provision")), "{table}");
        let args = ["history", "--process", "persist", "--key", "ns/a", "--json"];
        let runs = json(&drover(url, None, &args, ""));
        assert_eq!(runs, serde_json::json!([]), "no run yet, no history");
        // Both persist keys run once (the deduplicated ns/a counted two enqueues).
        support::store::run_ready(&db.store, "persist", 5, &Outcome::Done).await;
        let runs = json(&drover(url, None, &args, ""));
        let runs = runs.as_array().expect("array");
        assert_eq!(runs.len(), 1, "one run: {runs:?}");
        assert_eq!(runs[0]["outcome"], "done");
        assert_eq!(runs[0]["attempt"], 1);
        let lines = ok(&drover(url, None, &["history", "--limit", "2"], ""));
        assert_eq!(lines.lines().count(), 2, "{lines}");
        assert!(lines.lines().all(|l| l.contains("  done  ")), "{lines}");
        ok(&drover(url, None, &["retry", "persist", "ns/a"], ""));
        ok(&drover(url, None, &["park", "persist", "ns/b"], ""));
        let runs = json(&drover(url, None, &["history", "--json"], ""));
        let runs = runs.as_array().expect("array");
        assert_eq!(
            runs.len(),
            4,
            "one row per run and operator action: {runs:?}"
        );
        assert_eq!(runs[0]["outcome"], "parked");
        assert_eq!(runs[0]["actor"], "cli");
        assert_eq!(runs[1]["outcome"], "retried");
    })
    .await;
}

/// Runs `drover ARGS…` against `url` with a stdout nobody reads (the pipe's
/// reader closed before drover writes, as `drover status | head -0` does).
fn drover_unread(url: &str, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(args)
        .env("DROVER_DATABASE_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn drover");
    drop(child.stdout.take().expect("stdout"));
    child.wait_with_output().expect("drover runs")
}

/// A reader that has gone (`drover history | head`) ends a command quietly:
/// exit 0, nothing on stderr, and what the command did stays done; a command
/// that acts on several keys acts on each. `println!` panicked there
/// ("failed printing to stdout"), exit 101, after the first key.
#[tokio::test]
async fn a_command_whose_reader_has_gone_ends_quietly_and_keeps_what_it_did() {
    let (db, _dir) = support::sqlite().await;
    for args in [
        &["enqueue", "gone", "a", "b"][..],
        &["status"],
        &["status", "--json"],
        &["history", "--json"],
        &["process", "list"],
        &["park", "gone", "a", "b"],
    ] {
        let out = drover_unread(&db.url, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {} {stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
    let status = json(&drover(Some(&db.url), None, &["status", "--json"], ""));
    assert_eq!(status[0]["process"], "gone");
    assert_eq!(status[0]["pending"], 0, "{status}");
    assert_eq!(status[0]["parked"], 2, "every key asked for: {status}");
}

#[tokio::test]
async fn bad_input_fails_with_one_line_and_writes_nothing() {
    each_engine(|db| async move {
        let url = Some(db.url.as_str());
        let long = "k".repeat(1025);
        let cases: [(&[&str], &str, &str); 7] = [
            (&["enqueue", "p", "a", ""], "", "must not be empty"),
            (
                &["enqueue", "p", "a", "--after", "181d"],
                "",
                "longer than 180 days",
            ),
            (&["enqueue", "p", "a", &long], "", "at most 1024 bytes"),
            (&["enqueue", "p", "-"], "a\nb\0c\n", "must not contain NUL"),
            (&["enqueue", "p", "a", "--after", "-5s"], "", "negative"),
            (
                &["enqueue", "p", "a", "--after", "soon"],
                "",
                "not a duration",
            ),
            (
                &["history", "--process", "nope"],
                "",
                "unknown process \"nope\"",
            ),
        ];
        for (args, stdin, needle) in cases {
            fails_with(&drover(url, None, args, stdin), needle);
        }
        let not_text = drover(url, None, &["enqueue", "p", "-"], b"a\nb\xffc\nd\n");
        fails_with(&not_text, "line 2 of stdin is not valid UTF-8 text");
        let status = json(&drover(url, None, &["status", "--json"], ""));
        assert_eq!(status, Value::Array(vec![]), "nothing was written");
    })
    .await;
}

/// A line on stdin no key fits in is refused as soon as it is too long, not
/// read whole: an endless line (from `/dev/zero`) under an address space of
/// 4 GiB fails with the line's number, where reading it whole ended in an
/// allocation failure (and, unbounded, took every byte of memory).
#[tokio::test]
async fn a_line_on_stdin_too_long_for_a_key_is_refused_before_it_is_read_whole() {
    let (db, _dir) = support::sqlite().await;
    let child = tokio::process::Command::new("sh")
        .args([
            "-c",
            r#"ulimit -v 4194304 && { echo first; tr '\0' k </dev/zero; } | exec "$@""#,
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_drover"))
        .args(["enqueue", "p", "-"])
        .env("DROVER_DATABASE_URL", &db.url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run drover enqueue");
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("refused within 60 s")
        .expect("drover enqueue runs");
    fails_with(&output, "line 2 of stdin is longer than 1024 bytes");
    let status = json(&drover(Some(&db.url), None, &["status", "--json"], ""));
    assert_eq!(status, Value::Array(vec![]), "nothing was written");
}

/// A SQLite refusal keeps its result code ("(code: 26) file is not a
/// database"): several codes share one message (every `SQLITE_IOERR_*` is
/// "disk I/O error"). Only PostgreSQL's errors lose sqlx's addition, the
/// server's source line.
#[test]
fn a_sqlite_refusal_keeps_its_result_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("garbage.db");
    std::fs::write(&path, vec![0x5a_u8; 8192]).expect("write garbage");
    let url = format!("sqlite://{}", path.display());
    let out = drover(None, None, &["status", "--db", &url], "");
    fails_with(&out, "(code: 26) file is not a database");
}

/// Output that fails for another reason than its reader having gone (a
/// full disk: `/dev/full`) is an error that says so, exit 1; a command that
/// acts on several keys still acts on each.
#[tokio::test]
async fn a_full_disk_under_stdout_is_an_error_and_every_key_is_still_acted_on() {
    let (db, _dir) = support::sqlite().await;
    ok(&drover(
        Some(&db.url),
        None,
        &["enqueue", "full", "a", "b"],
        "",
    ));
    for args in [
        &["status"][..],
        &["park", "full", "a", "b"],
        &["history", "prune"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let out = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(args)
            .env("DROVER_DATABASE_URL", &db.url)
            .stdin(Stdio::null())
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .expect("drover runs");
        fails_with(&out, "cannot write to stdout");
    }
    let status = json(&drover(Some(&db.url), None, &["status", "--json"], ""));
    assert_eq!(status[0]["parked"], 2, "every key asked for: {status}");
}

#[test]
fn bad_urls_and_unreachable_servers_fail_fast_with_one_line() {
    let cases = [
        (
            "mysql://localhost/x",
            "unsupported database scheme \"mysql\"",
        ),
        ("drover.db", "invalid database URL"),
        ("postgres://:::", "invalid database URL"),
        ("postgres://postgres@127.0.0.1:1/test", "cannot connect"),
        (
            "postgres://u@127.0.0.1:5432,127.0.0.1:54x2/test",
            "host 2 of 2 (\"127.0.0.1:54x2\") has an invalid port \"54x2\"",
        ),
        (
            "postgres://u@h1,h2/test?target_session_attrs=standby",
            "target_session_attrs=standby would reach a server drover cannot write to",
        ),
        (
            "postgres://postgres@127.0.0.1:1,127.0.0.1:2/test",
            "no host accepts read-write sessions: 127.0.0.1:1 refused",
        ),
        (
            "sqlite:///nonexistent-drover-dir/x.db",
            "the directory /nonexistent-drover-dir does not exist: create it",
        ),
        // `sqlite://$UNSET`: SQLite gave each connection a private temporary
        // database, and the writer's had no tables ("no such table").
        ("sqlite://", "it names no file"),
        // A store several processes share, with SQLite's locking off, was
        // corrupted within seconds.
        (
            "sqlite:///nonexistent-drover-dir/x.db?vfs=unix-none",
            "`vfs` turns SQLite's locking off",
        ),
        (
            "sqlite:///nonexistent-drover-dir/x.db?immutable=1",
            "`immutable` turns SQLite's locking off",
        ),
        // Read as SQLite reads them, percent-decoded.
        (
            "sqlite:///nonexistent-drover-dir/x.db?%76fs=unix-none",
            "`vfs` turns SQLite's locking off",
        ),
        // A one-shot command's in-memory database ends with it, and what it
        // wrote: `enqueue` said "enqueued" of keys no worker could see.
        (
            "sqlite::memory:",
            "an in-memory database ends with this command",
        ),
    ];
    for (url, needle) in cases {
        let started = Instant::now();
        fails_with(&drover(None, None, &["status", "--db", url], ""), needle);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{url} took too long"
        );
    }
    for memory in ["sqlite::memory:", "sqlite://x.db?mode=%6Demory"] {
        fails_with(
            &drover(None, None, &["enqueue", "p", "a", "--db", memory], ""),
            "an in-memory database ends with this command",
        );
    }
    let out = drover(
        Some("postgres://u:hunter2@127.0.0.1:1/x"),
        None,
        &["status"],
        "",
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("hunter2"),
        "password leaked"
    );
    // A server's refusal is its message alone: sqlx adds the line of
    // PostgreSQL's C source it came from ("… at line 948"), which reads as a
    // line of the user's input.
    let Ok(base) = std::env::var("DROVER_TEST_POSTGRES_URL") else {
        eprintln!("skipping the server's refusal: DROVER_TEST_POSTGRES_URL is not set");
        return;
    };
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    let url = format!("{server}/drover_no_such_database");
    let out = drover(None, None, &["status", "--db", &url], "");
    let needle = "database \"drover_no_such_database\" does not exist";
    fails_with(&out, needle);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.trim_end().ends_with(needle), "{stderr}");
}

/// A password given in the URL's query (`?password=…`, which the driver
/// reads as libpq does, its name percent-decoded) is hidden in an error as
/// one in the user part is: the URL was quoted whole.
#[test]
fn a_password_in_the_query_of_a_url_is_hidden_in_errors() {
    for url in [
        "postgres://u@127.0.0.1:1/x?password=hunter2",
        "postgres://u@127.0.0.1:1/x?sslmode=disable&password=hunter2&application_name=a",
        "postgres://u@127.0.0.1:1/x?pass%77ord=hunter2",
    ] {
        let out = drover(None, None, &["status", "--db", url], "");
        fails_with(&out, "cannot connect to postgres://u@127.0.0.1:1/x?");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("hunter2"), "password leaked: {stderr}");
        assert!(stderr.contains("=***"), "{stderr}");
    }
}

/// `--help` shows no database URL taken from the environment: clap prints an
/// option's `env` value beside it, and `DROVER_DATABASE_URL` or
/// `DROVER_LISTEN_DATABASE_URL` may hold a password.
#[test]
fn help_shows_no_database_url_from_the_environment() {
    for args in [
        &["status", "--help"][..],
        &["work", "--help"],
        &["serve", "-h"],
        &["bench", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(args)
            .env("DROVER_DATABASE_URL", "postgres://u:hunter2@db/x")
            .env("DROVER_LISTEN_DATABASE_URL", "postgres://u:hunter3@db/x")
            .output()
            .expect("drover runs");
        let help = ok(&out);
        assert!(help.contains("DROVER_DATABASE_URL"), "{help}");
        assert!(
            !help.contains("hunter2") && !help.contains("hunter3"),
            "password leaked by {args:?}: {help}"
        );
    }
}

#[test]
fn a_rejected_enqueue_does_not_create_the_default_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    fails_with(
        &drover(None, Some(dir.path()), &["enqueue", "p", ""], ""),
        "invalid key",
    );
    assert!(!dir.path().join("drover.db").exists());
    ok(&drover(None, Some(dir.path()), &["enqueue", "p", "a"], ""));
    assert!(
        dir.path().join("drover.db").exists(),
        "the default is sqlite://drover.db"
    );
}

/// `drover process list --json`'s object for `process`.
fn settings(url: &str, process: &str) -> Value {
    let all = json(&drover(Some(url), None, &["process", "list", "--json"], ""));
    let all = all.as_array().expect("array");
    let found = all.iter().find(|p| p["process"] == process);
    found.cloned().expect("the process is listed")
}

#[tokio::test]
async fn process_configure_changes_only_the_settings_given() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    let first = [
        "process",
        "configure",
        "provision",
        "--keep-runs-for",
        "3d",
        "--keep-runs-per-key",
        "5",
        "--forget-idle-after",
        "30d",
        "--backoff-initial",
        "2s",
        "--backoff-max",
        "1m",
    ];
    let out = ok(&drover(url, None, &first, ""));
    let row = out.lines().find(|l| l.starts_with("provision"));
    assert!(
        row.is_some_and(|l| l.contains("3days")
            && l.contains("30days")
            && l.contains("2s ×2 up to 1m")),
        "prints the resulting settings: {out}"
    );
    let partial = ["process", "configure", "provision", "--backoff-max", "10m"];
    ok(&drover(url, None, &partial, ""));
    let s = settings(&db.url, "provision");
    assert_eq!(s["keep_runs_for_seconds"], 259_200.0);
    assert_eq!(s["keep_runs_per_key"], 5);
    assert_eq!(s["forget_idle_after_seconds"], 2_592_000.0);
    assert_eq!(
        s["backoff"]["initial_seconds"], 2.0,
        "the stored initial stays"
    );
    assert_eq!(s["backoff"]["max_seconds"], 600.0);
    assert_eq!(s["backoff"]["factor"], 2.0);
    let never = [
        "process",
        "configure",
        "provision",
        "--forget-idle-after",
        "never",
        "--backoff-jitter",
        "0.5",
    ];
    ok(&drover(url, None, &never, ""));
    let s = settings(&db.url, "provision");
    assert_eq!(s["forget_idle_after_seconds"], Value::Null);
    assert_eq!(s["keep_runs_per_key"], 5);
    assert_eq!(s["backoff"]["jitter"], 0.5);
    assert_eq!(s["backoff"]["max_seconds"], 600.0);

    ok(&drover(url, None, &["enqueue", "persist", "a"], ""));
    let s = settings(&db.url, "persist");
    assert_eq!(s["keep_runs_for_seconds"], 604_800.0, "7 days by default");
    assert_eq!(s["keep_runs_per_key"], 100);
    assert_eq!(
        s["forget_idle_after_seconds"],
        Value::Null,
        "never by default"
    );
    let table = ok(&drover(url, None, &["process", "list"], ""));
    let names: Vec<_> = table.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(names, ["PROCESS", "persist", "provision"], "{table}");
}

#[tokio::test]
async fn process_configure_refuses_bad_input_with_one_line_and_writes_nothing() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    let configure = |rest: &[&str]| {
        let args: Vec<&str> = ["process", "configure"]
            .iter()
            .chain(rest)
            .copied()
            .collect();
        drover(url, None, &args, "")
    };
    let cases: [(&[&str], &str); 8] = [
        (&["p", "--keep-runs-per-key", "0"], "--keep-runs-per-key"),
        (&["p", "--keep-runs-for", "a week"], "not a duration"),
        (&["p", "--keep-runs-for", "0s"], "is zero"),
        (&["p", "--forget-idle-after", "sometimes"], "not a duration"),
        (&["", "--keep-runs-per-key", "3"], "invalid process name"),
        (&["p", "--backoff-factor", "0.5"], "factor must be"),
        (&["p", "--backoff-jitter", "2"], "jitter must be"),
        (
            &["p", "--backoff-initial", "5m", "--backoff-max", "1m"],
            "at least the initial delay",
        ),
    ];
    for (args, needle) in cases {
        fails_with(&configure(args), needle);
    }
    let all = json(&drover(url, None, &["process", "list", "--json"], ""));
    assert_eq!(all, Value::Array(vec![]), "nothing was written");

    ok(&configure(&["p", "--keep-runs-per-key", "3"]));
    let before = settings(&db.url, "p");
    let over_the_stored_max = ["p", "--backoff-initial", "10m", "--keep-runs-per-key", "7"];
    fails_with(
        &configure(&over_the_stored_max),
        "at least the initial delay",
    );
    assert_eq!(settings(&db.url, "p"), before, "nothing was written");
}

#[tokio::test]
async fn process_configure_sets_the_resync_lists_it_and_refuses_bad_values() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    let set = [
        "process",
        "configure",
        "provision",
        "--resync",
        "1h",
        "--resync-jitter",
        "0.2",
        "--resync-priority",
        "-7",
    ];
    let out = ok(&drover(url, None, &set, ""));
    assert!(out.contains("1h +20% prio -7"), "{out}");
    let s = settings(&db.url, "provision");
    assert_eq!(s["resync"]["every_seconds"], 3600.0);
    assert_eq!(s["resync"]["jitter"], 0.2);
    assert_eq!(s["resync"]["priority"], -7);
    for (bad, needle) in [
        (["--resync-jitter", "2"], "resync jitter"),
        (["--resync", "10ms"], "resync every 1s"),
        (["--resync", "often"], "not a duration"),
    ] {
        let args: Vec<&str> = ["process", "configure", "provision"]
            .into_iter()
            .chain(bad)
            .collect();
        fails_with(&drover(url, None, &args, ""), needle);
    }
    assert_eq!(settings(&db.url, "provision")["resync"]["jitter"], 0.2);
    ok(&drover(
        url,
        None,
        &["process", "configure", "provision", "--resync", "never"],
        "",
    ));
    assert_eq!(settings(&db.url, "provision")["resync"], Value::Null);
}

/// Claims one ready key of `process` on `store` and ends its run `done`.
async fn run_one(store: &drover::Store, process: &str) -> String {
    let ran = support::store::run_ready(store, process, 1, &Outcome::Done).await;
    ran.into_iter().next().expect("a ready key")
}

#[tokio::test]
async fn history_prune_applies_each_process_retention_now() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    // Operator actions are history rows: three on a, two on b.
    ok(&drover(url, None, &["enqueue", "provision", "a", "b"], ""));
    for _ in 0..3 {
        ok(&drover(url, None, &["retry", "provision", "a"], ""));
    }
    for _ in 0..2 {
        ok(&drover(url, None, &["park", "provision", "b"], ""));
    }
    ok(&drover(url, None, &["enqueue", "persist", "x", "y"], ""));
    let cap = [
        "process",
        "configure",
        "provision",
        "--keep-runs-per-key",
        "1",
    ];
    ok(&drover(url, None, &cap, ""));
    let out = ok(&drover(url, None, &["history", "prune"], ""));
    assert_eq!(
        out,
        "persist: removed 0 run(s) and 0 idle key(s)\n\
         provision: removed 3 run(s) and 0 idle key(s)\n"
    );
    let args = ["history", "--process", "provision", "--json"];
    let runs = json(&drover(url, None, &args, ""));
    let kept: Vec<_> = runs
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap_or_default(),
                r["outcome"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        kept,
        [("b", "parked"), ("a", "retried")],
        "the newest per key"
    );

    // x converges and goes untouched for two days (its times moved back by
    // hand: the CLI reads the database's own clock); y stays pending.
    assert_eq!(run_one(&db.store, "persist").await, "x");
    db.execute("UPDATE drover_items SET last_ended_at = last_ended_at - 172800000 WHERE key = 'x'")
        .await;
    let forget = [
        "process",
        "configure",
        "persist",
        "--forget-idle-after",
        "1d",
    ];
    ok(&drover(url, None, &forget, ""));
    let args = ["history", "prune", "--process", "persist"];
    let out = ok(&drover(url, None, &args, ""));
    assert_eq!(out, "persist: removed 0 run(s) and 1 idle key(s)\n");
    let status = json(&drover(url, None, &["status", "--json"], ""));
    assert_eq!(status[0]["process"], "persist");
    assert_eq!(status[0]["pending"], 1, "y stays");
    let args = ["history", "prune", "--process", "nope"];
    fails_with(&drover(url, None, &args, ""), "unknown process \"nope\"");
    let args = ["history", "--process", "provision", "prune"];
    let out = drover(url, None, &args, "");
    assert!(!out.status.success(), "a listing flag is not a prune flag");
}

#[tokio::test]
async fn retry_park_and_delete_act_on_each_key_and_refuse_running_ones() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    ok(&drover(url, None, &["enqueue", "p", "a", "b", "c"], ""));
    let running = {
        use drover::store::{LeaseClaim, SessionStart, StoreEngine as _};
        let start = SessionStart::new("test", Duration::from_secs(30));
        let session = db.store.session_start(start).await.expect("session");
        let claim = LeaseClaim {
            session: session.id,
            process: "p".into(),
            max: 1,
            trace_links: false,
        };
        let lease = db
            .store
            .lease_claim(claim)
            .await
            .expect("claim")
            .leases
            .pop();
        lease.expect("a lease").key
    };
    assert_eq!(running, "a");

    let park = ["park", "p", "b", "c", "--reason", "disk gone"];
    assert_eq!(
        ok(&drover(url, None, &park, "")),
        "p/b: parked\np/c: parked\n"
    );
    let out = ok(&drover(url, None, &["retry", "p", "b"], ""));
    assert_eq!(out, "p/b: retried, now pending\n");
    assert_eq!(
        ok(&drover(url, None, &["delete", "p", "c"], "")),
        "p/c: deleted\n"
    );

    for action in ["retry", "park", "delete"] {
        let out = drover(url, None, &[action, "p", "a"], "");
        fails_with(&out, "p/a is leased by another worker");
    }
    let out = drover(url, None, &["retry", "p", "b", "nope"], "");
    fails_with(&out, "p/nope is not a known key");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "p/b: retried, now pending\n"
    );
    fails_with(&drover(url, None, &["park", "p", ""], ""), "invalid key");
    // A key is any text: printed, it must not forge a line or reach the terminal.
    let forged = "x\np/b: deleted\u{1b}[2J";
    let out = drover(url, None, &["retry", "p", forged], "");
    fails_with(&out, "p/x\\np/b: deleted\\u{1b}[2J is not a known key");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains('\u{1b}'),
        "escaped"
    );

    let runs = json(&drover(url, None, &["history", "--json"], ""));
    let rows: Vec<_> = runs
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            let field = |name: &str| r[name].as_str().unwrap_or_default().to_owned();
            (
                field("key"),
                field("outcome"),
                field("actor"),
                field("error"),
            )
        })
        .collect();
    let row = |key: &str, outcome: &str, error: &str| {
        (
            key.to_owned(),
            outcome.to_owned(),
            "cli".to_owned(),
            error.to_owned(),
        )
    };
    assert_eq!(
        rows,
        [
            row("b", "retried", ""),
            row("c", "deleted", ""),
            row("b", "retried", ""),
            row("c", "parked", "disk gone"),
            row("b", "parked", "disk gone"),
        ],
        "one row per action, by cli; nothing for the refused ones"
    );
    let status = json(&drover(url, None, &["status", "--json"], ""));
    assert_eq!(status[0]["running"], 1, "a still runs");
    assert_eq!(status[0]["pending"], 1, "b");
    assert_eq!(status[0]["parked"], 0, "c was deleted");
    let said = ok(&drover(url, None, &["pause", forged], ""));
    assert_eq!(said, "paused x\\np/b: deleted\\u{1b}[2J\n");
    let said = ok(&drover(url, None, &["errors", forged], ""));
    assert_eq!(
        said,
        "x\\np/b: deleted\\u{1b}[2J: no parked or backing-off keys\n"
    );
}

#[tokio::test]
async fn errors_lists_the_groups_and_a_filter_acts_on_every_matching_key() {
    each_engine(|db| async move {
        let url = Some(db.url.as_str());
        ok(&drover(
            url,
            None,
            &["enqueue", "provision", "vm-1", "vm-22"],
            "",
        ));
        let failed = Outcome::Permanent("timeout after 30s".into());
        support::store::run_ready(&db.store, "provision", 2, &failed).await;
        ok(&drover(url, None, &["enqueue", "provision", "ns/a"], ""));
        let out = ok(&drover(url, None, &["errors", "provision"], ""));
        assert!(out.contains("timeout after <n>s"), "{out}");
        assert!(out.contains("      2  parked"), "{out}");
        assert!(out.contains("e.g. timeout after 30s"), "{out}");
        let groups = json(&drover(url, None, &["errors", "provision", "--json"], ""));
        assert_eq!(groups[0]["count"], 2, "{groups}");

        let out = ok(&drover(
            url,
            None,
            &["retry", "provision", "--error", "timeout after <n>s"],
            "",
        ));
        assert_eq!(out.trim(), "provision: retried 2 key(s)");
        let history = json(&drover(
            url,
            None,
            &[
                "history",
                "--process",
                "provision",
                "--outcome",
                "retried",
                "--json",
            ],
            "",
        ));
        assert_eq!(history.as_array().expect("runs").len(), 2, "{history}");
        assert_eq!(history[0]["actor"], "cli");

        let out = ok(&drover(
            url,
            None,
            &["park", "provision", "--prefix", "vm-", "--reason", "hold"],
            "",
        ));
        assert_eq!(out.trim(), "provision: parked 2 key(s)");
        let out = ok(&drover(
            url,
            None,
            &["delete", "provision", "--state", "parked"],
            "",
        ));
        assert_eq!(out.trim(), "provision: deleted 2 key(s)");
        let out = ok(&drover(url, None, &["errors", "provision"], ""));
        assert!(out.contains("no parked or backing-off keys"), "{out}");
        let status = json(&drover(url, None, &["status", "--json"], ""));
        assert_eq!(status[0]["pending"], 1, "ns/a untouched: {status}");
    })
    .await;
}

/// What workers and producers wrote (a key, an error) is printed with its
/// control characters escaped, so it can neither forge a line of `drover
/// history` nor send the operator's terminal an escape sequence (a new title,
/// the clipboard, the cursor). Before, both went out raw; `drover work`
/// already escaped keys in its log prefixes.
#[tokio::test]
async fn listings_escape_what_workers_wrote() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    let key = "vm-1\u{1b}]0;owned\u{7}";
    ok(&drover(url, None, &["enqueue", "provision", key], ""));
    let forged = "boom\n999  2026-12-07 06:00:00.000Z  provision  vm-1  done  by=cli";
    let failed = Outcome::Permanent(forged.into());
    support::store::run_ready(&db.store, "provision", 1, &failed).await;
    let history = ok(&drover(
        url,
        None,
        &["history", "--process", "provision"],
        "",
    ));
    let errors = ok(&drover(url, None, &["errors", "provision"], ""));
    let status = ok(&drover(url, None, &["status"], ""));
    for (what, out) in [
        ("history", &history),
        ("errors", &errors),
        ("status", &status),
    ] {
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "{what} printed control characters: {out:?}"
        );
    }
    assert_eq!(history.lines().count(), 1, "one run: {history:?}");
    assert!(history.contains(r"vm-1\u{1b}]0;owned\u{7}"), "{history}");
    assert!(history.contains(r"error: boom\n999"), "{history}");
}

/// `enqueue` names the process in its summary, escaped as every listing
/// does: a newline in the name forged a line, an escape reached the terminal.
#[tokio::test]
async fn enqueue_shows_the_process_it_enqueued_for_escaped() {
    let (db, _dir) = support::sqlite().await;
    let process = "p\u{1b}[31m\nenqueued 0 key(s) for p";
    let out = ok(&drover(
        Some(db.url.as_str()),
        None,
        &["enqueue", process, "k"],
        "",
    ));
    assert_eq!(
        out.trim_end(),
        r"enqueued 1 key(s) for p\u{1b}[31m\nenqueued 0 key(s) for p: 1 pending"
    );
}

/// A key given twice counts once, however far apart: keys go to the store
/// 5,000 at a time, and a key met again in a later batch was enqueued again
/// there, so the summary counted it twice ("enqueued 5001 key(s) …: 5001
/// pending" for 5,000 keys; a running one showed as two runs to come) and
/// its item counted two enqueues, where a repeat within one batch counted
/// once.
#[tokio::test]
async fn enqueue_counts_a_key_given_twice_once_even_batches_apart() {
    use drover::store::StoreEngine as _;
    each_engine(|db| async move {
        let mut stdin: String = (0..5_000).map(|i| format!("k{i}\n")).collect();
        stdin.push_str("k0\n");
        let out = ok(&drover(
            Some(&db.url),
            None,
            &["enqueue", "provision", "-"],
            stdin,
        ));
        assert_eq!(
            out.trim_end(),
            "enqueued 5000 key(s) for provision: 5000 pending"
        );
        let first = drover::store::ItemGet {
            process: "provision".into(),
            key: "k0".into(),
            runs_limit: 0,
        };
        let item = db.store.item_get(first).await.expect("read").expect("k0");
        assert_eq!(item.item.enqueue_count, 1, "one enqueue of k0");
    })
    .await;
}

/// Processes on one SQLite file take turns on one lock file beside it,
/// however the URL names the file: `sqlite:file:…` (a URI, whose path only
/// SQLite reads) and `sqlite://…` alike. Before, the URI form locked a file
/// named after the URI's text (`file:d.db-lock`), so such a process never took
/// turns with the others.
#[test]
fn the_writers_lock_file_sits_beside_the_database_whatever_the_url_form() {
    let dir = tempfile::tempdir().expect("tempdir");
    for url in ["sqlite:file:d.db", "sqlite://d.db"] {
        ok(&drover(
            Some(url),
            Some(dir.path()),
            &["enqueue", "p", "a"],
            "",
        ));
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with("-lock"))
        .collect();
    names.sort();
    assert_eq!(names, ["d.db-lock"]);
}

#[test]
fn a_bulk_action_takes_keys_or_a_filter_never_both_nor_neither() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let url = Some(url.as_str());
    ok(&drover(url, None, &["enqueue", "p", "a"], ""));
    for args in [
        &["retry", "p"][..],
        &["delete", "p", "a", "--prefix", "a"],
        &["park", "p", "--state", "running"],
    ] {
        let out = drover(url, None, args, "");
        assert!(!out.status.success(), "{args:?} must fail");
    }
    fails_with(
        &drover(url, None, &["delete", "nope", "--prefix", "a"], ""),
        "nope",
    );
    let out = ok(&drover(url, None, &["errors", "p"], ""));
    assert!(out.contains("no parked"), "{out}");
}

/// An upgrade can take minutes on a large file (some migrations rebuild a
/// table), so drover says it is upgrading before it starts, at the default
/// log level (without colour codes, its standard error not being a terminal);
/// a database already current, or a new one, gets no such line.
#[tokio::test]
async fn an_upgrade_of_an_older_schema_is_announced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, pool) = support::old_sqlite(dir.path(), "old.db", "0003").await;
    pool.close().await;
    let announced = |output: &Output| {
        String::from_utf8_lossy(&output.stderr).contains("upgrading the database schema")
    };
    let upgrade = drover(Some(&url), None, &["migrate"], "");
    ok(&upgrade);
    assert!(announced(&upgrade), "{upgrade:?}");
    let stderr = String::from_utf8_lossy(&upgrade.stderr);
    assert!(
        !stderr.contains('\u{1b}'),
        "no colour codes off a terminal: {stderr:?}"
    );
    let again = drover(Some(&url), None, &["migrate"], "");
    ok(&again);
    assert!(!announced(&again), "{again:?}");
    let fresh = format!("sqlite://{}?mode=rwc", dir.path().join("new.db").display());
    let new = drover(Some(&fresh), None, &["migrate"], "");
    ok(&new);
    assert!(!announced(&new), "{new:?}");
}
