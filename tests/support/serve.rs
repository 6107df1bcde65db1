//! `drover serve` spawned from the built binary, for tests whose workers talk
//! HTTP.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// A running `drover serve` without tokens on a free loopback port; killed
/// when dropped.
#[derive(Debug)]
pub(crate) struct Serve {
    /// The server process.
    pub(crate) child: Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub(crate) url: String,
}

impl Serve {
    /// Starts `drover serve --db db_url` and waits (at most 30 s) for the
    /// banner naming its URL.
    pub(crate) async fn start(db_url: &str) -> Self {
        Self::start_with(db_url, &["--listen", "127.0.0.1:0"]).await
    }

    /// [`start`](Self::start) with `flags` (`--listen ADDR`, `--tokens FILE`).
    pub(crate) async fn start_with(db_url: &str, flags: &[&str]) -> Self {
        Self::start_with_env(db_url, flags, &[]).await
    }

    /// [`start_with`](Self::start_with) with environment variables `env`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`, …).
    pub(crate) async fn start_with_env(db_url: &str, flags: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(super::process::drover_bin())
            .args(["serve", "--db", db_url])
            .args(flags)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn drover serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("serve starts within 30 s")
            .expect("read the banner")
            .expect("a banner line");
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .expect("the banner names the URL")
            .to_owned();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child, url }
    }

    /// The address it listens on (to put a proxy in front of it).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.url
            .trim_start_matches("http://")
            .parse()
            .expect("the URL is http://IP:PORT")
    }
}
