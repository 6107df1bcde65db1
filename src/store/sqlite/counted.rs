//! The item counts of the store's batch statements: a claim or a completion of
//! many keys moves them between states in one statement and adjusts the counts
//! once for all of them (migration 0011), where the per-row trigger would change
//! a counts row for each key.
//!
//! A statement that counts its rows itself sets `counts_mark = counts_mark + 1`
//! on them, so the trigger skips exactly those rows (their mark changed, which
//! no other writer's does); it must then change only rows whose old state it
//! names in its `WHERE`, all of one process, and pass how many it changed to
//! [`shift`] in the same transaction.

use super::engine::Tx;
use super::error::Db as _;
use crate::store::StoreError;
use crate::store::exec::Exec as _;

/// Moves `$n` items of process `$process` from state `$from` to state `$to`
/// (writing nothing when `$n` is 0, so that a transaction that moved none
/// commits without a page to write), each operand given as SQL (a parameter, a literal or an expression), so
/// that a query of several statements, whose parameters are numbered across
/// them, can end with it.
macro_rules! shift_sql {
    ($process:literal, $from:literal, $to:literal, $n:literal) => {
        concat!(
            "UPDATE drover_item_counts SET n = n + CASE state WHEN ",
            $to,
            " THEN ",
            $n,
            " ELSE -",
            $n,
            " END WHERE process = ",
            $process,
            " AND state IN (",
            $from,
            ", ",
            $to,
            ") AND ",
            $n,
            " <> 0"
        )
    };
}
pub(super) use shift_sql;

/// Moves `?4` items of process `?1` from state `?2` to state `?3`.
const SHIFT: &str = shift_sql!("?1", "?2", "?3", "?4");

/// [`shift`] and `COMMIT` in one trip ([`Tx::commit_with`]): the last write
/// of a transaction that counts its rows itself.
pub(super) async fn shift_and_commit(
    tx: Tx,
    process: &str,
    (from, to): (&str, &str),
    n: u64,
) -> Result<(), StoreError> {
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    tx.commit_with(
        concat!(shift_sql!("?1", "?2", "?3", "?4"), ";\nCOMMIT"),
        |query| query.bind(process).bind(from).bind(to).bind(n),
    )
    .await
    .db()
}

/// Moves `n` items of `process` from state `from` to state `to` in the counts,
/// for the rows a marked statement changed.
pub(super) async fn shift(
    tx: &mut Tx,
    process: &str,
    (from, to): (&str, &str),
    n: u64,
) -> Result<(), StoreError> {
    if n == 0 {
        return Ok(());
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    sqlx::query(SHIFT)
        .bind(process)
        .bind(from)
        .bind(to)
        .bind(n)
        .exec(&mut **tx)
        .await?;
    Ok(())
}
