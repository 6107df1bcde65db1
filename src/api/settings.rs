//! A process's settings on the wire: read them, change them (`configure`),
//! pause and resume.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::limits::millis;
#[cfg(feature = "server")]
use super::limits::ms;
#[cfg(feature = "server")]
use crate::backoff::{Backoff, BackoffError, MAX_DELAY};
#[cfg(feature = "server")]
use crate::store::{LimitChanges, ProcessConfigure};

/// A process's stored settings: `GET /v1/processes/{process}/settings`, and
/// the answer of a `PATCH` there.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessSettingsBody {
    /// The process.
    pub process: String,
    /// Retry delay after the first failure.
    pub backoff_initial_ms: u64,
    /// Growth of the delay per further failure.
    pub backoff_factor: f64,
    /// The longest retry delay.
    pub backoff_max_ms: u64,
    /// Spread of each delay, 0 to 1.
    pub backoff_jitter: f64,
    /// Runs are kept this long.
    pub keep_runs_for_ms: u64,
    /// At most this many runs are kept per key.
    pub keep_runs_per_key: u32,
    /// Idle keys untouched this long are forgotten; null: never.
    pub forget_idle_after_ms: Option<u64>,
    /// No worker claims the process's keys while it is paused.
    pub paused: bool,
    /// At most this many of its keys run at once across the fleet; null: no limit.
    pub concurrency: Option<u32>,
    /// At most this many runs start per second across the fleet; null: no limit.
    pub rate_per_s: Option<f64>,
    /// The rate limit's burst; null when there is no rate limit.
    pub rate_burst: Option<u32>,
}

impl From<crate::store::ProcessSettings> for ProcessSettingsBody {
    fn from(s: crate::store::ProcessSettings) -> Self {
        Self {
            process: s.process,
            backoff_initial_ms: millis(s.backoff.initial()),
            backoff_factor: s.backoff.factor(),
            backoff_max_ms: millis(s.backoff.max()),
            backoff_jitter: s.backoff.jitter(),
            keep_runs_for_ms: millis(s.retention.keep_runs_for),
            keep_runs_per_key: s.retention.keep_runs_per_key,
            forget_idle_after_ms: s.retention.forget_idle_after.map(millis),
            paused: s.limits.paused,
            concurrency: s.limits.concurrency,
            rate_per_s: s.limits.rate.map(|r| r.per_second),
            rate_burst: s.limits.rate.map(|r| r.burst),
        }
    }
}

/// Body of `PATCH /v1/processes/{process}/settings`: the settings to change,
/// as `drover process configure` takes them; those left out keep their
/// stored values (a partial backoff is merged with the stored one). Pause
/// and resume have their own routes.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfigureRequest {
    /// Retry delay after the first failure.
    #[serde(default)]
    #[schema(maximum = 15552000000_u64)]
    pub backoff_initial_ms: Option<u64>,
    /// Growth of the delay per further failure, at least 1 (any larger
    /// finite factor is taken: the delay is capped at the longest one).
    #[serde(default)]
    #[schema(minimum = 1.0)]
    pub backoff_factor: Option<f64>,
    /// The longest retry delay (not below the initial one).
    #[serde(default)]
    #[schema(maximum = 15552000000_u64)]
    pub backoff_max_ms: Option<u64>,
    /// Spread of each delay, 0 to 1.
    #[serde(default)]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub backoff_jitter: Option<f64>,
    /// Keep runs this long (at least 1, at most 100 years).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3155760000000_u64)]
    pub keep_runs_for_ms: Option<u64>,
    /// Keep at most this many runs per key (at least 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub keep_runs_per_key: Option<u32>,
    /// Forget idle keys untouched this long (at least 1, at most 100 years);
    /// null: never.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 3155760000000_u64)]
    pub forget_idle_after_ms: Option<Option<u64>>,
    /// At most this many keys running at once across the fleet (at least 1);
    /// null: no limit.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub concurrency: Option<Option<u32>>,
    /// At most this many runs started per second (at least 0.000000001, at most
    /// 1,000,000); null: no limit.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 0.000000001, maximum = 1000000.0)]
    pub rate_per_s: Option<Option<f64>>,
    /// The rate limit's burst (at least 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub rate_burst: Option<u32>,
}

#[cfg(feature = "server")] // read by the server only
impl ProcessConfigureRequest {
    /// The request's changes to `process` as the store takes them: a partial
    /// backoff is merged over the `stored` one, and an invalid result refused.
    pub(crate) fn changes(
        &self,
        process: String,
        stored: Backoff,
    ) -> Result<ProcessConfigure, BackoffError> {
        let mut params = ProcessConfigure::new(process);
        let backoff_given = self.backoff_initial_ms.is_some()
            || self.backoff_factor.is_some()
            || self.backoff_max_ms.is_some()
            || self.backoff_jitter.is_some();
        if backoff_given {
            let delay = |v: Option<u64>, or| v.map_or(or, ms).min(MAX_DELAY);
            let backoff = Backoff::new(
                delay(self.backoff_initial_ms, stored.initial()),
                self.backoff_factor.unwrap_or(stored.factor()),
                delay(self.backoff_max_ms, stored.max()),
            )
            .and_then(|b| b.with_jitter(self.backoff_jitter.unwrap_or(stored.jitter())))?;
            params = params.backoff(backoff);
        }
        if let Some(period) = self.keep_runs_for_ms {
            params = params.keep_runs_for(ms(period));
        }
        if let Some(runs) = self.keep_runs_per_key {
            params = params.keep_runs_per_key(runs);
        }
        if let Some(period) = self.forget_idle_after_ms {
            params = params.forget_idle_after(period.map(ms));
        }
        params.limits = LimitChanges {
            concurrency: self.concurrency,
            rate: self.rate_per_s,
            burst: self.rate_burst,
        };
        Ok(params)
    }
}

/// A field that may be given as null (`Some(None)`), apart from left out
/// (`None`, through `#[serde(default)]`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Answer of `POST /v1/processes/{process}/pause` and `…/resume`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseResponse {
    /// The process.
    pub process: String,
    /// Whether it is paused now.
    pub paused: bool,
    /// Whether this request changed it (false: it already was).
    pub changed: bool,
}
