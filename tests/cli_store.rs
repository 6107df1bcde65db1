//! The store commands (`migrate`, `enqueue`, `status`, `history`) run as a user
//! would run them: the built `drover` binary against each engine.

mod support;

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use drover::store::{LeaseClaim, LeaseComplete, Outcome, StoreEngine as _};
use serde_json::Value;
use support::each_engine;

/// Runs `drover ARGS…` against `url` (through `DROVER_DATABASE_URL`), feeding
/// `stdin` when given.
fn drover(url: Option<&str>, dir: Option<&std::path::Path>, args: &[&str], stdin: &str) -> Output {
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
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("drover runs")
}

fn ok(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "drover failed: {stderr}");
    String::from_utf8(output.stdout.clone()).expect("utf-8 output")
}

/// Asserts a failure with exactly one `error: …` line mentioning `needle`.
fn fails_with(output: &Output, needle: &str) {
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
        let session = db.session().await;
        let claim = LeaseClaim {
            session: session.id,
            process: "persist".into(),
            max: 5,
        };
        for lease in db.store.lease_claim(claim).await.expect("claim") {
            let done = LeaseComplete {
                lease: &lease,
                outcome: &Outcome::Done,
            };
            db.store.lease_complete(done).await.expect("done");
        }
        let runs = json(&drover(url, None, &args, ""));
        let runs = runs.as_array().expect("array");
        assert_eq!(runs.len(), 1, "one run: {runs:?}");
        assert_eq!(runs[0]["outcome"], "done");
        assert_eq!(runs[0]["attempt"], 1);
        let lines = ok(&drover(url, None, &["history", "--limit", "2"], ""));
        assert_eq!(lines.lines().count(), 2, "{lines}");
        assert!(lines.lines().all(|l| l.contains("  done  ")), "{lines}");
    })
    .await;
}

#[tokio::test]
async fn bad_input_fails_with_one_line_and_writes_nothing() {
    each_engine(|db| async move {
        let url = Some(db.url.as_str());
        let long = "k".repeat(1025);
        let cases: [(&[&str], &str, &str); 6] = [
            (&["enqueue", "p", "a", ""], "", "must not be empty"),
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
        let status = json(&drover(url, None, &["status", "--json"], ""));
        assert_eq!(status, Value::Array(vec![]), "nothing was written");
    })
    .await;
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
    ];
    for (url, needle) in cases {
        let started = Instant::now();
        fails_with(&drover(None, None, &["status", "--db", url], ""), needle);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{url} took too long"
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
