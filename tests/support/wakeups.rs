//! Knowing when a controller waits for a wake-up, so that a test of wake-ups
//! makes its change only then: made earlier, the change would be found by a
//! claim already on its way, and the test would pass with the wake-up broken.
//!
//! [`Watched`] wraps a test backend and counts the claims that came back
//! short (fewer keys than asked for). On the database, a controller that got
//! a short answer waits on its subscription (armed before that claim) until a
//! wake-up or its idle poll.
//! Through a server, the controller's claim is a long-poll that waits on the
//! server: the server's `drover_claims_waiting` gauge says when.

use std::sync::Arc;
use std::time::Duration;

use drover::store::{Claimed, StoreError};
use tokio::sync::watch;

use super::backend::TestBackend;
use super::claim_hook::{Hooked, OnClaim};

/// A test backend whose short claim answers are counted.
pub(crate) type Watched = Hooked<TestBackend, ShortClaims>;

/// Counts the claims answered with fewer keys than asked for.
#[derive(Debug, Clone)]
pub(crate) struct ShortClaims(Arc<watch::Sender<u64>>);

impl OnClaim for ShortClaims {
    fn on_claim(
        &self,
        asked: u32,
        claimed: Result<Claimed, StoreError>,
    ) -> Result<Claimed, StoreError> {
        if claimed
            .as_ref()
            .is_ok_and(|c| c.leases.len() < asked as usize)
        {
            self.0.send_modify(|n| *n += 1);
        }
        claimed
    }
}

impl Watched {
    /// Watches `inner`.
    pub(crate) fn new(inner: &TestBackend) -> Self {
        Self {
            inner: inner.clone(),
            hook: ShortClaims(Arc::new(watch::Sender::new(0))),
        }
    }

    /// How many claims have come back short so far: pass it to
    /// [`waiting_since`](Self::waiting_since).
    pub(crate) fn mark(&self) -> u64 {
        *self.hook.0.borrow()
    }

    /// Returns once the controller waits for a wake-up after `mark`: on the
    /// database, once a claim came back short after it; through a server,
    /// once a claim waits there for work. Fails after 10 s.
    pub(crate) async fn waiting_since(&self, mark: u64) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            match &self.inner {
                TestBackend::Store(_) => {
                    let mut short = self.hook.0.subscribe();
                    short
                        .wait_for(|n| *n > mark)
                        .await
                        .expect("the counter lives with the backend");
                }
                TestBackend::Client(client, ..) => {
                    while claims_waiting(client.base_url()).await < 1 {
                        // The server tells no one when a claim starts to
                        // wait: ask its /metrics again.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            panic!(
                "the controller never waited for work ({})",
                self.inner.name()
            )
        });
    }
}

/// `drover_claims_waiting` on the server at `base`.
async fn claims_waiting(base: &str) -> i64 {
    let page = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the metrics page");
    page.lines()
        .find_map(|l| l.strip_prefix("drover_claims_waiting "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the server reports drover_claims_waiting")
}
