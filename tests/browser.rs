//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) loads
//! it from a running server and must show a process's counts after work was
//! enqueued, and a hostile key as text; its Park button must work, and another
//! site's page must not be able to make the browser enqueue or park. A
//! process page shows its error groups, and a group's "retry all" button
//! retries exactly its keys.
//! The workers page lists a fleet with its leases (an expired worker as such),
//! and the process page charts an hour of runs and depth.
//! Screenshots go to `target/artifacts/`.
//!
//! Skips (saying why) when `/usr/bin/chromium` is missing, unless
//! `DROVER_TEST_BROWSER=1` is set (as `.ci/run` does): then it fails.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover::backoff::Backoff;
use drover::server::{Server, ServerOptions};
use drover::store::{
    ItemEnqueue, ItemGet, ItemState, LeaseClaim, LeaseComplete, Outcome, ProcessConfigure,
    StoreEngine as _,
};
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
    // m1 converges (and stays known, idle), m2 fails for good, the third waits.
    let session = db.session().await;
    let claim = LeaseClaim {
        session: session.id,
        process: "provision".into(),
        max: 2,
        trace_links: false,
    };
    let leases = db.store.lease_claim(claim).await.expect("claim").leases;
    let outcomes = [Outcome::Done, Outcome::Permanent("bad manifest".into())];
    for (lease, outcome) in leases.iter().zip(&outcomes) {
        let done = LeaseComplete {
            lease,
            outcome,
            trace_id: None,
        };
        db.store.lease_complete(done).await.expect("complete");
    }
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
        overview.contains(r#"<td class="n pending">1</td>"#),
        "{overview}"
    );
    let shot = artifacts().join("dashboard.png");
    let arg = format!("--screenshot={}", shot.display());
    chromium(profile.path(), &[arg], &format!("{base}/")).await;
    assert!(std::fs::metadata(&shot).expect("screenshot written").len() > 1000);

    let item = format!("{base}/ui/processes/provision/items/%3Cscript%3Ealert(1)%3C%2Fscript%3E");
    let page = chromium(profile.path(), &["--dump-dom".into()], &item).await;
    assert!(
        page.contains(r#"<td class="key"><bdi>&lt;script&gt;alert(1)&lt;/script&gt;</bdi></td>"#),
        "the key is text: {page}"
    );
    assert!(
        !page.contains(HOSTILE),
        "no script element was injected: {page}"
    );
    let shot = artifacts().join("dashboard-item.png");
    let arg = format!("--screenshot={}", shot.display());
    chromium(profile.path(), &[arg], &item).await;

    // A converged key's page: known, idle, with its run.
    let idle = format!("{base}/ui/processes/provision/items/m1");
    let page = chromium(profile.path(), &["--dump-dom".into()], &idle).await;
    assert!(page.contains(r#"<td class="state">idle</td>"#), "{page}");
    assert!(page.contains(r#"<td class="outcome">done</td>"#), "{page}");
    let parked = format!("{base}/ui/processes/provision/items/m2");
    let page = chromium(profile.path(), &["--dump-dom".into()], &parked).await;
    assert!(page.contains(r#"<td class="failures">1</td>"#), "{page}");
    assert!(
        page.contains(r#"<td class="outcome">parked</td>"#),
        "{page}"
    );
    assert!(page.contains("bad manifest"), "{page}");
    let shot = artifacts().join("dashboard-runs.png");
    let arg = format!("--screenshot={}", shot.display());
    chromium(profile.path(), &[arg], &parked).await;

    shutdown.cancel();
    serving.await.expect("server task").expect("served");
    eprintln!("screenshots in {}", artifacts().display());
}

/// A page on drover's own origin that clicks the item page's real Park button
/// (in a frame, as a person would in the tab).
const CLICK_PARK: &str = r#"<!DOCTYPE html><title>click</title>
<iframe src="/ui/processes/provision/items/m1" onload="
  const park = this.contentDocument.querySelector('form[action$=&quot;/park&quot;] button');
  if (park) { this.onload = null; park.click(); }"></iframe>"#;

/// Another site's page that makes the browser post to drover at `base` on load:
/// a `text/plain` form whose body is the JSON of an enqueue, and the Park
/// button's form.
fn attack_page(base: &str) -> String {
    format!(
        r#"<!DOCTYPE html><title>attack</title>
<iframe name="a"></iframe><iframe name="b"></iframe>
<form target="a" method="post" enctype="text/plain" action="{base}/v1/processes/provision/items">
  <input name='{{"keys":["evil","' value='"]}}'></form>
<form target="b" method="post" action="{base}/ui/processes/provision/items/m1/park"></form>
<script>for (const form of document.forms) form.submit();</script>"#
    )
}

/// Serves `app` on a fresh loopback port until `shutdown`; returns the port.
async fn serve(app: axum::Router, shutdown: &CancellationToken) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
            .expect("served");
    });
    port
}

/// How many `POST`s to `route` drover answered with `status`, from `/metrics`.
async fn answered(base: &str, route: &str, status: u16) -> String {
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let series = format!(
        r#"drover_http_requests_total{{method="POST",route="{route}",status="{status}"}} "#
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or("0")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_park_button_works_in_a_browser_and_another_sites_forms_are_refused() {
    if !chromium_available() {
        return;
    }
    let (db, _dir) = support::sqlite().await;
    db.store
        .item_enqueue(ItemEnqueue::new("provision", ["m1"]))
        .await
        .expect("enqueue");
    let shutdown = CancellationToken::new();
    let server = Server::new(db.store.clone(), ServerOptions::default());
    let click = axum::routing::get(|| async { axum::response::Html(CLICK_PARK) });
    let drover = serve(server.router().route("/test/click-park", click), &shutdown).await;
    let base = format!("http://127.0.0.1:{drover}");
    let page = attack_page(&base);
    let evil = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(page) }),
    );
    // `localhost` is another site than `127.0.0.1` for the browser.
    let evil = format!("http://localhost:{}/", serve(evil, &shutdown).await);
    let profile = tempfile::tempdir().expect("profile dir");
    let wait = "--virtual-time-budget=10000".to_owned();

    chromium(profile.path(), &[wait.clone(), "--dump-dom".into()], &evil).await;
    let get = |key: &str| ItemGet {
        process: "provision".into(),
        key: key.into(),
        runs_limit: 0,
    };
    let evil_key = db.store.item_get(get("evil")).await.expect("get");
    assert!(evil_key.is_none(), "nothing was enqueued");
    let m1 = db
        .store
        .item_get(get("m1"))
        .await
        .expect("get")
        .expect("m1");
    assert_eq!(m1.item.state, ItemState::Pending, "nothing was parked");
    // … because both posts were refused, not because none was sent.
    let item = "/ui/processes/{process}/items/{key}/{action}";
    assert_eq!(
        answered(&base, "/v1/processes/{process}/items", 403).await,
        "1"
    );
    assert_eq!(answered(&base, item, 403).await, "1");

    let click = format!("{base}/test/click-park");
    chromium(profile.path(), &[wait, "--dump-dom".into()], &click).await;
    assert_eq!(answered(&base, item, 303).await, "1");
    let m1 = db
        .store
        .item_get(get("m1"))
        .await
        .expect("get")
        .expect("m1");
    assert_eq!(m1.item.state, ItemState::Parked, "the button parked it");

    shutdown.cancel();
    server.stop();
}

/// A page on drover's own origin that clicks the first error group's real
/// "retry all" button on the process page (in a frame, as a person would).
const CLICK_RETRY_ALL: &str = r#"<!DOCTYPE html><title>click</title>
<iframe src="/ui/processes/provision" onload="
  const retry = this.contentDocument.querySelector('form[action$=&quot;/errors/retry&quot;] button');
  if (retry) { this.onload = null; retry.click(); }"></iframe>"#;

/// The error each key of the realistic data set fails with, and whether for
/// good (parked) or transiently (backing off); `None`: it converges.
fn failure(key: &str) -> Option<Outcome> {
    let n: usize = key.rsplit('-').next()?.parse().ok()?;
    match key.split('-').next()? {
        "vm" => Some(Outcome::Permanent(format!(
            "{key}: provisioning timed out after {}s (attempt {})",
            30 + n,
            n % 3 + 1
        ))),
        "db" => Some(Outcome::Transient(format!(
            "connection to 10.0.0.{n}:5432 refused"
        ))),
        "disk" => Some(Outcome::Permanent(format!(
            "<img src=x onerror=alert(1)> disk {n} full"
        ))),
        _ => None,
    }
}

/// `keys` of `provision` enqueued, claimed and each settled with
/// `outcome(key)`.
async fn settled(db: &support::TestDb, keys: &[String], outcome: impl Fn(&str) -> Outcome) {
    db.store
        .item_enqueue(ItemEnqueue::new("provision", keys.to_vec()))
        .await
        .expect("enqueue");
    let session = db.session().await;
    let claim = LeaseClaim {
        session: session.id,
        process: "provision".into(),
        max: u32::try_from(keys.len()).expect("a few keys"),
        trace_links: false,
    };
    let leases = db.store.lease_claim(claim).await.expect("claim").leases;
    assert_eq!(leases.len(), keys.len());
    for lease in &leases {
        let outcome = outcome(&lease.key);
        let done = LeaseComplete {
            lease,
            outcome: &outcome,
            trace_id: None,
        };
        db.store.lease_complete(done).await.expect("complete");
    }
}

/// A server on `db` with the page that clicks the first "retry all"
/// (`/test/click-retry-all`), and its base URL.
async fn serving_the_click(db: &support::TestDb, shutdown: &CancellationToken) -> (Server, String) {
    let server = Server::new(db.store.clone(), ServerOptions::default());
    let click = axum::routing::get(|| async { axum::response::Html(CLICK_RETRY_ALL) });
    let port = serve(
        server.router().route("/test/click-retry-all", click),
        shutdown,
    )
    .await;
    (server, format!("http://127.0.0.1:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_page_groups_errors_and_retry_all_retries_exactly_a_group() {
    if !chromium_available() {
        return;
    }
    let (db, _dir) = support::sqlite().await;
    let backoff = Backoff::new(Duration::from_secs(600), 2.0, Duration::from_secs(3600))
        .expect("valid backoff");
    let configure = ProcessConfigure::new("provision").backoff(backoff);
    db.store
        .process_configure(configure)
        .await
        .expect("configure");
    let mut keys: Vec<String> = (1..=12).map(|i| format!("vm-{i}")).collect();
    keys.extend((1..=6).map(|i| format!("db-{i}")));
    keys.extend((1..=3).map(|i| format!("disk-{i}")));
    keys.extend((1..=9).map(|i| format!("web-{i}")));
    settled(&db, &keys, |key| failure(key).unwrap_or(Outcome::Done)).await;
    let shutdown = CancellationToken::new();
    let (server, base) = serving_the_click(&db, &shutdown).await;
    let profile = tempfile::tempdir().expect("profile dir");

    let process = format!("{base}/ui/processes/provision");
    let page = chromium(profile.path(), &["--dump-dom".into()], &process).await;
    let groups: Vec<&str> = page.split(r#"<tr class="group">"#).skip(1).collect();
    assert_eq!(groups.len(), 3, "{page}");
    assert!(
        groups[0].contains(r#"<td class="n count">12</td>"#),
        "{}",
        groups[0]
    );
    assert!(
        groups[0]
            .contains("&lt;key&gt;: provisioning timed out after &lt;n&gt;s (attempt &lt;n&gt;)"),
        "{}",
        groups[0]
    );
    assert!(
        groups[1].contains(r#"<td class="states">backoff</td>"#),
        "{}",
        groups[1]
    );
    assert!(
        groups[1]
            .contains("connection to &lt;n&gt;.&lt;n&gt;.&lt;n&gt;.&lt;n&gt;:&lt;n&gt; refused")
    );
    assert!(
        groups[2].contains("&lt;img src=x onerror=alert(1)&gt; disk"),
        "the error is text: {}",
        groups[2]
    );
    assert!(!page.contains("<img src=x"), "no element was injected");
    for button in ["retry all", "park all", "delete all"] {
        assert_eq!(page.matches(button).count(), 3, "{button}");
    }
    let shot = artifacts().join("dashboard-errors.png");
    let arg = format!("--screenshot={}", shot.display());
    chromium(profile.path(), &[arg], &process).await;
    assert!(std::fs::metadata(&shot).expect("screenshot written").len() > 1000);

    let wait = "--virtual-time-budget=10000".to_owned();
    let click = format!("{base}/test/click-retry-all");
    chromium(profile.path(), &[wait, "--dump-dom".into()], &click).await;
    for key in &keys {
        let detail = db
            .store
            .item_get(ItemGet {
                process: "provision".into(),
                key: key.clone(),
                runs_limit: 1,
            })
            .await
            .expect("get")
            .expect("known");
        let expected = match key.split('-').next() {
            Some("vm") => ItemState::Pending,
            Some("db") => ItemState::Backoff,
            Some("disk") => ItemState::Parked,
            _ => ItemState::Idle,
        };
        assert_eq!(detail.item.state, expected, "{key}");
        if expected == ItemState::Pending {
            assert_eq!(detail.runs[0].actor.as_deref(), Some("admin"), "{key}");
        }
    }

    shutdown.cancel();
    server.stop();
}

/// A command's error is often more than one line (its stderr): a browser
/// sends a form field's line breaks as CRLF, so the group's button must
/// still name the group the page showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_all_retries_a_group_whose_error_has_more_than_one_line() {
    if !chromium_available() {
        return;
    }
    let (db, _dir) = support::sqlite().await;
    let keys = ["m-a", "m-b"];
    settled(&db, &keys.map(str::to_owned), |key| {
        Outcome::Permanent(format!(
            "exit status 2\nstderr: {key} disk full\r\nsee the log"
        ))
    })
    .await;
    let shutdown = CancellationToken::new();
    let (server, base) = serving_the_click(&db, &shutdown).await;
    let profile = tempfile::tempdir().expect("profile dir");
    let wait = "--virtual-time-budget=10000".to_owned();
    let click = format!("{base}/test/click-retry-all");
    chromium(profile.path(), &[wait, "--dump-dom".into()], &click).await;
    let route = "/ui/processes/{process}/errors/{action}";
    assert_eq!(
        answered(&base, route, 303).await,
        "1",
        "the button was clicked"
    );
    for key in keys {
        let detail = db
            .store
            .item_get(ItemGet {
                process: "provision".into(),
                key: key.into(),
                runs_limit: 1,
            })
            .await
            .expect("get")
            .expect("known");
        assert_eq!(
            detail.item.state,
            ItemState::Pending,
            "{key}: retried by its group's button"
        );
    }

    shutdown.cancel();
    server.stop();
}

/// An hour of a busy process, a minute at a time (the database clock moved
/// on after each): a varying number of keys enqueued, run, and mostly
/// converged, some failing; the queue depth sampled each minute. Then three
/// workers holding leases, one of them expired and not yet reclaimed.
async fn an_hour_of_work(db: &support::TestDb) -> Vec<drover::store::Session> {
    let store = &db.store;
    let sample = drover::store::DepthSample {
        keep: Duration::from_secs(86_400),
        min_gap: Duration::from_secs(30),
    };
    // One batch worker for the hour (its TTL outlasts it), closed after.
    let batch = drover::store::SessionStart::new("batch", Duration::from_secs(7200));
    let session = store.session_start(batch).await.expect("session");
    for minute in 0_u64..60 {
        let n = 20 + (minute * 7) % 25 + if (20..30).contains(&minute) { 30 } else { 0 };
        let keys: Vec<String> = (0..n).map(|i| format!("node-{minute:02}-{i:02}")).collect();
        store
            .item_enqueue(ItemEnqueue::new("provision", keys))
            .await
            .expect("enqueue");
        store.depth_sample(sample).await.expect("sample");
        let claim = LeaseClaim {
            session: session.id,
            process: "provision".into(),
            max: u32::try_from(n - 5).expect("small"),
            trace_links: false,
        };
        for (i, lease) in store
            .lease_claim(claim)
            .await
            .expect("claim")
            .leases
            .iter()
            .enumerate()
        {
            let outcome = match i % 13 {
                0 => Outcome::Transient(format!("{}: API rate limited", lease.key)),
                7 if minute > 40 => Outcome::Permanent("image not found".into()),
                _ => Outcome::Done,
            };
            let done = LeaseComplete {
                lease,
                outcome: &outcome,
                trace_id: None,
            };
            store.lease_complete(done).await.expect("complete");
        }
        store.clock().advance(Duration::from_secs(60));
    }
    let close = drover::store::SessionClose {
        session: session.id,
    };
    store.session_close(close).await.expect("close");
    let mut workers = Vec::new();
    for (n, host) in ["node-a", "node-b", "node-c"].into_iter().enumerate() {
        let ttl = Duration::from_secs(if n == 2 { 5 } else { 300 });
        let mut start = drover::store::SessionStart::new(format!("provisioner-{n}"), ttl);
        start.identity.host = Some(host.into());
        start.identity.pid = Some(4100 + u32::try_from(n).expect("small"));
        let s = store.session_start(start).await.expect("session");
        let claim = LeaseClaim {
            session: s.id,
            process: "provision".into(),
            max: 3,
            trace_links: false,
        };
        store.lease_claim(claim).await.expect("claim");
        workers.push(s);
    }
    store.clock().advance(Duration::from_secs(10));
    workers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_page_and_the_charts_show_a_fleet_at_work() {
    if !chromium_available() {
        return;
    }
    let (db, _dir) = support::sqlite().await;
    let workers = an_hour_of_work(&db).await;
    let shutdown = CancellationToken::new();
    // No reclaim during the test: the expired worker must still show.
    let options = ServerOptions::default().reclaim_interval(Duration::from_secs(3600));
    let server = Server::new(db.store.clone(), options);
    let port = serve(server.router(), &shutdown).await;
    let base = format!("http://127.0.0.1:{port}");
    let profile = tempfile::tempdir().expect("profile dir");

    let page = chromium(
        profile.path(),
        &["--dump-dom".into()],
        &format!("{base}/ui/workers"),
    )
    .await;
    let rows: Vec<&str> = page.split(r#"<tr class="session""#).skip(1).collect();
    assert_eq!(rows.len(), 3, "three workers: {page}");
    for (n, host) in ["node-a", "node-b", "node-c"].iter().enumerate() {
        let row = rows[n];
        assert!(
            row.contains(&format!(r#"<td class="host"><bdi>{host}</bdi></td>"#)),
            "{row}"
        );
        assert!(row.contains(&format!("{}", 4100 + n)), "{row}");
        assert!(row.contains(r#"<td class="n leases">3</td>"#), "{row}");
        assert_eq!(row.contains("expired, awaiting reclaim"), n == 2, "{row}");
        let tokens = row.matches(r#"<td class="n token">"#).count();
        assert_eq!(tokens, 3, "each lease with its fencing token: {row}");
    }
    assert_eq!(workers.len(), 3);
    let shot = artifacts().join("dashboard-workers.png");
    chromium(
        profile.path(),
        &[format!("--screenshot={}", shot.display())],
        &format!("{base}/ui/workers"),
    )
    .await;
    assert!(std::fs::metadata(&shot).expect("screenshot written").len() > 1000);

    let process = format!("{base}/ui/processes/provision");
    let page = chromium(profile.path(), &["--dump-dom".into()], &process).await;
    let runs = page
        .split(r#"id="runs-chart""#)
        .nth(1)
        .expect("a runs chart");
    let runs = runs.split("</figure>").next().expect("its end");
    assert!(
        runs.matches("<rect").count() >= 120,
        "bars for an hour of minutes: {runs}"
    );
    assert!(
        runs.contains(" retry</title>") && runs.contains(" parked</title>"),
        "{runs}"
    );
    let depth = page
        .split(r#"id="depth-chart""#)
        .nth(1)
        .expect("a depth chart");
    let line = depth.split("<polyline points=\"").nth(1).expect("a line");
    let points = line.split('"').next().expect("points").split(' ').count();
    assert!(points >= 59, "a point per sampled minute: {line}");
    // Attention order: parked keys lead the listing, then backing-off ones.
    let items = page.split(r#"<table id="items">"#).nth(1).expect("items");
    let first = items.split(r#"<td class="state">"#).nth(1).expect("a row");
    assert!(first.starts_with("parked"), "{first}");
    let shot = artifacts().join("dashboard-charts.png");
    chromium(
        profile.path(),
        &[format!("--screenshot={}", shot.display())],
        &process,
    )
    .await;
    assert!(std::fs::metadata(&shot).expect("screenshot written").len() > 1000);

    shutdown.cancel();
    server.stop();
}

/// A page on drover's own origin that, in a frame, picks the first process
/// of the overview's key search, types ` spaced ` as the key and clicks
/// Find, as a person would; then writes where the frame landed (its path
/// and query) and the key its page shows, as JSON in `<pre id="reached">`.
const SEARCH_FOR_A_KEY: &str = r#"<!DOCTYPE html><title>search</title>
<iframe src="/" onload="
  const d = this.contentDocument;
  if (!this.dataset.sent) {
    this.dataset.sent = 1;
    const form = d.querySelector('form[action=&quot;/ui/search&quot;]');
    form.querySelector('select').selectedIndex = 0;
    form.querySelector('input[type=search]').value = ' spaced ';
    form.querySelector('button').click();
  } else {
    this.onload = null;
    const key = d.querySelector('td.key');
    const out = document.createElement('pre');
    out.id = 'reached';
    out.textContent = JSON.stringify([d.location.pathname + d.location.search, key && key.textContent]);
    document.body.appendChild(out);
  }"></iframe>"#;

/// A process name holding a line break, and a key with spaces around it,
/// found by the overview's key search in a browser: the browser sends a
/// form field's line breaks as CRLF, and the search used to trim the key,
/// so it reached the key `spaced` of the process `multi\r\nline`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_search_finds_exactly_the_process_and_key_chosen() {
    if !chromium_available() {
        return;
    }
    let (db, _dir) = support::sqlite().await;
    // Listed by name: the first option is "multi\nline".
    for (process, key) in [("multi\nline", " spaced "), ("multi\r\nline", "spaced")] {
        db.store
            .item_enqueue(ItemEnqueue::new(process, [key]))
            .await
            .expect("enqueue");
    }
    let shutdown = CancellationToken::new();
    let server = Server::new(db.store.clone(), ServerOptions::default());
    let search = axum::routing::get(|| async { axum::response::Html(SEARCH_FOR_A_KEY) });
    let port = serve(server.router().route("/test/search", search), &shutdown).await;
    let profile = tempfile::tempdir().expect("profile dir");
    let wait = "--virtual-time-budget=10000".to_owned();
    let url = format!("http://127.0.0.1:{port}/test/search");
    let page = chromium(profile.path(), &[wait, "--dump-dom".into()], &url).await;
    let reached = page
        .split(r#"<pre id="reached">"#)
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("the search landed somewhere: {page}"))
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let reached: Vec<Option<String>> = serde_json::from_str(&reached).expect("JSON");
    assert_eq!(
        reached,
        [
            Some("/ui/processes/multi%0Aline/items/%20spaced%20".to_owned()),
            Some(" spaced ".to_owned())
        ],
        "the search reached the key chosen in the process chosen"
    );
    shutdown.cancel();
    server.stop();
}
