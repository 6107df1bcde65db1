//! Names for the sessions and leases one side of a case was handed, by their
//! order within the case: session ids and fencing tokens differ between
//! databases, their order must not. Also where a side's fencing tokens are
//! checked to grow.

use std::collections::HashMap;

use drover::store::{Lease, SessionId};

use crate::ops::Op;
use crate::view::Leased;

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
            Self::newest(n, self.leases.len()).map(|i| format!("L{i} ({})", self.leases[i].key))
        };
        let named = match op {
            Op::Heartbeat { session: n }
            | Op::Close { session: n }
            | Op::Claim { session: n, .. }
            | Op::Lock { session: n, .. } => session(*n),
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
