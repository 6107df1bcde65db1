//! `drover process configure --concurrency/--rate/--burst` and `drover
//! pause|resume` as a user runs them: the built binary on each engine, and
//! through a `drover serve` with an admin's token.

mod support;

use std::process::{Command, Output, Stdio};

use drover::store::{Store, StoreEngine as _};
use serde_json::Value;
use support::cli::{fails_with, ok};
use support::each_engine;
use support::serve::Serve;

/// Runs `drover ARGS…` with `DROVER_DATABASE_URL` = `url` (when given).
fn drover(url: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.args(args)
        .env_remove("DROVER_DATABASE_URL")
        .env_remove("DROVER_TOKEN")
        .stdin(Stdio::null());
    if let Some(url) = url {
        cmd.env("DROVER_DATABASE_URL", url);
    }
    cmd.output().expect("drover runs")
}

/// `drover process list --json`'s entry for `process`.
fn listed(url: &str, process: &str) -> Value {
    let all: Value = serde_json::from_str(&ok(&drover(Some(url), &["process", "list", "--json"])))
        .expect("JSON");
    all.as_array()
        .expect("an array")
        .iter()
        .find(|p| p["process"] == process)
        .cloned()
        .unwrap_or(Value::Null)
}

async fn paused(store: &Store, process: &str) -> bool {
    let all = store.process_list().await.expect("list");
    all.iter().any(|s| s.process == process && s.limits.paused)
}

#[tokio::test]
async fn limits_are_set_shown_and_removed_from_the_command_line() {
    each_engine(|db| async move {
        let url = Some(db.url.as_str());
        let args = [
            "process",
            "configure",
            "provision",
            "--concurrency",
            "5",
            "--rate",
            "20/s",
            "--burst",
            "5",
        ];
        let table = ok(&drover(url, &args));
        assert!(table.contains("at most 5 at once, 20/s burst 5"), "{table}");
        let entry = listed(&db.url, "provision");
        assert_eq!(entry["concurrency"], 5);
        assert_eq!(entry["rate_per_second"], 20.0);
        assert_eq!(entry["rate_burst"], 5);
        ok(&drover(
            url,
            &["process", "configure", "provision", "--rate", "600/m"],
        ));
        assert_eq!(listed(&db.url, "provision")["rate_per_second"], 10.0);
        let none = [
            "process",
            "configure",
            "provision",
            "--concurrency",
            "none",
            "--rate",
            "none",
        ];
        ok(&drover(url, &none));
        let entry = listed(&db.url, "provision");
        assert_eq!(entry["concurrency"], Value::Null);
        assert_eq!(entry["rate_per_second"], Value::Null);
    })
    .await;
}

#[tokio::test]
async fn bad_limits_get_one_line_and_write_nothing() {
    let (db, _dir) = support::sqlite().await;
    let url = Some(db.url.as_str());
    let cases: [(&[&str], &str); 8] = [
        (&["--concurrency", "0"], "at least 1"),
        (&["--concurrency=-2"], "not a number"),
        (&["--concurrency", "lots"], "not a number"),
        (&["--rate", "0/s"], "out of range"),
        (&["--rate", "fast"], "not a rate"),
        (&["--rate", "5/week"], "not a period"),
        (&["--burst", "0"], "--burst"),
        (&["--rate=-1/s"], "out of range"),
    ];
    for (flags, needle) in cases {
        let args: Vec<&str> = ["process", "configure", "p"]
            .iter()
            .chain(flags)
            .copied()
            .collect();
        fails_with(&drover(url, &args), needle);
    }
    fails_with(&drover(url, &["pause", ""]), "invalid process name");
    assert_eq!(listed(&db.url, "p"), Value::Null, "nothing was written");
}

#[tokio::test]
async fn pause_and_resume_on_the_database_say_what_changed() {
    each_engine(|db| async move {
        let url = Some(db.url.as_str());
        assert_eq!(
            ok(&drover(url, &["pause", "provision"])),
            "paused provision\n"
        );
        assert!(paused(&db.store, "provision").await);
        assert_eq!(
            ok(&drover(url, &["pause", "provision"])),
            "provision was already paused\n"
        );
        assert_eq!(
            ok(&drover(url, &["resume", "provision"])),
            "resumed provision\n"
        );
        assert!(!paused(&db.store, "provision").await);
        let history = ok(&drover(url, &["history", "--process", "provision"]));
        assert!(
            history.contains("resumed") && history.contains("paused"),
            "{history}"
        );
        assert!(history.contains("by=cli"), "{history}");
    })
    .await;
}

#[tokio::test]
async fn pause_through_a_server_needs_an_admins_token() {
    let (db, dir) = support::sqlite().await;
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "admin:a-token\nworker:w-token\n").expect("tokens file");
    let flags = [
        "--listen",
        "127.0.0.1:0",
        "--tokens",
        tokens.to_str().expect("utf-8"),
    ];
    let serve = Serve::start_with(&db.url, &flags).await;
    let server = serve.url.as_str();
    let refused = drover(
        None,
        &[
            "pause",
            "provision",
            "--server",
            server,
            "--token",
            "w-token",
        ],
    );
    fails_with(&refused, "403");
    assert!(
        !paused(&db.store, "provision").await,
        "a worker cannot pause"
    );
    let by_admin = [
        "pause",
        "provision",
        "--server",
        server,
        "--token",
        "a-token",
    ];
    assert_eq!(ok(&drover(None, &by_admin)), "paused provision\n");
    assert!(paused(&db.store, "provision").await);
    let resume = [
        "resume",
        "provision",
        "--server",
        server,
        "--token",
        "a-token",
    ];
    assert_eq!(ok(&drover(None, &resume)), "resumed provision\n");
    assert!(!paused(&db.store, "provision").await);
}

/// `--server` acts instead of the database, so a `--db` given beside it is
/// refused; but `DROVER_DATABASE_URL` in the environment (where the other
/// commands go) is not a `--db` given: it was refused as one, "the argument
/// '--server <URL>' cannot be used with '--db <URL>'", and no `pause`,
/// `resume` or `work --server` ran in a shell that had it set.
#[tokio::test]
async fn pause_through_a_server_goes_there_whatever_database_the_environment_names() {
    let (db, dir) = support::sqlite().await;
    let serve = Serve::start(&db.url).await;
    let server = serve.url.as_str();
    let elsewhere = dir.path().join("elsewhere.db");
    let elsewhere_url = format!("sqlite://{}", elsewhere.display());
    let out = drover(
        Some(&elsewhere_url),
        &["pause", "provision", "--server", server],
    );
    assert_eq!(ok(&out), "paused provision\n");
    assert!(paused(&db.store, "provision").await);
    assert!(!elsewhere.exists(), "the environment's database was opened");
    let both = [
        "resume",
        "provision",
        "--server",
        server,
        "--db",
        &elsewhere_url,
    ];
    fails_with(&drover(None, &both), "--server");
    assert!(paused(&db.store, "provision").await);
    assert!(!elsewhere.exists(), "the database given was opened");
}

/// A `--server` URL may carry credentials (the client sends them as Basic
/// auth, and a server takes a token as the Basic password): they are hidden
/// wherever the URL is printed. `work`'s banner and the refusal of a
/// malformed URL printed it whole.
#[test]
fn a_password_in_the_server_url_is_never_printed() {
    for args in [
        &[
            "work",
            "p",
            "--exec",
            "true",
            "--server",
            "http://u:hunter2@127.0.0.1:1",
        ][..],
        &["pause", "p", "--server", "ftp://u:hunter2@127.0.0.1:1"],
    ] {
        let out = drover(None, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "password printed: {stderr}");
        assert!(stderr.contains("u:***@127.0.0.1:1"), "{stderr}");
    }
}

/// `drover pause|resume --server` builds the API's path from the process
/// name: a process named `.` or `..` must reach that process, not a path an
/// HTTP client shortened (it removes such a segment before sending).
#[tokio::test]
async fn pause_through_a_server_reaches_a_process_named_dot_or_dot_dot() {
    each_engine(|db| async move {
        let serve = Serve::start(&db.url).await;
        let server = serve.url.as_str();
        for process in [".", ".."] {
            let pause = drover(None, &["pause", process, "--server", server]);
            assert_eq!(ok(&pause), format!("paused {process}\n"), "{process:?}");
            assert!(paused(&db.store, process).await, "{process:?} paused");
            let resume = drover(None, &["resume", process, "--server", server]);
            assert_eq!(ok(&resume), format!("resumed {process}\n"), "{process:?}");
            assert!(!paused(&db.store, process).await, "{process:?} resumed");
        }
        let all = db.store.process_list().await.expect("list");
        let mut names: Vec<&str> = all.iter().map(|s| s.process.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, [".", ".."], "no other process was touched");
    })
    .await;
}
