//! Claims grouped per store ([`grouped`](crate::store::grouped)): the claims of
//! many controllers sharing one store (a node running many processes, a
//! server answering many workers) that arrive while a claim runs go together
//! in the next statement, one round trip and one commit for all of them.
//!
//! A node running a hundred control loops of ten runs each made a claim of a
//! few keys per loop, each its own statement and commit: 26,000–28,000
//! transactions per 100,000 keys against 227 for one loop of 1,024 runs
//! (issue 39, `drover bench burn-down --processes 100`).
//!
//! Each claim in a group is still its own call of `drover_claim` (migration
//! 0025), with its own session, process and maximum, so its order, its
//! fencing tokens and its `live` and `held` answers are exactly those of a
//! claim on its own; the calls run one after the other in the statement's
//! transaction, each seeing the rows the ones before it took. A claim of a
//! paused or limited process answers `held` there and claims again through
//! `drover_claim_gated` on its own, as it would alone.

use std::sync::Arc;

use super::engine::PostgresStore;
use super::error::{commit, map_commit};
use super::leases::{CLAIM, ClaimRow, claim_rows};
use super::retry::bounded;
use crate::store::StoreError;
use crate::store::grouped::{self, Answer, Group, Grouped};
use crate::store::params::LeaseClaim;

/// Several claims in one statement: `drover_claim` called once per element
/// of the arrays (sessions `$1`, processes `$2`, maximums `$3`, whether to
/// read trace links `$5`; the clock offset `$4` is the store's), in array
/// order, its rows tagged with the claim's place (`n`, from 1).
const CLAIM_GROUP: &str = "
SELECT r.n, c.live, c.held, c.process, c.key, c.priority, c.failures, c.enqueued_at,
    c.lease_token, c.started_at, c.trace_run
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $5::boolean[])
        WITH ORDINALITY AS r(session, process, max, traces, n)
    CROSS JOIN LATERAL drover_claim(r.session, r.process, r.max, $4::float8, r.traces)
        WITH ORDINALITY c
ORDER BY r.n, c.ordinality";

/// One row of [`CLAIM_GROUP`]: a row of one claim, and which claim.
#[derive(Debug, sqlx::FromRow)]
struct GroupRow {
    n: i64,
    #[sqlx(flatten)]
    row: ClaimRow,
}

/// The claim groups of one store.
pub(super) type Claims = Grouped<LeaseClaim, Answer<Vec<ClaimRow>>>;

/// Claims, grouped.
struct Claiming;

impl Group for Claiming {
    type Store = PostgresStore;
    type Req = LeaseClaim;
    type Ans = Answer<Vec<ClaimRow>>;

    fn weight(_: &LeaseClaim) -> usize {
        1
    }

    /// A group is bounded so that its statement stays short (each call locks
    /// and leases its own rows) and a claim behind a full group waits at
    /// most one more statement.
    const MOST: usize = 128;

    fn grouped(store: &PostgresStore) -> &Arc<Claims> {
        &store.claims
    }

    async fn run(store: &PostgresStore, group: Vec<LeaseClaim>) -> Vec<Self::Ans> {
        if let [one] = group.as_slice() {
            return match claim_rows(store, (CLAIM, true), one).await {
                Ok(rows) => vec![Answer::Done(rows)],
                Err(e) => Answer::failed(1, e, "claims"),
            };
        }
        match group_rows(store, &group).await {
            Ok(rows) => {
                let mut answers: Vec<Vec<ClaimRow>> = group.iter().map(|_| Vec::new()).collect();
                for GroupRow { n, row } in rows {
                    let at = usize::try_from(n - 1).ok();
                    if let Some(answer) = at.and_then(|i| answers.get_mut(i)) {
                        answer.push(row);
                    }
                }
                answers.into_iter().map(Answer::Done).collect()
            }
            Err(e) => Answer::failed(group.len(), e, "claims"),
        }
    }
}

/// The rows of `params`' claim ([`CLAIM`]'s), in the next group of the
/// store's claims. A caller that goes away mid-claim leaves its leases to
/// its session, which hands them back when it closes or expires.
pub(super) async fn claim(
    store: &PostgresStore,
    params: &LeaseClaim,
) -> Result<Vec<ClaimRow>, StoreError> {
    if let Some(_leading) = grouped::lead::<Claiming>(store) {
        return claim_rows(store, (CLAIM, true), params).await;
    }
    match Answer::result(grouped::wait::<Claiming>(store, params.clone()).await) {
        Some(result) => result,
        None => claim_rows(store, (CLAIM, true), params).await,
    }
}

/// [`CLAIM_GROUP`]'s rows for `group`; directly connected the statement is
/// its own transaction, through a pooler one is wrapped around it. Watched
/// by [`bounded`]: unanswered past its timeout, its server must show a sign
/// of life.
async fn group_rows(
    store: &PostgresStore,
    group: &[LeaseClaim],
) -> Result<Vec<GroupRow>, StoreError> {
    let sessions: Vec<i64> = group.iter().map(|w| w.session.0).collect();
    let processes: Vec<&str> = group.iter().map(|w| w.process.as_str()).collect();
    let maxes: Vec<i64> = group.iter().map(|w| i64::from(w.max)).collect();
    let traces: Vec<bool> = group.iter().map(|w| w.trace_links).collect();
    bounded(store, async {
        let mut tx = store.read().await?;
        let rows = sqlx::query_as(CLAIM_GROUP)
            .bind(sessions)
            .bind(processes)
            .bind(maxes)
            .bind(store.clock.offset_ms())
            .bind(traces)
            .fetch_all(&mut tx)
            .await
            .map_err(map_commit)?;
        commit(tx).await?;
        Ok(rows)
    })
    .await
}
