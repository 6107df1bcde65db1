//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) loads
//! it from a running server and must show a process's counts after work was
//! enqueued, and a hostile key as text. Screenshots go to `target/artifacts/`.
//!
//! Skips (saying why) when `/usr/bin/chromium` is missing, unless
//! `DROVER_TEST_BROWSER=1` is set (as `.ci/run` does): then it fails.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover::server::{Server, ServerOptions};
use drover::store::{ItemEnqueue, StoreEngine as _};
use tokio_util::sync::CancellationToken;

const CHROMIUM: &str = "/usr/bin/chromium";
const HOSTILE: &str = "<script>alert(1)</script>";

/// Whether to run: `false` (with a printed reason) when Chromium is missing and
/// the browser test is not required.
fn chromium_available() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    let required = std::env::var("DROVER_TEST_BROWSER").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "DROVER_TEST_BROWSER=1 but {CHROMIUM} is missing: apt-get install -y chromium"
    );
    eprintln!("skipping the browser test: {CHROMIUM} is missing (apt-get install -y chromium)");
    false
}

/// Runs headless Chromium with `args` then `url`; returns its stdout.
async fn chromium(profile: &Path, args: &[String], url: &str) -> String {
    let mut command = tokio::process::Command::new(CHROMIUM);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1280,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(90), command.output())
        .await
        .expect("chromium finished within 90 s")
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&dir).expect("create target/artifacts");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_counts_after_enqueue_and_a_hostile_key_as_text() {
    if !chromium_available() {
        return;
    }
    let (db, _dir) = support::sqlite().await;
    db.store
        .item_enqueue(ItemEnqueue::new("provision", ["m1", "m2", HOSTILE]))
        .await
        .expect("enqueue");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let server = Server::new(db.store.clone(), ServerOptions::default());
    let serving = tokio::spawn(server.serve(listener, shutdown.clone()));
    let profile = tempfile::tempdir().expect("profile dir");

    let overview = chromium(profile.path(), &["--dump-dom".into()], &format!("{base}/")).await;
    assert!(
        overview.contains(r#"<tr data-process="provision">"#),
        "{overview}"
    );
    assert!(
        overview.contains(r#"<td class="n pending">3</td>"#),
        "{overview}"
    );
    let shot = artifacts().join("dashboard.png");
    let arg = format!("--screenshot={}", shot.display());
    chromium(profile.path(), &[arg], &format!("{base}/")).await;
    assert!(std::fs::metadata(&shot).expect("screenshot written").len() > 1000);

    let item = format!("{base}/ui/processes/provision/items/%3Cscript%3Ealert(1)%3C%2Fscript%3E");
    let page = chromium(profile.path(), &["--dump-dom".into()], &item).await;
    assert!(
        page.contains(r#"<td class="key">&lt;script&gt;alert(1)&lt;/script&gt;</td>"#),
        "the key is text: {page}"
    );
    assert!(
        !page.contains(HOSTILE),
        "no script element was injected: {page}"
    );
    let shot = artifacts().join("dashboard-item.png");
    let arg = format!("--screenshot={}", shot.display());
    chromium(profile.path(), &[arg], &item).await;

    shutdown.cancel();
    serving.await.expect("server task").expect("served");
    eprintln!("screenshots in {}", artifacts().display());
}
