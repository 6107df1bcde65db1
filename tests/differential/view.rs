//! What a differential case compares: each operation's answer and the state
//! after it, normalised so the model and every engine can be held equal.
//! Session ids and fencing tokens differ between databases, so both are
//! named by their order within the case ([`Aliases`]); times are left out
//! (they differ by the real time a case takes) except as what they decide:
//! whether a pending key is ready, and whether it is backing off.

use std::collections::BTreeMap;
use std::fmt;

use drover::store::{RunOutcome, StoreError};

/// Why an engine (or the model) refused an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    SessionExpired,
    LeaseLost,
    /// An operator's action or a lock on a running key (`AlreadyLeased`).
    Running,
    /// A lock of a parked key.
    Parked,
    /// A lock of a key not ready yet (backing off, or delayed).
    NotReady,
    /// A lock the fleet controls held back: paused, at the concurrency
    /// limit, or out of rate tokens.
    Held(&'static str),
}

impl Refusal {
    /// The refusal an error is, or the error's words when it is none.
    pub(crate) fn of(e: &StoreError) -> Result<Self, String> {
        match e {
            StoreError::SessionExpired { .. } => Ok(Self::SessionExpired),
            StoreError::LeaseLost { .. } => Ok(Self::LeaseLost),
            StoreError::AlreadyLeased { .. } => Ok(Self::Running),
            StoreError::Parked { .. } => Ok(Self::Parked),
            StoreError::InBackoff { .. } => Ok(Self::NotReady),
            StoreError::Held { why, .. } => Ok(Self::Held(why)),
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

/// How a process's fleet controls shaped a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gate {
    pub paused: bool,
    /// The concurrency limit held the claim back.
    pub limited: bool,
    /// The rate bucket ran dry (the claim was told when the next token
    /// comes; when exactly depends on real time, so only that it was).
    pub out_of_tokens: bool,
}

impl Gate {
    pub(crate) fn of(gate: &drover::store::ClaimGate) -> Self {
        Self {
            paused: gate.paused,
            limited: gate.concurrency_limited,
            out_of_tokens: gate.next_token_in.is_some(),
        }
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
    /// A claim's leases in claim order, and its gate. The gate is `None`
    /// when no key was ready: then it held nothing back, and an engine may
    /// report it or not (SQLite's one-trip claim does not read it).
    Claimed {
        leases: Vec<Leased>,
        gate: Option<Gate>,
    },
    /// A lock's lease.
    Locked(Leased),
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
    /// A whole retention pass: the runs deleted and the idle keys forgotten.
    Pruned {
        runs: u64,
        items: u64,
    },
    /// An error no side should give, or a broken promise (a token that did
    /// not increase): a divergence whatever the model says.
    Failed(String),
}

impl Answer {
    /// What kind of answer this is, for the run's tally of what its cases
    /// exercised.
    pub(crate) fn kind(&self) -> String {
        match self {
            Self::Claimed { leases, gate } => {
                let n = leases.len();
                match gate {
                    Some(g) if g.paused => "claim held by pause".into(),
                    Some(g) if g.limited => format!("claim of {n} held by the limit"),
                    Some(g) if g.out_of_tokens => format!("claim of {n} held by the rate"),
                    None if n == 0 => "claim of nothing".into(),
                    _ => format!("claim of {n}"),
                }
            }
            Self::Batch(each) => {
                let ok = each.iter().filter(|r| r.is_ok()).count();
                format!("batch of {}, {ok} ok", each.len())
            }
            Self::Refused(r) => format!("refused: {r:?}"),
            Self::Locked(_) => "locked".into(),
            Self::Closed(n) => format!("close releasing {n}"),
            Self::Reclaimed { leases, .. } => format!("reclaim of {leases} leases"),
            Self::Enqueued { dirty } => format!("enqueue, {dirty} dirty"),
            Self::Admin(words) => format!("admin: {words}"),
            Self::Pruned { runs, items } => format!(
                "prune removing {} runs, {} keys",
                if *runs > 0 { "some" } else { "no" },
                if *items > 0 { "some" } else { "no" }
            ),
            other => format!("{other:?}"),
        }
    }

    /// This answer as `model` would be compared: a claim's gate left out
    /// when the model's is (no key was ready).
    pub(crate) fn compared_with(self, model: &Self) -> Self {
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
                    Some(g) if g.paused => write!(f, " (paused)"),
                    Some(g) if g.limited => write!(f, " (concurrency-limited)"),
                    Some(g) if g.out_of_tokens => write!(f, " (out of rate tokens)"),
                    _ => Ok(()),
                }
            }
            Self::Started(s) => write!(f, "S{s}"),
            Self::Locked(lease) => write!(f, "locked {lease}"),
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
