//! The claim gate: how many keys a claim of a paused or limited process may
//! take, decided in Rust from the process row and its running count, which
//! each engine reads under a lock that serialises the process's claims.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::fleet::ClaimGate;

/// A process's fleet controls and its rate bucket, as an engine read them
/// (with the process row locked).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GateRow {
    pub(crate) paused: bool,
    pub(crate) concurrency: Option<i64>,
    pub(crate) rate_per_s: Option<f64>,
    pub(crate) rate_burst: i64,
    /// The bucket's content at `tokens_at` (`None`: full).
    pub(crate) tokens: Option<f64>,
    pub(crate) tokens_at: Option<DateTime<Utc>>,
}

/// What the gate lets one claim do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    /// How many keys it may take.
    pub(crate) allowed: u32,
    /// The rate bucket's content now, before this claim takes any.
    tokens: Option<f64>,
    /// Whether the bucket, not the claim's size or the concurrency limit,
    /// set `allowed`.
    by_tokens: bool,
    /// Whether the concurrency limit cut the claim below its size.
    by_concurrency: bool,
    /// When it was decided: the bucket's new content is as of then.
    pub(crate) at: DateTime<Utc>,
}

/// A little under one token still counts as one: the bucket's refill is
/// floating point.
const EPSILON: f64 = 1e-9;

impl GateRow {
    /// Whether claims must pass the gate at all (paused or limited).
    pub(crate) fn binds(&self) -> bool {
        self.paused || self.concurrency.is_some() || self.rate_per_s.is_some()
    }

    /// Why a lock that the gate admitted none for was refused.
    pub(crate) fn why_held(&self, admission: &Admission) -> &'static str {
        if self.paused {
            "paused"
        } else if admission.by_tokens {
            "out of rate-limit tokens"
        } else {
            "at its concurrency limit"
        }
    }

    /// Whether the process has a concurrency limit (and so its running keys
    /// must be counted).
    pub(crate) fn counts_running(&self) -> bool {
        !self.paused && self.concurrency.is_some()
    }

    /// How many of `max` keys a claim may take at `now` with `running` of the
    /// process's keys running.
    pub(crate) fn admit(&self, now: DateTime<Utc>, running: i64, max: u32) -> Admission {
        if self.paused {
            return Admission {
                allowed: 0,
                tokens: None,
                by_tokens: false,
                by_concurrency: false,
                at: now,
            };
        }
        let mut allowed = u64::from(max);
        let mut by_concurrency = false;
        if let Some(limit) = self.concurrency {
            let free = u64::try_from(limit - running).unwrap_or(0);
            by_concurrency = free < allowed;
            allowed = allowed.min(free);
        }
        let tokens = self.rate_per_s.map(|rate| self.refilled(now, rate));
        let mut by_tokens = false;
        if let Some(tokens) = tokens {
            // Truncation intended: only whole tokens start runs.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let whole = (tokens + EPSILON).floor().max(0.0) as u64;
            if whole < allowed {
                allowed = whole;
                by_tokens = true;
            }
        }
        Admission {
            allowed: u32::try_from(allowed).unwrap_or(u32::MAX),
            tokens,
            by_tokens,
            by_concurrency,
            at: now,
        }
    }

    /// The bucket at `now`: what it held, plus what flowed in since, capped at
    /// the burst. A clock that went back adds nothing.
    fn refilled(&self, now: DateTime<Utc>, rate: f64) -> f64 {
        #[allow(clippy::cast_precision_loss)] // bursts are far below 2^52
        let burst = self.rate_burst.max(1) as f64;
        let (Some(tokens), Some(at)) = (self.tokens, self.tokens_at) else {
            return burst;
        };
        #[allow(clippy::cast_precision_loss)] // milliseconds since the last claim
        let elapsed = (now - at).num_milliseconds().max(0) as f64 / 1000.0;
        (tokens + elapsed * rate).min(burst)
    }

    /// After a claim took `taken` keys: the bucket's new content to store
    /// (`None`: no rate limit, or nothing taken, so nothing to write), and
    /// what the claimer hears.
    pub(crate) fn taken(&self, admission: Admission, taken: u32) -> (Option<f64>, ClaimGate) {
        let left = admission.tokens.map(|t| t - f64::from(taken));
        let next_token_in = match (left, self.rate_per_s) {
            (Some(left), Some(rate)) if admission.by_tokens && taken == admission.allowed => {
                let wait = ((1.0 - left).max(0.0) / rate).min(3600.0);
                Some(Duration::from_secs_f64(wait).max(Duration::from_millis(1)))
            }
            _ => None,
        };
        let gate = ClaimGate {
            paused: self.paused,
            concurrency_limited: admission.by_concurrency,
            next_token_in,
        };
        (left.filter(|_| taken > 0), gate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).expect("in range")
    }

    fn rate(per_s: f64, burst: i64) -> GateRow {
        GateRow {
            rate_per_s: Some(per_s),
            rate_burst: burst,
            ..GateRow::default()
        }
    }

    #[test]
    fn a_paused_process_admits_nothing() {
        let row = GateRow {
            paused: true,
            ..GateRow::default()
        };
        let a = row.admit(at(0), 0, 10);
        assert_eq!(a.allowed, 0);
        assert!(row.taken(a, 0).1.paused);
    }

    #[test]
    fn concurrency_admits_the_free_slots_only() {
        let row = GateRow {
            concurrency: Some(5),
            ..GateRow::default()
        };
        let bound = row.admit(at(0), 3, 10);
        assert_eq!(bound.allowed, 2);
        assert!(
            row.taken(bound, 2).1.concurrency_limited,
            "the limit held it back"
        );
        let free = row.admit(at(0), 3, 1);
        assert_eq!(free.allowed, 1);
        assert!(
            !row.taken(free, 1).1.concurrency_limited,
            "a limit that did not bind"
        );
        assert_eq!(
            row.admit(at(0), 7, 10).allowed,
            0,
            "over the limit admits none"
        );
    }

    #[test]
    fn a_full_bucket_admits_its_burst_then_tells_when_the_next_token_comes() {
        let row = rate(20.0, 5);
        let a = row.admit(at(0), 0, 8);
        assert_eq!(a.allowed, 5);
        let (left, gate) = row.taken(a, 5);
        assert_eq!(left, Some(0.0));
        assert_eq!(gate.next_token_in, Some(Duration::from_millis(50)));
    }

    #[test]
    fn the_bucket_refills_at_the_rate_up_to_the_burst() {
        let mut row = rate(20.0, 5);
        row.tokens = Some(0.0);
        row.tokens_at = Some(at(1_000));
        assert_eq!(
            row.admit(at(1_120), 0, 8).allowed,
            2,
            "2.4 tokens after 120 ms"
        );
        assert_eq!(
            row.admit(at(60_000), 0, 8).allowed,
            5,
            "never past the burst"
        );
        assert_eq!(
            row.admit(at(0), 0, 8).allowed,
            0,
            "a clock that went back adds none"
        );
    }

    #[test]
    fn no_hint_when_the_claim_not_the_bucket_was_the_bound() {
        let row = rate(20.0, 5);
        let a = row.admit(at(0), 0, 3);
        assert_eq!(a.allowed, 3);
        let (left, gate) = row.taken(a, 3);
        assert_eq!(left, Some(2.0));
        assert_eq!(gate.next_token_in, None);
        let a = row.admit(at(0), 0, 8);
        assert_eq!(
            row.taken(a, 2).1.next_token_in,
            None,
            "fewer ready than tokens"
        );
    }

    #[test]
    fn nothing_taken_writes_no_bucket() {
        let row = rate(1.0, 1);
        let a = row.admit(at(0), 0, 1);
        assert_eq!(row.taken(a, 0).0, None);
    }
}
