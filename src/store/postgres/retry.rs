//! Retrying operations that lost a race, found the pool exhausted or met a
//! server whose role changed.

use std::future::Future;
use std::time::Duration;

use super::PostgresStore;
use crate::store::{DriverError, StoreError};

/// Attempts per operation, the first included.
const ATTEMPTS: u32 = 4;

/// The pause before the first retry; doubled for each further one.
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// Runs `op` until it succeeds, fails with anything but [`StoreError::Busy`], or
/// has been tried [`ATTEMPTS`] times. Only failures that guarantee nothing was
/// committed are retried, so running the operation again cannot apply it twice:
/// a `Busy` from PostgreSQL itself (serialization failure, deadlock, lock
/// timeout: the transaction was aborted) and `Unavailable` (the connection broke
/// before the commit, or the server refused the write as read-only or shutting
/// down; the transaction is rolled back). A broken connection at the commit is
/// `CommitUnknown` and is not retried. An error saying the server's role may
/// have changed retires the store's connections first (see [`watched`]), so
/// the next attempt runs on a fresh one.
pub(super) async fn retry<T, F, Fut>(store: &PostgresStore, op: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut pause = FIRST_PAUSE;
    for _ in 1..ATTEMPTS {
        match op().await {
            Err(
                e @ (StoreError::Busy(DriverError(sqlx::Error::Database(_)))
                | StoreError::Unavailable(_)),
            ) => {
                notice(store, &e);
                tracing::debug!(error = %crate::store::error_chain(&e), "postgres transaction failed before commit; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return noticed(store, other),
        }
    }
    noticed(store, op().await)
}

/// How long one of a worker's own requests (a session's start, heartbeat or
/// close, a reclaim, a claim, a lock, a release, a batch of completions) may
/// go unanswered before the store looks whether its server is alive. Each is
/// a few statements of milliseconds, but one may rightly wait far longer: for
/// a lock (a caller's transaction holding a key's row, an index built on the
/// items), for a pooled connection, or through a reclaim of many leases.
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the look at the server may take: a new connection to the
/// request's host, and one round trip on it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Awaits `op`; each time it has gone [`ANSWER_TIMEOUT`] without an answer,
/// asks its server for a sign of life on a new connection of its own (while
/// `op` goes on). A server that answers is busy, or `op` waits for a lock or
/// a connection: `op` is awaited on. A server that does not answer within
/// [`PROBE_TIMEOUT`], or one the store has moved away from meanwhile, is
/// frozen or gone (a VM paused, a process stopped, a link that
/// drops packets while both ends live: the kernel keeps the socket open, so
/// nothing fails by itself): `op` is dropped (its connection is closed, not
/// reused: the notice retires it) and answered `CommitUnknown`, since a
/// commit may have been sent. A claim's caller then gives its session up, a
/// batch of completions is sent again; the store's connections are retired
/// and, with several hosts, the host that now accepts writes is looked for.
/// Before, such a request waited for ever, and with it the worker's claim
/// loop or completer, every later outcome included, while its keeper moved
/// on to the new primary.
pub(super) async fn bounded<T>(
    store: &PostgresStore,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    // The host the request's connection reached: new connections go to it
    // as the request starts.
    let host = store.failover.current();
    let mut op = std::pin::pin!(op);
    loop {
        tokio::select! {
            biased;
            done = &mut op => return done,
            () = tokio::time::sleep(ANSWER_TIMEOUT) => {}
        }
        // The store found another host meanwhile (a new connection waited
        // too long and the search chose one that fits now): the request's
        // server is the one that went away, however well the new one answers.
        let alive = store.failover.current() == host
            && tokio::select! {
                biased;
                done = &mut op => return done,
                alive = store.failover.answers(host, PROBE_TIMEOUT) => alive,
            };
        if !alive {
            let e = super::error::unanswered(format!(
                "the database did not answer within {ANSWER_TIMEOUT:?}, nor a new connection \
                 within {PROBE_TIMEOUT:?} (a frozen server or link)"
            ));
            notice(store, &e);
            return Err(e);
        }
    }
}

/// Awaits `op`, retiring the store's connections when its error says their
/// server is read-only, shutting down or gone.
pub(super) async fn watched<T>(
    store: &PostgresStore,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    noticed(store, op.await)
}

fn noticed<T>(store: &PostgresStore, result: Result<T, StoreError>) -> Result<T, StoreError> {
    if let Err(e) = &result {
        notice(store, e);
    }
    result
}

/// Tells the store's failover about `e`; a notice starts a search for the
/// host that now accepts writes.
fn notice(store: &PostgresStore, e: &StoreError) {
    if store.failover.notice(e) {
        store.failover.search(&store.pool, &store.at);
    }
}
