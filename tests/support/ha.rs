//! A highly available PostgreSQL for failover tests: a primary and a streaming
//! standby built from the installed binaries (`initdb`, `pg_basebackup -R`,
//! `pg_ctl`), on free ports, with their data folders in a temporary directory,
//! stopped and removed on drop. Replication is synchronous or asynchronous;
//! the test promotes the standby after killing the primary or making it
//! read-only (a demoted writer whose open connections stay).
//!
//! Run as root, every binary runs as the `postgres` user (`runuser`). Tests
//! using it run when `DROVER_TEST_POSTGRES_URL` is set (as every PostgreSQL
//! test) and then fail loudly if the binaries are missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sqlx::{Connection as _, PgConnection};

/// Where the PostgreSQL binaries are, unless `DROVER_TEST_PG_BIN` says.
const BIN: &str = "/usr/lib/postgresql/15/bin";

/// How the standby replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replication {
    /// The primary acknowledges a commit once the standby has it
    /// (`synchronous_standby_names`, `synchronous_commit = on`).
    Sync,
    /// The primary acknowledges at once; the standby follows behind.
    Async,
}

/// A primary and its standby.
#[derive(Debug)]
pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The primary's port.
    pub(crate) primary: u16,
    /// The standby's port.
    pub(crate) standby: u16,
}

/// The cluster, or `None` (with the reason printed) when PostgreSQL tests are
/// not asked for.
pub(crate) fn cluster(replication: Replication) -> Option<Cluster> {
    if std::env::var_os(super::POSTGRES_ENV).is_none() {
        eprintln!(
            "skipped: {} is not set (failover tests build their own primary and standby)",
            super::POSTGRES_ENV
        );
        return None;
    }
    Some(Cluster::start(replication))
}

impl Cluster {
    /// Builds and starts both servers and waits until the standby streams
    /// (and, synchronous, is the synchronous standby).
    pub(crate) fn start(replication: Replication) -> Self {
        let bin = std::env::var_os("DROVER_TEST_PG_BIN")
            .map_or_else(|| PathBuf::from(BIN), PathBuf::from);
        assert!(
            bin.join("initdb").exists(),
            "{} has no initdb: install PostgreSQL 15's server binaries or set DROVER_TEST_PG_BIN",
            bin.display()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let cluster = Self {
            dir,
            bin,
            primary: free_port(),
            standby: free_port(),
        };
        if is_root() {
            run(Command::new("chown")
                .arg("postgres")
                .arg(cluster.dir.path()));
        }
        let primary = cluster.data("primary");
        cluster.pg(
            "initdb",
            &["-D", s(&primary), "-U", "postgres", "--auth=trust", "-N"],
        );
        let sync = match replication {
            Replication::Sync => "synchronous_standby_names = 'standby'\n",
            Replication::Async => "",
        };
        cluster.append(
            &primary.join("postgresql.conf"),
            &format!(
                "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 5\nfsync = off\nfull_page_writes = off\n\
                 max_connections = 60\n{sync}",
                cluster.primary,
                cluster.dir.path().display()
            ),
        );
        cluster.ctl(&[
            "start",
            "-w",
            "-t",
            START_WAIT_S,
            "-D",
            s(&primary),
            "-l",
            s(&cluster.log("primary")),
        ]);
        let standby = cluster.data("standby");
        cluster.pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &cluster.primary.to_string(),
                "-U",
                "postgres",
                "-D",
                s(&standby),
                "-R",
                "-X",
                "stream",
            ],
        );
        cluster.append(
            &standby.join("postgresql.conf"),
            // Promoted, it has no standby of its own to wait for (the
            // primary's setting came with the base backup).
            &format!(
                "port = {}\ncluster_name = 'standby'\nsynchronous_standby_names = ''\n",
                cluster.standby
            ),
        );
        cluster.ctl(&[
            "start",
            "-w",
            "-t",
            START_WAIT_S,
            "-D",
            s(&standby),
            "-l",
            s(&cluster.log("standby")),
        ]);
        cluster
    }

    /// Waits (in `tokio`) until the primary sees its standby streaming, in
    /// the expected mode.
    pub(crate) async fn wait_streaming(&self, replication: Replication) {
        let wanted = match replication {
            Replication::Sync => "sync",
            Replication::Async => "async",
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = PgConnection::connect(&self.url(self.primary))
            .await
            .expect("primary");
        loop {
            let state: Option<String> = sqlx::query_scalar(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'",
            )
            .fetch_optional(&mut conn)
            .await
            .expect("pg_stat_replication");
            if state.as_deref() == Some(wanted) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "standby not streaming ({state:?}) within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A URL reaching the server on `port`.
    pub(crate) fn url(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    /// A multi-host URL naming the primary, then the standby.
    pub(crate) fn multi_host_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
            self.primary, self.standby
        )
    }

    /// Stops the primary at once, as a crash would (every connection cut).
    pub(crate) fn kill_primary(&self) {
        self.ctl(&["stop", "-m", "immediate", "-D", s(&self.data("primary"))]);
    }

    /// Leaves the primary running but read-only for every session, its open
    /// connections included: what a demoted writer looks like while a name
    /// or an address moves to the new primary.
    pub(crate) async fn make_primary_read_only(&self) {
        let mut conn = PgConnection::connect(&self.url(self.primary))
            .await
            .expect("primary");
        sqlx::query("ALTER SYSTEM SET default_transaction_read_only = on")
            .execute(&mut conn)
            .await
            .expect("alter system");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await
            .expect("reload");
        conn.close().await.ok();
    }

    /// Waits until the standby has replayed everything the primary has
    /// written so far.
    pub(crate) async fn wait_replayed(&self) {
        let mut primary = PgConnection::connect(&self.url(self.primary))
            .await
            .expect("primary");
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut primary)
            .await
            .expect("pg_current_wal_lsn");
        primary.close().await.ok();
        let mut standby = PgConnection::connect(&self.url(self.standby))
            .await
            .expect("standby");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let replayed: bool =
                sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
                    .bind(&written)
                    .fetch_one(&mut standby)
                    .await
                    .expect("pg_last_wal_replay_lsn");
            if replayed {
                break;
            }
            assert!(Instant::now() < deadline, "standby behind for 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        standby.close().await.ok();
    }

    /// Cuts the standby off its primary (its WAL receiver stops; both servers
    /// stay up): what the primary commits from now on never reaches it, as a
    /// commit inside the replication lag of an asynchronous standby. Returns
    /// once the primary no longer sees it.
    pub(crate) async fn disconnect_standby(&self) {
        let mut standby = PgConnection::connect(&self.url(self.standby))
            .await
            .expect("standby");
        for sql in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::query(sql)
                .execute(&mut standby)
                .await
                .expect("standby settings");
        }
        standby.close().await.ok();
        let mut primary = PgConnection::connect(&self.url(self.primary))
            .await
            .expect("primary");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let senders: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_replication")
                .fetch_one(&mut primary)
                .await
                .expect("pg_stat_replication");
            if senders == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "standby still connected after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        primary.close().await.ok();
    }

    /// Promotes the standby and waits until it accepts writes.
    pub(crate) fn promote(&self) {
        self.ctl(&["promote", "-w", "-D", s(&self.data("standby"))]);
    }

    /// Stops the primary's server and every one of its backends with
    /// SIGSTOP, as a frozen virtual machine: its sockets stay open and its
    /// kernel keeps acknowledging what is sent, so nothing fails by itself.
    /// It runs again when the guard is dropped.
    pub(crate) fn freeze_primary(&self) -> Frozen {
        let pid_file = std::fs::read_to_string(self.data("primary").join("postmaster.pid"))
            .expect("the primary's postmaster.pid");
        let postmaster = pid_file.lines().next().expect("a pid").trim().to_owned();
        let mut pids = vec![postmaster.clone()];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid …; comm may hold spaces, so read past it.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            if after.split_whitespace().nth(1) == Some(postmaster.as_str()) {
                pids.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        let frozen = Frozen(pids);
        frozen.signal("STOP");
        frozen
    }

    fn data(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    fn ctl(&self, args: &[&str]) {
        self.pg("pg_ctl", args);
    }

    /// Runs one binary (as `postgres` when root), failing with its output.
    fn pg(&self, name: &str, args: &[&str]) {
        let program = self.bin.join(name);
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.args(args).current_dir(self.dir.path());
        run(&mut command);
    }

    /// Appends `text` to a file the `postgres` user owns.
    fn append(&self, file: &Path, text: &str) {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(file)
            .expect("open conf");
        f.write_all(text.as_bytes()).expect("write conf");
    }
}

/// A server stopped by [`Cluster::freeze_primary`]: its processes, which
/// run again when this is dropped.
pub(crate) struct Frozen(Vec<String>);

impl Frozen {
    fn signal(&self, signal: &str) {
        Command::new("kill")
            .arg(format!("-{signal}"))
            .args(&self.0)
            .output()
            .expect("kill");
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.signal("CONT");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for name in ["standby", "primary"] {
            let data = self.data(name);
            if data.join("postmaster.pid").exists() {
                let mut command = if is_root() {
                    let mut c = Command::new("runuser");
                    c.args(["-u", "postgres", "--"])
                        .arg(self.bin.join("pg_ctl"));
                    c
                } else {
                    Command::new(self.bin.join("pg_ctl"))
                };
                command
                    .args(["stop", "-m", "immediate", "-D"])
                    .arg(&data)
                    .output()
                    .ok();
            }
        }
    }
}

/// How long `pg_ctl start` waits for a server to accept connections, in
/// seconds: its default of 60 ran out once on a machine busy with a build and
/// a copy of a large directory (the primary's first start replays nothing, so
/// only a starved machine takes that long).
const START_WAIT_S: &str = "300";

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

fn run(command: &mut Command) -> Output {
    let out = command.output().expect("run a PostgreSQL binary");
    assert!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn is_root() -> bool {
    // The effective user's id, without a libc dependency.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
