//! Table watching on SQLite: SQLite has no stored procedures, so the checks
//! run here and the triggers are written here, one per kind of change, each
//! inserting the row's key into the view `drover_enqueue` (whose trigger is
//! the store's enqueue). Every name is quoted as an identifier or a string
//! literal, so no table, column or process name can end the statement.

use sqlx::SqliteConnection;

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use crate::store::watch::{OWN_PREFIX, TableWatch};
use crate::store::{StoreError, validate_process};

/// `name` as an SQL identifier: in double quotes, inner quotes doubled.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an SQL string literal: in single quotes, inner quotes doubled.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Whether a declared column type has INTEGER or TEXT affinity (SQLite's
/// rules, section 3.1 of its datatype page): only those hold keys as written.
fn key_affinity(declared: &str) -> bool {
    let t = declared.to_ascii_uppercase();
    t.contains("INT") || t.contains("CHAR") || t.contains("CLOB") || t.contains("TEXT")
}

/// The triggers of watch `id`, by the change they follow.
fn trigger_names(id: i64) -> [String; 3] {
    ["insert", "update", "delete"].map(|change| ident(&format!("drover_watch_{id}_{change}")))
}

/// The statements that create watch `id`'s triggers on `table`.
fn create_triggers(id: i64, table: &str, watch: &TableWatch) -> [String; 3] {
    let (table, key) = (ident(table), ident(&watch.key_column));
    let process = literal(&watch.process);
    let enqueue = |row: &str| {
        format!(
            "INSERT INTO drover_enqueue (process, key) \
             SELECT {process}, CAST({row}.{key} AS TEXT) WHERE {row}.{key} IS NOT NULL;"
        )
    };
    // With a filter, an update fires when the key or a filtered column
    // changed: a key that moves is always seen (the old and the new key).
    let changed = std::iter::once(&watch.key_column)
        .chain(&watch.columns)
        .map(|c| format!("OLD.{0} IS NOT NEW.{0}", ident(c)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let when = if watch.columns.is_empty() {
        String::new()
    } else {
        format!("WHEN {changed}")
    };
    let [insert, update, delete] = trigger_names(id);
    [
        format!(
            "CREATE TRIGGER {insert} AFTER INSERT ON {table} BEGIN {} END",
            enqueue("NEW")
        ),
        format!(
            "CREATE TRIGGER {update} AFTER UPDATE ON {table} {when} BEGIN \
             INSERT INTO drover_enqueue (process, key) SELECT {process}, CAST(OLD.{key} AS TEXT) \
             WHERE OLD.{key} IS NOT NULL AND OLD.{key} IS NOT NEW.{key}; {} END",
            enqueue("NEW")
        ),
        format!(
            "CREATE TRIGGER {delete} AFTER DELETE ON {table} BEGIN {} END",
            enqueue("OLD")
        ),
    ]
}

/// `name` without its double quotes when it is a quoted identifier (as
/// PostgreSQL's watch takes it), else as it is.
fn unquoted(name: &str) -> String {
    match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(inner) if !inner.is_empty() => inner.replace("\"\"", "\""),
        _ => name.to_owned(),
    }
}

/// The table's name as the schema spells it, or why it cannot be watched.
async fn resolve_table(conn: &mut SqliteConnection, table: &str) -> Result<String, StoreError> {
    let table = &unquoted(table);
    let found: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await
    .db()?;
    let Some(name) = found else {
        return Err(StoreError::Watch(format!(
            "no table {}: name an existing table of this database",
            ident(table)
        )));
    };
    if name.to_ascii_lowercase().starts_with(OWN_PREFIX) {
        return Err(StoreError::Watch(format!(
            "table {} is one of drover's own: watch a table of yours",
            ident(&name)
        )));
    }
    Ok(name)
}

/// Checks the key column's existence and type and the filter columns'
/// existence against the table's columns.
async fn check_columns(
    conn: &mut SqliteConnection,
    table: &str,
    watch: &TableWatch,
) -> Result<(), StoreError> {
    let columns: Vec<(String, String)> =
        sqlx::query_as("SELECT name, type FROM pragma_table_info(?1)")
            .bind(table)
            .fetch_all(&mut *conn)
            .await
            .db()?;
    let find = |name: &str| columns.iter().find(|(c, _)| c.eq_ignore_ascii_case(name));
    let missing = |name: &str| {
        StoreError::Watch(format!(
            "table {} has no column {}",
            ident(table),
            ident(name)
        ))
    };
    let (_, declared) = find(&watch.key_column).ok_or_else(|| missing(&watch.key_column))?;
    if !key_affinity(declared) {
        let shown = if declared.is_empty() {
            "no type"
        } else {
            declared
        };
        return Err(StoreError::Watch(format!(
            "key column {} of {} has {shown}: use a TEXT or INTEGER column",
            ident(&watch.key_column),
            ident(table)
        )));
    }
    match watch.columns.iter().find(|c| find(c).is_none()) {
        Some(c) => Err(missing(c)),
        None => Ok(()),
    }
}

/// The id of `table`'s watch, if it has one.
async fn watch_id(tx: &mut Tx, table: &str) -> Result<Option<i64>, StoreError> {
    sqlx::query_scalar("SELECT id FROM drover_watches WHERE relation = ?1 COLLATE NOCASE")
        .bind(table)
        .fetch_optional(&mut **tx)
        .await
        .db()
}

impl SqliteStore {
    /// See [`Store::table_watch`](crate::store::Store::table_watch).
    pub(crate) async fn table_watch(&self, watch: &TableWatch) -> Result<String, StoreError> {
        validate_process(&watch.process)?;
        let (mut tx, now) = self.write().await?;
        let table = resolve_table(&mut tx, &watch.table).await?;
        check_columns(&mut tx, &table, watch).await?;
        if watch_id(&mut tx, &table).await?.is_some() {
            return Err(StoreError::Watch(format!(
                "table {} is already watched: run drover unwatch first",
                ident(&table)
            )));
        }
        let columns = (!watch.columns.is_empty())
            .then(|| serde_json::to_string(&watch.columns).expect("strings serialize"));
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO drover_watches (relation, process, key_column, columns, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
        )
        .bind(&table)
        .bind(&watch.process)
        .bind(&watch.key_column)
        .bind(columns)
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .db()?;
        for statement in create_triggers(id, &table, watch) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await
                .db()?;
        }
        tx.commit().await.db()?;
        Ok(table)
    }

    /// See [`Store::table_unwatch`](crate::store::Store::table_unwatch).
    pub(crate) async fn table_unwatch(&self, table: &str) -> Result<Option<String>, StoreError> {
        let (mut tx, _) = self.write().await?;
        let found: Option<(i64, String)> = sqlx::query_as(
            "SELECT id, relation FROM drover_watches WHERE relation = ?1 COLLATE NOCASE",
        )
        .bind(unquoted(table))
        .fetch_optional(&mut *tx)
        .await
        .db()?;
        let Some((id, relation)) = found else {
            return Ok(None);
        };
        for trigger in trigger_names(id) {
            let drop = format!("DROP TRIGGER IF EXISTS {trigger}");
            sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
                .execute(&mut *tx)
                .await
                .db()?;
        }
        sqlx::query("DELETE FROM drover_watches WHERE id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .db()?;
        tx.commit().await.db()?;
        Ok(Some(relation))
    }

    /// See [`Store::table_watches`](crate::store::Store::table_watches).
    pub(crate) async fn table_watches(&self) -> Result<Vec<TableWatch>, StoreError> {
        let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
            "SELECT relation, process, key_column, columns FROM drover_watches ORDER BY relation",
        )
        .fetch_all(&self.pool)
        .await
        .db()?;
        // The filter columns are a JSON array (NULL: none).
        let json = |c: Option<String>| c.and_then(|c| serde_json::from_str(&c).ok());
        let rows = rows
            .into_iter()
            .map(|(t, p, k, c)| (t, p, k, json(c).unwrap_or_default()))
            .collect();
        Ok(TableWatch::listed(rows))
    }
}
