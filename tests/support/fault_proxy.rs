//! A TCP proxy on 127.0.0.1 that breaks the link on command: the network
//! faults a worker meets while it stays alive.
//!
//! - [`freeze`](FaultProxy::freeze): no byte goes through either way, sockets
//!   stay open (a partition, a dead switch: the peer hears nothing, not even a
//!   reset); connections made meanwhile are frozen too;
//! - [`reset`](FaultProxy::reset): every connection is closed with a TCP reset,
//!   and new ones are reset as soon as they are accepted;
//! - [`delay`](FaultProxy::delay): each chunk is held this long before it is
//!   passed on (order kept);
//! - [`heal`](FaultProxy::heal): bytes flow again, held ones first;
//! - [`move_to`](FaultProxy::move_to): new connections go to another
//!   upstream while open ones stay where they were (a virtual IP or a DNS
//!   name moved to a new primary);
//! - one way only: [`delay_answers`](FaultProxy::delay_answers) holds what the
//!   upstream sends back, [`freeze_requests`](FaultProxy::freeze_requests)
//!   stops what the client sends while answers still come back.
//!
//! Unlike [`CommitCut`](super::commit_cut::CommitCut) it does not read the
//! protocol, so it stands between any client and server (PostgreSQL, drover's
//! HTTP API).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use drover::store::Store;

/// What the link does to bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Flow,
    Delay(Duration),
    Frozen,
    Reset,
}

/// The proxy; it serves until the test ends.
#[derive(Debug, Clone)]
pub(crate) struct FaultProxy {
    /// Where clients connect.
    pub(crate) addr: SocketAddr,
    /// What happens to bytes from the client to the upstream.
    mode: Arc<watch::Sender<Mode>>,
    /// What happens to bytes from the upstream back to the client.
    answers: Arc<watch::Sender<Mode>>,
    /// The pumps of every open connection, aborted by a reset.
    pumps: Arc<Mutex<Vec<AbortHandle>>>,
    /// Where new connections go.
    upstream: Arc<Mutex<SocketAddr>>,
}

impl FaultProxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let proxy = Self {
            addr: listener.local_addr().expect("proxy address"),
            mode: Arc::new(watch::Sender::new(Mode::Flow)),
            answers: Arc::new(watch::Sender::new(Mode::Flow)),
            pumps: Arc::default(),
            upstream: Arc::new(Mutex::new(upstream)),
        };
        let serving = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = *serving.upstream.lock();
                serving.serve(client, upstream).await;
            }
        });
        proxy
    }

    /// A proxy in front of the PostgreSQL server at `base`, and a store on the
    /// test database `url` connected through it.
    pub(crate) async fn in_front_of(base: &str, url: &str) -> (Self, Store) {
        let proxy = Self::start(super::server_addr(base).await).await;
        let store = Store::connect(&proxy.url_for(url))
            .await
            .expect("connect through the proxy");
        (proxy, store)
    }

    /// The PostgreSQL URL `url` (a test database's) reaching it through this
    /// proxy.
    pub(crate) fn url_for(&self, url: &str) -> String {
        super::through_proxy(url, self.addr)
    }

    /// Sends new connections to `upstream`; open ones stay where they are.
    pub(crate) fn move_to(&self, upstream: SocketAddr) {
        *self.upstream.lock() = upstream;
    }

    /// Stops every byte both ways, keeping the sockets open.
    pub(crate) fn freeze(&self) {
        self.set(Mode::Frozen);
    }

    /// Stops every byte from the client, keeping the sockets open; answers
    /// to what got through still come back.
    pub(crate) fn freeze_requests(&self) {
        self.mode.send_replace(Mode::Frozen);
    }

    /// Resets every connection, and every new one until [`heal`](Self::heal).
    pub(crate) fn reset(&self) {
        self.set(Mode::Reset);
        for pump in self.pumps.lock().drain(..) {
            pump.abort();
        }
    }

    /// Holds every chunk `by` before passing it on.
    pub(crate) fn delay(&self, by: Duration) {
        self.set(Mode::Delay(by));
    }

    /// Holds every chunk the upstream sends back `by` before passing it on;
    /// the client's bytes go through at once.
    pub(crate) fn delay_answers(&self, by: Duration) {
        self.answers.send_replace(Mode::Delay(by));
    }

    /// How many connections are open through the proxy (two pumps each):
    /// with the link frozen, a request is in flight once one is.
    pub(crate) fn connections(&self) -> usize {
        let pumps = self.pumps.lock();
        pumps.iter().filter(|pump| !pump.is_finished()).count() / 2
    }

    /// How many connections the proxy took since it started or was last
    /// reset, open or not.
    pub(crate) fn accepted(&self) -> usize {
        self.pumps.lock().len() / 2
    }

    /// Lets bytes flow again, both ways.
    pub(crate) fn heal(&self) {
        self.set(Mode::Flow);
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
        self.answers.send_replace(mode);
    }

    async fn serve(&self, client: TcpStream, upstream: SocketAddr) {
        if *self.mode.borrow() == Mode::Reset {
            reset(client);
            return;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            reset(client);
            return;
        };
        // A close is a reset: what a reset link looks like to both ends.
        for stream in [&client, &server] {
            stream.set_zero_linger().ok();
            stream.set_nodelay(true).ok();
        }
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let mut pumps = self.pumps.lock();
        pumps.retain(|pump| !pump.is_finished());
        let ways = [
            (client_read, server_write, &self.mode),
            (server_read, client_write, &self.answers),
        ];
        for (from, to, mode) in ways {
            let task = tokio::spawn(pump(from, to, mode.subscribe()));
            pumps.push(task.abort_handle());
        }
    }
}

fn reset(stream: TcpStream) {
    stream.set_zero_linger().ok();
    drop(stream);
}

/// Copies `from` to `to` chunk by chunk, obeying the mode at each chunk.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let now = *mode
            .wait_for(|m| *m != Mode::Frozen)
            .await
            .expect("the proxy outlives its pumps");
        match now {
            Mode::Reset => return,
            Mode::Delay(by) => tokio::time::sleep(by).await,
            Mode::Flow | Mode::Frozen => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
