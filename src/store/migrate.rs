//! The embedded migrations (`migrations/sqlite`, `migrations/postgres`) and the
//! schema-version check every engine runs on connect.

use sqlx::migrate::{MigrateError, Migrator};

use super::error::StoreError;

/// The table recording applied migrations, prefixed like every drover table.
pub(crate) const MIGRATIONS_TABLE: &str = "drover_migrations";

/// The SQLite migrations, compiled into the binary.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite() -> Migrator {
    with_table(sqlx::migrate!("migrations/sqlite"))
}

/// The PostgreSQL migrations, compiled into the binary.
#[cfg(feature = "postgres")]
pub(crate) fn postgres() -> Migrator {
    with_table(sqlx::migrate!("migrations/postgres"))
}

fn with_table(mut m: Migrator) -> Migrator {
    m.dangerous_set_table_name(MIGRATIONS_TABLE);
    m
}

/// The newest migration version a migrator knows.
pub(crate) fn supported(m: &Migrator) -> i64 {
    m.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Refuses a schema newer than this binary, and (when not migrating) one that is
/// older. `found` is the newest applied version, 0 for an empty database.
///
/// An upgrade of a database that has a schema is announced first: some
/// migrations rewrite a table (SQLite's 0012 rebuilds the items), which on a
/// file of millions of keys takes minutes, and a `drover serve` that says
/// nothing meanwhile looks hung.
pub(crate) fn check_version(found: i64, m: &Migrator, migrating: bool) -> Result<(), StoreError> {
    let supported = supported(m);
    if found > supported {
        return Err(StoreError::SchemaTooNew { found, supported });
    }
    if found < supported && !migrating {
        return Err(StoreError::SchemaBehind { found, supported });
    }
    if 0 < found && found < supported {
        tracing::warn!(
            from = found,
            to = supported,
            "upgrading the database schema; on a database of millions of keys this can take \
             minutes, and drover starts when it is done"
        );
    }
    Ok(())
}

/// Maps a migration failure; an applied migration unknown to this binary means the
/// schema is newer.
pub(crate) fn map_error(e: MigrateError, m: &Migrator) -> StoreError {
    match e {
        MigrateError::VersionMissing(found) => StoreError::SchemaTooNew {
            found,
            supported: supported(m),
        },
        other => StoreError::Migrate(other),
    }
}
