//! Noticing that the database's history forked (a promoted standby, a restore
//! elsewhere), and the pause of claims that follows (DESIGN.md rule 12).
//!
//! Every new connection asks the SQL function `drover_observe_lineage`
//! (migration 0011) before it is used: the first to meet a new timeline or
//! system identifier expires every session of before the fork and pauses
//! claims for the longest of their TTLs, on the database clock. Every claim
//! and lock (`drover_claim`, `CLAIM_GATED` in `gated`, `lease_lock`) asks
//! `drover_claims_paused` (migrations 0026, 0027) and hands no key out while
//! the pause lasts, nor, for a role that may read it, while the server's
//! timeline is not the one recorded: a
//! connection that never broke (one opened to a standby before its
//! promotion, one held by a pooler whose own connections moved to the new
//! primary) claims nothing until the fork is observed, by the next new
//! connection or by the reclaim, which every live node runs every few
//! seconds and which asks too; the pause then runs from that moment.

use chrono::{DateTime, Utc};

/// The observation, with the test clock offset bound as `$1`.
const OBSERVE: &str = "SELECT forked, paused_until FROM drover_observe_lineage($1::float8)";

/// What one observation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct Lineage {
    /// This observation noticed the fork (and started the pause).
    pub(super) forked: bool,
    /// When claims may resume, if a fork was ever noticed.
    pub(super) paused_until: Option<DateTime<Utc>>,
}

/// Asks the database whether its history forked since drover last looked,
/// and logs a fork this call noticed. `None` on a standby, on a server that
/// hides its identity, and on a database not yet migrated (a store's first
/// connection may come before its migrations).
pub(super) async fn observe<'c, E>(
    conn: E,
    clock_offset_ms: i64,
) -> Result<Option<Lineage>, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let row: Result<Option<Lineage>, sqlx::Error> = sqlx::query_as(OBSERVE)
        .bind(clock_offset_ms)
        .persistent(false)
        .fetch_optional(conn)
        .await;
    let lineage = match row {
        Ok(Some(lineage)) => lineage,
        Ok(None) => return Ok(None),
        Err(sqlx::Error::Database(e)) if not_migrated(e.code().as_deref()) => return Ok(None),
        Err(e) => return Err(e),
    };
    if lineage.forked {
        tracing::warn!(
            paused_until = %lineage.paused_until.map(|t| t.to_rfc3339()).unwrap_or_default(),
            "the database's history forked (a standby was promoted, or it was restored): \
             sessions of before are expired, and no key is handed out until every worker \
             of before has given its runs up by its own clock"
        );
    }
    Ok(Some(lineage))
}

/// Whether SQLSTATE `code` says the function or its table does not exist yet.
fn not_migrated(code: Option<&str>) -> bool {
    matches!(code, Some("42883" | "42P01"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_function_or_table_counts_as_not_migrated() {
        assert!(not_migrated(Some("42883")));
        assert!(not_migrated(Some("42P01")));
        assert!(!not_migrated(Some("25006")));
        assert!(!not_migrated(None));
    }
}
