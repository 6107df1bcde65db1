//! Forcing an interleaving on PostgreSQL: a test transaction holds a lock, the
//! operations under test queue behind it in a known order, then it commits.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};

/// A test transaction that holds row locks, and its backend's pid.
#[derive(Debug)]
pub(crate) struct Holder {
    /// The open transaction; commit or drop it to let the waiters go.
    pub(crate) tx: Transaction<'static, Postgres>,
    pid: i32,
}

impl Holder {
    /// Opens a transaction on `pool` and runs `lock` (a `SELECT … FOR UPDATE`)
    /// in it with `id` bound as `$1`.
    pub(crate) async fn lock(pool: &PgPool, lock: &'static str, id: i64) -> Self {
        let mut holder = Self::begin(pool).await;
        sqlx::query(lock)
            .bind(id)
            .execute(&mut *holder.tx)
            .await
            .expect("the holder takes its lock");
        holder
    }

    /// Opens a transaction on `pool` that holds `table` in `ACCESS EXCLUSIVE`
    /// mode: every statement that reads or writes the table waits for it.
    pub(crate) async fn lock_table(pool: &PgPool, table: &'static str) -> Self {
        let mut holder = Self::begin(pool).await;
        let lock = format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE");
        sqlx::query(sqlx::AssertSqlSafe(lock))
            .execute(&mut *holder.tx)
            .await
            .expect("the holder locks the table");
        holder
    }

    /// An open transaction on `pool`, holding nothing yet.
    async fn begin(pool: &PgPool) -> Self {
        let mut tx = pool.begin().await.expect("begin the holder");
        let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .expect("the holder's pid");
        Self { tx, pid }
    }

    /// Returns once `n` backends wait, directly or behind another waiter, for
    /// this holder's locks. Polls `pg_blocking_pids`: PostgreSQL offers no
    /// notification for "a backend started waiting".
    pub(crate) async fn wait_for_waiters(&self, pool: &PgPool, n: i64) {
        const WAITERS: &str = "
            WITH RECURSIVE w(pid) AS (
              SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))
              UNION
              SELECT a.pid FROM pg_stat_activity a JOIN w ON w.pid = ANY(pg_blocking_pids(a.pid)))
            SELECT count(*) FROM w";
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let waiting: i64 = sqlx::query_scalar(WAITERS)
                    .bind(self.pid)
                    .fetch_one(pool)
                    .await
                    .expect("pg_blocking_pids");
                if waiting >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} waiters never queued behind the holder"));
    }

    /// Returns once a backend waits for this holder's locks in a statement
    /// whose text contains `text` (PostgreSQL shows a waiter's top-level
    /// statement, not the function call inside it that waits).
    pub(crate) async fn wait_for_a_waiter_running(&self, pool: &PgPool, text: &str) {
        const RUNNING: &str = "
            SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                           WHERE $1 = ANY(pg_blocking_pids(pid)) AND strpos(query, $2) > 0)";
        tokio::time::timeout(Duration::from_secs(10), async {
            while !sqlx::query_scalar::<_, bool>(RUNNING)
                .bind(self.pid)
                .bind(text)
                .fetch_one(pool)
                .await
                .expect("pg_blocking_pids")
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no statement containing {text:?} waited for the holder"));
    }

    /// Commits, letting the waiters go in the order they queued.
    pub(crate) async fn release(self) {
        self.tx.commit().await.expect("the holder commits");
    }
}

/// Holds `drover_items` in SHARE mode (no row of it may change, so every
/// claim waits) on a connection of `url` for `held`, from a task of its
/// own, which ends once it has let go.
pub(crate) async fn items_held_for(url: &str, held: Duration) -> tokio::task::JoinHandle<()> {
    let pool = PgPool::connect(url).await.expect("the holder's pool");
    let mut tx = pool.begin().await.expect("begin the holder");
    sqlx::query("LOCK TABLE drover_items IN SHARE MODE")
        .execute(&mut *tx)
        .await
        .expect("the holder locks the items");
    tokio::spawn(async move {
        tokio::time::sleep(held).await;
        tx.commit().await.expect("the holder commits");
        pool.close().await;
    })
}

/// A lock that makes a store operation wait, on either engine: on PostgreSQL a
/// [`Holder`] of one row, on SQLite the write lock (`BEGIN IMMEDIATE` on a
/// connection of the test's own), which every writer waits for.
#[derive(Debug)]
pub(crate) enum Blocker {
    /// A held row and the pool to watch its waiters from.
    Postgres(Holder, PgPool),
    /// A held write lock, and the name of the thread whose wait for it
    /// [`wait_for_a_waiter`](Self::wait_for_a_waiter) watches.
    Sqlite(Transaction<'static, sqlx::Sqlite>, String),
}

impl Blocker {
    /// Takes the lock: on PostgreSQL `pg_lock` with `id` bound as `$1`.
    pub(crate) async fn hold(db: &super::TestDb, pg_lock: &'static str, id: i64) -> Self {
        if db.engine == "postgres" {
            // A pool of the test's own, straight to the server (the
            // store's may go through a transaction-pooling PgBouncer).
            let pool = PgPool::connect(&db.sql_url).await.expect("connect");
            Self::Postgres(Holder::lock(&pool, pg_lock, id).await, pool)
        } else {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            let tx = pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .expect("write lock");
            Self::Sqlite(tx, db.sqlite_writer_thread())
        }
    }

    /// Returns once an operation waits for the lock: on SQLite, once the
    /// database's writer thread sleeps in SQLite's busy handler (see
    /// [`wait_for_sqlite_writers`]).
    pub(crate) async fn wait_for_a_waiter(&self) {
        match self {
            Self::Postgres(holder, pool) => holder.wait_for_waiters(pool, 1).await,
            Self::Sqlite(_, thread) => wait_for_sqlite_writers(thread, 1).await,
        }
    }

    /// Lets the waiter go.
    pub(crate) async fn release(self) {
        match self {
            Self::Postgres(holder, _) => holder.release().await,
            Self::Sqlite(tx, _) => tx.commit().await.expect("release the write lock"),
        }
    }
}

/// Returns once `n` threads named `thread` (a SQLite store's writer, see
/// [`TestDb::sqlite_writer_thread`](super::TestDb::sqlite_writer_thread))
/// sleep at once. SQLite tells no one that a connection waits for its write
/// lock: the waiting connection's busy handler sleeps and tries again, on the
/// thread sqlx runs that connection on, and a writer's thread sleeps for
/// nothing else (an idle one waits on a futex for its next command). So on
/// Linux the wait is seen in `/proc`: the thread's current system call is a
/// `nanosleep`. Elsewhere (another OS or CPU) this only
/// yields, and says so.
pub(crate) async fn wait_for_sqlite_writers(thread: &str, n: usize) {
    wait_for_writers_in("/proc/self/task", thread, n).await;
}

/// [`wait_for_sqlite_writers`] in another process, `pid` (a `drover` the
/// test started: its SQLite writer thread is `drover-w`).
pub(crate) async fn wait_for_sqlite_writers_of(pid: u32, thread: &str, n: usize) {
    wait_for_writers_in(&format!("/proc/{pid}/task"), thread, n).await;
}

/// Returns once `n` threads named `thread` of the process whose tasks are
/// listed in `tasks` sleep at once.
async fn wait_for_writers_in(tasks: &str, thread: &str, n: usize) {
    let seen = cfg!(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ));
    if !seen {
        eprintln!(
            "cannot see a SQLite writer wait here (Linux on x86-64 or ARM64 only): the test only yields"
        );
        tokio::task::yield_now().await;
        return;
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        while sleeping_threads(tasks, thread) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} writers named {thread} never waited for the write lock"));
}

/// How many of the threads listed in `tasks` (`/proc/PID/task`) named
/// `name` are in a sleep system call right now.
fn sleeping_threads(tasks: &str, name: &str) -> usize {
    // nanosleep and clock_nanosleep (glibc's usleep uses either).
    #[cfg(target_arch = "x86_64")]
    const SLEEPS: [&str; 2] = ["35", "230"];
    #[cfg(target_arch = "aarch64")]
    const SLEEPS: [&str; 2] = ["101", "115"];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const SLEEPS: [&str; 0] = [];
    let Ok(tasks) = std::fs::read_dir(tasks) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            comm.trim_end() == name
        })
        .filter(|task| {
            let call = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
            let number = call.split_whitespace().next().unwrap_or_default();
            SLEEPS.contains(&number)
        })
        .count()
}
