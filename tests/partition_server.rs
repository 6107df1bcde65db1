//! Partitions around `drover serve`: a `drover work --server` worker cut off
//! while it stays alive kills its command before another worker starts the
//! key (DESIGN.md rule 6, for a session kept by HTTP calls).
//!
//! Each round: worker A (`drover work --server`, through one `drover serve`)
//! runs a key whose command ticks into a log every 20 ms; one link breaks
//! (frozen or reset) while A, its server and its command stay alive; worker B
//! (`drover work --db`, connected directly) starts the key once A's session
//! expires and the key is reclaimed, by B or by the test's [`EagerReclaim`]
//! (a node reclaiming every 5 ms: the worst schedule for A). The round fails if any tick of A's command is later
//! than B's first, as the commands logged them. Two links are cut:
//!
//! - between A and its server ([`Link::WorkerToServe`]): A's heartbeats go
//!   unanswered or fail;
//! - between A's server and PostgreSQL ([`Link::ServeToDatabase`]): A reaches
//!   its server, whose heartbeats on A's behalf hang or fail.
//!
//! PostgreSQL only (skipped without `DROVER_TEST_POSTGRES_URL`). The ignored
//! `measure_*` tests run the measurement of issue 11 (see
//! `support::partition`).

mod support;

use std::time::Duration;

use drover::store::{ItemEnqueue, StoreEngine as _};
use support::TestDb;
use support::fault_proxy::FaultProxy;
use support::partition::{PROCESS, Tally, answers_come_late, both_cuts, take_over, worker};
use support::process::{eventually, stop};
use support::serve::Serve;
use support::ticks::TickLog;

/// CI's rounds: (TTL, rounds) with each cut.
const PLAN: [(Duration, usize); 2] = [(Duration::from_secs(1), 2), (Duration::from_secs(2), 1)];

/// Which link of worker A breaks.
#[derive(Debug, Clone, Copy)]
enum Link {
    /// Between `drover work --server` and `drover serve`.
    WorkerToServe,
    /// Between `drover serve` and PostgreSQL.
    ServeToDatabase,
}

/// A's side of a round: its server, the proxy on the link that breaks, and
/// the URL A works on.
async fn a_side(base: &str, db_url: &str, link: Link) -> (Serve, FaultProxy, String) {
    match link {
        Link::WorkerToServe => {
            let serve = Serve::start(db_url).await;
            let proxy = FaultProxy::start(serve.addr()).await;
            let url = format!("http://{}", proxy.addr);
            (serve, proxy, url)
        }
        Link::ServeToDatabase => {
            let proxy = FaultProxy::start(support::server_addr(base).await).await;
            let serve = Serve::start(&proxy.url_for(db_url)).await;
            let url = serve.url.clone();
            (serve, proxy, url)
        }
    }
}

/// One round, in which `fault` breaks A's link; returns the gap from A's last
/// tick to B's first (negative if they overlapped).
async fn round(
    base: &str,
    link: Link,
    ttl: Duration,
    name: &str,
    fault: impl AsyncFnOnce(&FaultProxy, &TestDb),
) -> f64 {
    let (db, schema) = support::postgres(base).await;
    let (serve, proxy, a_url) = a_side(base, &db.url, link).await;
    let log = TickLog::new();
    let a = worker(["--server", &a_url], &log.command("A"), ttl, &[]);
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    eventually("A's command ticking", || async {
        !log.ticks("A").is_empty()
    })
    .await;
    let a_pid = log.pid("A").expect("A's command logged its pid");
    fault(&proxy, &db).await;
    let (b, gap) = take_over(&db, &log, a_pid, ttl, name).await;
    proxy.heal();
    stop(b).await;
    stop(a).await;
    stop(serve.child).await;
    db.store.close().await;
    support::drop_schema(base, &schema).await;
    gap
}

/// CI's rounds on `link`, failing at the first overlap.
async fn rounds_on(link: Link) {
    let Some(base) = support::postgres_url() else {
        return;
    };
    for rounds in both_cuts(&PLAN) {
        for n in 0..rounds.count {
            let name = format!(
                "{link:?}, {:?}, ttl {:?}, round {n}",
                rounds.cut, rounds.ttl
            );
            let gap = round(&base, link, rounds.ttl, &name, async |proxy, _| {
                rounds.cut.apply(proxy)
            })
            .await;
            eprintln!("{name}: gap {gap:.1} ms");
            assert!(
                gap > 0.0,
                "{name}: A's command still ticked {:.1} ms after B's started",
                -gap
            );
        }
    }
}

/// The measurement's rounds on `link` (see `support::partition`).
async fn measure(link: Link) {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let mut tally = Tally::default();
    for rounds in support::partition::measured() {
        for n in 0..rounds.count {
            let name = format!(
                "{link:?}, {:?}, ttl {:?}, round {n}",
                rounds.cut, rounds.ttl
            );
            let gap = round(&base, link, rounds.ttl, &name, async |proxy, _| {
                rounds.cut.apply(proxy)
            })
            .await;
            tally.record(rounds, &name, gap);
        }
    }
    tally.finish(&format!("{link:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_its_server_kills_its_command_before_another_starts_the_key() {
    rounds_on(Link::WorkerToServe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_server_lost_the_database_kills_its_command_before_another_starts_the_key() {
    rounds_on(Link::ServeToDatabase).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (minutes): scripts/partition-measure.sh"]
async fn measure_a_worker_cut_off_from_its_server() {
    measure(Link::WorkerToServe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (minutes): scripts/partition-measure.sh"]
async fn measure_a_worker_whose_server_lost_the_database() {
    measure(Link::ServeToDatabase).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_answers_come_late_counts_its_session_from_each_heartbeats_send() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    for n in 0..2 {
        let name = format!("late answers, round {n}");
        let ttl = Duration::from_secs(2);
        let gap = round(&base, Link::WorkerToServe, ttl, &name, answers_come_late).await;
        eprintln!("{name}: gap {gap:.1} ms");
        assert!(
            gap > 0.0,
            "{name}: A's command still ticked {:.1} ms after B's started",
            -gap
        );
    }
}
