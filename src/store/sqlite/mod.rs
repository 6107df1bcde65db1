//! The SQLite engine: the embedded default. One file, no server; WAL so readers
//! never block the writer, every write in one `BEGIN IMMEDIATE` transaction so
//! writers queue on SQLite's busy timeout instead of failing with "database is
//! locked", and times stored as integer milliseconds of the database clock.

mod admin;
mod checkpoint;
mod claims;
mod complete;
mod completions;
mod connect;
mod counted;
mod counts;
mod engine;
mod enqueue;
mod error;
mod gate;
#[cfg(test)]
mod grouped_tests;
mod groups;
mod inspect;
mod leases;
#[cfg(test)]
mod plans;
mod processes;
mod resync;
mod rows;
mod runs;
mod savepoints;
mod series;
mod sessions;
mod trace;
mod transactional;
mod turns;
mod watch;
mod writer;

pub use connect::is_in_memory;
pub use engine::SqliteStore;
pub(crate) use transactional::CallerTx;
