//! `drover serve` as a process: its startup banner (where it listens, which
//! database with the password hidden, the dashboard URL) and a graceful stop on
//! SIGTERM.

mod support;

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// Starts `drover serve` on a free loopback port with `db`.
fn serve(db: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db", db])
        .env_remove("DROVER_TOKENS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start drover serve")
}

/// The banner: every line up to the `auth:` one.
async fn banner(lines: &mut tokio::io::Lines<BufReader<ChildStdout>>) -> String {
    let mut text = String::new();
    let read = async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            text.push_str(&line);
            text.push('\n');
            if line.trim_start().starts_with("auth:") {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("banner within 30 s");
    text
}

/// The `host:port` the banner says the server listens on.
fn address(banner: &str) -> String {
    banner
        .split("listening on http://")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("address in the banner")
        .to_owned()
}

/// A plain HTTP/1.0 GET; returns the whole response.
async fn get(addr: &str, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
}

/// Sends SIGTERM and expects a clean exit with the closing line.
async fn stop(mut child: Child, mut lines: tokio::io::Lines<BufReader<ChildStdout>>) {
    let pid = Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stopped within 30 s")
        .expect("wait");
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    while let Some(line) = lines.next_line().await.expect("stdout") {
        rest.push_str(&line);
    }
    assert!(rest.contains("drover serve stopped"), "{rest}");
}

#[tokio::test]
async fn serve_announces_its_address_and_dashboard_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    let mut child = serve(&db);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let text = banner(&mut lines).await;
    let addr = address(&text);
    assert!(
        text.contains(&format!("dashboard: http://{addr}/")),
        "{text}"
    );
    assert!(text.contains(&db), "{text}");
    assert!(get(&addr, "/healthz").await.starts_with("HTTP/1.0 200"));
    stop(child, lines).await;
}

/// A `serve` whose stderr nobody reads any more (its log shipper died) still
/// stops on SIGTERM: the signal task wrote "shutting down gracefully" into
/// the closed pipe before it started the shutdown, and that write panicked,
/// so SIGTERM stopped nothing.
#[tokio::test]
async fn serve_whose_stderr_reader_has_gone_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = serve(&format!("sqlite://{}", dir.path().join("d.db").display()));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    banner(&mut lines).await;
    drop(child.stderr.take().expect("stderr"));
    stop(child, lines).await;
}

/// `drover serve --tokens FILE` on `db`, `DROVER_TOKENS` set to `env` (or
/// unset), its output piped.
fn serve_with_tokens(db: &str, tokens: &std::path::Path, env: Option<&str>) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drover"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--db", db, "--tokens"])
        .arg(tokens);
    match env {
        Some(env) => command.env("DROVER_TOKENS", env),
        None => command.env_remove("DROVER_TOKENS"),
    };
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start drover serve")
}

/// `--tokens FILE` asks for a server that checks tokens: a file that holds
/// none (empty, or comments only: a secret not written yet) is refused with
/// one line. It started an open server, every caller an admin.
#[tokio::test]
async fn serve_refuses_a_tokens_file_that_holds_no_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# one ROLE:TOKEN per line\n\n").expect("tokens file");
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    let child = serve_with_tokens(&db, &tokens, None);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("refused at once, not served open")
        .expect("wait");
    support::cli::fails_with(&out, "holds no token");
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// A `drover serve` started on a port already taken stops before it opens
/// the database: it ran the store's migrations first (creating a SQLite
/// file, or upgrading a shared schema under nodes still on the older
/// version) and only then found the port taken.
#[tokio::test]
async fn serve_on_a_taken_port_stops_before_opening_the_database() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("address").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("d.db");
    let out = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db"])
        .arg(format!("sqlite://{}", file.display()))
        .env_remove("DROVER_TOKENS")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("refused, not served")
        .expect("run drover serve");
    support::cli::fails_with(&out, "another server is there");
    assert!(
        !file.exists(),
        "the database was opened (and migrated) first"
    );
}

/// A `DROVER_TOKENS` that is not blank but holds no token (`,`, a comment)
/// asks for a server that checks tokens, as an empty tokens file does, and
/// is refused with one line: it served open, every caller an admin. A blank
/// one is as good as unset (an environment template's empty default).
#[tokio::test]
async fn serve_refuses_a_tokens_variable_that_holds_no_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    let start = |env: &str| {
        Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["serve", "--listen", "127.0.0.1:0", "--db", &db])
            .env("DROVER_TOKENS", env)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start drover serve")
    };
    for empty in [",", " # later "] {
        let out = tokio::time::timeout(Duration::from_secs(10), start(empty).wait_with_output())
            .await
            .expect("refused at once, not served open")
            .expect("wait");
        support::cli::fails_with(&out, "DROVER_TOKENS holds no token");
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    let mut blank = start("  ");
    let stdout = blank.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let said = banner(&mut lines).await;
    assert!(said.contains("auth:      open"), "{said}");
    stop(blank, lines).await;
}

/// One token given two roles (an entry copied and not edited, or
/// `DROVER_TOKENS` beside the file) is refused, naming both entries: the
/// later entry silently won, so a viewer's line after an admin's took the
/// admin's rights away, and an admin's after a viewer's gave them.
#[tokio::test]
async fn serve_refuses_a_token_given_two_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "viewer:shared\nworker:w1\n").expect("tokens file");
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    for (env, needle) in [
        ("admin:shared", "gives the token of entry 1 another role"),
        ("viewer:shared,worker:w1", ""),
    ] {
        let child = serve_with_tokens(&db, &tokens, Some(env));
        if needle.is_empty() {
            // The same role again is only a repeat: served.
            let mut child = child;
            let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
            let text = banner(&mut lines).await;
            assert!(text.contains("2 bearer token(s)"), "{text}");
            stop(child, lines).await;
            continue;
        }
        let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
            .await
            .expect("refused at once, not served")
            .expect("wait");
        support::cli::fails_with(&out, needle);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("shared"), "a token printed: {stderr}");
    }
}

/// The binary turns transparent huge pages off for itself (`src/main.rs`:
/// mimalloc asked for them and the kernel zeroed two megabytes per first
/// touch); the kernel reports the process's setting in `/proc/PID/status`.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn serve_runs_without_transparent_huge_pages() {
    let ours = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    if !ours.contains("THP_enabled:") {
        eprintln!("skipping: this kernel does not report THP_enabled");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = serve(&format!("sqlite://{}", dir.path().join("d.db").display()));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    banner(&mut lines).await;
    let pid = child.id().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find(|l| l.starts_with("THP_enabled:"));
    assert_eq!(
        line.map(|l| l.split_whitespace().nth(1)),
        Some(Some("0")),
        "{line:?}"
    );
    stop(child, lines).await;
}

#[tokio::test]
async fn serve_hides_the_database_password_in_its_banner() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    // Trust authentication ignores the password, so the server still connects.
    let Some((scheme, rest)) = db.url.split_once("://") else {
        panic!("URL {base}")
    };
    let Some((user, host)) = rest.split_once('@').filter(|(u, _)| !u.contains(':')) else {
        eprintln!("skipping: {base} already carries a password or no user");
        return;
    };
    // The password in the user part, or in the query as libpq allows.
    let separator = if host.contains('?') { '&' } else { '?' };
    for (url, hidden) in [
        (
            format!("{scheme}://{user}:hunter2@{host}"),
            format!("{user}:***@"),
        ),
        (
            format!("{scheme}://{user}@{host}{separator}password=hunter2"),
            "password=***".to_owned(),
        ),
    ] {
        let mut child = serve(&url);
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let text = banner(&mut lines).await;
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains(&hidden), "{text}");
        stop(child, lines).await;
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A `drover serve` on a new SQLite file under the open-file limits `ulimit`
/// sets (a shell command), asked for more connections than any such limit
/// holds: the child, its banner's lines, its address and the first line it
/// wrote on stderr, and the directory that holds its file.
async fn serve_under(ulimit: &str) -> Limited {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    let mut child = Command::new("sh")
        .args(["-c", &format!(r#"{ulimit} && exec "$@""#), "sh"])
        .arg(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db", &db])
        .args(["--max-connections", "100000"])
        .env_remove("DROVER_TOKENS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start drover serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let text = banner(&mut lines).await;
    let addr = address(&text);
    let mut errors = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let said = tokio::time::timeout(Duration::from_secs(30), errors.next_line())
        .await
        .expect("a line on stderr")
        .expect("stderr")
        .expect("a line");
    Limited {
        child,
        lines,
        addr,
        said,
        _stderr: errors,
        _dir: dir,
    }
}

/// A `drover serve` started by [`serve_under`].
struct Limited {
    child: Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    addr: String,
    said: String,
    /// Kept open: `serve` writes on stderr as it stops.
    _stderr: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    _dir: tempfile::TempDir,
}

impl Limited {
    /// Sends SIGTERM and expects a clean exit (see [`stop`]).
    async fn stop(self) {
        stop(self.child, self.lines).await;
    }
}

/// `serve` fits `--max-connections` to the open-file limit, keeping room for
/// the database's files: past the limit an accepted connection would take
/// the descriptor a database connection needs. Under a hard limit of 256
/// (macOS's usual soft limit) it keeps a quarter back and holds 192, so a
/// caller holding a connection half-sent does not hold everyone off (a
/// fixed reserve of 256 once left it one connection).
#[tokio::test]
async fn serve_fits_its_connections_to_the_open_file_limit() {
    let server = serve_under("ulimit -n 256").await;
    let (said, addr) = (&server.said, &server.addr);
    assert!(
        said.contains("--max-connections 100000 lowered to 192")
            && said.contains("open-file limit is 256"),
        "{said}"
    );
    let mut holder = tokio::net::TcpStream::connect(addr).await.expect("connect");
    holder
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("send a part");
    let answered = tokio::time::timeout(Duration::from_secs(10), get(addr, "/healthz"))
        .await
        .expect("answered beside a held connection");
    assert!(answered.starts_with("HTTP/1.0 200"), "{answered}");
    drop(holder);
    server.stop().await;
}

/// A soft open-file limit below the hard one (commonly 1,024 against
/// 524,288) is raised to the hard one before the connections are fitted:
/// under 256 soft and 512 hard, `serve` holds 384 connections, not the 192
/// the soft limit alone would leave.
#[tokio::test]
async fn serve_raises_its_soft_open_file_limit_to_the_hard_one() {
    let server = serve_under("ulimit -S -n 256 && ulimit -H -n 512").await;
    let said = &server.said;
    assert!(
        said.contains("--max-connections 100000 lowered to 384")
            && said.contains("open-file limit is 512"),
        "{said}"
    );
    server.stop().await;
}
