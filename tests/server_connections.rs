//! The server's connections are bounded (DESIGN.md rule 13: a caller cannot
//! exhaust the server): a caller that never finishes its headers or its body,
//! stays idle, or stops reading its answers is cut after the client timeout,
//! and past `max_connections` new connections wait for one to close. Each
//! test talks raw TCP on loopback, as a hostile caller would.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use drover::server::{Server, ServerOptions};
use drover::store::{SessionList, StoreEngine as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The longest any test here waits for the server to act; the timeouts under
/// test are a fraction of it.
const PATIENCE: Duration = Duration::from_secs(20);

/// A server on a fresh SQLite file, on a loopback port.
struct Running {
    addr: SocketAddr,
    shutdown: CancellationToken,
    served: JoinHandle<std::io::Result<()>>,
    db: (support::TestDb, tempfile::TempDir),
}

async fn start(options: ServerOptions) -> Running {
    let db = support::sqlite().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let stop = CancellationToken::new();
    let served =
        tokio::spawn(Server::new(db.0.store.clone(), options).serve(listener, stop.clone()));
    Running {
        addr,
        shutdown: stop,
        served,
        db,
    }
}

impl Running {
    /// Shuts the server down and waits for `serve` to return.
    async fn stop(self) {
        self.shutdown.cancel();
        self.served.await.expect("joined").expect("served");
    }

    /// Shuts the server down once every connection made before this call is
    /// its own (a probe connected after them is answered, and the accept
    /// queue is first come, first served), and waits for `serve` to return,
    /// [`PATIENCE`] at most, whatever those connections do.
    async fn stop_once_accepted(&mut self) {
        let mut probe = TcpStream::connect(self.addr).await.expect("connect");
        probe.write_all(HEALTHZ).await.expect("send a request");
        read_response(&mut probe).await;
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, &mut self.served)
            .await
            .expect("serve returned while callers stalled")
            .expect("joined")
            .expect("served");
    }
}

/// Reads until the server closes the connection (end of stream or reset),
/// returning what came; fails the test if it stays open past [`PATIENCE`].
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin), what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await {
            Err(_) => panic!("{what}: the server kept the connection open past {PATIENCE:?}"),
            Ok(Ok(0) | Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one response whose body is `Content-Length` long, leaving the
/// connection open.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .expect("a content-length");
            if got.len() >= end + 4 + length {
                return text;
            }
        }
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("read a response");
        assert_ne!(n, 0, "the connection closed before the response");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Whether the server has closed `stream` by now: its end of stream (or
/// reset) is already here, with nothing before it.
async fn closed_by_now(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_millis(50), stream.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected bytes from a stalled connection: {n}"),
        Err(_) => false,
    }
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/// A caller that sends half its headers and then nothing is cut; so is a
/// kept-alive connection left idle after its answer. Before, hyper ran
/// without a timer and either held its connection for ever.
#[tokio::test]
async fn half_sent_headers_and_idle_connections_are_cut_after_the_client_timeout() {
    let server = start(ServerOptions::default().client_timeout(Duration::from_millis(300))).await;

    let mut half = TcpStream::connect(server.addr).await.expect("connect");
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("send half the headers");
    read_until_closed(&mut half, "half-sent headers").await;

    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(HEALTHZ).await.expect("send a request");
    let first = read_response(&mut idle).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Kept alive: a request sent at once is answered on the same connection.
    idle.write_all(HEALTHZ).await.expect("send another");
    let second = read_response(&mut idle).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    let rest = read_until_closed(&mut idle, "an idle kept-alive connection").await;
    assert!(rest.is_empty(), "nothing more was asked: {rest:?}");
    server.stop().await;
}

/// A body that trickles in, a byte at a time, is answered 408 once the
/// client timeout has passed since its headers: the deadline is on the
/// whole body, so a byte now and then does not stretch it. Both kinds of
/// body reader are covered: the API's JSON and a dashboard form's.
#[tokio::test]
async fn a_trickling_body_is_answered_408_when_the_client_timeout_passes() {
    let server = start(ServerOptions::default().client_timeout(Duration::from_millis(500))).await;
    for (path, kind, says) in [
        ("/v1/sessions", "application/json", "request_timeout"),
        (
            "/ui/processes/p/errors/park",
            "application/x-www-form-urlencoded",
            "did not arrive within",
        ),
    ] {
        let mut stream = TcpStream::connect(server.addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\n\
             Content-Length: 10000\r\n\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("send headers");
        let (mut reader, mut writer) = stream.split();
        let trickle = async {
            // Each byte well within the timeout of the one before.
            for _ in 0..10_000 {
                if writer.write_all(b" ").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let answered = tokio::select! {
            got = read_until_closed(&mut reader, path) => got,
            () = trickle => panic!("{path}: the whole trickle was read"),
        };
        let text = String::from_utf8_lossy(&answered);
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(text.contains(says), "{path}: {text}");
    }
    server.stop().await;
}

/// Past `max_connections` the server accepts nothing more until one of its
/// connections closes: a request on a fourth connection beside three stalled
/// ones is answered only after the server has cut one of them.
#[tokio::test]
async fn a_connection_past_the_cap_waits_until_one_closes() {
    let server = start(
        ServerOptions::default()
            .max_connections(3)
            .client_timeout(Duration::from_secs(2)),
    )
    .await;
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(server.addr).await.expect("connect");
        stream.write_all(b"GET /he").await.expect("send a little");
        stalled.push(stream);
    }
    // The three are the server's before the fourth: one answered request on
    // each would prove it, but would also end their stall; the accept queue
    // is first come, first served.
    let mut fourth = TcpStream::connect(server.addr).await.expect("connect");
    fourth.write_all(HEALTHZ).await.expect("send a request");
    let answer = read_response(&mut fourth).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut cut = 0;
    for stream in &mut stalled {
        if closed_by_now(stream).await {
            cut += 1;
        }
    }
    assert!(
        cut >= 1,
        "the fourth connection was served while the three stalled ones were all open"
    );
    server.stop().await;
}

/// A caller that sends requests and never reads the answers is cut once a
/// write has waited the client timeout: its writes then fail, where before
/// the server waited on it for ever (and so did the caller's writes, once
/// the server stopped reading).
#[tokio::test]
async fn a_caller_that_stops_reading_is_cut() {
    let server = start(ServerOptions::default().client_timeout(Duration::from_millis(300))).await;
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("a small buffer");
    let mut stream = socket.connect(server.addr).await.expect("connect");
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(64);
    let writes = async {
        loop {
            if let Err(e) = stream.write_all(&request).await {
                return e;
            }
        }
    };
    let error = tokio::time::timeout(PATIENCE, writes)
        .await
        .expect("the server cut a caller that does not read");
    assert!(
        matches!(
            error.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{error}"
    );
    server.stop().await;
}

/// Shutdown does not wait on a caller that stalls: `serve` returns while a
/// half-sent request and a caller that stopped reading are still connected.
#[tokio::test]
async fn shutdown_is_not_held_by_stalled_callers() {
    let mut server =
        start(ServerOptions::default().client_timeout(Duration::from_millis(300))).await;
    let mut half = TcpStream::connect(server.addr).await.expect("connect");
    half.write_all(
        b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .expect("send a part");
    let idle = TcpStream::connect(server.addr).await.expect("connect");
    server.stop_once_accepted().await;
    drop((half, idle));
}

/// Nothing is served after `serve` returns: a connection still holding half
/// a request when shutdown's drain (10 s) runs out is dropped, and the rest of
/// its request, sent later, reaches nothing. Before, its task lived on and
/// served the request (here it would start a session) after the server had
/// stopped, while the store was being closed.
#[tokio::test]
async fn nothing_is_served_after_serve_returns() {
    // Longer than the drain, so only the drain ends the connection.
    let mut server = start(ServerOptions::default().client_timeout(Duration::from_secs(60))).await;
    let body = r#"{"component":"late","ttl_ms":60000}"#;
    let mut late = TcpStream::connect(server.addr).await.expect("connect");
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    late.write_all(head.as_bytes())
        .await
        .expect("send most headers");
    server.stop_once_accepted().await;
    // The rest may find the connection reset already.
    let _ = late.write_all(format!("\r\n{body}").as_bytes()).await;
    let answer = read_until_closed(&mut late, "a connection after serve returned").await;
    assert!(
        answer.is_empty(),
        "served after serve returned: {}",
        String::from_utf8_lossy(&answer)
    );
    let list = SessionList {
        after: None,
        limit: 10,
        leases_per_session: 0,
    };
    let sessions = server.db.0.store.session_list(list).await.expect("list");
    assert!(
        sessions.items.is_empty(),
        "a session was started after serve returned: {:?}",
        sessions.items
    );
}

/// Only HTTP/1.1 is served: HTTP/2 by prior knowledge (h2c), whose streams
/// and pings these bounds do not cover, is refused. A caller that opens with
/// HTTP/2's preface gets no SETTINGS frame (a server speaking HTTP/2 sends
/// one first), at most an HTTP/1 error, and the connection closes.
#[tokio::test]
async fn http2_by_prior_knowledge_is_refused() {
    let server = start(ServerOptions::default()).await;
    let mut h2 = TcpStream::connect(server.addr).await.expect("connect");
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("send HTTP/2's preface");
    // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
    h2.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .expect("send SETTINGS");
    let got = read_until_closed(&mut h2, "HTTP/2's preface").await;
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 "),
        "an HTTP/2 answer: {got:?}"
    );
    // An HTTP/1.1 caller is served beside it.
    let mut one = TcpStream::connect(server.addr).await.expect("connect");
    one.write_all(HEALTHZ).await.expect("send a request");
    let answer = read_response(&mut one).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(one);
    server.stop().await;
}

/// A body over the limit is answered 413 with the connection kept: the
/// server reads the body to its end first, so the next request on that
/// connection (an HTTP client's pool reuses it, and drover's worker sends the
/// batch again in halves) is answered. Before, the server answered at once
/// and closed the connection with the body unread, without saying so; the
/// client's next request on it failed with a broken pipe, and the worker
/// could not tell "too large, send less" from a lost request.
#[tokio::test]
async fn a_body_over_the_limit_is_answered_413_on_a_connection_kept_open() {
    let server = start(ServerOptions::default().body_limit(4096)).await;
    let body = vec![b' '; 256 * 1024];
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send headers");
    stream.write_all(&body).await.expect("send the body");
    let answer = read_response(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    stream
        .write_all(HEALTHZ)
        .await
        .expect("send another request");
    let next = read_response(&mut stream).await;
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    server.stop().await;
}

/// `body` as a POST to `path` with a JSON body.
fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Waits until the server's `drover_claims_waiting` gauge says a claim
/// waits (the server tells no one when one starts to wait), reading
/// `/metrics` again every 5 ms; fails after [`PATIENCE`].
async fn until_a_claim_waits(addr: SocketAddr) {
    let mut metrics = TcpStream::connect(addr).await.expect("connect");
    let request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    tokio::time::timeout(PATIENCE, async {
        loop {
            metrics.write_all(request).await.expect("ask for /metrics");
            let text = read_response(&mut metrics).await;
            let waiting = text
                .lines()
                .find_map(|l| l.strip_prefix("drover_claims_waiting "))
                .and_then(|v| v.trim().parse::<i64>().ok())
                .expect("the server reports drover_claims_waiting");
            if waiting >= 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the claim waited within the patience");
}

/// A claim waiting when shutdown begins is answered (with no leases) saying
/// `Connection: close`, as hyper then closes the connection. Before, the
/// answer said so only when the connection's task heard of the shutdown
/// before the claim's answer came (about one time in two): otherwise it
/// said nothing, and the connection was closed right after it. A worker
/// that claimed again at once sent its next claim on that connection, into
/// its close ("connection closed before message completed"): a claim whose
/// answer never came, which drover's client must take for one that may have
/// leased keys. It gave its session up and stopped every run under it, so a
/// graceful restart of `drover serve` killed remote workers' runs. Sixteen
/// shutdowns, so that the old order shows in all but one run in 65,536.
#[tokio::test]
async fn a_claim_answered_at_shutdown_says_the_connection_closes() {
    for round in 0..16 {
        let server = start(ServerOptions::default()).await;
        let mut stream = TcpStream::connect(server.addr).await.expect("connect");
        let start = post("/v1/sessions", r#"{"component":"w","ttl_ms":60000}"#);
        stream
            .write_all(start.as_bytes())
            .await
            .expect("start a session");
        let started = read_response(&mut stream).await;
        let (_, body) = started.split_once("\r\n\r\n").expect("a body");
        let session: serde_json::Value = serde_json::from_str(body).expect("a session");
        let claim = post(
            &format!("/v1/sessions/{}/claim", session["id"]),
            r#"{"process":"idle","wait_ms":60000}"#,
        );
        stream.write_all(claim.as_bytes()).await.expect("claim");
        until_a_claim_waits(server.addr).await;
        server.shutdown.cancel();
        let answer = read_until_closed(&mut stream, "a claim answered at shutdown").await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let (head, _) = answer.split_once("\r\n\r\n").expect("a head");
        assert!(
            head.lines()
                .any(|l| l.eq_ignore_ascii_case("connection: close")),
            "shutdown {round}: the answer does not say the connection closes after it:\n{head}"
        );
        server.served.await.expect("joined").expect("served");
    }
}
