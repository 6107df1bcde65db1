//! The PostgreSQL engine: many drover nodes against one database. Claims are one
//! `FOR UPDATE SKIP LOCKED` statement per batch, so parallel claimers never wait
//! on or fight over the same row; everything is correct under the default READ
//! COMMITTED isolation; each enqueue sends a `NOTIFY` on the process's channel
//! (see [`PostgresStore::notify_channel`]) as an optional wake-up.

mod admin;
mod claims;
mod complete;
mod completions;
mod connect;
mod copy_rows;
mod counts;
mod engine;
mod enqueue;
mod error;
mod failover;
mod gate;
mod gated;
#[cfg(test)]
mod grouped_tests;
mod groups;
mod hosts;
mod inspect;
mod leases;
mod lineage;
mod listen;
#[cfg(test)]
mod plans;
mod processes;
mod resync;
mod retry;
mod rows;
mod runs;
mod series;
mod sessions;
mod statistics;
mod tid;
mod trace;
mod transactional;
mod tx;
mod watch;

pub use engine::PostgresStore;
pub(crate) use transactional::CallerTx;
