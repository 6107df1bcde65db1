//! Serving connections: the accept loop and HTTP/1.1 under the server's
//! connection limits.
//!
//! `axum::serve` runs hyper without a timer, so a caller that sends half a
//! request line, keeps a connection idle, or stops reading its answer holds
//! that connection and its task for as long as it likes, and nothing bounds
//! how many it holds: a few hundred such callers exhaust the server's file
//! descriptors without a token. drover serves connections itself so that
//! every one is bounded:
//!
//! - at most `max_connections` at once; past it the loop accepts no more
//!   until one closes (the kernel queues the rest);
//! - headers must arrive within the client timeout, and so must the next
//!   request on a kept-alive connection (hyper's header timer runs while the
//!   connection is idle too);
//! - a write the caller does not take within the client timeout ends the
//!   connection (`tokio-io-timeout`);
//! - the body's deadline is a layer of the router (`app.rs`), answered 408.
//!
//! Once shutdown has begun, every answer says `Connection: close`. hyper
//! closes the connection after such an answer either way, but said so only
//! when the connection's task heard of the shutdown before the answer was
//! ready: a waiting claim answered at shutdown went out, about one time in
//! two, as if the connection stayed open, and a client that claimed again at
//! once sent its claim into the close. A claim whose answer never came may
//! have leased keys, so drover's client gave its session up and stopped
//! every run under it. Told, the client opens a new connection for its next
//! request, which is refused (nothing sent) until the server is back.
//!
//! Only HTTP/1.1 is served: drover's clients speak it, and HTTP/2 without TLS
//! (prior knowledge) would add many streams per connection to bound.

use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use hyper::server::conn::http1;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long shutdown waits for connections to finish their requests after it
/// has asked them to close: in-flight requests are short (waiting claims are
/// answered at shutdown), so only a caller that stalls takes this long. Those
/// still open then are dropped where they stand, so nothing is served after
/// [`serve`] returns (the store may be closing).
const DRAIN: Duration = Duration::from_secs(10);

/// What bounds each connection and their number.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The most connections served at once.
    pub(super) max_connections: usize,
    /// The longest a caller may take to send headers, stay idle between
    /// requests, or leave a write untaken.
    pub(super) client_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` fires; then stops accepting,
/// lets each connection finish the request it is on (for [`DRAIN`] at most,
/// then drops it) and returns once every connection is gone.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    // Fires with `shutdown` itself, before the server answers its waiting
    // claims (they end on a token `shutdown` cancels), so their answers
    // already say `Connection: close`.
    let closing = shutdown.child_token();
    let force = CancellationToken::new();
    let mut at_cap = false;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                at_cap = false;
                permit
            }
            Err(TryAcquireError::NoPermits) => {
                if !at_cap {
                    at_cap = true;
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "the server holds as many connections as it may: new ones wait \
                         until one closes"
                    );
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                }
            }
            Err(TryAcquireError::Closed) => break,
        };
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        connections.spawn(connection(
            stream,
            app.clone(),
            limits,
            permit,
            (closing.clone(), force.clone()),
        ));
    }
    drop(listener);
    closing.cancel();
    connections.close();
    if tokio::time::timeout(DRAIN, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = connections.len(),
            "connections still open {DRAIN:?} after shutdown began are dropped"
        );
        force.cancel();
        connections.wait().await;
    }
    Ok(())
}

/// Serves one connection, holding its `permit` until it closes: to its end,
/// or once `closing` fires to the end of the request it is on, or until
/// `force` fires, which drops it where it stands.
async fn connection(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    permit: OwnedSemaphorePermit,
    (closing, force): (CancellationToken, CancellationToken),
) {
    // Answers are small and written whole: no reason to wait for more.
    stream.set_nodelay(true).ok();
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(limits.client_timeout));
    let io = TokioIo::new(Box::pin(io));
    let app = TowerToHyperService::new(app);
    let ending = closing.clone();
    let service = hyper::service::service_fn(move |request| {
        let answer = app.call(request);
        let ending = ending.clone();
        async move {
            let mut response = answer.await?;
            if ending.is_cancelled() {
                // The connection closes after this answer: see the module doc.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.client_timeout);
    let mut conn = pin!(http.serve_connection(io, service));
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = closing.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                served = conn.as_mut() => served,
                () = force.cancelled() => return,
            }
        }
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    drop(permit);
}

/// After a failed `accept`: a connection that died in the queue is no matter;
/// anything else (out of file descriptors, most often) is logged, and the
/// loop pauses so as not to spin on it.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "cannot accept a connection; trying again in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
