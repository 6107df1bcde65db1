//! Turns at a SQLite file's write lock, for the drover processes that share
//! the file.
//!
//! SQLite lets one connection write at a time, and one that finds the lock
//! taken waits in its busy handler, which sleeps 1, 2, 5 … up to 100 ms
//! between tries. A busy process takes the lock again microseconds after each
//! of its commits, so a quiet process beside it kept missing the gap: its
//! heartbeat waited for seconds, past its session's TTL, and it lost its
//! session and its runs.
//!
//! So each store's writer also takes an exclusive `flock` on a file beside the
//! database (`<database>-lock`) for each write transaction. A process that
//! finds it taken waits for it in the kernel, on a thread of its own, and is
//! woken when the holder lets go: it gets a chance at every one of a busy
//! neighbour's commits instead of one every 100 ms.
//!
//! The lock is a courtesy among drover processes, never what keeps writes
//! apart: SQLite's own locks still do that. So another program writing the
//! file, a file system without `flock`, or the file deleted by hand cost
//! fairness and nothing else, and a process that waited [`PATIENCE`] for its
//! turn (a neighbour stopped inside a transaction) goes on to SQLite's busy
//! handler as before. Ending a transaction never needs the lock (a rollback
//! runs without it), so a process holding it waits only for transactions that
//! end by themselves.

use std::fs::{File, TryLockError};
use std::path::Path;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// How long a transaction waits for its turn before it goes on without it, to
/// wait in SQLite's busy handler alone. Longer than common transactions, so a
/// busy neighbour's back-to-back ones cannot starve the waiter (a quiet
/// process's turn came within 300 ms beside four busy writers); short,
/// because a neighbour stopped (`SIGSTOP`, Ctrl-Z) between taking its turn and
/// its `BEGIN`, or between its `COMMIT` and letting go, holds the turn but not
/// SQLite's lock: the first transaction of the others to meet it waits this
/// long, and the next ones not at all until it lets go (see
/// [`Asking::stalled`]).
pub(super) const PATIENCE: Duration = Duration::from_secs(1);

/// The lock file a store's writer takes its turns on.
#[derive(Debug)]
pub(super) struct Turns {
    file: Arc<File>,
    /// This store's turns one at a time. The writer's queue keeps its own
    /// transactions apart, but a caller's (`Store::begin`) holds its turn
    /// after leaving that queue, and every turn is on this one open file,
    /// where `flock` does not exclude: without this, a turn taken beside an
    /// open caller's transaction was the lock at once, and the first of them
    /// to end let go of it for both.
    local: Arc<tokio::sync::Mutex<()>>,
    /// Shared with the thread that waits for the lock, when one does.
    asking: Arc<Mutex<Asking>>,
    /// Asks the store's waiting thread, started at the first turn that had
    /// to wait, to wait for the lock (one thread for the store's life: a
    /// busy neighbour makes most turns wait, and a thread started for each
    /// cost a tenth of four nodes' throughput). It ends with the store.
    ask: OnceLock<mpsc::Sender<()>>,
}

/// What the waiting thread and the transaction waiting for it share.
#[derive(Debug, Default)]
struct Asking {
    /// A thread is blocked on the lock.
    waiting: bool,
    /// A transaction gave up waiting ([`PATIENCE`]) and the thread has not got
    /// the lock since: the holder is stalled (stopped, or its runtime stuck),
    /// so later transactions go straight to SQLite's busy handler instead of
    /// each waiting out its own patience (ten writes took 11 s behind one
    /// stopped neighbour). Patience is spent once per stall.
    stalled: bool,
    /// Where that thread says it got the lock; `None` once the transaction
    /// that asked stopped waiting, so the thread lets the lock go at once.
    answer: Option<oneshot::Sender<()>>,
}

/// One transaction's turn: the lock, let go when dropped.
#[derive(Debug)]
pub(super) struct Turn {
    /// `None` when the transaction went on without the lock.
    file: Option<Arc<File>>,
    /// [`Turns::local`], let go after the lock (dropped after `drop`).
    _local: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            unlock(&file);
        }
    }
}

impl Turns {
    /// Opens (creating it if missing) the lock file beside `database`, by its
    /// real path (so processes that name the file through a symbolic link or
    /// another relative path share one lock). `None`, logged, when it cannot
    /// be opened (a read-only directory): the store then writes on SQLite's
    /// busy handler alone, as it did before.
    pub(super) fn open(database: &Path) -> Option<Self> {
        let real = std::fs::canonicalize(database);
        let mut path = real.as_deref().unwrap_or(database).as_os_str().to_owned();
        path.push("-lock");
        // Read-only where the file is another user's: a lock needs no write.
        let opened = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .or_else(|_| File::open(&path));
        match opened {
            Ok(file) => Some(Self {
                file: Arc::new(file),
                local: Arc::default(),
                asking: Arc::default(),
                ask: OnceLock::new(),
            }),
            Err(e) => {
                tracing::warn!(
                    path = %Path::new(&path).display(),
                    error = %e,
                    "cannot open the SQLite writers' lock file: a busy process on this \
                     database may starve the others' writes"
                );
                None
            }
        }
    }

    /// Waits for this process's turn, at most [`PATIENCE`]. Called by one
    /// transaction at a time (under the writer's queue). Cancel-safe: a caller
    /// that stops waiting leaves the lock free.
    pub(super) async fn take(&self) -> Turn {
        // Behind this store's other turn, if one is held (a caller's open
        // transaction), for as long as it would wait for another process's.
        let local = tokio::time::timeout(PATIENCE, Arc::clone(&self.local).lock_owned()).await;
        let Ok(local) = local else {
            return Turn {
                file: None,
                _local: None,
            };
        };
        let mut turn = self.take_the_lock().await;
        turn._local = Some(local);
        turn
    }

    /// [`take`](Self::take) once this store holds no other turn.
    async fn take_the_lock(&self) -> Turn {
        let (waiting, stalled) = {
            let asking = self.asking.lock();
            (asking.waiting, asking.stalled)
        };
        if waiting && stalled {
            return Turn {
                file: None,
                _local: None,
            };
        }
        if !waiting {
            match self.file.try_lock() {
                Ok(()) => return self.held(),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    tracing::debug!(error = %e, "no turn on the SQLite writers' lock file");
                    return Turn {
                        file: None,
                        _local: None,
                    };
                }
            }
        }
        let (answer, got) = oneshot::channel();
        {
            let mut asking = self.asking.lock();
            asking.answer = Some(answer);
            if !asking.waiting {
                if let Err(e) = self.ask_the_thread() {
                    tracing::debug!(error = %e, "no thread to wait for a SQLite turn on");
                    asking.answer = None;
                    return Turn {
                        file: None,
                        _local: None,
                    };
                }
                asking.waiting = true;
                asking.stalled = false;
            }
        }
        let mut waiting = Waiting {
            got,
            turns: self,
            answered: false,
        };
        match tokio::time::timeout(PATIENCE, &mut waiting.got).await {
            Ok(Ok(())) => {
                waiting.answered = true;
                self.held()
            }
            // The thread could not take the lock: go on without it.
            Ok(Err(_)) => Turn {
                file: None,
                _local: None,
            },
            // PATIENCE ran out: go on without it (the drop of `waiting` lets go
            // of a lock got late), and so do the next transactions until the
            // thread gets it.
            Err(_) => {
                let mut asking = self.asking.lock();
                // Unless the thread got the lock just now (then the drop of
                // `waiting` lets it go, and nothing is stalled).
                asking.stalled = asking.waiting;
                Turn {
                    file: None,
                    _local: None,
                }
            }
        }
    }

    /// Asks the waiting thread to wait for the lock, starting it first if
    /// this is the store's first turn that waits.
    fn ask_the_thread(&self) -> std::io::Result<()> {
        let ask = match self.ask.get() {
            Some(ask) => ask,
            None => {
                let (ask, asked) = mpsc::channel();
                let (file, asking) = (Arc::clone(&self.file), Arc::clone(&self.asking));
                std::thread::Builder::new()
                    .name("drover-sqlite-turns".into())
                    .spawn(move || {
                        while asked.recv().is_ok() {
                            wait_for_the_lock(&file, &asking);
                        }
                    })?;
                self.ask.get_or_init(|| ask)
            }
        };
        ask.send(())
            .map_err(|_| std::io::Error::other("the waiting thread is gone"))
    }

    fn held(&self) -> Turn {
        Turn {
            file: Some(Arc::clone(&self.file)),
            _local: None,
        }
    }
}

/// One wait of the waiting thread: blocks on the lock, then hands it to the
/// transaction that asked, or lets it go when that transaction stopped
/// waiting.
fn wait_for_the_lock(file: &File, asking: &Mutex<Asking>) {
    let locked = file.lock();
    let mut asking = asking.lock();
    asking.waiting = false;
    asking.stalled = false;
    let answer = asking.answer.take();
    match locked {
        Ok(()) => {
            // Sent under `asking`'s lock: a transaction that stops waiting
            // either took the answer away first, or finds it sent.
            if answer.is_none_or(|answer| answer.send(()).is_err()) {
                unlock(file);
            }
        }
        Err(e) => tracing::debug!(error = %e, "waiting for a SQLite turn failed"),
    }
}

/// A transaction waiting for the thread's answer. Dropped unanswered (its
/// caller stopped waiting, or it went on without the lock), it makes sure
/// the lock does not stay taken with no transaction to let it go.
struct Waiting<'a> {
    got: oneshot::Receiver<()>,
    turns: &'a Turns,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // Taken away under `asking`'s lock: the thread, which answers under
        // it, either finds no one to answer and lets the lock go itself, or
        // has already sent the answer, read here.
        self.turns.asking.lock().answer = None;
        self.got.close();
        if self.got.try_recv().is_ok() {
            unlock(&self.turns.file);
        }
    }
}

/// Lets go of the lock; a failure is logged (the kernel lets go when the file
/// is closed, at the latest).
fn unlock(file: &File) {
    if let Err(e) = file.unlock() {
        tracing::debug!(error = %e, "letting go of a SQLite turn failed");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Two stores' turns on one database (two opens of the lock file, as two
    /// processes have), and the database's path.
    fn two() -> (tempfile::TempDir, Turns, Turns, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("d.db");
        let a = Turns::open(&db).expect("a's lock file");
        let b = Turns::open(&db).expect("b's lock file");
        (dir, a, b, db)
    }

    /// Whether a third process could take the lock now (and lets it go).
    fn free(db: &std::path::Path) -> bool {
        let mut path = db.as_os_str().to_owned();
        path.push("-lock");
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .expect("the lock file");
        file.try_lock().is_ok()
    }

    /// Waits (up to 10 s) until the lock is free: the waiting thread lets
    /// go of a lock no one waits for any more on its own time.
    async fn until_free(db: &std::path::Path) {
        for _ in 0..1000 {
            if free(db) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the lock stayed taken with no turn holding it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_process_gets_its_turn_when_the_holder_lets_go() {
        let (_dir, a, b, db) = two();
        let held = a.take().await;
        assert!(held.file.is_some(), "an uncontended turn is the lock");
        assert!(!free(&db));
        let b = Arc::new(b);
        let waiting = tokio::spawn({
            let b = Arc::clone(&b);
            async move { b.take().await }
        });
        // Still waiting while `a` holds its turn.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "b's turn came while a held its own");
        drop(held);
        let turn = waiting.await.expect("b's task");
        assert!(turn.file.is_some(), "b went on without the lock");
        assert!(!free(&db), "b's turn is not the lock");
        drop(turn);
        assert!(free(&db), "b's turn kept the lock when dropped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_that_stops_waiting_leaves_the_lock_free() {
        let (_dir, a, b, db) = two();
        let held = a.take().await;
        let gave_up = tokio::time::timeout(Duration::from_millis(50), b.take()).await;
        assert!(gave_up.is_err(), "b's turn came while a held its own");
        drop(held);
        until_free(&db).await;
        // And b's next transaction gets its turn, on the thread still there
        // or on the lock at once.
        let turn = b.take().await;
        assert!(turn.file.is_some());
        assert!(!free(&db));
    }

    /// Behind a neighbour that holds its turn and stays stalled, only the
    /// first transaction waits out its patience; the next go straight on
    /// (SQLite's busy handler then decides). Before, each waited its own
    /// second, and ten writes took eleven.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn patience_is_spent_once_per_stalled_neighbour() {
        let (_dir, a, b, db) = two();
        let held = a.take().await;
        assert!(b.take().await.file.is_none(), "b holds a lock a holds");
        let started = std::time::Instant::now();
        for _ in 0..5 {
            assert!(b.take().await.file.is_none());
        }
        assert!(
            started.elapsed() < PATIENCE / 2,
            "five transactions behind a stalled turn waited {:?}",
            started.elapsed()
        );
        drop(held);
        until_free(&db).await;
        // The waiting thread b asked (and left stalled) wakes when a lets go,
        // and may take the lock after `until_free` saw it free: b's turns are
        // the lock again once that wait is over.
        for _ in 0..1000 {
            if !b.asking.lock().waiting {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let turn = b.take().await;
        assert!(
            turn.file.is_some(),
            "once a let go, b's turns are the lock again"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_turn_not_had_within_the_patience_goes_on_without_the_lock() {
        let (_dir, a, b, db) = two();
        let held = a.take().await;
        let started = std::time::Instant::now();
        let turn = b.take().await;
        assert!(turn.file.is_none(), "b holds a lock a holds");
        assert!(started.elapsed() >= PATIENCE);
        drop(turn);
        drop(held);
        // The thread that went on waiting takes the lock for no one and lets
        // it go.
        until_free(&db).await;
    }
}
