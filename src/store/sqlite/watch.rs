//! Table watching on SQLite: SQLite has no stored procedures, so the checks
//! run here and the triggers are written here, one per kind of change, each
//! inserting the row's key into the view `drover_enqueue` (whose trigger is
//! the store's enqueue). Every name is quoted as an identifier or a string
//! literal, so no table, column or process name can end the statement.
//!
//! The triggers are the watch's truth. SQLite moves them along with an
//! `ALTER TABLE … RENAME` (their `tbl_name` follows the table) and rewrites
//! the names in their bodies on a rename of the table or of a column, and it
//! refuses to drop a column they use. So a watch is found by its triggers'
//! table, and listed with the key and filter columns read back from them;
//! `drover_watches` keeps the names as they were when the watch was made,
//! used only once the table (and its triggers with it) is dropped.
//!
//! `INSERT OR REPLACE` (and `REPLACE`, `UPDATE OR REPLACE`, an `ON CONFLICT
//! REPLACE` constraint) deletes the rows the new one collides with on a
//! unique index without firing their delete triggers, since the writer's
//! connection has `recursive_triggers` off and drover cannot turn it on. Two
//! more triggers, before each insert and update, enqueue the keys of the
//! rows the new values collide with, from the table's unique indexes as they
//! were when the watch was made.

use crate::store::exec::Exec as _;
use std::collections::HashSet;

use sqlx::SqliteConnection;

use super::engine::SqliteStore;
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

/// The changes a watch has a trigger for: the three that enqueue the changed
/// row's keys, and the two that enqueue the keys of the rows an `OR REPLACE`
/// is about to delete (watches made before migration 17 lack those two until
/// the store upgrades them, see [`upgrade`]).
const CHANGES: [&str; 5] = [
    "insert",
    "update",
    "delete",
    "insert_or_replace",
    "update_or_replace",
];

/// The schema version (migration 17) whose watches have the `OR REPLACE`
/// triggers; the store gives them to older watches as it migrates past it.
pub(super) const REPLACE_SEEN_FROM: i64 = 17;

/// The schema version (migration 26) whose watches' update triggers compare
/// values as written (`COLLATE BINARY`); the store makes the update triggers
/// of older watches again as it migrates past it.
pub(super) const BINARY_FROM: i64 = 26;

/// The name of watch `id`'s trigger for `change` (one of [`CHANGES`]).
fn trigger(id: i64, change: &str) -> String {
    format!("drover_watch_{id}_{change}")
}

/// The statements that create watch `id`'s triggers on `table` that follow
/// the changed rows themselves.
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
    // Values compare as written (`COLLATE BINARY`), not by the column's
    // collation: under `COLLATE NOCASE` a key that moved by its case only
    // was no change, and its old key was never enqueued.
    let changed = std::iter::once(&watch.key_column)
        .chain(&watch.columns)
        .map(|c| format!("OLD.{0} IS NOT NEW.{0} COLLATE BINARY", ident(c)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let when = if watch.columns.is_empty() {
        String::new()
    } else {
        format!("WHEN {changed}")
    };
    let [insert, update, delete] = ["insert", "update", "delete"].map(|c| ident(&trigger(id, c)));
    [
        format!(
            "CREATE TRIGGER {insert} AFTER INSERT ON {table} BEGIN {} END",
            enqueue("NEW")
        ),
        format!(
            "CREATE TRIGGER {update} AFTER UPDATE ON {table} {when} BEGIN \
             INSERT INTO drover_enqueue (process, key) SELECT {process}, CAST(OLD.{key} AS TEXT) \
             WHERE OLD.{key} IS NOT NULL AND OLD.{key} IS NOT NEW.{key} COLLATE BINARY; {} END",
            enqueue("NEW")
        ),
        format!(
            "CREATE TRIGGER {delete} AFTER DELETE ON {table} BEGIN {} END",
            enqueue("OLD")
        ),
    ]
}

/// A unique constraint as `OR REPLACE` finds the rows it collides with: its
/// columns, each with the collation its index compares by (none for the
/// rowid).
type Unique = Vec<(String, Option<String>)>;

/// What `OR REPLACE` can collide on in a table: its unique indexes, and how
/// a row names itself (to leave the updated row out of its own collisions).
struct Collisions {
    /// Every unique index made of columns (PRIMARY KEY, UNIQUE, CREATE
    /// UNIQUE INDEX, partial ones too: a spurious enqueue is harmless), and
    /// the rowid of a rowid table. One on an expression is left out.
    uniques: Vec<Unique>,
    /// The columns that identify a row: the rowid, or a WITHOUT ROWID
    /// table's primary key.
    own: Vec<String>,
}

/// Reads `table`'s [`Collisions`].
async fn collisions(conn: &mut SqliteConnection, table: &str) -> Result<Collisions, StoreError> {
    let parts: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT il.name, ix.name, ix.coll FROM pragma_index_list(?1) AS il \
         JOIN pragma_index_xinfo(il.name) AS ix \
         WHERE il.\"unique\" = 1 AND ix.key = 1 ORDER BY il.seq, ix.seqno",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .db()?;
    let mut indexes: Vec<(String, Option<Unique>)> = Vec::new();
    for (index, column, collation) in parts {
        if indexes.last().is_none_or(|(name, _)| *name != index) {
            indexes.push((index, Some(Vec::new())));
        }
        let (_, unique) = indexes.last_mut().expect("just pushed");
        match column {
            Some(column) => {
                if let Some(unique) = unique {
                    unique.push((column, collation));
                }
            }
            None => *unique = None, // an expression
        }
    }
    let mut uniques: Vec<Unique> = indexes.into_iter().filter_map(|(_, u)| u).collect();
    let without_rowid: bool =
        sqlx::query_scalar("SELECT wr FROM pragma_table_list(?1) WHERE schema = 'main'")
            .bind(table)
            .fetch_optional(&mut *conn)
            .await
            .db()?
            .unwrap_or(false);
    let columns: Vec<(String, i64)> = sqlx::query_as("SELECT name, pk FROM pragma_table_info(?1)")
        .bind(table)
        .fetch_all(&mut *conn)
        .await
        .db()?;
    let own = if without_rowid {
        let mut key: Vec<_> = columns.iter().filter(|(_, pk)| *pk > 0).collect();
        key.sort_by_key(|(_, pk)| *pk);
        key.into_iter().map(|(name, _)| name.clone()).collect()
    } else {
        // The rowid under a name no column of the table has taken.
        let rowid = ["rowid", "_rowid_", "oid"]
            .into_iter()
            .find(|r| !columns.iter().any(|(c, _)| c.eq_ignore_ascii_case(r)));
        if let Some(rowid) = rowid {
            uniques.push(vec![(rowid.to_owned(), None)]);
        }
        rowid.map(|r| vec![r.to_owned()]).unwrap_or_default()
    };
    Ok(Collisions { uniques, own })
}

/// A column of `row` in a trigger: `NEW."c"`, or the rowid (a name, unquoted,
/// since a quoted `"rowid"` would be a column).
fn column(row: &str, name: &str, own: &[String]) -> String {
    let rowid = own.len() == 1 && ["rowid", "_rowid_", "oid"].contains(&own[0].as_str());
    if rowid && name == own[0] {
        format!("{row}.{name}")
    } else {
        format!("{row}.{}", ident(name))
    }
}

/// The statements that create watch `id`'s triggers before an insert and an
/// update of `table`, enqueueing the keys of the existing rows the new
/// values collide with on a unique index: the rows an `OR REPLACE` deletes.
/// A statement that does not replace (a plain insert that fails, `OR
/// IGNORE`, an upsert) may enqueue a key spuriously: harmless, since a
/// controller reads the state whenever it runs.
fn create_replace_triggers(
    id: i64,
    table: &str,
    process: &str,
    key_column: &str,
    collisions: &Collisions,
) -> Vec<String> {
    let Collisions { uniques, own } = collisions;
    if uniques.is_empty() {
        return Vec::new();
    }
    let (table_name, key, process) = (ident(table), ident(key_column), literal(process));
    let enqueue = |unique: &Unique, not_itself: &str| {
        let collides = unique
            .iter()
            .map(|(c, collation)| {
                let collate = collation
                    .as_ref()
                    .map(|coll| format!(" COLLATE {}", ident(coll)))
                    .unwrap_or_default();
                format!(
                    "{} = {}{collate}",
                    column("o", c, own),
                    column("NEW", c, own)
                )
            })
            .collect::<Vec<_>>()
            .join(" AND ");
        format!(
            "INSERT INTO drover_enqueue (process, key) SELECT {process}, CAST(o.{key} AS TEXT) \
             FROM {table_name} AS o WHERE o.{key} IS NOT NULL AND {collides}{not_itself};"
        )
    };
    let on_insert: String = uniques.iter().map(|u| enqueue(u, "")).collect();
    // An update collides with other rows only: not with the row it updates.
    let itself = own
        .iter()
        .map(|c| format!("{} IS {}", column("o", c, own), column("OLD", c, own)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let not_itself = if itself.is_empty() {
        String::new()
    } else {
        format!(" AND NOT ({itself})")
    };
    let on_update: String = uniques.iter().map(|u| enqueue(u, &not_itself)).collect();
    let mut seen = HashSet::new();
    let changed = uniques
        .iter()
        .flatten()
        .filter(|(c, _)| seen.insert(c.clone()))
        .map(|(c, _)| format!("{} IS NOT {}", column("NEW", c, own), column("OLD", c, own)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let [insert, update] =
        ["insert_or_replace", "update_or_replace"].map(|c| ident(&trigger(id, c)));
    vec![
        format!("CREATE TRIGGER {insert} BEFORE INSERT ON {table_name} BEGIN {on_insert} END"),
        format!(
            "CREATE TRIGGER {update} BEFORE UPDATE ON {table_name} WHEN {changed} \
             BEGIN {on_update} END"
        ),
    ]
}

/// Runs each of `statements` on `conn`.
async fn run_all(conn: &mut SqliteConnection, statements: Vec<String>) -> Result<(), StoreError> {
    for statement in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
            .db()?;
    }
    Ok(())
}

/// `name` without its double quotes when it is a quoted identifier (as
/// PostgreSQL's watch takes it), else as it is.
fn unquoted(name: &str) -> String {
    match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(inner) if !inner.is_empty() => inner.replace("\"\"", "\""),
        _ => name.to_owned(),
    }
}

/// A token of a trigger's SQL as SQLite stores it, as far as reading the
/// watch back needs: a quoted identifier (unquoted), a word, or anything
/// else (string literals and punctuation, whose content does not matter).
#[derive(Debug, PartialEq)]
enum Token {
    /// A `"quoted"`, `` `quoted` `` or `[quoted]` identifier, unquoted.
    Quoted(String),
    /// An unquoted word, as written: a keyword such as `NEW`, `WHEN`, `BEGIN`.
    Word(String),
    /// A `.` between a row and its column.
    Dot,
    /// Anything else.
    Other,
}

/// `sql` as [`Token`]s. Quoted identifiers and string literals are read
/// whole, so no name or process can pass for a keyword.
fn tokens(sql: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '`' | '\'' | '[' => {
                let close = if c == '[' { ']' } else { c };
                let mut text = String::new();
                while let Some(d) = chars.next() {
                    if d != close {
                        text.push(d);
                    } else if close != ']' && chars.peek() == Some(&close) {
                        chars.next();
                        text.push(d);
                    } else {
                        break;
                    }
                }
                out.push(if c == '\'' {
                    Token::Other
                } else {
                    Token::Quoted(text)
                });
            }
            '.' => out.push(Token::Dot),
            c if c.is_alphanumeric() || c == '_' => {
                let mut word = String::from(c);
                while let Some(&d) = chars.peek() {
                    if !(d.is_alphanumeric() || d == '_' || d == '$') {
                        break;
                    }
                    word.push(d);
                    chars.next();
                }
                out.push(Token::Word(word));
            }
            c if c.is_whitespace() => {}
            _ => out.push(Token::Other),
        }
    }
    out
}

/// The columns that `row.column` names in `tokens`, in order.
fn columns_of(tokens: &[Token], row: &str) -> Vec<String> {
    tokens
        .windows(3)
        .filter_map(|w| match w {
            [
                Token::Word(r),
                Token::Dot,
                Token::Quoted(c) | Token::Word(c),
            ] if r.eq_ignore_ascii_case(row) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// The key and filter columns a watch's triggers use now, read back from the
/// SQL of its insert trigger (whose `NEW."key"` is the key column) and of its
/// update trigger (whose `WHEN` names the key, then each filter column, as
/// `OLD."c" IS NOT NEW."c"` (then `COLLATE BINARY` in the watches made since
/// it was added); no `WHEN`: no filter).
fn read_back(insert: &str, update: &str) -> Option<(String, Vec<String>)> {
    let key = columns_of(&tokens(insert), "NEW").into_iter().next()?;
    let update = tokens(update);
    let keyword = |k: &str| {
        update
            .iter()
            .position(|t| matches!(t, Token::Word(w) if w.eq_ignore_ascii_case(k)))
    };
    let columns = match (keyword("WHEN"), keyword("BEGIN")) {
        // Every column but the key: the watches made before the key was
        // added to the `WHEN` name the filter columns alone.
        (Some(when), Some(begin)) if when < begin => columns_of(&update[when..begin], "OLD")
            .into_iter()
            .filter(|c| *c != key)
            .collect(),
        _ => Vec::new(),
    };
    Some((key, columns))
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

/// Refuses a table already holding a row whose key `drover_enqueue` refuses
/// (empty, over 1,024 bytes, holding a NUL, not UTF-8: written before the
/// watch, since the watch's triggers refuse it after). Watched, such a row
/// could be neither updated nor deleted: every trigger that enqueues its key
/// fails the change, with a message about writing a key that a `DELETE`
/// does not write. Only keys that fail a cheap check in SQL (a length, a NUL,
/// a byte outside printable ASCII) are read, and the scan stops at the
/// first one that is refused.
async fn check_keys(
    conn: &mut SqliteConnection,
    table: &str,
    key_column: &str,
) -> Result<(), StoreError> {
    use futures_util::TryStreamExt as _;
    let bytes = format!("CAST(CAST({} AS TEXT) AS BLOB)", ident(key_column));
    let sql = format!(
        "SELECT {bytes} FROM {table} WHERE {key} IS NOT NULL AND (length({bytes}) NOT BETWEEN 1 AND {max} \
         OR instr({bytes}, x'00') > 0 OR CAST({key} AS TEXT) GLOB '*[^ -~]*')",
        table = ident(table),
        key = ident(key_column),
        max = crate::store::key::MAX_NAME_BYTES,
    );
    let mut rows = sqlx::query_scalar::<_, Vec<u8>>(sqlx::AssertSqlSafe(sql)).fetch(&mut *conn);
    while let Some(key) = rows.try_next().await.db()? {
        let refused = key.is_empty()
            || key.len() > crate::store::key::MAX_NAME_BYTES
            || key.contains(&0)
            || std::str::from_utf8(&key).is_err();
        if refused {
            let shown: String = String::from_utf8_lossy(&key).chars().take(40).collect();
            return Err(StoreError::Watch(format!(
                "table {} holds a row whose key {} drover refuses ({shown:?}: a key is 1 to \
                 1,024 bytes of UTF-8 text without NUL); watched, its changes would fail: \
                 fix or delete such rows, then watch",
                ident(table),
                ident(key_column)
            )));
        }
    }
    Ok(())
}

/// The watches joined with the insert trigger (`i`) and update trigger
/// (`u`) each has, when the table still has them: `FROM` this, then `WHERE`.
const WITH_TRIGGERS: &str = "drover_watches w \
     LEFT JOIN sqlite_schema i ON i.type = 'trigger' AND i.name = 'drover_watch_' || w.id || '_insert' \
     LEFT JOIN sqlite_schema u ON u.type = 'trigger' AND u.name = 'drover_watch_' || w.id || '_update'";

/// The watch of `table` and the table's name now: the one whose triggers are
/// on it (they follow it through a rename), else one watched under that name
/// whose triggers are gone (the table was dropped).
async fn find_watch(
    conn: &mut SqliteConnection,
    table: &str,
) -> Result<Option<(i64, String)>, StoreError> {
    let sql = format!(
        "SELECT w.id, COALESCE(i.tbl_name, w.relation) FROM {WITH_TRIGGERS} \
         WHERE i.tbl_name = ?1 COLLATE NOCASE \
            OR (i.name IS NULL AND w.relation = ?1 COLLATE NOCASE) \
         ORDER BY i.name IS NULL, w.id LIMIT 1"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(table)
        .fetch_optional(&mut *conn)
        .await
        .db()
}

/// The watches that still have their insert and update triggers and match
/// `also` (an SQL condition on `w`, drover's own): id, the table's name now,
/// process, and the two triggers' SQL, to make a watch's triggers again from.
async fn with_their_triggers(
    conn: &mut SqliteConnection,
    also: &str,
) -> Result<Vec<(i64, String, String, String, String)>, StoreError> {
    let sql = format!(
        "SELECT w.id, i.tbl_name, w.process, i.sql, u.sql FROM {WITH_TRIGGERS} \
         WHERE i.name IS NOT NULL AND u.name IS NOT NULL AND {also}"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await
        .db()
}

/// Installs the `OR REPLACE` triggers of every watch that lacks them and
/// still has its table: the watches made before migration 17, upgraded as
/// the store migrates the database past it. The table and key column are
/// the triggers' own, wherever the table or column was renamed since.
pub(super) async fn upgrade(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let lacking = "NOT EXISTS (SELECT 1 FROM sqlite_schema r WHERE r.type = 'trigger' \
                   AND r.name = 'drover_watch_' || w.id || '_insert_or_replace')";
    for (id, table, process, insert, update) in with_their_triggers(conn, lacking).await? {
        let Some((key, _)) = read_back(&insert, &update) else {
            continue; // not a trigger drover wrote: leave it be
        };
        let collisions = collisions(conn, &table).await?;
        let statements = create_replace_triggers(id, &table, &process, &key, &collisions);
        run_all(conn, statements).await?;
    }
    Ok(())
}

/// Makes the update trigger of every watch that still has its table again,
/// comparing values as written: the watches made before migration 26, whose
/// triggers compared by the column's collation (so a key that moved by its
/// case only, under `COLLATE NOCASE`, lost its old key). The table, key and
/// filter columns are the triggers' own, wherever they were renamed since.
pub(super) async fn compare_as_written(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    for (id, table, process, insert, update) in with_their_triggers(conn, "true").await? {
        let Some((key, columns)) = read_back(&insert, &update) else {
            continue; // not a trigger drover wrote: leave it be
        };
        let watch = TableWatch::new(table.clone(), process, key).columns(columns);
        let [_, update, _] = create_triggers(id, &table, &watch);
        let drop = format!("DROP TRIGGER {}", ident(&trigger(id, "update")));
        run_all(conn, vec![drop, update]).await?;
    }
    Ok(())
}

impl SqliteStore {
    /// See [`Store::table_watch`](crate::store::Store::table_watch).
    pub(crate) async fn table_watch(&self, watch: &TableWatch) -> Result<String, StoreError> {
        validate_process(&watch.process)?;
        let (mut tx, now) = self.write().await?;
        let table = resolve_table(&mut tx, &watch.table).await?;
        check_columns(&mut tx, &table, watch).await?;
        check_keys(&mut tx, &table, &watch.key_column).await?;
        // A watch under this name whose triggers are gone watched a table
        // since dropped: this is another table.
        let stale = format!(
            "DELETE FROM drover_watches WHERE id IN (SELECT w.id FROM {WITH_TRIGGERS} \
             WHERE i.name IS NULL AND w.relation = ?1 COLLATE NOCASE)"
        );
        sqlx::query(sqlx::AssertSqlSafe(stale))
            .bind(&table)
            .exec(&mut *tx)
            .await?;
        if find_watch(&mut tx, &table).await?.is_some() {
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
        run_all(&mut tx, create_triggers(id, &table, watch).into()).await?;
        let collisions = collisions(&mut tx, &table).await?;
        let replace =
            create_replace_triggers(id, &table, &watch.process, &watch.key_column, &collisions);
        run_all(&mut tx, replace).await?;
        tx.commit().await.db()?;
        Ok(table)
    }

    /// See [`Store::table_unwatch`](crate::store::Store::table_unwatch).
    pub(crate) async fn table_unwatch(&self, table: &str) -> Result<Option<String>, StoreError> {
        let (mut tx, _) = self.write().await?;
        let Some((id, name)) = find_watch(&mut tx, &unquoted(table)).await? else {
            return Ok(None);
        };
        let drops = CHANGES
            .iter()
            .map(|change| format!("DROP TRIGGER IF EXISTS {}", ident(&trigger(id, change))))
            .collect();
        run_all(&mut tx, drops).await?;
        sqlx::query("DELETE FROM drover_watches WHERE id = ?1")
            .bind(id)
            .exec(&mut *tx)
            .await?;
        tx.commit().await.db()?;
        Ok(Some(name))
    }

    /// See [`Store::table_watches`](crate::store::Store::table_watches).
    ///
    /// A watch whose triggers are on a table is listed under that table's
    /// name now, with the columns its triggers use now; one whose table was
    /// dropped, as it was made.
    pub(crate) async fn table_watches(&self) -> Result<Vec<TableWatch>, StoreError> {
        type Row = (
            String,
            String,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let sql = format!(
            "SELECT COALESCE(i.tbl_name, w.relation) AS name, w.process, w.key_column, \
             w.columns, i.sql, u.sql FROM {WITH_TRIGGERS} ORDER BY name"
        );
        let mut conn = self.pool.acquire().await.db()?;
        let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
            .db()?;
        let mut listed = Vec::with_capacity(rows.len());
        for (table, process, key, columns, insert, update) in rows {
            // The filter columns as made are a JSON array (NULL: none).
            let made = columns
                .and_then(|c| serde_json::from_str(&c).ok())
                .unwrap_or_default();
            let now = insert.zip(update).and_then(|(i, u)| read_back(&i, &u));
            let live = now.is_some();
            let (key, columns) = now.unwrap_or((key, made));
            let mut gone = Vec::new();
            if live {
                let present: Vec<String> =
                    sqlx::query_scalar("SELECT name FROM pragma_table_info(?1)")
                        .bind(&table)
                        .fetch_all(&mut *conn)
                        .await
                        .db()?;
                gone = std::iter::once(&key)
                    .chain(&columns)
                    .filter(|c| !present.iter().any(|p| p.eq_ignore_ascii_case(c)))
                    .cloned()
                    .collect();
                gone.sort();
                gone.dedup();
            }
            listed.push((table, process, key, columns, gone));
        }
        Ok(TableWatch::listed(listed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_is_read_back_from_the_triggers_it_wrote_whatever_the_names() {
        let watch = TableWatch::new("t", "p'; --", "k\"ey WHEN").columns(["v; BEGIN", "NEW.x"]);
        let [insert, update, _] = create_triggers(7, "odd \"table\"", &watch);
        assert_eq!(
            read_back(&insert, &update),
            Some((watch.key_column.clone(), watch.columns.clone()))
        );
        let plain = TableWatch::new("t", "p", "id");
        let [insert, update, _] = create_triggers(7, "t", &plain);
        assert_eq!(read_back(&insert, &update), Some(("id".into(), vec![])));
    }
}
