//! The runner's two backends for tests: a controller on the database itself, or
//! the same controller through a `drover serve` started by the test (an
//! in-process [`Server`] on a loopback port, in front of the same database).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use drover::client::Client;
use drover::server::{Server, ServerOptions};
use drover::store::{
    Claimed, LeaseClaim, LeaseComplete, LeaseRelease, ProcessConfigure, ReclaimReport, Session,
    SessionClose, SessionHeartbeat, SessionStart, Store, StoreError, WorkerBackend,
};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Where a test's controllers work: the store, or a server's client.
#[derive(Debug, Clone)]
pub(crate) enum TestBackend {
    /// The database directly.
    Store(Store),
    /// A drover server in front of it; the store is where the test, as an
    /// operator would, sets what the API does not (a backoff policy). The
    /// server stops when the last clone is dropped.
    Client(Client, Store, Arc<DropGuard>),
}

impl TestBackend {
    /// `store` or `client`, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Store(_) => "store",
            Self::Client(..) => "client",
        }
    }
}

/// A controller backend through a server serving `store` on a loopback port
/// (until the backend's last clone drops), with short poll and reclaim
/// intervals so tests do not wait for them.
pub(crate) fn served(store: &Store) -> TestBackend {
    served_polling(store, Duration::from_millis(50))
}

/// [`served`] with a server whose waiting claims look at the database again
/// only once an hour: a claim waits until a wake-up comes (or its wait ends),
/// so a test judging wake-ups through it cannot be passed by the server's
/// polling.
pub(crate) fn served_unpolled(store: &Store) -> TestBackend {
    served_polling(store, Duration::from_secs(3600))
}

fn served_polling(store: &Store, poll: Duration) -> TestBackend {
    served_with(store, ServerOptions::default().poll_interval(poll))
}

/// [`served`] by a server with `options` (its reclaim every 100 ms).
pub(crate) fn served_with(store: &Store, options: ServerOptions) -> TestBackend {
    let options = options.reclaim_interval(Duration::from_millis(100));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("local address");
    let stop = CancellationToken::new();
    let server = Server::new(store.clone(), options);
    tokio::spawn({
        let stop = stop.clone();
        async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            server.serve(listener, stop).await.expect("serve");
        }
    });
    let client = Client::new(&format!("http://{addr}")).expect("a valid URL");
    TestBackend::Client(client, store.clone(), Arc::new(stop.drop_guard()))
}

macro_rules! dispatch {
    ($self:ident, $b:ident => $call:expr) => {
        match $self {
            TestBackend::Store($b) => $call,
            TestBackend::Client($b, ..) => $call,
        }
    };
}

impl WorkerBackend for TestBackend {
    const RECLAIMS: bool = true;

    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        dispatch!(self, b => WorkerBackend::session_start(b, params).await)
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        dispatch!(self, b => WorkerBackend::session_heartbeat(b, params).await)
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        dispatch!(self, b => WorkerBackend::session_close(b, params).await)
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        dispatch!(self, b => WorkerBackend::session_reclaim(b).await)
    }

    async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> Result<Claimed, StoreError> {
        dispatch!(self, b => WorkerBackend::lease_claim_wait(b, params, wait).await)
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        dispatch!(self, b => WorkerBackend::lease_complete_batch(b, batch).await)
    }

    async fn lease_complete_batch_within(
        &self,
        batch: &[LeaseComplete<'_>],
        within: Duration,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        dispatch!(self, b => WorkerBackend::lease_complete_batch_within(b, batch, within).await)
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        dispatch!(self, b => WorkerBackend::lease_release(b, params).await)
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        match self {
            // Set where the database is, as an operator would; the controller
            // over HTTP then obeys it like every node.
            TestBackend::Client(_, store, _) | TestBackend::Store(store) => {
                WorkerBackend::process_configure(store, params).await
            }
        }
    }

    fn subscribe(&self, process: &str) -> Option<Arc<Notify>> {
        dispatch!(self, b => WorkerBackend::subscribe(b, process))
    }

    fn local_store(&self) -> Option<&Store> {
        dispatch!(self, b => b.local_store())
    }
}
