//! What a differential case compares: each operation's answer and the state
//! after it, normalised so the model and every engine can be held equal.
//! Session ids and fencing tokens differ between databases, so both are
//! named by their order within the case ([`Aliases`]); times are left out
//! (they differ by the real time a case takes) except as what they decide:
//! whether a pending key is ready, and whether it is backing off.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use drover::store::{Lease, RunOutcome, SessionId, StoreError};

use crate::ops::Op;

/// Why an engine (or the model) refused an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    SessionExpired,
    LeaseLost,
    /// An operator's action on a running key (`AlreadyLeased`).
    Running,
}

impl Refusal {
    /// The refusal an error is, or the error's words when it is none.
    pub(crate) fn of(e: &StoreError) -> Result<Self, String> {
        match e {
            StoreError::SessionExpired { .. } => Ok(Self::SessionExpired),
            StoreError::LeaseLost { .. } => Ok(Self::LeaseLost),
            StoreError::AlreadyLeased { .. } => Ok(Self::Running),
            other => Err(format!("unexpected error: {other}")),
        }
    }
}

/// One lease handed out, by its number in the case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leased {
    pub lease: usize,
    pub key: String,
    pub attempt: u32,
    pub priority: i32,
}

impl fmt::Display for Leased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "L{}={} (attempt {}, priority {})",
            self.lease, self.key, self.attempt, self.priority
        )
    }
}

/// An operation's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// It named a session or lease the case has none of.
    Skipped,
    Started(usize),
    /// How many of the keys were running (marked dirty).
    Enqueued {
        dirty: u64,
    },
    Renewed,
    Closed(u64),
    /// A claim's leases in claim order, and its gate: whether the process
    /// was paused or its concurrency limit held the claim back. The gate is
    /// `None` when no key was ready: then it held nothing back, and an engine
    /// may report it or not (SQLite's one-trip claim does not read it).
    Claimed {
        leases: Vec<Leased>,
        gate: Option<(bool, bool)>,
    },
    Ok,
    Refused(Refusal),
    Batch(Vec<Result<(), Refusal>>),
    Reclaimed {
        sessions: u64,
        leases: u64,
    },
    /// An operator's action: `done`, `no such key` or `refused: running`.
    Admin(&'static str),
    /// A pause or resume, and whether it changed anything.
    Changed(bool),
    Set,
    /// An error no side should give, or a broken promise (a token that did
    /// not increase): a divergence whatever the model says.
    Failed(String),
}

impl Answer {
    /// What kind of answer this is, for the run's tally of what its cases
    /// exercised.
    pub(crate) fn kind(&self) -> String {
        match self {
            Self::Claimed { leases, gate } => match (leases.len(), gate) {
                (0, Some((true, _))) => "claim held by pause".into(),
                (0, Some((false, true))) => "claim held by the limit".into(),
                (0, _) => "claim of nothing".into(),
                (_, Some((false, true))) => "claim cut by the limit".into(),
                (n, _) => format!("claim of {n}"),
            },
            Self::Batch(each) => {
                let ok = each.iter().filter(|r| r.is_ok()).count();
                format!("batch of {}, {ok} ok", each.len())
            }
            Self::Refused(r) => format!("refused: {r:?}"),
            Self::Closed(n) => format!("close releasing {n}"),
            Self::Reclaimed { leases, .. } => format!("reclaim of {leases} leases"),
            Self::Enqueued { dirty } => format!("enqueue, {dirty} dirty"),
            Self::Admin(words) => format!("admin: {words}"),
            other => format!("{other:?}"),
        }
    }

    /// This answer as `model` would be compared: a claim's gate left out
    /// when the model's is (no key was ready).
    pub(crate) fn as_compared_with(self, model: &Self) -> Self {
        match (self, model) {
            (Self::Claimed { leases, .. }, Self::Claimed { gate: None, .. }) => {
                Self::Claimed { leases, gate: None }
            }
            (answer, _) => answer,
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Claimed { leases, gate } => {
                let each: Vec<String> = leases.iter().map(ToString::to_string).collect();
                write!(f, "claimed [{}]", each.join(", "))?;
                match gate {
                    Some((true, _)) => write!(f, " (paused)"),
                    Some((false, true)) => write!(f, " (concurrency-limited)"),
                    Some((false, false)) | None => Ok(()),
                }
            }
            Self::Started(s) => write!(f, "S{s}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// One key's item as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ItemView {
    /// `ready`, `waiting` (pending, not yet ready), `backoff`, `running`,
    /// `parked` or `idle`.
    pub state: &'static str,
    pub priority: i32,
    pub failures: u32,
    pub dirty: bool,
    pub last_error: Option<String>,
    /// The running lease: its session's and its own number in the case.
    pub lease: Option<(usize, usize)>,
}

/// Everything observable after an operation: the items, and each key's
/// history (outcome and lease number, oldest first; pause rows under `""`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub items: BTreeMap<String, ItemView>,
    pub history: BTreeMap<String, Vec<(RunOutcome, Option<usize>)>>,
}

impl Snapshot {
    /// The first difference from `other`, in words; `None` when equal.
    pub(crate) fn difference(&self, other: &Self) -> Option<String> {
        let keys = self.items.keys().chain(other.items.keys());
        for key in keys {
            let (a, b) = (self.items.get(key), other.items.get(key));
            if a != b {
                return Some(format!("item {key}: model {a:?}\n       engine {b:?}"));
            }
        }
        let keys = self.history.keys().chain(other.history.keys());
        for key in keys {
            let (a, b) = (self.history.get(key), other.history.get(key));
            if a != b {
                return Some(format!(
                    "history of {key:?}: model {a:?}\n       engine {b:?}"
                ));
            }
        }
        None
    }
}

/// Names for the sessions and leases one side was handed, in order.
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    pub sessions: Vec<SessionId>,
    pub leases: Vec<Lease>,
    by_token: HashMap<i64, usize>,
    by_session: HashMap<i64, usize>,
    /// The highest fencing token seen: each new one must be above it.
    top_token: Option<i64>,
}

impl Aliases {
    /// The number of the `n`th newest of `len` (counting round).
    fn newest(n: u8, len: usize) -> Option<usize> {
        (len > 0).then(|| len - 1 - usize::from(n) % len)
    }

    /// The session an operation names (`n` = 0: the newest), if the case
    /// has any, and its number.
    pub(crate) fn session(&self, n: u8) -> Option<SessionId> {
        Self::newest(n, self.sessions.len()).map(|i| self.sessions[i])
    }

    /// The lease an operation names (`n` = 0: the newest), if the case has
    /// any.
    pub(crate) fn lease(&self, n: u8) -> Option<&Lease> {
        Self::newest(n, self.leases.len()).map(|i| &self.leases[i])
    }

    /// What the sessions and leases an operation names are, in the case's
    /// numbering: `S2`, `L5 (k1)`.
    pub(crate) fn names(&self, op: &Op) -> String {
        let session = |n: u8| Self::newest(n, self.sessions.len()).map(|i| format!("S{i}"));
        let lease = |n: u8| {
            Self::newest(n, self.leases.len())
                .map(|i| format!("L{i} ({})", self.leases[i].key))
        };
        let named = match op {
            Op::Heartbeat { session: n } | Op::Close { session: n } | Op::Claim { session: n, .. } => {
                session(*n)
            }
            Op::Complete { lease: n, .. } | Op::Release { lease: n } => lease(*n),
            Op::Batch(each) => {
                let each: Option<Vec<String>> = each.iter().map(|(n, _)| lease(*n)).collect();
                each.map(|each| each.join(", "))
            }
            _ => return String::new(),
        };
        named.map_or_else(|| "[none]".into(), |named| format!("[{named}]"))
    }

    pub(crate) fn add_session(&mut self, id: SessionId) -> usize {
        let n = self.sessions.len();
        self.sessions.push(id);
        self.by_session.insert(id.0, n);
        n
    }

    /// Names the leases of one claim, in claim order; an error if a token
    /// is not above every token handed out before this claim (the tokens of
    /// one claim may come in any order among themselves).
    pub(crate) fn add_leases(&mut self, leases: &[Lease]) -> Result<Vec<Leased>, String> {
        let floor = self.top_token;
        let mut named = Vec::with_capacity(leases.len());
        for lease in leases {
            let token = lease.token.0;
            if floor.is_some_and(|top| token <= top) || self.by_token.contains_key(&token) {
                return Err(format!(
                    "fencing token {token} of {} is not above the earlier tokens (top {floor:?})",
                    lease.key
                ));
            }
            self.top_token = Some(self.top_token.map_or(token, |t| t.max(token)));
            let n = self.leases.len();
            self.by_token.insert(token, n);
            self.leases.push(lease.clone());
            named.push(Leased {
                lease: n,
                key: lease.key.clone(),
                attempt: lease.attempt,
                priority: lease.priority,
            });
        }
        Ok(named)
    }

    /// A lease's number, by its token (`usize::MAX` for a token this side
    /// never handed out, which then shows as a difference).
    pub(crate) fn token(&self, token: i64) -> usize {
        self.by_token.get(&token).copied().unwrap_or(usize::MAX)
    }

    /// A session's number, by its id.
    pub(crate) fn session_of(&self, id: i64) -> usize {
        self.by_session.get(&id).copied().unwrap_or(usize::MAX)
    }
}
