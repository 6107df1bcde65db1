//! `drover serve`: the HTTP API, `/metrics` and the dashboard over one database.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args as ClapArgs;
use drover::server::{Server, ServerOptions, Tokens, TraceUrl};
use tokio_util::sync::CancellationToken;

use super::db::{DbArgs, parse_duration};
use super::open_files;
use super::say::{errln, sayln};
use super::signal::shutdown_on_signals;

/// The variable holding tokens (`ROLE:TOKEN,ROLE:TOKEN`), added to `--tokens`.
const TOKENS_ENV: &str = "DROVER_TOKENS";

/// Arguments of `drover serve`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Where to listen. Without tokens only a loopback address is allowed (see
    /// --insecure).
    #[arg(long, default_value = "127.0.0.1:7420", value_name = "ADDR")]
    listen: String,
    /// A file of bearer tokens, one `ROLE:TOKEN` per line (ROLE is viewer, worker
    /// or admin; `#` starts a comment). DROVER_TOKENS adds comma-separated ones.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Serve without tokens on a non-loopback address: anyone who can reach it is
    /// an admin.
    #[arg(long)]
    insecure: bool,
    /// A host name a server without tokens answers to, besides IP addresses
    /// and localhost (repeat for more): the name browsers use to reach it.
    /// Other names are refused, so a page cannot reach it by rebinding a name
    /// of its own to this machine.
    #[arg(long = "allowed-host", value_name = "NAME", value_parser = host_name)]
    allowed_hosts: Vec<String>,
    /// The longest a claim may wait for work.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    max_wait: Duration,
    /// How often to apply every process's retention (`drover process configure`),
    /// jittered ±10 %.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    prune_every: Duration,
    /// How often to sample every process's queue depth for the dashboard's
    /// depth chart (kept a day).
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    sample_every: Duration,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 1024 * 1024, value_name = "BYTES")]
    max_body: usize,
    /// The most processes workers' enqueues may create (every process in the
    /// database counts); an enqueue to a new process over it is refused (422
    /// too_many_processes). Raise it for a fleet of more control loops.
    #[arg(long, default_value_t = 100, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_processes: u32,
    /// The most live sessions one token may hold (with --tokens); a start
    /// over it is answered 429 too_many_sessions. Raise it for a fleet that
    /// shares one token across more control loops.
    #[arg(long, default_value_t = 10_000, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions_per_token: u32,
    /// The most processes /metrics gives series to, the first in name order
    /// (drover_metrics_processes_truncated is 1 when the database holds
    /// more): each costs a scrape a database read and about 2.4 KB.
    #[arg(long, default_value_t = 10_000, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    metrics_max_processes: u32,
    /// The most claims that may wait for work at once (16 per session, and
    /// half of this per token when there are several worker tokens); a claim over it
    /// is answered 429 too_many_waiting_claims.
    #[arg(long, default_value_t = 10_000, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_waiting_claims: u32,
    /// The most connections to hold at once; past it new ones wait until one
    /// closes. Lowered to fit the open-file limit (raised to its hard limit
    /// at start).
    #[arg(long, default_value_t = 16_384, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// How long a caller may stall: to send a request's headers or its
    /// whole body (408 request_timeout), to take an answer it stopped
    /// reading, or idle between requests. Waiting claims are bounded by
    /// --max-wait instead.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    client_timeout: Duration,
    /// A link to your tracing UI for each traced run on the dashboard's key
    /// page: an http(s) URL where `{trace_id}` stands for the run's trace
    /// id, e.g. 'http://jaeger:16686/trace/{trace_id}'. Without it the id
    /// is shown as text.
    #[arg(long, value_name = "TEMPLATE", value_parser = trace_url)]
    trace_url: Option<TraceUrl>,
    #[command(flatten)]
    db: DbArgs,
}

/// A `--trace-url` value, checked before anything starts.
fn trace_url(value: &str) -> Result<TraceUrl, String> {
    TraceUrl::parse(value).map_err(|e| e.to_string())
}

/// A `--allowed-host` value: a host name alone (no scheme, port or path),
/// since the name is what a request's `Host` is compared with.
fn host_name(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a host name: give the name alone, like drover.example.com \
             (no scheme, port or path)"
        ))
    }
}

/// The tokens from `--tokens` and `DROVER_TOKENS`, merged. A `--tokens`
/// file that holds no token (empty, or comments only), or a `DROVER_TOKENS`
/// that is not blank and holds none (`,`, a comment), is refused: without
/// tokens the server is open, every caller an admin, and whoever gave them
/// asked for the opposite. A blank `DROVER_TOKENS` is as good as unset (an
/// environment template's empty default).
fn load_tokens(file: Option<&PathBuf>) -> anyhow::Result<Tokens> {
    let mut text = String::new();
    if let Some(path) = file {
        text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the tokens file {}", path.display()))?;
        anyhow::ensure!(
            !Tokens::parse(&text).context("invalid tokens")?.is_empty(),
            "the tokens file {} holds no token: write one ROLE:TOKEN per line (ROLE is \
             viewer, worker or admin), or leave out --tokens to serve without tokens",
            path.display()
        );
        text.push('\n');
    }
    if let Ok(env) = std::env::var(TOKENS_ENV)
        && !env.trim().is_empty()
    {
        anyhow::ensure!(
            !Tokens::parse(&env).context("invalid tokens")?.is_empty(),
            "{TOKENS_ENV} holds no token: give comma-separated ROLE:TOKEN entries (ROLE is \
             viewer, worker or admin), or leave it empty to serve without tokens"
        );
        text.push_str(&env);
    }
    Tokens::parse(&text).context("invalid tokens")
}

/// Resolves `--listen` and refuses a non-loopback address without tokens.
async fn resolve(listen: &str, open: bool, insecure: bool) -> anyhow::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("--listen {listen:?} is not an address like 127.0.0.1:7420"))?
        .collect();
    if open && !insecure && addrs.iter().any(|a| !a.ip().is_loopback()) {
        bail!(
            "refusing to listen on {listen} without tokens: anyone who can reach it would be an \
             admin. Give --tokens FILE (or DROVER_TOKENS), listen on 127.0.0.1, or pass --insecure"
        );
    }
    Ok(addrs)
}

/// `wanted` connections, or fewer if the open-file limit (raised first, see
/// [`open_files::raise`]) cannot hold them beside the descriptors everything
/// else needs ([`open_files::reserve`]): past that limit an accepted
/// connection would take the descriptor a database connection needs.
fn fit_connections(wanted: usize) -> usize {
    let Some(limit) = open_files::raise() else {
        return wanted;
    };
    let room = limit.saturating_sub(open_files::reserve(limit)).max(1);
    if room < wanted {
        errln!(
            "drover serve: --max-connections {wanted} lowered to {room}: the open-file limit is \
             {limit} (raise it with `ulimit -n` to hold more)"
        );
    }
    wanted.min(room)
}

/// Serves until SIGINT/SIGTERM, then shuts down gracefully.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let tokens = load_tokens(args.tokens.as_ref())?;
    let addrs = resolve(&args.listen, tokens.is_empty(), args.insecure).await?;
    // The port first: a serve started on a port already taken (a second one
    // by mistake, a newer version beside the running one) must stop before
    // it opens the database, whose migrations it would otherwise have run
    // (and a newer schema is refused by the nodes still on the older one).
    let listener = tokio::net::TcpListener::bind(addrs.as_slice())
        .await
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                " (another server is there: stop it or choose another --listen)"
            } else {
                ""
            };
            anyhow::Error::new(e).context(format!("cannot listen on {}{hint}", args.listen))
        })?;
    let store = args.db.open_lasting().await?;
    let local = listener.local_addr()?;
    let auth = if tokens.is_empty() {
        "open: no tokens, every caller is an admin (answers IP addresses and localhost names only)"
            .to_owned()
    } else {
        format!("{} bearer token(s)", tokens.len())
    };
    // Handlers first: a signal right after the banner must shut down gracefully.
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signals(shutdown.clone()));
    sayln!("drover serve listening on http://{local}");
    sayln!(
        "  database:  {} ({})",
        args.db.redacted(),
        store.engine_name()
    );
    sayln!("  dashboard: http://{local}/");
    sayln!("  API:       http://{local}/v1 (OpenAPI at http://{local}/openapi.json)");
    sayln!("  auth:      {auth}");
    let mut options = ServerOptions::default()
        .tokens(tokens)
        .max_wait(args.max_wait)
        .body_limit(args.max_body)
        .prune_interval(args.prune_every)
        .sample_interval(args.sample_every)
        .allowed_hosts(args.allowed_hosts)
        .max_processes(args.max_processes as usize)
        .max_sessions_per_token(args.max_sessions_per_token as usize)
        .metrics_max_processes(args.metrics_max_processes as usize)
        .max_waiting_claims(args.max_waiting_claims as usize)
        .max_connections(fit_connections(args.max_connections as usize))
        .client_timeout(args.client_timeout);
    if let Some(template) = args.trace_url {
        options = options.trace_url(template);
    }
    let served = Server::new(store.clone(), options)
        .serve(listener, shutdown)
        .await;
    store.close().await;
    served.context("the server failed")?;
    sayln!("drover serve stopped");
    Ok(())
}
