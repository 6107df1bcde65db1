//! Table watching: the informer of the SQL world (DESIGN.md rule 11).
//!
//! A watched table carries triggers that enqueue the key column of every
//! inserted, updated and deleted row, in the transaction that changed the row,
//! through the same enqueue SQL the store runs (`drover_enqueue`). A delete
//! enqueues its key too, so the controller finds the object gone, like an
//! informer's delete event; an update that moves the key enqueues both keys.
//! On PostgreSQL a `TRUNCATE` enqueues every key the table held, and one of
//! a partition of a watched partitioned table the keys that partition held
//! (a partition made after the watch only once the table is watched again,
//! or when the whole table is truncated).
//! Combined with a periodic resync this is client-go's informer model:
//! edge-triggered events plus a level-triggered resync, on the user's tables.
//!
//! A watch belongs to its table, not to the name it was made under: after an
//! `ALTER TABLE … RENAME` it is listed, unwatched and refused as "already
//! watched" under the new name (PostgreSQL records the table's oid, SQLite
//! finds the triggers, which move with the table). A column renamed or
//! dropped under a watch is never silently ignored: SQLite rewrites the
//! triggers on a rename and refuses to drop a column they use; PostgreSQL's
//! triggers fail the writer's change while the key column is gone, and the
//! listing names it ([`TableWatch::gone`]). On SQLite, an `OR REPLACE` that
//! deletes rows colliding on a unique index enqueues their keys too.

/// One watch: which table, whose key column feeds which process.
///
/// Used both to install a watch ([`Store::table_watch`](crate::store::Store::table_watch))
/// and to list them ([`Store::table_watches`](crate::store::Store::table_watches)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableWatch {
    /// The table, as SQL names it: `machines`; on PostgreSQL also
    /// schema-qualified (`public.machines`) and quoted (`"Odd ""name"""`).
    /// A listing shows the table's name now, wherever it was renamed since
    /// (the watch goes with the table), or the name it was watched under
    /// once the table is dropped.
    pub table: String,
    /// The process its keys are enqueued to.
    pub process: String,
    /// The column whose value is the key, named exactly (no quoting). Its
    /// type must be text or integer (on PostgreSQL also varchar, char, uuid);
    /// a row whose key is NULL enqueues nothing.
    pub key_column: String,
    /// When not empty, an update that changes none of these columns (named
    /// exactly) enqueues nothing; inserts and deletes always enqueue. A
    /// change is one of the value as written (a change of case is one, in a
    /// column whose collation ignores case), so a key that moves is always
    /// seen, and a column of a type without equality (`json`) can filter.
    pub columns: Vec<String>,
    /// In a listing, the columns above that the table no longer has: renamed
    /// or dropped since the watch was made. PostgreSQL's triggers name the
    /// key column as it was, so while the key column is gone every change of
    /// the table fails, saying so (rather than enqueueing nothing);
    /// unwatching and watching again under the new name mends it. Ignored
    /// when installing a watch.
    pub gone: Vec<String>,
}

impl TableWatch {
    /// A watch of every change of `table`, enqueueing `key_column` to `process`.
    #[must_use]
    pub fn new(
        table: impl Into<String>,
        process: impl Into<String>,
        key_column: impl Into<String>,
    ) -> Self {
        Self {
            table: table.into(),
            process: process.into(),
            key_column: key_column.into(),
            columns: Vec::new(),
            gone: Vec::new(),
        }
    }

    /// Only updates that change one of `columns` enqueue (default: every update).
    #[must_use]
    pub fn columns<C: Into<String>>(self, columns: impl IntoIterator<Item = C>) -> Self {
        Self {
            columns: columns.into_iter().map(Into::into).collect(),
            ..self
        }
    }
}

/// A listed watch: table, process, key column, filter columns, and those of
/// its columns the table no longer has.
#[cfg(feature = "_engine")]
pub(crate) type WatchRow = (String, String, String, Vec<String>, Vec<String>);

#[cfg(feature = "_engine")]
impl TableWatch {
    /// The watches listed by `rows`.
    pub(crate) fn listed(rows: Vec<WatchRow>) -> Vec<Self> {
        rows.into_iter()
            .map(|(table, process, key_column, columns, gone)| Self {
                table,
                process,
                key_column,
                columns,
                gone,
            })
            .collect()
    }
}

/// drover's own tables start with this; watching one would enqueue from
/// inside drover's writes, so it is refused (in SQL on PostgreSQL).
#[cfg(feature = "sqlite")]
pub(crate) const OWN_PREFIX: &str = "drover_";
