//! [`TriageCursor`]: where a page of a process's items ends, in the attention
//! order of [`item_triage`](super::StoreEngine::item_triage).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use super::StoreError;
use super::types::ItemState;

/// Where a page ends, to start the next one from: opaque to callers (its
/// text form goes into links), meaningful only with the same filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriageCursor {
    pub(crate) section: ItemState,
    pub(crate) position: Position,
}

/// A position within one section's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Position {
    /// After this key (key-ordered sections).
    Key(String),
    /// After this backoff end and row (the backoff section).
    Backoff { at: DateTime<Utc>, id: i64 },
    /// After this claim position (the pending section).
    Claim {
        priority: i32,
        at: DateTime<Utc>,
        id: i64,
    },
}

impl fmt::Display for TriageCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let section = self.section.as_str();
        match &self.position {
            Position::Key(key) => write!(f, "{section}:k:{key}"),
            Position::Backoff { at, id } => {
                write!(f, "{section}:b:{}:{id}", at.timestamp_micros())
            }
            Position::Claim { priority, at, id } => {
                write!(f, "{section}:c:{priority}:{}:{id}", at.timestamp_micros())
            }
        }
    }
}

impl FromStr for TriageCursor {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        let bad = || {
            StoreError::InvalidArgument(
                "not a cursor of this listing: use the `next` value of the previous page".into(),
            )
        };
        let (section, rest) = s.split_once(':').ok_or_else(bad)?;
        let section = ItemState::parse(section).ok_or_else(bad)?;
        let (kind, rest) = rest.split_once(':').ok_or_else(bad)?;
        let micros = |v: &str| {
            v.parse()
                .ok()
                .and_then(DateTime::from_timestamp_micros)
                .ok_or_else(bad)
        };
        let int = |v: &str| v.parse::<i64>().map_err(|_| bad());
        let position = match kind {
            "k" if !rest.contains('\0') => Position::Key(rest.to_owned()),
            "b" => {
                let (at, id) = rest.split_once(':').ok_or_else(bad)?;
                Position::Backoff {
                    at: micros(at)?,
                    id: int(id)?,
                }
            }
            "c" => {
                let mut parts = rest.splitn(3, ':');
                let mut next = || parts.next().ok_or_else(bad);
                let priority = next()?.parse().map_err(|_| bad())?;
                let (at, id) = (micros(next()?)?, int(next()?)?);
                Position::Claim { priority, at, id }
            }
            _ => return Err(bad()),
        };
        Ok(Self { section, position })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_through_their_text() {
        let at = DateTime::from_timestamp_micros(1_767_225_600_123_456).expect("a time");
        for position in [
            Position::Key("ns/a:b".into()),
            Position::Backoff { at, id: 7 },
            Position::Claim {
                priority: -3,
                at,
                id: 9,
            },
        ] {
            let c = TriageCursor {
                section: ItemState::Pending,
                position,
            };
            assert_eq!(c.to_string().parse::<TriageCursor>().expect("parses"), c);
        }
        assert!("pending:x:1".parse::<TriageCursor>().is_err());
        assert!("nope:k:a".parse::<TriageCursor>().is_err());
    }
}
