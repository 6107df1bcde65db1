//! A TCP proxy in front of PostgreSQL that, once armed, lets one claim commit
//! on the server and then cuts the connection before the client hears the
//! answer: the "committed, but the client cannot know" case that no local
//! fault can produce otherwise.
//!
//! It reads the client's side of the wire protocol (plain text only: connect
//! through it with `sslmode=disable`): statements are remembered by name from
//! `Parse`, a `Bind` of one that leases keys ([`CLAIMS`]) marks the
//! transaction, and that transaction's commit is the one cut: its `COMMIT`, or
//! for a statement outside `BEGIN` the `Sync` that ends its implicit
//! transaction. The server's answer (up to its `ReadyForQuery`, sent once the
//! commit is done) is swallowed, then both connections are dropped.
//! [`arm_for`](CommitCut::arm_for) cuts instead the commit of a transaction
//! that ran a given statement (the claims of several controllers grouped into
//! one, a batch of completions written the general way).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use drover::store::Store;

/// What a statement may contain for its transaction's commit to be cut: a
/// call of one of the claim functions (`drover_claim`, `drover_claim_gated`)
/// or a write that leases a key itself (`lease_lock`).
const CLAIMS: [&str; 2] = ["drover_claim", "SET state = 'running'"];

/// The proxy; it serves until the test ends.
#[derive(Debug, Clone)]
pub(crate) struct CommitCut {
    /// Where clients connect.
    pub(crate) addr: SocketAddr,
    armed: Arc<AtomicBool>,
    /// Text a statement of the cut transaction contains (`None`: any claim).
    only: Arc<Mutex<Option<&'static str>>>,
    cut: Arc<Notify>,
}

impl CommitCut {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let proxy = Self {
            addr: listener.local_addr().expect("proxy address"),
            armed: Arc::new(AtomicBool::new(false)),
            only: Arc::new(Mutex::new(None)),
            cut: Arc::new(Notify::new()),
        };
        let serving = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(serving.clone().pipe(client, server));
            }
        });
        proxy
    }

    /// A proxy in front of the PostgreSQL server at `base`, and a store on the
    /// test database `url` connected through it.
    pub(crate) async fn in_front_of(base: &str, url: &str) -> (Self, Store) {
        let proxy = Self::start(super::server_addr(base).await).await;
        let store = Store::connect(&super::through_proxy(url, proxy.addr))
            .await
            .expect("connect through the proxy");
        (proxy, store)
    }

    /// Cuts the next claim's commit (once).
    pub(crate) fn arm(&self) {
        self.arm_only(None);
    }

    /// Cuts the commit of the next transaction that ran a statement
    /// containing `text` (once); every other commits and is answered as usual.
    pub(crate) fn arm_for(&self, text: &'static str) {
        self.arm_only(Some(text));
    }

    fn arm_only(&self, text: Option<&'static str>) {
        *self.only.lock().unwrap_or_else(PoisonError::into_inner) = text;
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Whether a bound statement of text `query` marks its transaction's
    /// commit as the one to cut, when armed.
    fn marks(&self, query: &str) -> bool {
        match *self.only.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(text) => query.contains(text),
            None => CLAIMS.iter().any(|c| query.contains(c)),
        }
    }

    /// Waits until a commit has been cut.
    pub(crate) async fn cut(&self) {
        self.cut.notified().await;
    }

    async fn pipe(self, client: TcpStream, server: TcpStream) {
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let cutting = Arc::new(AtomicBool::new(false));
        let replies = tokio::spawn(replies(
            server_read,
            client_write,
            Arc::clone(&cutting),
            Arc::clone(&self.cut),
        ));
        self.requests(client_read, server_write, &cutting).await;
        replies.abort();
    }

    /// Client to server, message by message, watching for the commit to cut.
    async fn requests(
        &self,
        mut from: OwnedReadHalf,
        mut to: OwnedWriteHalf,
        cutting: &AtomicBool,
    ) {
        // Each prepared statement's text, by name.
        let mut statements: HashMap<Vec<u8>, String> = HashMap::new();
        let (mut marked, mut explicit, mut started) = (false, false, false);
        loop {
            // Before the startup message is through, messages carry no type byte.
            let kind = if started {
                match from.read_u8().await {
                    Ok(kind) => Some(kind),
                    Err(_) => return,
                }
            } else {
                None
            };
            let Ok(len) = from.read_u32().await else {
                return;
            };
            let mut body = vec![0; (len as usize).saturating_sub(4)];
            if from.read_exact(&mut body).await.is_err() {
                return;
            }
            let mut commits = false;
            match kind {
                None => {
                    // SSLRequest and GSSENCRequest codes; anything else is the startup.
                    let code = body
                        .get(..4)
                        .map(|c| u32::from_be_bytes(c.try_into().unwrap()));
                    started = !matches!(code, Some(80_877_103 | 80_877_104));
                }
                Some(b'P') => {
                    let mut parts = body.split(|b| *b == 0);
                    let name = parts.next().unwrap_or_default().to_vec();
                    let query = String::from_utf8_lossy(parts.next().unwrap_or_default());
                    statements.insert(name, query.into_owned());
                }
                Some(b'B') => {
                    let statement = body.split(|b| *b == 0).nth(1).unwrap_or_default();
                    marked |= statements.get(statement).is_some_and(|q| self.marks(q));
                }
                Some(b'Q') if body.starts_with(b"BEGIN") => explicit = true,
                // `ROLLBACK TO SAVEPOINT` ends no transaction.
                Some(b'Q')
                    if body.starts_with(b"COMMIT")
                        || (body.starts_with(b"ROLLBACK") && !body.starts_with(b"ROLLBACK TO")) =>
                {
                    commits = body.starts_with(b"COMMIT") && marked;
                    (explicit, marked) = (false, false);
                }
                Some(b'S') if !explicit => {
                    commits = marked;
                    marked = false;
                }
                Some(_) => {}
            }
            if commits && self.armed.swap(false, Ordering::SeqCst) {
                // Set before the commit goes out: its answer is not passed on.
                cutting.store(true, Ordering::SeqCst);
            }
            let mut message = Vec::with_capacity(len as usize + 1);
            message.extend(kind);
            message.extend_from_slice(&len.to_be_bytes());
            message.extend_from_slice(&body);
            if to.write_all(&message).await.is_err() {
                return;
            }
        }
    }
}

/// Server to client, byte for byte, until the answer to a cut commit: that is
/// swallowed up to its `ReadyForQuery` (the server has committed by then), and
/// both connections are dropped.
async fn replies(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cutting: Arc<AtomicBool>,
    cut: Arc<Notify>,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cutting.load(Ordering::SeqCst) {
            // A `ReadyForQuery` ('Z', length 5, status) ends what the server sent.
            let ready = n >= 6 && buf[n - 6..n - 1] == [b'Z', 0, 0, 0, 5];
            if ready {
                drop((from, to));
                cut.notify_one();
                return;
            }
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
