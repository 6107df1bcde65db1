//! A process's items in the order an operator needs them: parked keys first,
//! then keys backing off (soonest retry first), then pending keys in the order
//! workers will take them (highest priority, then the longest waiting), then
//! running and idle ones; a page at a time by keyset cursor, never by OFFSET,
//! so the thousandth page costs what the first does.
//!
//! Each state is a *section* read through the index that holds it in that
//! order (the partial index of parked keys, the index of failed pending keys,
//! the claim index, the `(process, key)` key; running keys, few, are read from
//! the index that holds them and sorted on SQLite). With a key
//! prefix every section is read in key order over the prefix's key range
//! instead, since no time-ordered index can narrow by key. Both engines run
//! the SQL built here (only the placeholders differ) and bind its
//! [`Arg`]s their own way.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::store::StoreError;
use crate::store::cursor::{Position, TriageCursor};
use crate::store::key::{validate_key_prefix, validate_process};
use crate::store::params::ItemTriage;
use crate::store::types::{Item, ItemState, TriagePage};

/// The sections in the order a page walks them.
const SECTIONS: [ItemState; 5] = [
    ItemState::Parked,
    ItemState::Backoff,
    ItemState::Pending,
    ItemState::Running,
    ItemState::Idle,
];

/// A value a section query binds, in placeholder order.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    /// The process.
    Process(String),
    /// The database clock's now.
    Now,
    /// A key (a cursor's, or a prefix range bound).
    Key(String),
    /// A time (a cursor's).
    At(DateTime<Utc>),
    /// A row id or a priority (a cursor's).
    Int(i64),
    /// How many rows at most.
    Limit(u32),
}

/// One query of a section: SQL with numbered placeholders, and what to bind.
#[derive(Debug)]
pub(crate) struct SectionQuery {
    pub(crate) sql: String,
    pub(crate) args: Vec<Arg>,
}

/// What differs between the engines in the SQL built here.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// The placeholder mark (`?` or `$`), followed by the argument's number.
    pub(crate) mark: char,
    /// What the running section reads from without a key prefix: the items
    /// table, with an index hint where the planner, left to choose, would walk
    /// every key of the process in key order to find the running ones.
    pub(crate) running_from: &'static str,
    /// The columns of an [`ItemRow`](super::rows::ItemRow) as the engine
    /// reads them back (SQLite reads each number as an integer, whatever SQL
    /// stored there).
    pub(crate) columns: &'static str,
}

/// Builds a query, numbering placeholders as arguments are added.
struct Builder {
    mark: char,
    /// The table, with an index hint where one is needed.
    from: &'static str,
    /// The columns read ([`Dialect::columns`]).
    columns: &'static str,
    conds: Vec<String>,
    args: Vec<Arg>,
}

impl Builder {
    fn new(dialect: &Dialect, process: &str) -> Self {
        let mut b = Self {
            mark: dialect.mark,
            from: "drover_items",
            columns: dialect.columns,
            conds: Vec::new(),
            args: Vec::new(),
        };
        let p = b.arg(Arg::Process(process.to_owned()));
        b.cond(format!("process = {p}"));
        b
    }

    fn arg(&mut self, arg: Arg) -> String {
        self.args.push(arg);
        format!("{}{}", self.mark, self.args.len())
    }

    fn cond(&mut self, cond: impl Into<String>) {
        self.conds.push(cond.into());
    }

    fn finish(mut self, order: &str, limit: u32) -> SectionQuery {
        let l = self.arg(Arg::Limit(limit));
        SectionQuery {
            sql: format!(
                "SELECT id, {} FROM {} WHERE {} ORDER BY {order} LIMIT {l}",
                self.columns,
                self.from,
                self.conds.join(" AND ")
            ),
            args: self.args,
        }
    }
}

/// A key greater than every valid key (at most 1,024 bytes, so at most 256
/// characters of four bytes): the upper bound of an unbounded range.
fn beyond_every_key() -> String {
    char::MAX.to_string().repeat(257)
}

/// The smallest key greater than every key that starts with `prefix` (keys
/// compare byte by byte, and UTF-8 orders as code points do): the prefix with
/// its last character stepped up, dropping trailing characters that cannot be.
fn prefix_end(prefix: &str) -> String {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return chars.into_iter().collect();
        }
    }
    beyond_every_key()
}

/// The condition that puts a stored row in `section`.
fn section_cond(section: ItemState, b: &mut Builder) {
    match section {
        // SQLite uses a partial index only when the query states its
        // condition literally; PostgreSQL proves from these that its partial
        // indexes of running and of parked rows apply.
        ItemState::Parked => b.cond("state = 'parked'"),
        ItemState::Running => b.cond("state = 'running'"),
        ItemState::Idle => b.cond("state = 'idle'"),
        ItemState::Backoff => {
            let now = b.arg(Arg::Now);
            b.cond(format!(
                "state = 'pending' AND backoff_until IS NOT NULL AND backoff_until > {now}"
            ));
        }
        ItemState::Pending => {
            let now = b.arg(Arg::Now);
            b.cond(format!(
                "state = 'pending' AND (backoff_until IS NULL OR backoff_until <= {now})"
            ));
        }
    }
}

/// The queries that read `section` after `after`, in its order; run in turn
/// until enough rows came back.
pub(crate) fn section_queries(
    dialect: &Dialect,
    process: &str,
    section: ItemState,
    prefix: Option<&str>,
    after: Option<&Position>,
    limit: u32,
) -> Result<Vec<SectionQuery>, StoreError> {
    let mut b = Builder::new(dialect, process);
    section_cond(section, &mut b);
    let by_key = prefix.is_some()
        || matches!(
            section,
            ItemState::Parked | ItemState::Running | ItemState::Idle
        );
    if section == ItemState::Running && prefix.is_none() {
        b.from = dialect.running_from;
    }
    if by_key {
        let from = match after {
            None => prefix.unwrap_or("").to_owned(),
            Some(Position::Key(k)) => k.clone(),
            Some(_) => return Err(foreign()),
        };
        let op = if after.is_some() { ">" } else { ">=" };
        let lo = b.arg(Arg::Key(from));
        let hi = b.arg(Arg::Key(prefix.map_or_else(beyond_every_key, prefix_end)));
        b.cond(format!("key {op} {lo} AND key < {hi}"));
        return Ok(vec![b.finish("key", limit)]);
    }
    if section == ItemState::Backoff {
        match after {
            None => {}
            Some(Position::Backoff { at, id }) => {
                let (at, id) = (b.arg(Arg::At(*at)), b.arg(Arg::Int(*id)));
                b.cond(format!("(backoff_until, id) > ({at}, {id})"));
            }
            Some(_) => return Err(foreign()),
        }
        // Named with its table, as the claim order below is.
        return Ok(vec![b.finish("drover_items.backoff_until, id", limit)]);
    }
    // Pending, in claim order: the rest of the cursor's priority, then the
    // lower priorities, each a range of the claim index.
    // Each column named with its table: a bare name orders SQLite's rows by
    // the result column of that name, which `Dialect::columns` reads cast,
    // and no index gives that order.
    let order = "drover_items.priority DESC, drover_items.ready_at, id";
    match after {
        None => Ok(vec![b.finish(order, limit)]),
        Some(Position::Claim { priority, at, id }) => {
            let mut rest = Builder::new(dialect, process);
            section_cond(section, &mut rest);
            let p = b.arg(Arg::Int(i64::from(*priority)));
            let (at, id) = (b.arg(Arg::At(*at)), b.arg(Arg::Int(*id)));
            b.cond(format!("priority = {p} AND (ready_at, id) > ({at}, {id})"));
            let p = rest.arg(Arg::Int(i64::from(*priority)));
            rest.cond(format!("priority < {p}"));
            Ok(vec![b.finish(order, limit), rest.finish(order, limit)])
        }
        Some(_) => Err(foreign()),
    }
}

fn foreign() -> StoreError {
    StoreError::InvalidArgument(
        "this cursor belongs to a listing with other filters: start again from the first page"
            .into(),
    )
}

/// Where a row read in `section` sits in that section's order.
fn position_of(section: ItemState, by_key: bool, id: i64, item: &Item) -> Position {
    match section {
        ItemState::Backoff if !by_key => Position::Backoff {
            at: item.backoff_until.unwrap_or(item.ready_at),
            id,
        },
        ItemState::Pending if !by_key => Position::Claim {
            priority: item.priority,
            at: item.ready_at,
            id,
        },
        _ => Position::Key(item.key.clone()),
    }
}

/// What an engine does for a page: read one section query.
pub(crate) trait PageSteps: Sync {
    /// `UnknownProcess` unless the process is known.
    fn known(&self, process: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Runs `query` and returns its rows, each with its id, as seen now.
    fn section_rows(
        &self,
        query: SectionQuery,
    ) -> impl Future<Output = Result<Vec<(i64, Item)>, StoreError>> + Send;
}

/// One page of `params.process`'s items, in attention order.
pub(crate) async fn page<S: PageSteps>(
    store: &S,
    dialect: &Dialect,
    params: ItemTriage,
) -> Result<TriagePage, StoreError> {
    validate_process(&params.process)?;
    store.known(&params.process).await?;
    let prefix = params.key_prefix.as_deref().filter(|p| !p.is_empty());
    if let Some(prefix) = prefix {
        validate_key_prefix(prefix)?;
    }
    let limit = params.limit.max(1);
    let sections: Vec<ItemState> = match params.state {
        Some(state) => vec![state],
        None => SECTIONS.to_vec(),
    };
    let (start, mut after) = match params.after {
        Some(c) if sections.contains(&c.section) => (c.section, Some(c.position)),
        Some(_) => return Err(foreign()),
        None => (sections[0], None),
    };
    let mut items: Vec<(ItemState, i64, Item)> = Vec::new();
    for &section in sections.iter().skip_while(|s| **s != start) {
        for query in section_queries(
            dialect,
            &params.process,
            section,
            prefix,
            after.as_ref(),
            limit + 1,
        )? {
            let want = (limit as usize + 1).saturating_sub(items.len());
            if want == 0 {
                break;
            }
            let rows = store.section_rows(query).await?;
            items.extend(rows.into_iter().take(want).map(|(id, i)| (section, id, i)));
        }
        after = None;
    }
    let next = (items.len() > limit as usize).then(|| {
        let (section, id, item) = &items[limit as usize - 1];
        TriageCursor {
            section: *section,
            position: position_of(*section, prefix.is_some(), *id, item),
        }
    });
    items.truncate(limit as usize);
    Ok(TriagePage {
        items: items.into_iter().map(|(_, _, i)| i).collect(),
        next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_at_the_next_prefix() {
        assert_eq!(prefix_end("ns/a"), "ns/b");
        assert_eq!(prefix_end("a\u{10FFFF}"), "b");
        assert_eq!(prefix_end("\u{D7FF}"), "\u{E000}");
        assert!(prefix_end("\u{10FFFF}").as_str() > "\u{10FFFF}\u{10FFFF}zzz");
    }
}
