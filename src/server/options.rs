//! [`ServerOptions`]: the server's limits and intervals, validated by their
//! setters' types; the defaults suit `drover serve`.

use std::time::Duration;

use super::auth::Tokens;
use super::trace_url::TraceUrl;
use crate::runner::Pruner;
use crate::store::Store;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub(crate) tokens: Option<Tokens>,
    pub(crate) body_limit: usize,
    pub(crate) max_wait: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) reclaim_interval: Duration,
    pub(crate) prune_interval: Duration,
    pub(crate) sample_interval: Duration,
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) max_waiting_claims: usize,
    pub(crate) max_connections: usize,
    pub(crate) client_timeout: Duration,
    pub(crate) max_processes: usize,
    pub(crate) max_sessions_per_token: usize,
    pub(crate) metrics_max_processes: usize,
    pub(crate) trace_url: Option<TraceUrl>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            tokens: None,
            body_limit: 1024 * 1024,
            max_wait: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            reclaim_interval: Duration::from_secs(5),
            prune_interval: Pruner::<Store>::EVERY,
            sample_interval: Duration::from_secs(60),
            allowed_hosts: Vec::new(),
            max_waiting_claims: 10_000,
            max_connections: 16_384,
            client_timeout: Duration::from_secs(30),
            max_processes: 100,
            max_sessions_per_token: 10_000,
            metrics_max_processes: 10_000,
            trace_url: None,
        }
    }
}

impl ServerOptions {
    /// The tokens callers must present (default: none, so every caller is an
    /// admin — only safe on a loopback address). An empty list means the same.
    #[must_use]
    pub fn tokens(self, tokens: Tokens) -> Self {
        Self {
            tokens: (!tokens.is_empty()).then_some(tokens),
            ..self
        }
    }

    /// Host names an open server (one without tokens) answers to besides IP
    /// addresses and `localhost` (default: none). Every other name is refused
    /// with 403, since a page can make any name it owns resolve to this
    /// machine (DNS rebinding) and an open server takes every caller for an
    /// admin. Names are compared without case or port; a server with tokens
    /// answers to any name.
    #[must_use]
    pub fn allowed_hosts(self, hosts: impl IntoIterator<Item = String>) -> Self {
        let hosts = hosts.into_iter();
        let allowed_hosts = hosts.map(|h| h.trim_end_matches('.').to_ascii_lowercase());
        Self {
            allowed_hosts: allowed_hosts.collect(),
            ..self
        }
    }

    /// The largest request body in bytes (default 1 MiB, at least 1 KiB); larger
    /// ones are refused with 413 before they are parsed. Bigger batches of keys
    /// need more; a lower limit bounds the memory one request can take.
    #[must_use]
    pub fn body_limit(self, bytes: usize) -> Self {
        Self {
            body_limit: bytes.max(1024),
            ..self
        }
    }

    /// The longest a claim may wait for work (default 60 s). Longer waits mean
    /// fewer idle round trips but hold a connection open longer.
    #[must_use]
    pub fn max_wait(self, max_wait: Duration) -> Self {
        Self { max_wait, ..self }
    }

    /// How often a waiting claim looks again without a wake-up (default 1 s, at
    /// least 10 ms): the latency for work that no wake-up announces (delayed keys
    /// coming due, enqueues by `drover enqueue` into the same SQLite file).
    #[must_use]
    pub fn poll_interval(self, poll_interval: Duration) -> Self {
        Self {
            poll_interval: poll_interval.max(Duration::from_millis(10)),
            ..self
        }
    }

    /// How often the server reclaims the leases of expired sessions (default 5 s,
    /// at least 100 ms), so a crashed HTTP worker's keys run again.
    #[must_use]
    pub fn reclaim_interval(self, reclaim_interval: Duration) -> Self {
        Self {
            reclaim_interval: reclaim_interval.max(Duration::from_millis(100)),
            ..self
        }
    }

    /// How often the server applies every process's retention (default 60 s,
    /// jittered ±10 %, at least 10 ms; see [`Pruner`]). Shorter keeps the
    /// history closer to its limits at the cost of more small transactions.
    #[must_use]
    pub fn prune_interval(self, prune_interval: Duration) -> Self {
        Self {
            prune_interval: prune_interval.max(Duration::from_millis(10)),
            ..self
        }
    }

    /// How often the server samples every process's queue depth for the
    /// depth chart (default 60 s, at least 10 ms). Several servers on one
    /// database write one sample per half interval between them; samples are
    /// kept a day.
    #[must_use]
    pub fn sample_interval(self, sample_interval: Duration) -> Self {
        Self {
            sample_interval: sample_interval.max(Duration::from_millis(10)),
            ..self
        }
    }

    /// Whether callers must present a token.
    #[must_use]
    pub fn requires_tokens(&self) -> bool {
        self.tokens.is_some()
    }

    /// The most claims that may wait for work on this server at once
    /// (default 10,000; at least 1). Waiting claims share one claim per
    /// process per poll interval, so this bounds memory and connections, not
    /// database load; a claim over it is answered 429 at once. Each session
    /// may also have at most 16 waiting, and, when the server has more than one
    /// worker token, each token at most half of this, however many sessions it
    /// starts.
    #[must_use]
    pub fn max_waiting_claims(self, max: usize) -> Self {
        Self {
            max_waiting_claims: max.max(1),
            ..self
        }
    }

    /// The most connections the server holds at once (default 16,384; at
    /// least 1). Past it the server accepts no more until one closes: they
    /// wait in the kernel's queue rather than being refused. Each connection
    /// is a file descriptor, so keep it below the process's open-file limit
    /// with room for the database's (`drover serve` raises the soft limit
    /// to the hard one and lowers this to fit). With the
    /// [client timeout](Self::client_timeout) it bounds what callers that
    /// never finish a request can hold.
    #[must_use]
    pub fn max_connections(self, max: usize) -> Self {
        Self {
            max_connections: max.max(1),
            ..self
        }
    }

    /// How long a caller may stall (default 30 s, at least 100 ms): the
    /// longest it may take to send a request's headers, to send its body
    /// (as a whole, so a trickle of bytes does not stretch it; 408
    /// `request_timeout` after it), or to take a response it has stopped
    /// reading, and the longest a kept-alive connection stays idle between
    /// requests. A waiting claim is not a stall: it is bounded by
    /// [`max_wait`](Self::max_wait). drover's client drops an idle
    /// connection after 15 s, so a timeout below that may cut one the
    /// client is about to reuse.
    #[must_use]
    pub fn client_timeout(self, timeout: Duration) -> Self {
        Self {
            client_timeout: timeout.max(Duration::from_millis(100)),
            ..self
        }
    }

    /// The most processes a worker's enqueues may create (default 100; at
    /// least 1). Each process costs rows, 35 series on `/metrics` (about
    /// 2.9 KB) and a line on every list, so a worker token must not make them
    /// without bound, and the default keeps `/metrics` within ten times what
    /// ten processes give (`drover bench hostile`); a fleet of more control
    /// loops raises it. Once
    /// the database holds this many, an enqueue to a new process name is
    /// refused with 422 `too_many_processes`. Enqueues to the processes it
    /// holds, and an operator's settings, are not limited.
    #[must_use]
    pub fn max_processes(self, max: usize) -> Self {
        Self {
            max_processes: max.max(1),
            ..self
        }
    }

    /// The most live sessions one token may hold (default 10,000; at least
    /// 1), when the server has tokens. Each session is a database row kept
    /// until its TTL (up to a day) passes, a line on the workers page and an
    /// entry of the server's session-owner memory, so a token must not start
    /// them without end (a script that starts one per key and never closes
    /// it); a start over it is answered 429 `too_many_sessions`. A worker
    /// needs one session per control loop it runs; a fleet sharing one token
    /// across more loops raises it. Starts racing each other may pass it by
    /// a few.
    #[must_use]
    pub fn max_sessions_per_token(self, max: usize) -> Self {
        Self {
            max_sessions_per_token: max.max(1),
            ..self
        }
    }

    /// The most processes `/metrics` gives series to (default 10,000), the
    /// first in name order; `drover_metrics_processes_truncated` is 1 when
    /// the database holds more. Each process costs a scrape a database read
    /// and about 2.4 KB of text (35 series), and the server keeps its queue
    /// series for good, so a database filled past
    /// [`max_processes`](Self::max_processes) by other writers (a library,
    /// `drover enqueue`) cannot make a scrape unbounded. Raise it to see more
    /// processes, at that cost.
    #[must_use]
    pub fn metrics_max_processes(self, max: usize) -> Self {
        Self {
            metrics_max_processes: max.max(1),
            ..self
        }
    }

    /// Where the dashboard links a run's trace id (default: nowhere, the id
    /// is shown as text): a template of the tracing UI the runs' spans are
    /// exported to, checked when it was parsed ([`TraceUrl::parse`]).
    #[must_use]
    pub fn trace_url(self, template: TraceUrl) -> Self {
        Self {
            trace_url: Some(template),
            ..self
        }
    }
}
