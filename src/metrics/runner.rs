//! A controller's metrics: client-go's workqueue names (label `name` = process),
//! plus `drover_outcomes_total{process,outcome}`, `drover_sessions_active` and
//! `drover_leases_reclaimed_total`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::{InFlight, MetricsHandle, QueueMetrics};

type OutcomeLabels = [(&'static str, String); 2];

/// The outcomes a controller counts (`Outcome::name`, then the two a run can
/// end with before one is written), each given its own cached counter.
const OUTCOMES: [&str; 6] = [
    "done",
    "requeue_after",
    "transient",
    "permanent",
    "canceled",
    "lost",
];

/// The runner's metric families, registered once per registry.
#[derive(Debug, Clone)]
pub struct RunnerFamilies {
    outcomes: Family<OutcomeLabels, Counter>,
    sessions_active: Gauge,
    leases_reclaimed: Counter,
}

impl RunnerFamilies {
    /// Registers the families in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let families = Self {
            outcomes: Family::default(),
            sessions_active: Gauge::default(),
            leases_reclaimed: Counter::default(),
        };
        registry.register(
            "drover_outcomes",
            "Runs ended, by process and outcome (done, requeue_after, transient, permanent, canceled, lost)",
            families.outcomes.clone(),
        );
        registry.register(
            "drover_sessions_active",
            "Sessions this process holds",
            families.sessions_active.clone(),
        );
        registry.register(
            "drover_leases_reclaimed",
            "Leases of expired sessions this process turned back into pending items",
            families.leases_reclaimed.clone(),
        );
        families
    }

    /// Counts one run of `process` that ended with `outcome`, wherever it ran
    /// (a controller here, or a worker reporting over HTTP).
    #[cfg(feature = "server")] // called by the server only
    pub(crate) fn count_outcome(&self, process: &str, outcome: &str) {
        self.outcome_counter(process, outcome).inc();
    }

    /// The counter of runs of `process` that ended with `outcome`.
    fn outcome_counter(&self, process: &str, outcome: &str) -> Counter {
        let labels = [
            ("process", process.to_owned()),
            ("outcome", outcome.to_owned()),
        ];
        self.outcomes.get_or_create(&labels).clone()
    }
}

/// One controller's handles.
#[derive(Debug, Clone)]
pub(crate) struct RunnerMetrics {
    process: String,
    pub(crate) queue: MetricsHandle,
    families: RunnerFamilies,
    pub(crate) sessions_active: Gauge,
    pub(crate) leases_reclaimed: Counter,
    pub(crate) in_flight: Arc<Runs>,
    /// This process's counter of each of [`OUTCOMES`], once first counted:
    /// looked up in the family by its labels, a count cost two strings and a
    /// hash of both per run.
    outcomes: Arc<[OnceLock<Counter>; OUTCOMES.len()]>,
}

impl RunnerMetrics {
    /// The global handles for `process`, with its in-flight runs tracked for the
    /// scrape-time gauges.
    pub(crate) fn global(process: &str) -> Self {
        let queue = QueueMetrics::global();
        let families = super::runner().clone();
        let in_flight = Arc::new(Runs {
            process: process.to_owned(),
            started: Mutex::new(Started::default()),
        });
        let weak: std::sync::Weak<dyn InFlight> = Arc::downgrade(&in_flight) as _;
        queue.track(weak);
        Self {
            process: process.to_owned(),
            queue: queue.handle(process),
            sessions_active: families.sessions_active.clone(),
            leases_reclaimed: families.leases_reclaimed.clone(),
            families,
            in_flight,
            outcomes: Arc::default(),
        }
    }

    /// Counts one run's end.
    pub(crate) fn outcome(&self, outcome: &'static str) {
        let counter = || self.families.outcome_counter(&self.process, outcome);
        match OUTCOMES.iter().position(|known| *known == outcome) {
            Some(at) => self.outcomes[at].get_or_init(counter).inc(),
            None => counter().inc(),
        };
    }
}

/// Runs by fencing token: foldhash rather than SipHash, since the tokens come
/// from the database, not from anyone who could pick colliding ones, and a run
/// is added and removed once each (SipHash, here and in the store's own maps,
/// was 4 % of a burn-down's runner samples).
type Started = HashMap<i64, Instant, foldhash::fast::RandomState>;

/// The runs in flight, for `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds`.
#[derive(Debug)]
pub(crate) struct Runs {
    process: String,
    started: Mutex<Started>,
}

impl Runs {
    pub(crate) fn start(&self, token: i64) {
        self.lock().insert(token, Instant::now());
    }

    pub(crate) fn end(&self, token: i64) {
        self.lock().remove(&token);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Started> {
        self.started.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl InFlight for Runs {
    fn name(&self) -> &str {
        &self.process
    }

    fn in_flight(&self) -> (f64, f64) {
        let now = Instant::now();
        self.lock()
            .values()
            .map(|started| (now - *started).as_secs_f64())
            .fold((0.0, 0.0), |(sum, max), secs| {
                (sum + secs, f64::max(max, secs))
            })
    }
}
