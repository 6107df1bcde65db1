//! Requests of many callers on one store, run together: the requests that
//! arrive while one group runs form the next, which one task runs as one
//! statement (and one commit) for all of them.
//!
//! This is group commit, as the runner's completer does for one controller's
//! runs, at the level of the store, so it also groups what several
//! controllers sharing the store (a node running many processes, a server
//! answering many workers) ask at once. Nothing waits to fill a group: a
//! lone request runs at once, in its caller's task ([`lead`]). Each engine
//! groups its claims and its completions this way (on PostgreSQL as one
//! statement or transaction per group, on SQLite as one transaction on its
//! one writer).

use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::store::StoreError;

/// How long the group running may hold the next one back. A group is a
/// statement or a transaction of a few milliseconds, but one can wait far
/// longer: a completion for a row that a caller's transaction keeps locked
/// (an enqueue into a running key, a watched table's trigger) waits until
/// that transaction ends, and on SQLite every write waits while a caller's
/// own transaction holds the writer. Past this, the next group starts beside it, so
/// one stuck request holds up its own controller, as it did before the
/// grouping, and not every controller sharing the store. The requests in the
/// stuck group itself are held up with it; on PostgreSQL a completion group
/// of several callers gives up a lock wait past this too, and each caller
/// writes its batch on its own (`PostgresStore::stepping_aside`), so a
/// caller whose own transaction holds the lock is not left waiting for the
/// group that waits for it.
pub(super) const STALL: Duration = Duration::from_millis(100);

/// The requests waiting for the next group, and who runs them.
struct Queue<Req, Ans> {
    /// Groups (or leading callers, see [`lead`]) running now.
    running: usize,
    /// When the last of them started.
    started: Instant,
    waiting: Vec<(Req, oneshot::Sender<Ans>)>,
}

impl<Req, Ans> Queue<Req, Ans> {
    /// Whether a new group may start now: none runs, or the last one to
    /// start has run for [`STALL`] (the grouped's `stall` in tests).
    fn may_start(&self, stall: Duration) -> bool {
        self.running == 0 || self.started.elapsed() >= stall
    }

    /// Counts a group (or a leading caller) starting now.
    fn start(&mut self) {
        self.running += 1;
        self.started = Instant::now();
    }
}

/// The groups of one kind of request of one store (shared by its clones).
pub(super) struct Grouped<Req, Ans> {
    queue: Mutex<Queue<Req, Ans>>,
    /// [`STALL`], longer in the tests that count groups.
    stall: Duration,
    /// How many groups ran, for the tests.
    #[cfg(test)]
    pub(super) groups: std::sync::atomic::AtomicUsize,
}

impl<Req, Ans> Default for Grouped<Req, Ans> {
    fn default() -> Self {
        Self::with_stall(STALL)
    }
}

impl<Req, Ans> Grouped<Req, Ans> {
    /// Groups that hold the next one back for at most `stall`.
    pub(super) fn with_stall(stall: Duration) -> Self {
        Self {
            queue: Mutex::new(Queue {
                running: 0,
                started: Instant::now(),
                waiting: Vec::new(),
            }),
            stall,
            #[cfg(test)]
            groups: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<Req, Ans>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many requests wait for the next group, for the tests.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.queue().waiting.len()
    }

    /// Whether something runs and nothing waits, for the tests.
    #[cfg(test)]
    pub(super) fn taken(&self) -> bool {
        let queue = self.queue();
        queue.running > 0 && queue.waiting.is_empty()
    }
}

impl<Req, Ans> std::fmt::Debug for Grouped<Req, Ans> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grouped").finish_non_exhaustive()
    }
}

/// What a request in a group is answered.
pub(super) enum Answer<T> {
    /// Its result.
    Done(T),
    /// The group failed with nothing written: the request runs on its own,
    /// with its own error if that fails too.
    Alone,
    /// The request's own error (a group of one), or, for each request of a
    /// larger group, `CommitUnknown`: the group's commit may have happened,
    /// so each caller must treat its own as unknown (a claim's session may
    /// hold leases it never heard of).
    Failed(StoreError),
}

impl<T> Answer<T> {
    /// The answers of a group of `n` requests (`what`, for the log) that
    /// failed with `e`.
    pub(super) fn failed(n: usize, e: StoreError, what: &'static str) -> Vec<Self> {
        if n == 1 {
            return vec![Self::Failed(e)];
        }
        if e.is_commit_unknown() {
            return (0..n).map(|_| Self::Failed(e.duplicate())).collect();
        }
        tracing::debug!(error = %e, requests = n, what, "a group failed; each request runs on its own");
        (0..n).map(|_| Self::Alone).collect()
    }

    /// The caller's result; `None` when it runs its request on its own (the
    /// group failed, or its task ended without answering as its runtime
    /// stopped).
    pub(super) fn result(answer: Option<Self>) -> Option<Result<T, StoreError>> {
        match answer? {
            Self::Done(done) => Some(Ok(done)),
            Self::Failed(e) => Some(Err(e)),
            Self::Alone => None,
        }
    }
}

/// How a kind of request is grouped and run.
pub(super) trait Group: Send + Sync + 'static {
    /// The engine's store.
    type Store: Clone + Send + Sync + 'static;
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
    fn grouped(store: &Self::Store) -> &Arc<Grouped<Self::Req, Self::Ans>>;

    /// Runs `group` on `store`; one answer per request, in its order.
    fn run(
        store: &Self::Store,
        group: Vec<Self::Req>,
    ) -> impl Future<Output = Vec<Self::Ans>> + Send;
}

/// Makes the caller the one that runs its request, at once and on its own,
/// when no group of `store`'s requests of kind `G` is running (or the last
/// one to start has stalled): `None` otherwise, and the caller then
/// [`wait`]s for the next group. The requests that arrive while the caller
/// runs its own form the next group, run by a task started when the
/// returned guard is dropped. So a lone caller (one controller's claims, one
/// after the other) pays nothing for the grouping.
pub(super) fn lead<G: Group>(store: &G::Store) -> Option<Leading<'_, G>> {
    let grouped = G::grouped(store);
    let mut queue = grouped.queue();
    if !queue.may_start(grouped.stall) {
        return None;
    }
    queue.start();
    Some(Leading {
        store,
        group: PhantomData,
    })
}

/// The caller runs its request itself (see [`lead`]); dropped when it is
/// done or gone, it hands the requests that queued meanwhile to a task.
pub(super) struct Leading<'a, G: Group> {
    store: &'a G::Store,
    group: PhantomData<fn() -> G>,
}

impl<G: Group> Drop for Leading<'_, G> {
    fn drop(&mut self) {
        let mut queue = G::grouped(self.store).queue();
        queue.running -= 1;
        if !queue.waiting.is_empty() {
            queue.start();
            drop(queue);
            spawn_groups::<G>(self.store);
        }
    }
}

/// `req`'s answer, from the next group of `store`'s requests of kind `G`;
/// `None` when the task running the groups ended without answering (its
/// runtime stopping): the caller then runs its request on its own.
///
/// The groups run in a task of their own, so a caller that goes away cannot
/// cancel the others' requests; its own is left out when its group has not
/// started yet. While the request waits, each [`STALL`] it checks that the
/// group running has not stalled, and starts the next group beside it if it
/// has.
pub(super) async fn wait<G: Group>(store: &G::Store, req: G::Req) -> Option<G::Ans> {
    let grouped = G::grouped(store);
    let (reply, mut answer) = oneshot::channel();
    let mut start = {
        let mut queue = grouped.queue();
        queue.waiting.push((req, reply));
        let start = queue.running == 0;
        if start {
            queue.start();
        }
        start
    };
    loop {
        if start {
            spawn_groups::<G>(store);
        }
        match tokio::time::timeout(grouped.stall, &mut answer).await {
            Ok(answer) => return answer.ok(),
            Err(_) => {
                let mut queue = grouped.queue();
                start = !queue.waiting.is_empty() && queue.may_start(grouped.stall);
                if start {
                    queue.start();
                }
            }
        }
    }
}

/// Starts a task running `store`'s waiting requests of kind `G`, counted as
/// running already; without a runtime to run it on, every waiting caller
/// runs its own request.
fn spawn_groups<G: Group>(store: &G::Store) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(run_groups::<G>(store.clone()));
        }
        Err(_) => {
            let mut queue = G::grouped(store).queue();
            queue.running -= 1;
            queue.waiting.clear();
        }
    }
}

/// Runs the waiting requests, a group at a time, until none waits.
async fn run_groups<G: Group>(store: G::Store) {
    let grouped = G::grouped(&store);
    let mut running = Running(grouped, true);
    loop {
        let (reqs, replies): (Vec<G::Req>, Vec<oneshot::Sender<G::Ans>>) = {
            let mut queue = grouped.queue();
            // A caller gone before its group started asks for nothing.
            queue.waiting.retain(|(_, reply)| !reply.is_closed());
            if queue.waiting.is_empty() {
                queue.running -= 1;
                running.1 = false;
                return;
            }
            queue.started = Instant::now();
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

/// Uncounts [`run_groups`] if it ends without doing so (its task cancelled
/// as its runtime stops); when nothing else runs then, drops what still
/// waits (each of those callers then runs its request on its own).
struct Running<'a, Req, Ans>(&'a Grouped<Req, Ans>, bool);

impl<Req, Ans> Drop for Running<'_, Req, Ans> {
    fn drop(&mut self) {
        if !self.1 {
            return;
        }
        let mut queue = self.0.queue();
        queue.running -= 1;
        if queue.running == 0 {
            queue.waiting.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Answer;
    use crate::store::{DriverError, StoreError};

    #[test]
    fn a_failed_group_answers_its_own_error_alone_and_an_unknown_commit_to_every_caller() {
        let driver = |text: &str| DriverError(sqlx::Error::Protocol(text.into()));
        // A group of one: the request's own error, as it came.
        let [one] = <[_; 1]>::try_from(Answer::<()>::failed(
            1,
            StoreError::Busy(driver("busy")),
            "claims",
        ))
        .map_err(|_| "one answer")
        .expect("one answer");
        assert!(
            matches!(&one, Answer::Failed(StoreError::Busy(e)) if e.to_string().contains("busy")),
            "a lone request keeps its own error"
        );
        // A larger group whose commit may have happened: every caller is told
        // so, as each may hold what it never heard of.
        let unknown = Answer::<()>::failed(3, StoreError::CommitUnknown(driver("cut")), "claims");
        assert_eq!(unknown.len(), 3);
        assert!(
            unknown
                .iter()
                .all(|a| matches!(a, Answer::Failed(e) if e.is_commit_unknown())),
            "each caller learns that the commit is unknown"
        );
        // A larger group that wrote nothing: each request runs on its own.
        let alone = Answer::<()>::failed(3, StoreError::Unavailable(driver("gone")), "claims");
        assert_eq!(alone.len(), 3);
        assert!(alone.iter().all(|a| matches!(a, Answer::Alone)));
        assert!(Answer::result(alone.into_iter().next()).is_none());
        assert!(Answer::<()>::result(None).is_none(), "no answer: run alone");
    }
}
