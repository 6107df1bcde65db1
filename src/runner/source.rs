//! Where a controller's keys come from: the store's queue, or the user's own
//! query.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::error::BoxError;
use crate::store::Store;

type QueryFuture = Pin<Box<dyn Future<Output = Result<Vec<String>, BoxError>> + Send>>;
type QueryFn = dyn Fn(Store, u32) -> QueryFuture + Send + Sync;

/// The two loop shapes drover descends from.
#[derive(Clone, Default)]
pub enum Source {
    /// Keys enqueued in the store (by events, the CLI, the HTTP API): the
    /// persistence-agent shape. Claims are batched and coalesced by the store.
    #[default]
    Queue,
    /// Candidate keys returned by a query over the user's own tables: the BMDB
    /// `getMachines` shape. The runner locks each candidate through the store and
    /// skips those leased, parked or backing off, so the query may be loose; for
    /// efficiency, filter with [`Store::candidate_filter`].
    Query(Arc<QueryFn>),
}

impl Source {
    /// A query source from `query(store, limit)`, which returns up to `limit`
    /// candidate keys.
    pub fn query<F, Fut>(query: F) -> Self
    where
        F: Fn(Store, u32) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<String>, BoxError>> + Send + 'static,
    {
        Source::Query(Arc::new(move |store, limit| Box::pin(query(store, limit))))
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Queue => f.write_str("Queue"),
            Source::Query(_) => f.write_str("Query(..)"),
        }
    }
}
