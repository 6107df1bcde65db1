//! Fleet controls: a process's pause switch, cluster-wide concurrency limit and
//! cluster-wide rate limit, stored with the process so every worker and every
//! `serve` node obeys the same values at its next claim (DESIGN.md rule 10).

use std::time::Duration;

use serde::Serialize;

use super::types::{Lease, RunOutcome};

/// The most runs per second a rate limit may allow: past this the limit would
/// never bind anyway, and the bucket's arithmetic stays exact.
pub const MAX_RATE_PER_S: f64 = 1_000_000.0;

/// The fewest runs per second a rate limit may allow (one in about 32
/// years): below it a claim's refill, the time since the bucket's last write
/// times the rate, could underflow a float, which PostgreSQL's gated claim
/// raises as an error on every claim, so the process would never run again.
pub const MIN_RATE_PER_S: f64 = 1e-9;

/// A process's fleet controls as stored (see
/// [`ProcessSettings::limits`](super::ProcessSettings::limits)).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct FleetLimits {
    /// No worker claims the process's keys while it is paused; runs already
    /// going finish normally, and enqueues are kept (and coalesce) meanwhile.
    pub paused: bool,
    /// At most this many of the process's keys run at once across every worker
    /// and node (`None`: no limit).
    pub concurrency: Option<u32>,
    /// At most this many runs start per second across the fleet, with a burst
    /// (`None`: no limit).
    pub rate: Option<RateLimit>,
}

impl FleetLimits {
    /// Whether a claim must look at the limits at all: false for a process
    /// that is neither paused nor limited, whose claims stay on the fast path.
    #[must_use]
    pub fn binds(&self) -> bool {
        self.paused || self.concurrency.is_some() || self.rate.is_some()
    }
}

/// A token bucket on the database clock: `per_second` tokens flow in each
/// second, at most `burst` are kept, and each run started takes one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RateLimit {
    /// Runs started per second, over time.
    pub per_second: f64,
    /// Runs that may start at once after a quiet spell (at least 1).
    pub burst: u32,
}

/// The fleet-control part of a [`ProcessConfigure`](super::ProcessConfigure):
/// each field left `None` keeps its stored value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitChanges {
    /// The concurrency limit; `Some(None)` removes it. At least 1 (pause the
    /// process to run none).
    pub concurrency: Option<Option<u32>>,
    /// The rate limit in runs per second; `Some(None)` removes it. At least
    /// [`MIN_RATE_PER_S`] and at most [`MAX_RATE_PER_S`]. Changing it refills
    /// the bucket.
    pub rate: Option<Option<f64>>,
    /// The rate limit's burst (default 1; at least 1). Changing it refills the
    /// bucket.
    pub burst: Option<u32>,
}

impl LimitChanges {
    /// Whether the bucket must start full again (its rate or burst changed).
    #[cfg(feature = "_engine")]
    #[must_use]
    pub(crate) fn refills(&self) -> bool {
        self.rate.is_some() || self.burst.is_some()
    }

    /// The first value no process can run with, as a one-line error.
    #[cfg(feature = "_engine")]
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if self.concurrency == Some(Some(0)) {
            return Some("a concurrency limit must be at least 1 (pause the process to run none)");
        }
        if let Some(Some(rate)) = self.rate
            && !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&rate)
        {
            return Some(
                "a rate limit must be at least 0.000000001 and at most 1000000 runs per second",
            );
        }
        if self.burst == Some(0) {
            return Some("a rate limit's burst must be at least 1");
        }
        // The engines store both as 32-bit integers: a larger value is refused
        // rather than silently stored as another one.
        if self
            .concurrency
            .flatten()
            .is_some_and(|n| i32::try_from(n).is_err())
        {
            return Some("a concurrency limit must be at most 2147483647 (remove it for no limit)");
        }
        if self.burst.is_some_and(|n| i32::try_from(n).is_err()) {
            return Some("a rate limit's burst must be at most 2147483647");
        }
        None
    }
}

/// How a process's fleet controls shaped one claim, so a worker knows how to
/// wait before the next one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimGate {
    /// The process is paused: nothing was claimed. Resuming wakes waiters.
    pub paused: bool,
    /// The process's concurrency limit held the claim back (fewer keys than
    /// asked, all its slots taken): until a claim finds slots free again, runs
    /// of the process that end wake its claimers, since a slot came free.
    pub concurrency_limited: bool,
    /// The rate limit ran out of tokens, so fewer keys than asked came back
    /// though more may be ready: the next token comes in this long. A worker
    /// waits this long, not its idle poll, before claiming again.
    pub next_token_in: Option<Duration>,
}

/// What [`lease_claim`](super::StoreEngine::lease_claim) returns: the leases,
/// and how the process's fleet controls shaped the claim.
#[derive(Debug, Clone, Default)]
pub struct Claimed {
    /// The leased keys in claim order; empty when nothing is ready (or the
    /// process is paused, or its limits are reached).
    pub leases: Vec<Lease>,
    /// Why fewer keys than asked may have come back.
    pub gate: ClaimGate,
}

impl Claimed {
    /// Leases claimed with no fleet control in the way.
    #[must_use]
    pub fn open(leases: Vec<Lease>) -> Self {
        Self {
            leases,
            gate: ClaimGate::default(),
        }
    }
}

/// Parameters of [`process_pause`](super::StoreEngine::process_pause).
#[derive(Debug, Clone)]
pub struct ProcessPause {
    /// The process (created if unknown, so a process can be paused before its
    /// first enqueue).
    pub process: String,
    /// `true` to pause, `false` to resume.
    pub paused: bool,
    /// Who did it, recorded in the history (`admin`, `cli`).
    pub actor: String,
}

impl ProcessPause {
    /// The history row this change writes: `paused` or `resumed`.
    #[must_use]
    pub fn outcome(&self) -> RunOutcome {
        if self.paused {
            RunOutcome::Paused
        } else {
            RunOutcome::Resumed
        }
    }
}
