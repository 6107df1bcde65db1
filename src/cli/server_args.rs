//! `--server URL` and `--token`: the options of the commands that can act
//! through a drover server's HTTP API (`pause`, `resume`, `work`, `bench`),
//! and the client they make.

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::client::Client;

/// Where a command reaches a drover server, and as whom.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct ServerArgs {
    /// Go through this drover server's HTTP API: `pause`, `resume` and
    /// `work` instead of the database (for machines that should not hold
    /// database credentials); `bench` burn-down and backlog beside it, a
    /// `drover serve` on the same database, with a figure of their own.
    #[arg(long, value_name = "URL")]
    pub(crate) server: Option<String>,
    /// The bearer token for --server (`pause` and `resume` need an admin's,
    /// `work` a worker's or an admin's).
    #[arg(
        long,
        env = "DROVER_TOKEN",
        hide_env_values = true,
        requires = "server"
    )]
    token: Option<String>,
}

impl ServerArgs {
    /// A client of `url` (the --server given) with --token as its bearer
    /// token, if one was given.
    pub(crate) fn client(&self, url: &str) -> anyhow::Result<Client> {
        let client = Client::new(url).context("invalid --server")?;
        Ok(match &self.token {
            Some(token) => client.token(token.clone()),
            None => client,
        })
    }
}
