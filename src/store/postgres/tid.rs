//! A row's `ctid`: how a transaction finds again the item rows it holds locked.
//!
//! `drover_items` has no index on its `id` (migration 0023): a statement that
//! locked rows hands their `ctid`s to the statements after it, which reach each
//! row by one TID scan, no index at all. That is sound only for rows the
//! transaction holds `FOR UPDATE`: nothing else can update or delete them, so
//! their `ctid` stays put until this transaction changes them. An unlocked
//! row's `ctid` moves with every update, and a `FOR UPDATE` that meets a
//! concurrent update re-checks `ctid = …` on the new version and skips the row,
//! so a `Tid` never finds a row to lock; rows are locked by `(process, key)`.
//!
//! Within the statement that locked them, rows are found again by their key,
//! not by `ctid`: a row locked after a concurrent update is a version that
//! statement's snapshot does not see, so a TID scan there would miss it.

use std::fmt;

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};

/// A row version's physical address: its page and its line on the page, as
/// PostgreSQL's `tid` type (`ctid` column) has them.
///
/// It travels as text, `(block,offset)`: statements select `ctid::text` and
/// cast what they are given (`$1::text[]::tid[]`). sqlx knows no `tid` type,
/// and would look an unknown type up in the catalog in the middle of a
/// statement, which a transaction-pooling proxy does not survive.
///
/// A set of them is matched as `ctid = ANY(ARRAY(SELECT unnest(…)))`, not
/// `ctid = ANY($1)`: PostgreSQL costs a TID scan at a random page read per
/// `ctid`, so a custom plan of a large batch (whose array it can count) chose
/// to read the whole table instead (2,000 `ctid`s of a 100,000-row table:
/// 10 ms, against 1 ms). An array from a subquery is costed at ten
/// elements, so the TID scan is always chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Tid {
    block: u32,
    offset: u16,
}

impl fmt::Display for Tid {
    /// As PostgreSQL prints a `tid`, `(block,offset)`: what `ctid::text` gives.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({},{})", self.block, self.offset)
    }
}

impl sqlx::Type<Postgres> for Tid {
    fn type_info() -> PgTypeInfo {
        <String as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <String as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl PgHasArrayType for Tid {
    fn array_type_info() -> PgTypeInfo {
        <String as PgHasArrayType>::array_type_info()
    }
}

impl sqlx::Encode<'_, Postgres> for Tid {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <String as sqlx::Encode<'_, Postgres>>::encode_by_ref(&self.to_string(), buf)
    }
}

impl sqlx::Decode<'_, Postgres> for Tid {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        parse(<&str as sqlx::Decode<'_, Postgres>>::decode(value)?)
    }
}

/// A `tid` as text, `(block,offset)`.
fn parse(text: &str) -> Result<Tid, BoxDynError> {
    let inner = text
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| format!("not a tid: {text:?}"))?;
    let (block, offset) = inner
        .split_once(',')
        .ok_or_else(|| format!("not a tid: {text:?}"))?;
    Ok(Tid {
        block: block.parse()?,
        offset: offset.parse()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tid_prints_as_postgres_prints_it_and_parses_back() {
        let tid = Tid {
            block: 4_294_967_295,
            offset: 7,
        };
        assert_eq!(tid.to_string(), "(4294967295,7)");
        assert_eq!(parse(&tid.to_string()).unwrap(), tid);
        assert!(parse("(1;2)").is_err());
        assert!(parse("1,2").is_err());
    }
}
