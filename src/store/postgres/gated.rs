//! The claim of a paused or limited process on PostgreSQL: one call of the
//! SQL function `drover_claim_gated` (migration 0008, its running count read
//! from the item counts since 0016), which locks the process row, reads its
//! running count in a later statement (a fresh snapshot, see the migration), admits, claims and stores the rate bucket, all in one
//! statement and one commit. It replaced a transaction of five round trips
//! (lock; clock and count; claim; bucket; commit) that made a non-binding
//! limit cost a third of the claim rate with small claims.
//!
//! Which processes take this path is remembered per store ([`GatedProcesses`]),
//! so a limited process's claim is one round trip instead of the fast path's
//! `held` answer followed by this call.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};

use super::counts::Folds;
use super::engine::PostgresStore;
use super::leases::{ClaimedKey, claim_rows};
use super::trace;
use crate::store::StoreError;
use crate::store::fleet::Claimed;
use crate::store::params::LeaseClaim;
use crate::store::rules::gate::GateRow;
use crate::store::types::Lease;

/// The processes whose last claim through this store found them paused or
/// limited. A claim of one of them goes straight to `drover_claim_gated`; a
/// limit removed since is noticed there (the function claims without a gate
/// and says it did not bind), and the process leaves the set. A process
/// limited since its last claim is caught by the fast path's `held` answer.
#[derive(Debug, Default)]
pub(crate) struct GatedProcesses(Mutex<HashSet<String>>);

impl GatedProcesses {
    /// Whether the last claim of `process` found it paused or limited.
    pub(super) fn contains(&self, process: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(process)
    }

    /// Records whether the last claim of `process` found it paused or limited.
    fn remember(&self, process: &str, gated: bool) {
        let mut set = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if gated {
            if !set.contains(process) {
                set.insert(process.to_owned());
            }
        } else {
            set.remove(process);
        }
    }
}

/// The claim, one statement; directly connected it is its own transaction,
/// through a pooler [`Tx`](super::engine::Tx) wraps it in one. During the
/// pause after a fork in the database's history, or before the fork was
/// noticed (see `lineage`), it asks for no key, and says so in `forked`.
const CLAIM_GATED: &str = "
SELECT g.*, f.forked
FROM (SELECT drover_claims_paused(clock_timestamp() + $4::float8 * interval '1 millisecond')
      AS forked) f
CROSS JOIN LATERAL drover_claim_gated($1, $2, CASE WHEN f.forked THEN 0 ELSE $3 END, $4)
    WITH ORDINALITY g
ORDER BY g.ordinality";

/// One row of `drover_claim_gated`: the gate as the function read it under
/// the lock (repeated on every row), and one claimed key (all `None` when
/// nothing was claimed).
#[derive(Debug, sqlx::FromRow)]
struct GatedRow {
    live: bool,
    binds: bool,
    paused: Option<bool>,
    concurrency: Option<i32>,
    rate_per_s: Option<f64>,
    rate_burst: Option<i32>,
    rate_tokens: Option<f64>,
    rate_tokens_at: Option<DateTime<Utc>>,
    decided_at: DateTime<Utc>,
    running: i64,
    allowed: i64,
    /// Claims are paused after a fork: the function was asked for none.
    forked: bool,
    #[sqlx(flatten)]
    claimed: ClaimedKey,
}

impl GatedRow {
    /// The process row's fleet controls as the function read them.
    fn gate(&self) -> GateRow {
        GateRow {
            paused: self.paused.unwrap_or(false),
            concurrency: self.concurrency.map(i64::from),
            rate_per_s: self.rate_per_s,
            rate_burst: self.rate_burst.map_or(1, i64::from),
            tokens: self.rate_tokens,
            tokens_at: self.rate_tokens_at,
        }
    }
}

/// Claims from a process that is (or was at its last claim) paused or
/// limited. The admission is recomputed here with [`GateRow::admit`] from
/// what the function read, so the claimer's answer ([`GateRow::taken`]) has
/// one author on both engines; debug builds check that the function admitted
/// the same number, so every contract test that claims through a gate checks
/// that SQL and Rust agree.
pub(super) async fn claim(
    store: &PostgresStore,
    params: &LeaseClaim,
) -> Result<Claimed, StoreError> {
    let rows: Vec<GatedRow> = claim_rows(store, (CLAIM_GATED, false), params).await?;
    // The function's outer join returns one row even when nothing was claimed.
    let Some(first) = rows.first() else {
        return Err(StoreError::Database(sqlx::Error::RowNotFound.into()));
    };
    if !first.live {
        return Err(StoreError::SessionExpired {
            session: params.session,
        });
    }
    let binds = first.binds;
    store.gated.remember(&params.process, binds);
    let gate = first.gate();
    let max = if first.forked { 0 } else { params.max };
    let admission = gate.admit(first.decided_at, first.running, max);
    debug_assert_eq!(
        i64::from(admission.allowed),
        first.allowed,
        "drover_claim_gated and GateRow::admit disagree on {gate:?} at {} with {} running",
        first.decided_at,
        first.running
    );
    let mut leases: Vec<Lease> = rows
        .into_iter()
        .filter_map(|r| r.claimed.into_lease(params.session, false))
        .collect();
    if params.trace_links {
        trace::claimed_links(store, &mut leases).await;
    }
    if !binds {
        return Ok(Claimed::open(leases));
    }
    if gate.concurrency.is_some() {
        Folds::after_limited_claim(store);
    }
    let taken = u32::try_from(leases.len()).unwrap_or(u32::MAX);
    let (_, gate) = gate.taken(admission, taken);
    Ok(Claimed { leases, gate })
}
