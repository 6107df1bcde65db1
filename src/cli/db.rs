//! `--db URL`: the database option every store command shares.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::store::{Store, StoreOptions};

/// Where the store lives.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct DbArgs {
    /// The database: sqlite://PATH (created if missing), sqlite::memory: or
    /// postgres://USER[:PASSWORD]@HOST[:PORT]/DB; add ?pool_mode=transaction
    /// when it is a PgBouncer in transaction pooling mode.
    // `hide_env_values`: `--help` would print the variable's value, and
    // with it any password the URL holds.
    #[arg(
        long = "db",
        env = "DROVER_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://drover.db"
    )]
    url: String,
    /// With --db through a transaction-pooling PgBouncer: a direct
    /// PostgreSQL URL used only to LISTEN for wake-ups (without it, idle
    /// workers poll about once a second).
    #[arg(
        long = "listen-db",
        env = "DROVER_LISTEN_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    listen_url: Option<String>,
}

impl DbArgs {
    /// The database URL with its password hidden, for banners and logs.
    pub(crate) fn redacted(&self) -> String {
        drover::store::redact_url(&self.url)
    }

    /// Connects, applying any migrations the database lacks, for a command
    /// that ends once its work is done. An in-memory database would end
    /// with it, and what it wrote with it (an enqueue said "enqueued" of
    /// keys no worker could ever see), so one is refused.
    pub(crate) async fn open(&self) -> anyhow::Result<Store> {
        anyhow::ensure!(
            !self.in_memory(),
            "--db {}: an in-memory database ends with this command, and what it writes \
             with it; give a file (sqlite://drover.db) or a PostgreSQL URL (only serve and \
             work keep one, for as long as they run)",
            self.redacted()
        );
        self.open_lasting().await
    }

    /// [`open`](Self::open) for `serve` and `work`, which keep an in-memory
    /// database for as long as they run.
    pub(crate) async fn open_lasting(&self) -> anyhow::Result<Store> {
        Store::connect_with(&self.url, &self.options())
            .await
            .context("cannot open the store")
    }

    /// Whether the URL names an in-memory SQLite database.
    fn in_memory(&self) -> bool {
        self.url.starts_with("sqlite:") && drover::store::is_in_memory(&self.url)
    }

    /// The connect options these flags ask for.
    pub(crate) fn options(&self) -> StoreOptions {
        StoreOptions::default().listen_url(self.listen_url.clone())
    }
}

/// Parses a human duration (`90s`, `5m`, `1h 30m`, `0s`) for `--after` and
/// friends, with a message that says what was wrong.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let trimmed = s.trim();
    if trimmed.starts_with('-') {
        return Err(format!("{s:?} is negative; durations must be 0 or more"));
    }
    humantime::parse_duration(trimmed)
        .map_err(|e| format!("{s:?} is not a duration like 30s, 5m or 1h ({e})"))
}
