//! A TCP proxy in front of PostgreSQL that checks, on the wire, the one rule a
//! client of a transaction-pooling PgBouncer lives by: the pooler may hand the
//! connection to another server at every moment the server says it is idle
//! (a `ReadyForQuery` with status `I`), so a statement prepared before such a
//! moment must not be used after it. Two ways to break it:
//!
//! - an unnamed statement's `Parse` and its `Bind` with an idle moment between
//!   them (sqlx sends them in two round trips, each ended by a `Sync`): through
//!   a pooler the `Bind` can reach a server that never saw the `Parse`
//!   ("unnamed prepared statement does not exist", or worse, another
//!   client's statement bound to these parameters);
//! - a named statement alive across an idle moment: bound there later, it is
//!   missing or someone else's.
//!
//! A real PgBouncer breaks only when another client takes the server in
//! between, which a test cannot arrange on demand; this proxy judges every
//! statement, every time. Clients connect with `sslmode=disable` (the wire is
//! read as plain text) and `pool_mode=transaction` (so the store behaves as it
//! does through a pooler).
//!
//! How it counts: every point where the server answers with a
//! `ReadyForQuery` (the startup, each `Sync`, each simple `Query`) ends a
//! cycle; the k-th `ReadyForQuery` ends cycle k. A statement parsed in cycle
//! k and used (or closed) in cycle m is fine when none of the answers ending
//! cycles k..m was `I`. The answers may cross the client's next messages on
//! the wire, so the judgement is made at the end ([`PoolLint::violations`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it serves until the test ends.
#[derive(Debug, Clone)]
pub(crate) struct PoolLint {
    /// Where clients connect.
    pub(crate) addr: SocketAddr,
    wires: Arc<Mutex<Vec<Arc<Mutex<Wire>>>>>,
}

/// What one client connection did, as far as the rule goes.
#[derive(Debug, Default)]
struct Wire {
    /// The status of each `ReadyForQuery`, in order.
    ready: Vec<u8>,
    /// Cycles the client has ended so far (the cycle its next message is in).
    cycle: usize,
    /// Statements prepared and not closed: name → (cycle parsed, its text).
    open: HashMap<Vec<u8>, (usize, String)>,
    /// Uses to judge: (statement, cycle parsed, cycle used or closed).
    spans: Vec<(String, usize, usize)>,
    /// `Bind` messages seen, so a test can tell it checked something.
    binds: u64,
}

impl Wire {
    fn lock(wire: &Mutex<Wire>) -> std::sync::MutexGuard<'_, Wire> {
        wire.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a client message of type `kind` (`None`: the startup).
    fn client(&mut self, kind: Option<u8>, body: &[u8]) {
        match kind {
            None | Some(b'S') => self.cycle += 1,
            Some(b'Q') => {
                if contains(body, b"DEALLOCATE ALL") {
                    let closed: Vec<_> = self.open.drain().collect();
                    for (name, (parsed, text)) in closed {
                        self.spans
                            .push((describe(&name, &text), parsed, self.cycle));
                    }
                }
                self.cycle += 1;
            }
            Some(b'P') => {
                let mut parts = body.split(|b| *b == 0);
                let name = parts.next().unwrap_or_default().to_vec();
                let text = String::from_utf8_lossy(parts.next().unwrap_or_default());
                let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
                self.open
                    .insert(name, (self.cycle, text.chars().take(100).collect()));
            }
            Some(b'B') => {
                self.binds += 1;
                let name = body.split(|b| *b == 0).nth(1).unwrap_or_default();
                if let Some((parsed, text)) = self.open.get(name) {
                    self.spans.push((describe(name, text), *parsed, self.cycle));
                }
            }
            // Close ('S' for a statement, then its name).
            Some(b'C') if body.first() == Some(&b'S') => {
                let name = body[1..].split(|b| *b == 0).next().unwrap_or_default();
                if let Some((parsed, text)) = self.open.remove(name) {
                    self.spans.push((describe(name, &text), parsed, self.cycle));
                }
            }
            Some(_) => {}
        }
    }

    /// What broke the rule on this connection.
    fn violations(&self) -> Vec<String> {
        let idle_between =
            |from: usize, to: usize| (from..to).find(|c| self.ready.get(*c).copied() == Some(b'I'));
        let mut found = Vec::new();
        for (what, parsed, used) in &self.spans {
            if let Some(c) = idle_between(*parsed, *used) {
                found.push(format!(
                    "{what}: parsed in cycle {parsed}, used in cycle {used}, \
                     but the server was idle after cycle {c} (a pooler may have \
                     switched servers)"
                ));
            }
        }
        // A named statement never closed lives until the connection ends.
        for (name, (parsed, text)) in &self.open {
            if name.is_empty() {
                continue;
            }
            if let Some(c) = idle_between(*parsed, self.ready.len()) {
                found.push(format!(
                    "{}: parsed in cycle {parsed} and never closed, but the server \
                     was idle after cycle {c}",
                    describe(name, text)
                ));
            }
        }
        found
    }
}

fn describe(name: &[u8], text: &str) -> String {
    if name.is_empty() {
        format!("unnamed statement `{text}`")
    } else {
        format!("statement {} `{text}`", String::from_utf8_lossy(name))
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl PoolLint {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let lint = Self {
            addr: listener.local_addr().expect("proxy address"),
            wires: Arc::default(),
        };
        let wires = Arc::clone(&lint.wires);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                // Messages are passed on one by one: without this, Nagle's
                // algorithm holds each small one back for a delayed ACK.
                client.set_nodelay(true).ok();
                server.set_nodelay(true).ok();
                let wire = Arc::new(Mutex::new(Wire::default()));
                wires
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Arc::clone(&wire));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(requests(client_read, server_write, Arc::clone(&wire)));
                tokio::spawn(replies(server_read, client_write, wire));
            }
        });
        lint
    }

    /// Every break of the rule on every connection so far, described.
    pub(crate) fn violations(&self) -> Vec<String> {
        let wires = self.wires.lock().unwrap_or_else(PoisonError::into_inner);
        wires
            .iter()
            .flat_map(|wire| Wire::lock(wire).violations())
            .collect()
    }

    /// `Bind` messages seen on all connections.
    pub(crate) fn binds(&self) -> u64 {
        let wires = self.wires.lock().unwrap_or_else(PoisonError::into_inner);
        wires.iter().map(|wire| Wire::lock(wire).binds).sum()
    }

    /// Panics with every break seen, after checking that at least
    /// `at_least` statements were bound through the lint (so a store that
    /// went around it cannot pass).
    pub(crate) fn assert_clean(&self, at_least: u64) {
        let binds = self.binds();
        assert!(
            binds >= at_least,
            "the lint saw {binds} binds, fewer than the {at_least} this work sends: \
             is the store going around it?"
        );
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "statements a pooler would break:\n{}",
            violations.join("\n")
        );
    }
}

/// Reads one message: its type (none before the startup is through), the
/// length field and the body.
async fn message(from: &mut OwnedReadHalf, typed: bool) -> Option<(Option<u8>, u32, Vec<u8>)> {
    let kind = if typed {
        Some(from.read_u8().await.ok()?)
    } else {
        None
    };
    let len = from.read_u32().await.ok()?;
    let mut body = vec![0; (len as usize).saturating_sub(4)];
    from.read_exact(&mut body).await.ok()?;
    Some((kind, len, body))
}

async fn forward(to: &mut OwnedWriteHalf, kind: Option<u8>, len: u32, body: &[u8]) -> bool {
    let mut bytes = Vec::with_capacity(len as usize + 1);
    bytes.extend(kind);
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes.extend_from_slice(body);
    to.write_all(&bytes).await.is_ok()
}

/// Client to server, message by message, recorded before it is passed on.
async fn requests(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, wire: Arc<Mutex<Wire>>) {
    let mut started = false;
    while let Some((kind, len, body)) = message(&mut from, started).await {
        if kind.is_none() {
            // SSLRequest and GSSENCRequest are refused by the server with one
            // unframed byte; the proxy only reads plain text (sslmode=disable).
            let code = body
                .get(..4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
            assert!(
                !matches!(code, Some(80_877_103 | 80_877_104)),
                "connect through the pool lint with sslmode=disable"
            );
            started = true;
        }
        Wire::lock(&wire).client(kind, &body);
        if !forward(&mut to, kind, len, &body).await {
            return;
        }
    }
}

/// Server to client, message by message, recording each `ReadyForQuery`.
async fn replies(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, wire: Arc<Mutex<Wire>>) {
    while let Some((kind, len, body)) = message(&mut from, true).await {
        if kind == Some(b'Z') {
            let status = body.first().copied().unwrap_or_default();
            Wire::lock(&wire).ready.push(status);
        }
        if !forward(&mut to, kind, len, &body).await {
            return;
        }
    }
}

/// A fresh database on the PostgreSQL server at `direct`, reached through a
/// [`PoolLint`] as a store reaches a transaction-pooling PgBouncer
/// (`?pool_mode=transaction`); the test's own SQL goes to the server directly.
pub(crate) async fn through_lint(direct: &str) -> (super::TestDb, String, PoolLint) {
    let name = super::unique_name("drover_lint");
    super::admin_execute(direct, &format!("CREATE DATABASE {name}")).await;
    let lint = PoolLint::start(super::server_addr(direct).await).await;
    let database = super::with_database(direct, &name);
    let url = format!(
        "{}&pool_mode=transaction",
        super::through_proxy(&database, lint.addr)
    );
    let store = drover::store::Store::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect through the pool lint: {e}"));
    let mut db = super::TestDb::new(store, url, "postgres");
    db.sql_url = database;
    (db, name, lint)
}
