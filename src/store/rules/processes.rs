//! A process's stored settings, read and checked the same way on both engines.

use std::time::Duration;

use sqlx::query::Query;

use super::decode::backoff_policy;
use super::resync::{Rules, next_pass};
use super::rows::{MAX_PERIOD, Stamp, duration_ms, period_ms};
use crate::store::StoreError;
use crate::store::fleet::{FleetLimits, RateLimit};
use crate::store::key::validate_process;
use crate::store::settings::{ProcessConfigure, ProcessSettings, Resync, Retention};

/// `drover_processes` as both engines store it (durations in milliseconds),
/// with the next resync from `drover_resync` (times as the engine keeps them).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ProcessSettingsRow<T> {
    process: String,
    backoff_initial_ms: i64,
    backoff_factor: f64,
    backoff_max_ms: i64,
    backoff_jitter: f64,
    keep_runs_ms: i64,
    keep_runs_per_key: i32,
    forget_idle_ms: Option<i64>,
    #[sqlx(flatten)]
    limits: LimitsRow,
    #[sqlx(flatten)]
    resync: Rules,
    pass_started_at: Option<T>,
    next_due_at: Option<T>,
}

/// The fleet-control columns of `drover_processes` (see [`FleetLimits`]).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct LimitsRow {
    paused: bool,
    concurrency: Option<i32>,
    rate_per_s: Option<f64>,
    rate_burst: i32,
}

impl LimitsRow {
    fn into_limits(self) -> FleetLimits {
        let clamp = |v: i32| u32::try_from(v.max(1)).unwrap_or(1);
        FleetLimits {
            paused: self.paused,
            concurrency: self.concurrency.map(clamp),
            rate: self.rate_per_s.map(|per_second| RateLimit {
                per_second,
                burst: clamp(self.rate_burst),
            }),
        }
    }
}

/// The columns of a [`ProcessSettingsRow`], from `drover_processes p LEFT
/// JOIN drover_resync r ON r.process = p.process`, without a filter or order.
macro_rules! settings_select {
    () => {
        "SELECT p.process, p.backoff_initial_ms, \
         p.backoff_factor, p.backoff_max_ms, p.backoff_jitter, p.keep_runs_ms, \
         p.keep_runs_per_key, p.forget_idle_ms, \
         p.resync_every_ms, p.resync_jitter, p.resync_priority, \
         p.paused, p.concurrency, p.rate_per_s, p.rate_burst, \
         r.pass_started_at, r.next_due_at \
         FROM drover_processes p LEFT JOIN drover_resync r ON r.process = p.process"
    };
}

/// One page of processes with their settings, in process order (DESIGN.md
/// rule 13): those named after `$1` (`''` for the first page), at most `$2`
/// rows, a range of the primary key. Both engines read it as it is (SQLite
/// takes `$1` as the first parameter).
pub(crate) const SETTINGS_PAGE: &str = concat!(
    settings_select!(),
    " WHERE p.process > $1 ORDER BY p.process LIMIT $2"
);

/// One process with its settings (`$1`): a read by the primary key, so that
/// what a page about one process shows does not cost every process's row.
pub(crate) const SETTINGS_ONE: &str = concat!(settings_select!(), " WHERE p.process = $1");

/// Milliseconds as a duration (negative ones as zero).
fn ms(v: i64) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

impl<T: Stamp> ProcessSettingsRow<T> {
    /// The domain settings.
    pub(crate) fn into_settings(self) -> ProcessSettings {
        let resync = self.resync.every().map(|every| Resync {
            every,
            jitter: self.resync.resync_jitter,
            priority: self.resync.resync_priority,
        });
        ProcessSettings {
            backoff: backoff_policy(
                Some(self.backoff_initial_ms),
                Some(self.backoff_factor),
                Some(self.backoff_max_ms),
                Some(self.backoff_jitter),
            ),
            retention: Retention {
                keep_runs_for: ms(self.keep_runs_ms),
                keep_runs_per_key: u32::try_from(self.keep_runs_per_key.max(1)).unwrap_or(1),
                forget_idle_after: self.forget_idle_ms.map(ms),
            },
            next_resync: resync.and_then(|r| {
                next_pass(
                    self.pass_started_at.map(Stamp::time),
                    self.next_due_at.map(Stamp::time),
                    r.every,
                )
            }),
            resync,
            process: self.process,
            limits: self.limits.into_limits(),
        }
    }
}

/// A count as the engines' 32-bit integer columns store it.
pub(crate) fn clamp_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// How [`configure`](crate::store::StoreEngine::process_configure) writes
/// one column of `drover_processes`.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// One parameter, a value or `NULL` to keep the stored one.
    Replace,
    /// Two parameters: whether the setting was given, then its value (which
    /// may be `NULL`, to clear it).
    Clearable,
    /// One parameter: whether to empty the column (`NULL`).
    Empty,
}

/// The columns `configure` writes, in the order [`bind_configure`] binds
/// their parameters (after the process's, `1`). A new setting is a line
/// here, a bind there, a field in [`ProcessSettingsRow`] and a column in
/// [`SETTINGS_SELECT`].
const CONFIGURED: [(&str, Change); 14] = [
    ("backoff_initial_ms", Change::Replace),
    ("backoff_factor", Change::Replace),
    ("backoff_max_ms", Change::Replace),
    ("backoff_jitter", Change::Replace),
    ("keep_runs_ms", Change::Replace),
    ("keep_runs_per_key", Change::Replace),
    ("forget_idle_ms", Change::Clearable),
    ("resync_every_ms", Change::Clearable),
    ("resync_jitter", Change::Replace),
    ("resync_priority", Change::Replace),
    ("concurrency", Change::Clearable),
    ("rate_per_s", Change::Clearable),
    ("rate_burst", Change::Replace),
    ("rate_tokens", Change::Empty),
];

/// The `UPDATE drover_processes` of `configure`, written with the engine's
/// numbered placeholders (`mark` is `?` on SQLite, `$` on PostgreSQL): the
/// engines differ only in that.
pub(crate) fn configure_update(mark: char) -> String {
    let mut n = 1;
    let mut next = || {
        n += 1;
        format!("{mark}{n}")
    };
    let sets: Vec<String> = CONFIGURED
        .iter()
        .map(|&(column, change)| match change {
            Change::Replace => format!("{column} = COALESCE({}, {column})", next()),
            Change::Clearable => {
                let given = next();
                format!(
                    "{column} = CASE WHEN {given} THEN {} ELSE {column} END",
                    next()
                )
            }
            Change::Empty => format!(
                "{column} = CASE WHEN {} THEN NULL ELSE {column} END",
                next()
            ),
        })
        .collect();
    format!(
        "UPDATE drover_processes SET {} WHERE process = {mark}1",
        sets.join(", ")
    )
}

/// Binds the parameters of [`configure_update`]: the process (`1`), then
/// each setting as [`CONFIGURED`] lists it (`2`–`19`): a value, or `NULL` to
/// keep the stored one; for a setting that can be cleared, whether it was
/// given before its value; and last whether the rate bucket refills.
pub(crate) fn bind_configure<'q, DB>(
    query: Query<'q, DB, DB::Arguments>,
    params: &ProcessConfigure,
) -> Query<'q, DB, DB::Arguments>
where
    DB: sqlx::Database,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<i32>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<f64>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> bool: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    let b = params.backoff;
    let l = params.limits;
    query
        .bind(params.process.clone())
        .bind(b.map(|b| duration_ms(b.initial())))
        .bind(b.map(|b| b.factor()))
        .bind(b.map(|b| duration_ms(b.max())))
        .bind(b.map(|b| b.jitter()))
        .bind(params.keep_runs_for.map(period_ms))
        .bind(params.keep_runs_per_key.map(clamp_i32))
        .bind(params.forget_idle_after.is_some())
        .bind(params.forget_idle_after.flatten().map(period_ms))
        .bind(params.resync_every.is_some())
        .bind(params.resync_every.flatten().map(period_ms))
        .bind(params.resync_jitter)
        .bind(params.resync_priority)
        .bind(l.concurrency.is_some())
        .bind(l.concurrency.flatten().map(clamp_i32))
        .bind(l.rate.is_some())
        .bind(l.rate.flatten())
        .bind(l.burst.map(clamp_i32))
        .bind(l.refills())
}

/// Refuses settings no process can run with, before anything is written.
pub(crate) fn checked(params: &ProcessConfigure) -> Result<(), StoreError> {
    validate_process(&params.process)?;
    if params.keep_runs_per_key == Some(0) {
        return Err(StoreError::InvalidArgument(
            "keep at least 1 run per key (the last run is what the key's page shows)".into(),
        ));
    }
    if params
        .keep_runs_per_key
        .is_some_and(|n| i32::try_from(n).is_err())
    {
        return Err(StoreError::InvalidArgument(format!(
            "keep at most {} runs per key",
            i32::MAX
        )));
    }
    if params.keep_runs_for == Some(Duration::ZERO) {
        return Err(StoreError::InvalidArgument(
            "keep runs for longer than 0 (use 1s to keep them as briefly as possible)".into(),
        ));
    }
    let periods = [
        ("keep runs for", params.keep_runs_for),
        ("forget idle keys after", params.forget_idle_after.flatten()),
        ("resync every", params.resync_every.flatten()),
    ];
    if let Some((what, _)) = periods
        .iter()
        .find(|(_, period)| period.is_some_and(|p| p > MAX_PERIOD))
    {
        return Err(StoreError::InvalidArgument(format!(
            "{what} at most 100 years (100y, {} days)",
            MAX_PERIOD.as_secs() / 86_400
        )));
    }
    if let Some(problem) = params.limits.problem() {
        return Err(StoreError::InvalidArgument(problem.into()));
    }
    if params.forget_idle_after == Some(Some(Duration::ZERO)) {
        return Err(StoreError::InvalidArgument(
            "forget idle keys after longer than 0, or never".into(),
        ));
    }
    if params
        .resync_every
        .flatten()
        .is_some_and(|d| d < Duration::from_secs(1))
    {
        return Err(StoreError::InvalidArgument(
            "resync every 1s or longer, or never".into(),
        ));
    }
    if params
        .resync_jitter
        .is_some_and(|j| !(0.0..=1.0).contains(&j))
    {
        return Err(StoreError::InvalidArgument(
            "give a resync jitter between 0 and 1 (0.1 spreads keys over a tenth of the interval)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// White space folded, so statements compare by their words.
    fn words(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn configure_update_is_the_statement_each_engine_wrote_by_hand() {
        let by_hand = |m: &str| {
            words(&format!(
                "UPDATE drover_processes SET
                     backoff_initial_ms = COALESCE({m}2, backoff_initial_ms),
                     backoff_factor = COALESCE({m}3, backoff_factor),
                     backoff_max_ms = COALESCE({m}4, backoff_max_ms),
                     backoff_jitter = COALESCE({m}5, backoff_jitter),
                     keep_runs_ms = COALESCE({m}6, keep_runs_ms),
                     keep_runs_per_key = COALESCE({m}7, keep_runs_per_key),
                     forget_idle_ms = CASE WHEN {m}8 THEN {m}9 ELSE forget_idle_ms END,
                     resync_every_ms = CASE WHEN {m}10 THEN {m}11 ELSE resync_every_ms END,
                     resync_jitter = COALESCE({m}12, resync_jitter),
                     resync_priority = COALESCE({m}13, resync_priority),
                     concurrency = CASE WHEN {m}14 THEN {m}15 ELSE concurrency END,
                     rate_per_s = CASE WHEN {m}16 THEN {m}17 ELSE rate_per_s END,
                     rate_burst = COALESCE({m}18, rate_burst),
                     rate_tokens = CASE WHEN {m}19 THEN NULL ELSE rate_tokens END
                 WHERE process = {m}1"
            ))
        };
        assert_eq!(words(&configure_update('?')), by_hand("?"));
        assert_eq!(words(&configure_update('$')), by_hand("$"));
    }
}
