//! Requests of many callers on one store, run together: the requests that
//! arrive while one group runs form the next, which one task runs as one
//! statement (and one commit) for all of them.
//!
//! This is group commit, as the runner's completer does for one controller's
//! runs, at the level of the store, so it also groups what several
//! controllers sharing the store (a node running many processes, a server
//! answering many workers) ask at once. Nothing waits to fill a group: a
//! lone request runs at once, in its caller's task ([`lead`]). The claims ([`claims`](super::claims)) and the
//! completions ([`completions`](super::completions)) are grouped this way.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::engine::PostgresStore;

/// The requests waiting for the next group, and whether a task runs them.
struct Queue<Req, Ans> {
    running: bool,
    waiting: Vec<(Req, oneshot::Sender<Ans>)>,
}

/// The groups of one kind of request of one store (shared by its clones).
pub(super) struct Grouped<Req, Ans> {
    queue: Mutex<Queue<Req, Ans>>,
    /// How many groups ran, for the tests.
    #[cfg(test)]
    pub(super) groups: std::sync::atomic::AtomicUsize,
}

impl<Req, Ans> Default for Grouped<Req, Ans> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Queue {
                running: false,
                waiting: Vec::new(),
            }),
            #[cfg(test)]
            groups: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl<Req, Ans> std::fmt::Debug for Grouped<Req, Ans> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grouped").finish_non_exhaustive()
    }
}

/// How a kind of request is grouped and run.
pub(super) trait Group: Send + Sync + 'static {
    /// One caller's request.
    type Req: Send + 'static;
    /// What one caller is answered.
    type Ans: Send + 'static;

    /// How much of a group's bound `req` takes (at least one request runs in
    /// every group, however large).
    fn weight(req: &Self::Req) -> usize;

    /// The most a group carries, in [`weight`](Self::weight).
    const MOST: usize;

    /// The store's groups of this kind.
    fn grouped(store: &PostgresStore) -> &Arc<Grouped<Self::Req, Self::Ans>>;

    /// Runs `group` on `store`; one answer per request, in its order.
    fn run(
        store: &PostgresStore,
        group: Vec<Self::Req>,
    ) -> impl Future<Output = Vec<Self::Ans>> + Send;
}

impl<Req: Send + 'static, Ans: Send + 'static> Grouped<Req, Ans> {
    fn queue(&self) -> MutexGuard<'_, Queue<Req, Ans>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many requests wait for the next group, for the tests.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.queue().waiting.len()
    }

    /// Whether a group has been taken and none waits, for the tests.
    #[cfg(test)]
    pub(super) fn taken(&self) -> bool {
        let queue = self.queue();
        queue.running && queue.waiting.is_empty()
    }
}

/// Makes the caller the one that runs its request, at once and on its own,
/// when no group of `store`'s requests of kind `G` is running: `None` when one
/// is (the caller then [`wait`]s for the next). The requests that arrive
/// while the caller runs its own form the next group, run by a task started
/// when the returned guard is dropped. So a lone caller (one controller's
/// claims, one after the other) pays nothing for the grouping.
pub(super) fn lead<G: Group>(store: &PostgresStore) -> Option<Leading<G>> {
    let mut queue = G::grouped(store).queue();
    if queue.running {
        return None;
    }
    queue.running = true;
    Some(Leading {
        store: store.clone(),
        group: PhantomData,
    })
}

/// The caller runs its request itself (see [`lead`]); dropped when it is
/// done or gone, it hands the requests that queued meanwhile to a task.
pub(super) struct Leading<G: Group> {
    store: PostgresStore,
    group: PhantomData<fn() -> G>,
}

impl<G: Group> Drop for Leading<G> {
    fn drop(&mut self) {
        let mut queue = G::grouped(&self.store).queue();
        if queue.waiting.is_empty() {
            queue.running = false;
            return;
        }
        drop(queue);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(run_groups::<G>(self.store.clone()));
            }
            // No runtime to run them on: each waiting caller runs its own.
            Err(_) => {
                let mut queue = G::grouped(&self.store).queue();
                queue.running = false;
                queue.waiting.clear();
            }
        }
    }
}

/// `req`'s answer, from the next group of `store`'s requests of kind `G`;
/// `None` when the task running the groups ended without answering (its
/// runtime stopping): the caller then runs its request on its own.
///
/// The groups run in a task of their own, so a caller that goes away cannot
/// cancel the others' requests; its own is left out when its group has not
/// started yet.
pub(super) async fn wait<G: Group>(store: &PostgresStore, req: G::Req) -> Option<G::Ans> {
    let (reply, answer) = oneshot::channel();
    let lead = {
        let mut queue = G::grouped(store).queue();
        queue.waiting.push((req, reply));
        !std::mem::replace(&mut queue.running, true)
    };
    if lead {
        // The group that ran when this caller looked has ended since.
        tokio::spawn(run_groups::<G>(store.clone()));
    }
    answer.await.ok()
}

/// Runs the waiting requests, a group at a time, until none waits.
async fn run_groups<G: Group>(store: PostgresStore) {
    let grouped = G::grouped(&store);
    let _running = Running(grouped);
    loop {
        let (reqs, replies): (Vec<G::Req>, Vec<oneshot::Sender<G::Ans>>) = {
            let mut queue = grouped.queue();
            // A caller gone before its group started asks for nothing.
            queue.waiting.retain(|(_, reply)| !reply.is_closed());
            if queue.waiting.is_empty() {
                queue.running = false;
                return;
            }
            let mut weight = 0;
            let taken = queue
                .waiting
                .iter()
                .take_while(|(req, _)| {
                    let first = weight == 0;
                    weight += G::weight(req).max(1);
                    first || weight <= G::MOST
                })
                .count();
            queue.waiting.drain(..taken).unzip()
        };
        #[cfg(test)]
        grouped
            .groups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let answers = G::run(&store, reqs).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            reply.send(answer).ok();
        }
    }
}

/// Clears the `running` flag if [`run_groups`] ends without doing so (its
/// task cancelled as its runtime stops), dropping what still waits (each of
/// those callers then runs its request on its own).
struct Running<'a, Req, Ans>(&'a Grouped<Req, Ans>);

impl<Req, Ans> Drop for Running<'_, Req, Ans> {
    fn drop(&mut self) {
        let mut queue = self.0.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.running {
            queue.running = false;
            queue.waiting.clear();
        }
    }
}

#[cfg(test)]
mod tests;
