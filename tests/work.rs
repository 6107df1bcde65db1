//! `drover work --exec` as a user runs it: worker processes (spawned from the
//! built binary) on both engines, killed, stopped and raced against each other.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover::store::{
    ItemEnqueue, ItemGet, ItemState, Run, RunList, RunOutcome, Store, StoreEngine as _,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::process::{eventually, signal, stop};
use support::{TestDb, each_engine};
use tokio::process::Child;

const PROCESS: &str = "jobs";

/// Starts `drover work` on `db` with `exec` and extra flags.
fn worker(db: &TestDb, exec: &str, flags: &[&str]) -> Child {
    support::cli::worker(&db.url, PROCESS, exec, flags)
}

async fn enqueue(store: &Store, keys: &[String]) {
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, keys.iter().cloned()))
        .await
        .unwrap();
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key-{i:02}")).collect()
}

/// (pending + backoff, running, parked) of the process.
async fn counts(store: &Store) -> (u64, u64, u64) {
    let all = store.process_counts_all().await.unwrap();
    all.iter()
        .find(|c| c.process == PROCESS)
        .map_or((0, 0, 0), |c| (c.pending + c.backoff, c.running, c.parked))
}

/// The process's runs (up to 10,000), newest first.
async fn all_runs(store: &Store) -> Vec<Run> {
    store
        .run_list(RunList {
            process: Some(PROCESS.into()),
            limit: 10_000,
            ..RunList::default()
        })
        .await
        .unwrap()
}

/// The process's runs that ended with `outcome`, newest first.
async fn events(store: &Store, outcome: RunOutcome) -> Vec<Run> {
    let mut all = all_runs(store).await;
    all.retain(|e| e.outcome == outcome);
    all
}

fn log_path(db: &TestDb) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drover-work-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{}.log", db.engine, rand::random::<u32>()))
}

fn read_log(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// A program `--exec` cannot run (missing from `PATH`, a path to nothing, a
/// file without its executable bit) fails `drover work` at once with one
/// line, before the database is opened: every run of every key failed to
/// start instead, retried with backoff for good, the reason only in the runs'
/// history.
#[tokio::test]
async fn a_program_that_cannot_run_is_refused_as_the_worker_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("drover.db");
    let url = format!("sqlite://{}", db.display());
    let plain = dir.path().join("plain.sh");
    std::fs::write(&plain, "exit 0\n").expect("a script without its x bit");
    let plain = plain.display().to_string();
    for (exec, needle) in [
        ("drover-no-such-program --flag", "no such program on PATH"),
        ("/nonexistent/drover-no-such-program", "no such file"),
        (plain.as_str(), "not executable"),
    ] {
        let run = support::cli::work_command(["jobs", "--exec", exec, "--db", &url])
            .stderr(std::process::Stdio::piped())
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .unwrap_or_else(|_| panic!("{exec}: the worker started instead of refusing"))
            .expect("drover work");
        support::cli::fails_with(&out, needle);
        assert!(!db.exists(), "{exec}: the database was opened");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_decide_done_retry_and_park() {
    each_engine(|db| async move {
        let script = r#"case "$1" in
            ok) exit 0 ;;
            flaky) [ "$DROVER_ATTEMPT" -ge 2 ] && exit 0; echo "try again" >&2; exit 75 ;;
            *) echo "bad manifest for $DROVER_KEY in $DROVER_PROCESS" >&2; exit 3 ;;
        esac"#;
        let exec = format!("sh -c '{script}' sh");
        let child = worker(
            &db,
            &exec,
            &["--backoff-initial", "50ms", "--backoff-max", "50ms"],
        );
        enqueue(&db.store, &["ok".into(), "flaky".into(), "broken".into()]).await;
        eventually("ok and flaky done, broken parked", || async {
            counts(&db.store).await == (0, 0, 1)
        })
        .await;
        stop(child).await;

        let failed = events(&db.store, RunOutcome::Retry).await;
        let flaky: Vec<_> = failed.iter().filter(|e| e.key == "flaky").collect();
        assert_eq!(flaky.len(), 1);
        assert!(flaky[0].failed());
        assert_eq!(flaky[0].error.as_deref(), Some("exit 75: try again"));
        let broken = db
            .store
            .item_get(ItemGet {
                process: PROCESS.into(),
                key: "broken".into(),
                runs_limit: 10,
            })
            .await
            .unwrap()
            .expect("parked item");
        assert_eq!(broken.item.state, ItemState::Parked);
        assert_eq!(
            broken.item.last_error.as_deref(),
            Some("exit 3: bad manifest for broken in jobs")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_writing_invalid_utf8_and_nul_to_stderr_is_parked_with_readable_text_and_its_batch_mates_land()
 {
    each_engine(|db| async move {
        // Every key starts at once, so their outcomes are completed together.
        let script = r#"[ "$1" = bad ] || exit 0
            printf "before\377" >&2; head -c 1 /dev/zero >&2; printf "after\n" >&2
            echo "the rest is read too" >&2; exit 1"#;
        let exec = format!("sh -c '{script}' sh");
        let mut keys = keys(7);
        keys.push("bad".into());
        let child = worker(&db, &exec, &["--parallelism", "8"]);
        enqueue(&db.store, &keys).await;
        eventually("seven done and bad parked", || async {
            counts(&db.store).await == (0, 0, 1)
        })
        .await;
        stop(child).await;
        let bad = db
            .store
            .item_get(ItemGet {
                process: PROCESS.into(),
                key: "bad".into(),
                runs_limit: 10,
            })
            .await
            .unwrap()
            .expect("parked item");
        assert_eq!(bad.item.state, ItemState::Parked);
        assert_eq!(
            bad.item.last_error.as_deref(),
            Some("exit 1: before\u{FFFD}\u{FFFD}after | the rest is read too")
        );
        let finished = events(&db.store, RunOutcome::Done).await;
        assert_eq!(finished.len(), 7, "every batch-mate landed: {finished:?}");
    })
    .await;
}

/// A command whose work is a tool it starts (as a script runs `terraform`
/// or `curl`): it logs its own pid, then the tool's, and waits for the tool.
fn command_with_a_tool(log: &Path) -> String {
    format!(
        r#"sh -c 'echo start $1 $$ >> {0}; sleep 60 & echo tool $1 $! >> {0}; wait' sh"#,
        log.display()
    )
}

/// The pids in `log`'s lines (a command's and its tool's).
fn logged_pids(log: &Path) -> Vec<i32> {
    read_log(log)
        .iter()
        .map(|l| l[2].parse().unwrap())
        .collect()
}

/// What still runs of `pid`: `None` once it is gone or a zombie (a zombie
/// runs nothing; it waits for init, or a container's first process, to
/// reap it, which may take seconds), else its state, parent and name as
/// `/proc` shows them.
fn running(pid: i32) -> Option<String> {
    kill(Pid::from_raw(pid), None).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid …: comm may hold spaces, so split after its ')'.
    let (comm, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?;
    (state != "Z").then(|| format!("{pid} {state} parent {parent} {comm})"))
}

/// Waits (at most 30 s) until none of `pids` runs any more; on timeout says
/// which still run, in what state, under which parent.
async fn all_die(what: &str, pids: &[i32]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = pids.iter().filter_map(|pid| running(*pid)).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what} to die; still running: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The worker's commands die with it, and so do the tools they started:
/// the kernel kills each command (`PR_SET_PDEATHSIG`), the worker's keeper
/// the rest of its process group. Before the keeper, a tool outlived the
/// killed worker, and once the TTL passed another worker ran its key beside
/// it. Judged from the pids the commands and tools logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_takes_its_commands_down_and_its_keys_run_elsewhere_after_the_ttl()
 {
    each_engine(|db| async move {
        let log = log_path(&db);
        let hold = command_with_a_tool(&log);
        let doomed = worker(&db, &hold, &["--parallelism", "3", "--ttl", "1s"]);
        let all = keys(3);
        enqueue(&db.store, &all).await;
        eventually("three commands and their tools running", || async {
            read_log(&log).len() == 6
        })
        .await;
        signal(&doomed, Signal::SIGKILL);

        let pids = logged_pids(&log);
        all_die("the dead worker's commands and their tools", &pids).await;
        let quick = format!(
            r#"sh -c 'echo start $1 $$ >> {0}; echo end $1 $$ >> {0}' sh"#,
            log.display()
        );
        let heir = worker(&db, &quick, &["--parallelism", "3"]);
        eventually("every key run again", || async {
            counts(&db.store).await == (0, 0, 0)
        })
        .await;
        stop(heir).await;

        let lines = read_log(&log);
        assert_eq!(
            lines.len(),
            12,
            "3 killed runs with their tools, then 3 complete runs: {lines:?}"
        );
        assert!(
            lines[6..]
                .iter()
                .all(|l| !pids.contains(&l[2].parse().unwrap()))
        );
        let expired = events(&db.store, RunOutcome::Expired).await;
        assert_eq!(expired.len(), 3, "the dead session's leases were reclaimed");
        assert_eq!(events(&db.store, RunOutcome::Done).await.len(), 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_with_parallelism_four_never_run_a_key_twice_at_once() {
    each_engine(|db| async move {
        let log = log_path(&db);
        let exec = format!(
            r#"sh -c 'echo s $1 $(date +%s%N) >> {0}; sleep 0.05; echo e $1 $(date +%s%N) >> {0}' sh"#,
            log.display()
        );
        let workers: Vec<_> = (0..3).map(|_| worker(&db, &exec, &["--parallelism", "4"])).collect();
        let all = keys(12);
        for _ in 0..4 {
            enqueue(&db.store, &all).await;
            eventually("some runs", || async { !read_log(&log).is_empty() }).await;
        }
        eventually("all work done", || async { counts(&db.store).await == (0, 0, 0) }).await;
        for w in workers {
            stop(w).await;
        }

        let mut runs: HashMap<String, Vec<(char, u128)>> = HashMap::new();
        for line in read_log(&log) {
            let kind = line[0].chars().next().unwrap();
            runs.entry(line[1].clone()).or_default().push((kind, line[2].parse().unwrap()));
        }
        assert_eq!(runs.len(), all.len(), "every key ran");
        for (key, mut marks) in runs {
            marks.sort_by_key(|(_, at)| *at);
            for pair in marks.chunks(2) {
                assert!(
                    matches!(pair, [('s', _), ('e', _)]),
                    "{key}: a run started before the previous one ended: {marks:?}"
                );
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_work_releases_the_running_keys_for_the_next_start() {
    each_engine(|db| async move {
        let first = worker(
            &db,
            "sh -c 'exec sleep 60' sh",
            &["--parallelism", "2", "--shutdown-deadline", "200ms"],
        );
        let all = keys(4);
        enqueue(&db.store, &all).await;
        eventually("two keys running", || async {
            counts(&db.store).await.1 == 2
        })
        .await;
        stop(first).await;
        assert_eq!(
            counts(&db.store).await,
            (4, 0, 0),
            "nothing lost, nothing running"
        );
        assert_eq!(events(&db.store, RunOutcome::Canceled).await.len(), 2);

        let second = worker(&db, "true", &["--parallelism", "2"]);
        eventually("the released keys done", || async {
            counts(&db.store).await == (0, 0, 0)
        })
        .await;
        stop(second).await;
        assert_eq!(events(&db.store, RunOutcome::Done).await.len(), 4);
    })
    .await;
}

/// A worker whose output nobody reads any more (`drover work … 2>&1 | tee
/// log`, and `tee` died) finishes its keys and stops on SIGTERM. Its
/// commands' stderr lines are relayed to its stderr, where a write into the
/// closed pipe panicked: every run whose command wrote a line failed (each
/// key retried for ever), and the signal task died before it started the
/// shutdown (SIGTERM then stopped nothing). Its commands inherited its
/// stdout, where an `echo` died of SIGPIPE: a death by a signal is
/// transient, and the key was retried for ever too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_readers_have_gone_finishes_its_keys_and_stops_on_sigterm() {
    each_engine(|db| async move {
        let exec = "sh -c 'echo out $DROVER_KEY; echo err $DROVER_KEY >&2' sh";
        let args = [PROCESS, "--db", &db.url, "--exec", exec];
        let mut child = support::cli::work_command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn drover work");
        drop(child.stdout.take().expect("stdout"));
        drop(child.stderr.take().expect("stderr"));
        enqueue(&db.store, &keys(3)).await;
        eventually("the keys done", || async {
            counts(&db.store).await == (0, 0, 0)
        })
        .await;
        stop(child).await;
        let runs = all_runs(&db.store).await;
        assert_eq!(runs.len(), 3, "one run per key: {runs:?}");
        assert!(
            runs.iter().all(|r| r.outcome == RunOutcome::Done),
            "{runs:?}"
        );
    })
    .await;
}

/// A worker whose stderr is not read (a journal that is throttling, a pipe
/// into a pager nobody scrolls) keeps working: its lines wait for no one.
/// Its commands write 200 KB each to stderr, which the worker relays; the
/// pipe holds 64 KB. The relay wrote on the runtime's threads, which blocked
/// on the full pipe and stopped everything on them, the heartbeat and the
/// timer that kills commands before the session lapses included; no key
/// was done. Now lines the stream cannot take are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_stderr_is_not_read_keeps_working() {
    let (db, _dir) = support::sqlite().await;
    let exec = "sh -c 'head -c 200000 /dev/zero | tr \"\\0\" x | fold -w 100 >&2' sh";
    let args = [PROCESS, "--db", &db.url, "--exec", exec, "--ttl", "1s"];
    let mut child = support::cli::work_command(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn drover work");
    // Held open, never read.
    let unread = child.stderr.take().expect("stderr");
    enqueue(&db.store, &keys(20)).await;
    eventually("the keys done", || async {
        counts(&db.store).await == (0, 0, 0)
    })
    .await;
    stop(child).await;
    drop(unread);
    let runs = all_runs(&db.store).await;
    assert_eq!(runs.len(), 20, "one run per key: {runs:?}");
    assert!(
        runs.iter().all(|r| r.outcome == RunOutcome::Done),
        "{runs:?}"
    );
}

/// `drover work` raises its soft open-file limit to the hard one and fits
/// its runs to it: each command takes three descriptors (its stdout and
/// stderr pipes, and the one tokio waits on it with), and a command that
/// cannot be started for want of one is a transient failure that backs its
/// key off for nothing. Under 256 soft and 1,024 hard, 1,000 runs are
/// lowered to 256 ((1,024 − 256) / 3), and 400 keys of two seconds each run
/// once, done, 256 at a time. Before, commands past about the 80th could
/// not be started; fitted at two descriptors a run (384), past about the
/// 330th. The commands get the limit the worker found, not the raised one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_fits_its_runs_to_the_open_file_limit_and_starts_every_command() {
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    let (db, dir) = support::sqlite().await;
    let limits = dir.path().join("limits");
    let exec = format!("sh -c 'ulimit -Sn >> {}; sleep 2' sh", limits.display());
    let mut child = tokio::process::Command::new("sh")
        .args([
            "-c",
            r#"ulimit -S -n 256 && ulimit -H -n 1024 && exec "$@""#,
            "sh",
        ])
        .arg(support::process::drover_bin())
        .args(["work", PROCESS, "--db", &db.url, "--exec", &exec])
        .args(["--parallelism", "1000"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn drover work");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let said = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a line on stderr")
        .expect("stderr")
        .expect("a line");
    assert!(
        said.contains("--parallelism 1000 lowered to 256")
            && said.contains("open-file limit is 1024"),
        "{said}"
    );
    // The rest of its log is read and dropped (a full pipe would stall it).
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let all: Vec<String> = (0..400).map(|i| format!("key-{i:03}")).collect();
    enqueue(&db.store, &all).await;
    support::process::eventually_within("every key done", Duration::from_secs(90), || async {
        counts(&db.store).await == (0, 0, 0)
    })
    .await;
    stop(child).await;
    let runs = all_runs(&db.store).await;
    let done = runs
        .iter()
        .filter(|r| r.outcome == RunOutcome::Done)
        .count();
    assert_eq!((done, runs.len()), (400, 400), "each key once, done");
    let seen = std::fs::read_to_string(&limits).expect("the commands' limits");
    assert!(seen.lines().all(|l| l == "256"), "{seen}");
    assert_eq!(seen.lines().count(), 400);
}

/// A second signal exits at once, and what the commands started dies with
/// the worker (its keeper kills their process groups): before, `exit` ran
/// no destructor, and a command's tool ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let (db, _dir) = support::sqlite().await;
    let log = log_path(&db);
    let tools = log_path(&db);
    let mut child = support::cli::worker_logged(
        &db.url,
        PROCESS,
        &command_with_a_tool(&tools),
        &["--shutdown-deadline", "1h"],
        &log,
    );
    enqueue(&db.store, &keys(1)).await;
    eventually("the key's command and its tool running", || async {
        read_log(&tools).len() == 2
    })
    .await;
    signal(&child, Signal::SIGTERM);
    signal(&child, Signal::SIGINT);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits long before the one-hour deadline")
        .unwrap();
    assert_eq!(status.code(), Some(130));
    // Its last line is written before it exits, though its stderr is
    // written by a thread of its own.
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("second signal: exiting now"), "{said}");
    let pids = logged_pids(&tools);
    all_die("the command and its tool", &pids).await;
}

/// A key that looks like an option (issue 35): by default it is the command's
/// last argument (after a `--` the command line ends with, for programs that
/// honour it); with `--key-in-env-only` the command gets no argument from
/// drover at all, so no key reaches its option parser, and still finds the
/// key in `DROVER_KEY`. Judged from what the command itself saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_looks_like_an_option_reaches_the_command_only_where_asked() {
    each_engine(|db| async move {
        let hostile = "--checkpoint-action=exec=sh".to_owned();
        for (flags, seen) in [
            (&[][..], format!("1 {hostile} {hostile}")),
            (&["--key-in-env-only"][..], format!("0 {hostile}")),
        ] {
            let log = log_path(&db);
            let exec = format!(
                r#"sh -c 'echo "$# $DROVER_KEY $*" >> {}' sh"#,
                log.display()
            );
            let child = worker(&db, &exec, flags);
            enqueue(&db.store, std::slice::from_ref(&hostile)).await;
            eventually("the key ran", || async {
                counts(&db.store).await == (0, 0, 0) && !read_log(&log).is_empty()
            })
            .await;
            stop(child).await;
            assert_eq!(
                read_log(&log),
                [seen.split(' ').map(str::to_owned).collect::<Vec<_>>()],
                "{flags:?}"
            );
        }
    })
    .await;
}

/// Two thousand commands at once on a two-core machine (issue 35): spawning
/// them must not stall the worker's runtime (a blocked thread misses the
/// heartbeat and the lapse timer, the session is given up and keys run
/// again). Every key of 5,000 runs exactly once, all under the worker's one
/// session: no run is `canceled` or `expired`, none has a second session.
/// On SQLite only: what is tested is how the worker starts commands, which
/// does not depend on the engine (and the run takes about 45 s per engine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_commands_at_once_run_every_key_once_under_one_session() {
    let (db, _dir) = support::sqlite().await;
    let all: Vec<String> = (0..5000).map(|i| format!("k{i:04}")).collect();
    enqueue(&db.store, &all).await;
    let started = std::time::Instant::now();
    let child = worker(&db, "true", &["--parallelism", "2000", "--ttl", "3s"]);
    support::process::eventually_within("5,000 keys ran", Duration::from_secs(300), || async {
        counts(&db.store).await == (0, 0, 0)
    })
    .await;
    let took = started.elapsed();
    stop(child).await;
    let runs = all_runs(&db.store).await;
    let other: Vec<&Run> = runs
        .iter()
        .filter(|r| r.outcome != RunOutcome::Done)
        .collect();
    assert!(
        other.is_empty(),
        "runs that did not end done: {:?}",
        &other[..other.len().min(5)]
    );
    assert_eq!(runs.len(), 5000, "every key ran exactly once");
    let mut sessions: Vec<_> = runs.iter().map(|r| r.session).collect();
    sessions.sort_unstable();
    sessions.dedup();
    assert_eq!(
        sessions.len(),
        1,
        "one session, never given up: {sessions:?}"
    );
    eprintln!(
        "{}: 5,000 keys of `true` at --parallelism 2000 ran in {took:?} ({:.0} keys/s), one session",
        db.engine,
        5000.0 / took.as_secs_f64()
    );
}

/// A command outlives the thread that started it: on Linux a command dies
/// with its worker (`PR_SET_PDEATHSIG`), which the kernel ties to the thread
/// that forked it, so a command started on a thread that exits (tokio's
/// blocking pool drops a thread idle for ten seconds) was killed then. A
/// command of twelve seconds must end `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_longer_than_ten_seconds_is_not_killed_with_the_thread_that_started_it() {
    let (db, _dir) = support::sqlite().await;
    enqueue(&db.store, &["long".to_owned()]).await;
    let child = worker(&db, "sh -c 'sleep 12' sh", &["--parallelism", "2"]);
    support::process::eventually_within("the command ended", Duration::from_secs(60), || async {
        counts(&db.store).await == (0, 0, 0)
    })
    .await;
    stop(child).await;
    let all = all_runs(&db.store).await;
    let done = all.iter().filter(|r| r.outcome == RunOutcome::Done).count();
    assert_eq!((done, all.len()), (1, 1), "one run, done: {all:?}");
}

/// A command sees a terminal where drover's stdout is one, and a pipe
/// otherwise (the README's promise): an interactive user's command keeps its
/// colours and line buffering, and a command under a log shipper cannot be
/// killed by a reader that has gone. The worker runs under `script`, which
/// gives it a pseudo-terminal; each command logs what its stdout is, and its
/// parent's pid, the worker, which the test stops with SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sees_a_terminal_only_where_the_worker_has_one() {
    let (db, _dir) = support::sqlite().await;
    for (under_terminal, seen) in [(true, "terminal"), (false, "pipe")] {
        let log = log_path(&db);
        let exec = format!(
            r#"sh -c 'if [ -t 1 ]; then t=terminal; else t=pipe; fi; echo "$DROVER_KEY $t $PPID" >> {}' sh"#,
            log.display()
        );
        let args = [PROCESS, "--db", &db.url, "--exec", &exec];
        let mut child = if under_terminal {
            let words: Vec<String> = std::iter::once(support::process::drover_bin())
                .chain(["work".to_owned()])
                .chain(args.iter().map(|a| (*a).to_owned()))
                .collect();
            let line = shell_words::join(&words);
            tokio::process::Command::new("script")
                .args(["--quiet", "--return", "--command", &line, "/dev/null"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn script (util-linux)")
        } else {
            support::cli::work_command(args)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn drover work")
        };
        let batch: Vec<String> = keys(3).iter().map(|k| format!("{k}-{seen}")).collect();
        enqueue(&db.store, &batch).await;
        eventually("the keys ran", || async {
            counts(&db.store).await == (0, 0, 0) && read_log(&log).len() == 3
        })
        .await;
        let lines = read_log(&log);
        let worker: i32 = lines[0][2].parse().expect("the worker's pid");
        kill(Pid::from_raw(worker), Signal::SIGTERM).expect("stop the worker");
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("the worker stops on SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}");
        for line in &lines {
            assert_eq!(
                line[1], seen,
                "under a terminal: {under_terminal}: {lines:?}"
            );
            assert_eq!(line[2], lines[0][2], "one worker ran them: {lines:?}");
        }
    }
}

/// A keeper that stops reading (stopped with SIGSTOP: a debugger, a frozen
/// cgroup) never stalls its worker: the worker writes to it from a thread of
/// its own. Before, the runtime thread that started or ended a command wrote
/// to the keeper's pipe itself; once the pipe was full (some 4,700 runs),
/// every such thread blocked, and with them the heartbeats. Judged by the
/// store: runs keep ending, to the last key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_that_stops_reading_never_stalls_its_worker() {
    const KEYS: u64 = 6_000;
    let (db, _dir) = support::sqlite().await;
    let child = worker(&db, "true", &["--parallelism", "8"]);
    let parent = child.id().expect("the worker's pid").to_string();
    let keeper = || {
        let found = std::process::Command::new("pgrep")
            .args(["-P", &parent, "-f", "drover keeper"])
            .output()
            .expect("pgrep");
        String::from_utf8_lossy(&found.stdout)
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<i32>().ok())
    };
    eventually("the worker's keeper", || async { keeper().is_some() }).await;
    let keeper = Pid::from_raw(keeper().expect("found above"));
    kill(keeper, Signal::SIGSTOP).expect("stop the keeper");
    let all: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    enqueue(&db.store, &all).await;
    let mut last = (u64::MAX, std::time::Instant::now());
    let stalled = loop {
        let (waiting, running, _) = counts(&db.store).await;
        let done = KEYS - waiting - running;
        if done == KEYS {
            break None;
        }
        if done != last.0 {
            last = (done, std::time::Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(20) {
            break Some(format!("no run ended for 20 s: {done} of {KEYS} done"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = kill(keeper, Signal::SIGCONT);
    stop(child).await;
    assert_eq!(stalled, None);
}

/// A worker with a short TTL beside another process that writes without a
/// pause (four tasks enqueueing one key each, back to back, as a busy
/// `drover serve` or a fast neighbour does) keeps its session: its
/// heartbeats and completions get their turns at the file, so every run
/// ends `done` under one session and none is given up or reclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_beside_a_process_writing_without_pause_keeps_its_session() {
    each_engine(|db| worker_beside_a_busy_writer(db, false)).await;
}

/// [`a_worker_beside_a_process_writing_without_pause_keeps_its_session`]
/// where the busy process enqueues in transactions of its own
/// (`Store::begin`, README's "Enqueue in your transaction"): they are that
/// store's write transactions too, and must leave the worker its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_beside_a_process_enqueueing_in_its_own_transactions_keeps_its_session() {
    each_engine(|db| worker_beside_a_busy_writer(db, true)).await;
}

/// One `drover work --ttl 1s` beside four tasks of this process enqueueing
/// one key each, back to back (through `Store::begin` when `in_caller_tx`).
async fn worker_beside_a_busy_writer(db: TestDb, in_caller_tx: bool) {
    let child = worker(&db, "true", &["--parallelism", "4", "--ttl", "1s"]);
    let stop_hammer = tokio_util::sync::CancellationToken::new();
    let hammers: Vec<_> = (0..4)
        .map(|n| {
            let store = db.store.clone();
            let stop_hammer = stop_hammer.clone();
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop_hammer.is_cancelled() {
                    let params = ItemEnqueue::new("other", [format!("h{n}-{i}")]);
                    if in_caller_tx {
                        let mut tx = support::caller_tx::CallerTx::begin(&store).await;
                        tx.enqueue(params).await.expect("enqueue");
                        tx.commit().await;
                    } else {
                        store.item_enqueue(params).await.expect("enqueue");
                    }
                    i += 1;
                }
                i
            })
        })
        .collect();
    let all = keys(40);
    for round in 0..40 {
        enqueue(&db.store, &all[round..=round]).await;
        // Load, not synchronisation: a key every 100 ms for 4 s.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    support::process::eventually("the worker's keys done", || async {
        counts(&db.store).await == (0, 0, 0)
    })
    .await;
    stop_hammer.cancel();
    let mut written = 0;
    for h in hammers {
        written += h.await.unwrap();
    }
    stop(child).await;
    let runs = all_runs(&db.store).await;
    let lost: Vec<_> = runs
        .iter()
        .filter(|r| r.outcome != RunOutcome::Done)
        .collect();
    let sessions: std::collections::HashSet<_> = runs.iter().map(|r| r.session).collect();
    eprintln!(
        "{}: {written} enqueues beside the worker, {} runs",
        db.engine,
        runs.len()
    );
    assert!(
        lost.is_empty(),
        "runs given up beside a busy writer: {lost:?}"
    );
    assert_eq!(
        sessions.len(),
        1,
        "the worker lost its session: {sessions:?}"
    );
}
