//! `drover process configure|list`: a process's settings (retention, backoff,
//! fleet limits), stored in the database so every node applies the same ones.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args as ClapArgs, Subcommand};
use drover::backoff::{Backoff, MAX_DELAY};
use drover::store::{
    FleetLimits, ProcessConfigure, ProcessSettings, StoreEngine as _, validate_process,
};
use serde_json::json;

use super::db::{DbArgs, parse_duration};
use super::say::outln;
use super::shown::shown;

/// Arguments of `drover process`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Change a process's settings (creating the process if unknown); settings
    /// not given keep their stored values. Prints the resulting settings.
    Configure(ConfigureArgs),
    /// Print every process's settings.
    List(ListArgs),
}

/// Arguments of `drover process configure`: one flattened group of flags per
/// kind of setting, each turning what was given into its part of
/// [`ProcessConfigure`] (a new setting is a field in its group, or a new group).
#[derive(Debug, ClapArgs)]
struct ConfigureArgs {
    /// The process.
    process: String,
    #[command(flatten)]
    retention: RetentionFlags,
    #[command(flatten)]
    backoff: BackoffFlags,
    #[command(flatten)]
    resync: ResyncFlags,
    #[command(flatten)]
    limits: LimitFlags,
    #[command(flatten)]
    db: DbArgs,
}

/// Arguments of `drover process list`.
#[derive(Debug, ClapArgs)]
struct ListArgs {
    /// Print JSON (one array of objects) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// How long a process keeps its history and its idle keys.
#[derive(Debug, ClapArgs)]
struct RetentionFlags {
    /// Delete runs older than this, e.g. 7d (default 7 days).
    #[arg(long, value_name = "DURATION", value_parser = positive_duration)]
    keep_runs_for: Option<Duration>,
    /// Keep at most this many runs per key, the newest (default 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    keep_runs_per_key: Option<u32>,
    /// Forget idle keys untouched (no run ended, no enqueue) for this long, e.g.
    /// 30d, or `never` (the default).
    #[arg(long, value_name = "DURATION|never", value_parser = idle_limit)]
    forget_idle_after: Option<IdleLimit>,
}

impl RetentionFlags {
    fn apply(&self, params: ProcessConfigure) -> ProcessConfigure {
        let mut params = params;
        if let Some(period) = self.keep_runs_for {
            params = params.keep_runs_for(period);
        }
        if let Some(runs) = self.keep_runs_per_key {
            params = params.keep_runs_per_key(runs);
        }
        if let Some(IdleLimit(period)) = self.forget_idle_after {
            params = params.forget_idle_after(period);
        }
        params
    }
}

/// How often idle keys are looked at again.
#[derive(Debug, ClapArgs)]
struct ResyncFlags {
    /// Make every idle (converged) key pending again this long after its last
    /// run ended, e.g. 1h, or `never` (the default); parked, backing-off and
    /// running keys are never touched.
    #[arg(long, value_name = "DURATION|never", value_parser = idle_limit)]
    resync: Option<IdleLimit>,
    /// Spread keys over this fraction of the interval, 0 to 1 (default 0.1):
    /// each comes back between DURATION and DURATION × (1 + FRACTION).
    #[arg(long, value_name = "FRACTION")]
    resync_jitter: Option<f64>,
    /// The priority resynced keys wait at (default -100, below enqueues' 0).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    resync_priority: Option<i32>,
}

impl ResyncFlags {
    fn apply(&self, params: ProcessConfigure) -> ProcessConfigure {
        let mut params = params;
        if let Some(IdleLimit(every)) = self.resync {
            params = params.resync_every(every);
        }
        if let Some(jitter) = self.resync_jitter {
            params = params.resync_jitter(jitter);
        }
        if let Some(priority) = self.resync_priority {
            params = params.resync_priority(priority);
        }
        params
    }
}

/// The retry delays after failures; the fields not given keep the stored ones.
#[derive(Debug, ClapArgs)]
struct BackoffFlags {
    /// The delay after the first failure (default 1s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    backoff_initial: Option<Duration>,
    /// The longest delay (default 360s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    backoff_max: Option<Duration>,
    /// The growth per further failure, at least 1 (default 2).
    #[arg(long, value_name = "FACTOR")]
    backoff_factor: Option<f64>,
    /// Spread each delay by up to this fraction, 0 to 1 (default 0).
    #[arg(long, value_name = "FRACTION")]
    backoff_jitter: Option<f64>,
}

impl BackoffFlags {
    fn given(&self) -> bool {
        self.backoff_initial.is_some()
            || self.backoff_max.is_some()
            || self.backoff_factor.is_some()
            || self.backoff_jitter.is_some()
    }

    /// Refuses, before connecting, what no stored value could make valid: a
    /// factor below 1, a jitter outside 0..=1, a max below the initial delay.
    fn precheck(&self) -> anyhow::Result<()> {
        // The most lenient stored policy: 0 s, ×1, up to the longest delay.
        let lenient = Backoff::new(Duration::ZERO, 1.0, MAX_DELAY)
            .expect("0 ≤ MAX_DELAY and a factor of 1 make a valid backoff");
        self.merged(lenient).map(drop)
    }

    /// The flags given over `stored`, checked as a whole.
    fn merged(&self, stored: Backoff) -> anyhow::Result<Backoff> {
        let backoff = Backoff::new(
            self.backoff_initial.unwrap_or(stored.initial()),
            self.backoff_factor.unwrap_or(stored.factor()),
            self.backoff_max.unwrap_or(stored.max()),
        )
        .and_then(|b| b.with_jitter(self.backoff_jitter.unwrap_or(stored.jitter())))
        .context("invalid backoff")?;
        Ok(backoff)
    }

    fn apply(&self, params: ProcessConfigure, stored: Backoff) -> anyhow::Result<ProcessConfigure> {
        if !self.given() {
            return Ok(params);
        }
        let backoff = self.merged(stored).with_context(|| {
            format!(
                "over the stored backoff {} (the parts not given keep it)",
                describe_backoff(&stored)
            )
        })?;
        Ok(params.backoff(backoff))
    }
}

/// The fleet's limits on the process (pause it with `drover pause`).
#[derive(Debug, ClapArgs)]
struct LimitFlags {
    /// At most N of its keys running at once across every worker and node,
    /// or `none` (the default).
    #[arg(long, value_name = "N|none", value_parser = concurrency_limit)]
    concurrency: Option<Limit<u32>>,
    /// At most this many runs started per second (`20/s`, `600/m`, `2/h`)
    /// across the fleet, or `none` (the default).
    #[arg(long, value_name = "N/s|none", value_parser = rate_limit)]
    rate: Option<Limit<f64>>,
    /// How many runs may start at once after a quiet spell, at least 1
    /// (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    burst: Option<u32>,
}

impl LimitFlags {
    fn apply(&self, params: ProcessConfigure) -> ProcessConfigure {
        let mut params = params;
        if let Some(Limit(n)) = self.concurrency {
            params = params.concurrency(n);
        }
        if let Some(Limit(rate)) = self.rate {
            params = params.rate(rate);
        }
        if let Some(burst) = self.burst {
            params = params.burst(burst);
        }
        params
    }
}

/// A limit, or `none` (`Limit(None)`).
#[derive(Debug, Clone, Copy)]
struct Limit<T>(Option<T>);

fn concurrency_limit(s: &str) -> Result<Limit<u32>, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    match s.trim().parse::<u32>() {
        Ok(0) => {
            Err("a concurrency limit must be at least 1 (use `drover pause` to run none)".into())
        }
        Ok(n) => Ok(Limit(Some(n))),
        Err(_) => Err(format!(
            "{s:?} is not a number of runs; give e.g. 20, or none"
        )),
    }
}

/// `20/s`, `600/m`, `2/h` (or a bare number, per second) as runs per second.
fn rate_limit(s: &str) -> Result<Limit<f64>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    let (count, per) = s.split_once('/').unwrap_or((s, "s"));
    let seconds = match per.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        other => {
            return Err(format!(
                "{other:?} is not a period; give e.g. 20/s, 600/m or 2/h"
            ));
        }
    };
    let count: f64 = count
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a rate; give e.g. 20/s, 600/m, 2/h or none"))?;
    let rate = count / seconds;
    if !(drover::store::MIN_RATE_PER_S..=drover::store::MAX_RATE_PER_S).contains(&rate) {
        return Err(format!(
            "{s:?} is out of range; give a rate of at least 0.000000001/s and at most 1000000/s"
        ));
    }
    Ok(Limit(Some(rate)))
}

/// `--forget-idle-after`, `--resync`: a period, or never.
#[derive(Debug, Clone, Copy)]
struct IdleLimit(Option<Duration>);

fn idle_limit(s: &str) -> Result<IdleLimit, String> {
    if s.trim().eq_ignore_ascii_case("never") {
        return Ok(IdleLimit(None));
    }
    positive_duration(s).map(|d| IdleLimit(Some(d)))
}

/// A duration longer than zero.
fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} is zero; give a period like 1h or 7d"));
    }
    Ok(d)
}

/// Runs `drover process …`.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Configure(args) => configure(args).await,
        Command::List(args) => list(args).await,
    }
}

/// Merges the flags over the stored settings, writes them and prints the
/// result. Everything is checked before anything is written: the names before
/// connecting, the merged backoff before the write.
async fn configure(args: ConfigureArgs) -> anyhow::Result<()> {
    validate_process(&args.process)?;
    args.backoff.precheck()?;
    let store = args.db.open().await?;
    let result = async {
        let stored = settings_of(&store, &args.process).await?;
        let stored_backoff = stored.map_or_else(Backoff::default, |s| s.backoff);
        let params = ProcessConfigure::new(args.process.clone());
        let params = args.retention.apply(params);
        let params = args.backoff.apply(params, stored_backoff)?;
        let params = args.resync.apply(params);
        let params = args.limits.apply(params);
        store.process_configure(params).await?;
        settings_of(&store, &args.process)
            .await?
            .context("the process vanished after it was configured")
    }
    .await;
    store.close().await;
    print_table(&[result?])
}

/// Prints every process's settings.
async fn list(args: ListArgs) -> anyhow::Result<()> {
    let store = args.db.open().await?;
    let processes = store.process_list().await;
    store.close().await;
    let processes = processes?;
    if args.json {
        let rows: Vec<_> = processes.iter().map(to_json).collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    } else if processes.is_empty() {
        outln!("no processes yet: enqueue some keys or run `drover process configure PROCESS`")?;
    } else {
        print_table(&processes)?;
    }
    Ok(())
}

/// The stored settings of `process`, `None` if it is unknown.
async fn settings_of(
    store: &drover::Store,
    process: &str,
) -> anyhow::Result<Option<ProcessSettings>> {
    Ok(store.process_get(process).await?)
}

/// A duration as people write it (`7days`, `6m`).
fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A backoff as `1s ×2 up to 6m`, with its jitter if any.
fn describe_backoff(b: &Backoff) -> String {
    let mut text = format!(
        "{} ×{} up to {}",
        human(b.initial()),
        b.factor(),
        human(b.max())
    );
    if b.jitter() > 0.0 {
        text.push_str(&format!(", jitter {}", b.jitter()));
    }
    text
}

/// A resync as `1h ±10% prio -100`, or `never`.
fn describe_resync(s: &ProcessSettings) -> String {
    s.resync.map_or_else(
        || "never".to_owned(),
        |r| {
            format!(
                "{} +{}% prio {}",
                human(r.every),
                (r.jitter * 100.0).round(),
                r.priority
            )
        },
    )
}

/// The fleet controls as `paused, at most 5 at once, 20/s burst 5` (or `-`).
pub(crate) fn describe_limits(l: &FleetLimits) -> String {
    let mut parts = Vec::new();
    if l.paused {
        parts.push("paused".to_owned());
    }
    if let Some(n) = l.concurrency {
        parts.push(format!("at most {n} at once"));
    }
    if let Some(r) = l.rate {
        parts.push(format!("{}/s burst {}", r.per_second, r.burst));
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

fn print_table(processes: &[ProcessSettings]) -> anyhow::Result<()> {
    outln!(
        "{:<24} {:>15} {:>13} {:>18} {:>22}  {:<28}  BACKOFF",
        "PROCESS",
        "KEEP RUNS FOR",
        "RUNS PER KEY",
        "FORGET IDLE AFTER",
        "RESYNC",
        "FLEET"
    )?;
    for s in processes {
        let r = &s.retention;
        let forget = r
            .forget_idle_after
            .map_or_else(|| "never".to_owned(), human);
        outln!(
            "{:<24} {:>15} {:>13} {:>18} {:>22}  {:<28}  {}",
            shown(&s.process),
            human(r.keep_runs_for),
            r.keep_runs_per_key,
            forget,
            describe_resync(s),
            describe_limits(&s.limits),
            describe_backoff(&s.backoff)
        )?;
    }
    Ok(())
}

fn to_json(s: &ProcessSettings) -> serde_json::Value {
    let r = &s.retention;
    let b = &s.backoff;
    json!({
        "process": s.process,
        "keep_runs_for_seconds": r.keep_runs_for.as_secs_f64(),
        "keep_runs_per_key": r.keep_runs_per_key,
        "forget_idle_after_seconds": r.forget_idle_after.map(|d| d.as_secs_f64()),
        "resync": s.resync.map(|r| json!({
            "every_seconds": r.every.as_secs_f64(),
            "jitter": r.jitter,
            "priority": r.priority,
        })),
        "next_resync": s.next_resync,
        "backoff": {
            "initial_seconds": b.initial().as_secs_f64(),
            "factor": b.factor(),
            "max_seconds": b.max().as_secs_f64(),
            "jitter": b.jitter(),
        },
        "paused": s.limits.paused,
        "concurrency": s.limits.concurrency,
        "rate_per_second": s.limits.rate.map(|r| r.per_second),
        "rate_burst": s.limits.rate.map(|r| r.burst),
    })
}
