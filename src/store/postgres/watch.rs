//! Table watching on PostgreSQL: the SQL functions `drover_watch` and
//! `drover_unwatch` (migrations 0006, 0010 and 0013) resolve the name, check
//! it, and install or drop the triggers that call `drover_enqueue`, so a
//! program in any language can do the same with one `SELECT`. A watch is
//! recorded by its table's oid, so it follows the table through a rename.

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, map};
use crate::store::watch::TableWatch;
use crate::store::{StoreError, validate_process};

/// The SQLSTATEs `drover_watch` raises for a watch it refuses (and that a
/// malformed table name raises): invalid_parameter_value, undefined_table,
/// undefined_column, datatype_mismatch, duplicate_object, wrong_object_type,
/// invalid_name, invalid_schema_name.
const REFUSED: [&str; 8] = [
    "22023", "42P01", "42703", "42804", "42710", "42809", "42602", "3F000",
];

/// A refusal becomes [`StoreError::Watch`] with the database's one-line reason.
fn refusal(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.code().is_some_and(|c| REFUSED.contains(&&*c)) => {
            StoreError::Watch(db.message().to_owned())
        }
        _ => map(e),
    }
}

impl PostgresStore {
    /// See [`Store::table_watch`](crate::store::Store::table_watch).
    pub(crate) async fn table_watch(&self, watch: &TableWatch) -> Result<String, StoreError> {
        validate_process(&watch.process)?;
        let columns = (!watch.columns.is_empty()).then_some(&watch.columns);
        let mut tx = Tx::begin(&self.pool, self.pooled).await.db()?;
        let installed = sqlx::query_scalar("SELECT drover_watch($1, $2, $3, $4)")
            .bind(&watch.table)
            .bind(&watch.process)
            .bind(&watch.key_column)
            .bind(columns)
            .fetch_one(&mut tx)
            .await
            .map_err(refusal)?;
        tx.commit().await.db()?;
        Ok(installed)
    }

    /// See [`Store::table_unwatch`](crate::store::Store::table_unwatch).
    pub(crate) async fn table_unwatch(&self, table: &str) -> Result<Option<String>, StoreError> {
        let mut tx = Tx::begin(&self.pool, self.pooled).await.db()?;
        let removed = sqlx::query_scalar("SELECT drover_unwatch($1)")
            .bind(table)
            .fetch_one(&mut tx)
            .await
            .map_err(refusal)?;
        tx.commit().await.db()?;
        Ok(removed)
    }

    /// See [`Store::table_watches`](crate::store::Store::table_watches).
    ///
    /// A live watch (its table carries the trigger `drover_watch`) is listed
    /// under its table's current name, with the columns it names that the
    /// table no longer has; a watch whose table was dropped, under the name
    /// it was watched under.
    pub(crate) async fn table_watches(&self) -> Result<Vec<TableWatch>, StoreError> {
        /// Table, process, key column, filter columns (NULL: none), gone.
        type Row = (String, String, String, Option<Vec<String>>, Vec<String>);
        let mut tx = self.read().await?;
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT CASE WHEN c.oid IS NULL THEN w.relation
                             ELSE format('%I.%I', n.nspname, c.relname) END AS name,
                        w.process, w.key_column, w.columns,
                        ARRAY(SELECT DISTINCT col
                              FROM unnest(array_prepend(w.key_column, w.columns)) AS col
                              WHERE c.oid IS NOT NULL
                                  AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                                                  WHERE a.attrelid = c.oid AND a.attname = col
                                                      AND a.attnum > 0 AND NOT a.attisdropped)
                              ORDER BY col)
                 FROM drover_watches w
                 LEFT JOIN pg_class c ON c.oid = w.relid
                     AND EXISTS (SELECT 1 FROM pg_trigger t
                                 WHERE t.tgrelid = c.oid AND t.tgname = 'drover_watch')
                 LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
                 ORDER BY name",
        )
        .fetch_all(&mut tx)
        .await
        .db()?;
        tx.commit().await.db()?;
        let rows = rows
            .into_iter()
            .map(|(t, p, k, c, gone)| (t, p, k, c.unwrap_or_default(), gone))
            .collect();
        Ok(TableWatch::listed(rows))
    }
}
