//! `drover enqueue PROCESS KEY…`: add keys for a process, with coalescing.

use std::collections::HashSet;
use std::io::BufRead as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::backoff::MAX_DELAY;
use drover::store::{
    EnqueueReport, ItemEnqueue, MAX_NAME_BYTES, StoreEngine as _, TraceContext, validate_key,
    validate_process,
};

use super::db::{DbArgs, parse_duration};
use super::say::{errln, outln};
use super::shown::shown;

/// Keys per database round trip when many keys arrive on stdin.
const BATCH: usize = 5_000;

/// Arguments of `drover enqueue`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// The process (control loop) the keys are for.
    process: String,
    /// The keys; `-` reads one key per line from stdin (blank lines are skipped).
    #[arg(required = true)]
    keys: Vec<String>,
    /// Do not run the keys before this delay has passed (e.g. 30s, 5m; at
    /// most 180 days).
    #[arg(long, value_name = "DURATION", value_parser = parse_delay, allow_hyphen_values = true)]
    after: Option<Duration>,
    /// Higher priorities run first; resyncs use a negative one.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Run the keys even if they are backing off after a failure.
    #[arg(long)]
    bypass_backoff: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// `--after`: a duration of at most [`MAX_DELAY`], drover's longest delay,
/// refused past it as the HTTP API and the SQL enqueues refuse it (the store
/// would have cut it to 180 days without a word).
fn parse_delay(s: &str) -> Result<Duration, String> {
    let delay = parse_duration(s)?;
    if delay > MAX_DELAY {
        return Err(format!(
            "{s:?} is longer than 180 days, the longest delay a key can have"
        ));
    }
    Ok(delay)
}

/// The keys from the arguments, reading stdin for `-`.
fn collect_keys(args: &[String]) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::with_capacity(args.len());
    for arg in args {
        if arg != "-" {
            keys.push(arg.clone());
            continue;
        }
        let mut stdin = std::io::stdin().lock();
        for n in 1.. {
            let Some(line) = next_line(&mut stdin, n)? else {
                break;
            };
            let line = String::from_utf8(line).map_err(|_| {
                anyhow::anyhow!(
                    "line {n} of stdin is not valid UTF-8 text (keys are text): nothing was enqueued"
                )
            })?;
            let key = line.strip_suffix('\r').unwrap_or(&line);
            if !key.is_empty() {
                keys.push(key.to_owned());
            }
        }
    }
    Ok(keys)
}

/// `keys` without repeats, in first-seen order. The store takes a key once
/// per batch, but keys go to it [`BATCH`] at a time: a key met again in a
/// later batch was enqueued there again, counting one more enqueue on its
/// item and one more key (or run to come) in the summary.
fn distinct(mut keys: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::with_capacity(keys.len());
    let first: Vec<bool> = keys.iter().map(|k| seen.insert(k.as_str())).collect();
    drop(seen);
    let mut first = first.into_iter();
    keys.retain(|_| first.next().unwrap_or(true));
    keys
}

/// Line `n` of `input` without its newline, `None` at the end. A line no key
/// fits in is refused as soon as it is longer than that, not read whole: a
/// stream without a newline (`drover enqueue p - < /dev/zero`) would
/// otherwise be held in memory until it ran out.
fn next_line(input: &mut impl std::io::BufRead, n: usize) -> anyhow::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    // A key, a carriage return and the newline.
    let most = MAX_NAME_BYTES + 2;
    let mut line = Vec::new();
    let read = input
        .take(most as u64)
        .read_until(b'\n', &mut line)
        .context("cannot read keys from stdin")?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if read == most {
        anyhow::bail!(
            "line {n} of stdin is longer than {MAX_NAME_BYTES} bytes (a key is at most \
             {MAX_NAME_BYTES}): nothing was enqueued"
        );
    }
    Ok(Some(line))
}

/// Validates every key before connecting (so bad input writes nothing, not even a
/// new database file), then enqueues them in batches.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    validate_process(&args.process)?;
    let keys = distinct(collect_keys(&args.keys)?);
    for key in &keys {
        validate_key(key)?;
    }
    let trace = trace_from_env();
    let store = args.db.open().await?;
    let mut total = EnqueueReport::default();
    for chunk in keys.chunks(BATCH) {
        let params = ItemEnqueue::new(args.process.clone(), chunk.iter().cloned())
            .after(args.after.unwrap_or_default())
            .priority(args.priority)
            .bypass_backoff(args.bypass_backoff)
            .trace(trace.clone());
        let report = store.item_enqueue(params).await?;
        total.pending += report.pending;
        total.dirty += report.dirty;
    }
    let mut summary = format!(
        "enqueued {} key(s) for {}: {} pending",
        total.pending + total.dirty,
        shown(&args.process),
        total.pending
    );
    if total.dirty > 0 {
        summary.push_str(&format!(", {} running (each runs once more)", total.dirty));
    }
    store.close().await;
    outln!("{summary}")
}

/// The trace context of the change behind this enqueue, from `TRACEPARENT`
/// and `TRACESTATE` (the environment carrier OpenTelemetry specifies for
/// processes): each key's next run links to it. Taken as W3C asks of
/// headers: a malformed `TRACEPARENT` is ignored, a malformed `TRACESTATE`
/// alone is dropped (the run still links to the trace), each with a warning.
fn trace_from_env() -> Option<TraceContext> {
    let parent = std::env::var("TRACEPARENT")
        .ok()
        .filter(|p| !p.trim().is_empty())?;
    let state = std::env::var("TRACESTATE").ok(); // not UTF-8: no tracestate
    match TraceContext::received(&parent, state.as_deref()) {
        Ok((trace, dropped)) => {
            if let Some(e) = dropped {
                errln!("warning: TRACESTATE ignored: {e}");
            }
            Some(trace)
        }
        Err(e) => {
            errln!("warning: TRACEPARENT ignored: {e}");
            None
        }
    }
}
