//! The queue's rules, one test each. Time-dependent tests run on a paused tokio
//! clock: when every task waits, tokio jumps to the next timer, so a `get` that
//! returns "at" a delay proves the delay without sleeping.

use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::time::{Instant, advance};

use super::rate_limit::{ItemExponential, MaxOf};
use super::state::{LazyNow, State};
use super::{AddOpts, Queue, QueueMetrics};
use crate::backoff::{Backoff, MAX_DELAY};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A queue whose rate limiter is a plain exponential 100 ms → 10 s, so backoff
/// tests see exact delays.
fn queue() -> Queue<&'static str> {
    let backoff = Backoff::new(ms(100), 2.0, Duration::from_secs(10)).unwrap();
    Queue::builder()
        .rate_limiter(MaxOf::new(vec![Box::new(ItemExponential::new(backoff))]))
        .build()
}

/// Gets the next key and how long after `start` it was handed out.
async fn next_at(q: &Queue<&'static str>, start: Instant) -> (&'static str, Duration) {
    let key = q.get().await.expect("queue is running");
    (key, start.elapsed())
}

/// Hands out every ready key (marking each done) without waiting.
async fn drain_ready(q: &Queue<&'static str>) -> Vec<&'static str> {
    let mut keys = Vec::new();
    while !q.is_empty() {
        let key = q.get().await.unwrap();
        q.done(&key);
        keys.push(key);
    }
    keys
}

#[tokio::test]
async fn adding_a_queued_key_queues_it_once() {
    let q = queue();
    q.add("a");
    q.add("b");
    q.add("a");
    assert_eq!(q.len(), 2);
    assert_eq!(drain_ready(&q).await, ["a", "b"]);
}

#[tokio::test]
async fn adds_while_processing_requeue_exactly_once_after_done() {
    let q = queue();
    q.add("a");
    let key = q.get().await.unwrap();
    for _ in 0..100 {
        q.add("a");
    }
    assert_eq!(q.len(), 0, "a processing key is never queued beside itself");
    q.done(&key);
    assert_eq!(drain_ready(&q).await, ["a"]);
    assert!(q.is_empty());
}

#[tokio::test]
async fn a_key_is_not_handed_out_again_before_done() {
    let q = queue();
    q.add("a");
    let _held = q.get().await.unwrap();
    q.add("a");
    q.add("b");
    assert_eq!(q.get().await, Some("b"));
    assert!(q.is_empty());
}

#[tokio::test]
async fn done_of_a_key_not_processing_is_ignored() {
    let q = queue();
    q.done(&"ghost");
    q.add("a");
    q.done(&"a"); // queued, not processing: stays queued
    assert_eq!(q.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn add_after_hands_out_the_key_when_its_delay_passes() {
    let q = queue();
    let start = Instant::now();
    q.add_after("a", ms(250));
    assert!(q.is_empty());
    assert_eq!(next_at(&q, start).await, ("a", ms(250)));
}

#[tokio::test(start_paused = true)]
async fn the_earlier_ready_time_wins_when_a_key_is_already_waiting() {
    let q = queue();
    let start = Instant::now();
    q.add_after("a", ms(500));
    q.add_after("a", ms(100));
    q.add_after("a", ms(300));
    assert_eq!(next_at(&q, start).await, ("a", ms(100)));
    q.done(&"a");
    advance(ms(1000)).await;
    assert!(q.is_empty(), "the later timers were coalesced, not kept");
}

#[tokio::test(start_paused = true)]
async fn a_plain_add_runs_a_delayed_key_now_and_drops_its_timer() {
    let q = queue();
    q.add_after("a", ms(500));
    q.add("a");
    assert_eq!(drain_ready(&q).await, ["a"]);
    advance(ms(600)).await;
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn huge_delays_are_clamped_instead_of_panicking() {
    let q = queue();
    q.add_after("a", Duration::MAX);
    q.add_with("b", AddOpts::after(Duration::MAX).priority(i32::MAX));
    advance(MAX_DELAY - ms(1)).await;
    assert!(q.is_empty());
    advance(ms(1)).await;
    assert_eq!(q.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn add_rate_limited_waits_out_the_limiters_delay_and_counts_requeues() {
    let q = queue();
    let start = Instant::now();
    q.add_rate_limited("a");
    assert_eq!(q.num_requeues(&"a"), 1);
    assert_eq!(next_at(&q, start).await, ("a", ms(100)));
    q.add_rate_limited("a");
    q.done(&"a");
    assert_eq!(
        next_at(&q, start).await,
        ("a", ms(300)),
        "second failure: 200 ms more"
    );
    assert_eq!(q.num_requeues(&"a"), 2);
    q.forget(&"a");
    assert_eq!(q.num_requeues(&"a"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_plain_add_does_not_run_a_backing_off_key_early() {
    let q = queue();
    let start = Instant::now();
    q.add_rate_limited("a");
    q.add("a");
    q.add_after("a", ms(10));
    assert!(q.is_empty());
    assert_eq!(next_at(&q, start).await, ("a", ms(100)));
    q.done(&"a");
    advance(ms(1000)).await;
    assert!(q.is_empty(), "the key ran once, not once per add");
}

#[tokio::test(start_paused = true)]
async fn bypass_backoff_runs_a_backing_off_key_now() {
    let q = queue();
    q.add_rate_limited("a");
    q.add_with("a", AddOpts::default().bypass_backoff());
    assert_eq!(q.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_during_processing_defers_the_dirty_rerun_to_the_backoff() {
    let q = queue();
    let start = Instant::now();
    q.add("a");
    let key = q.get().await.unwrap();
    q.add("a"); // an event arrives while the key is processed...
    q.add_rate_limited("a"); // ...and then processing fails
    q.done(&key);
    assert!(q.is_empty(), "the failing key does not run again at once");
    assert_eq!(next_at(&q, start).await, ("a", ms(100)));
    q.done(&"a");
    advance(ms(1000)).await;
    assert!(q.is_empty(), "one run for the event and the retry together");
}

#[tokio::test(start_paused = true)]
async fn forget_ends_the_backoff_for_later_adds() {
    let q = queue();
    q.add_rate_limited("a");
    q.add_with("a", AddOpts::default().bypass_backoff());
    let key = q.get().await.unwrap();
    q.forget(&key); // it succeeded
    q.done(&key);
    q.add("a");
    assert_eq!(q.len(), 1, "a success clears the backoff");
}

/// Raising a queued key's priority leaves its old place behind (skipped when
/// reached); a key raised over and over must not leave a trail that grows with
/// every add while only one key is queued.
#[test]
fn raising_a_queued_keys_priority_again_and_again_keeps_memory_bounded() {
    let mut state = State::new(false);
    let mut now = LazyNow::default();
    state.add(2_u32, AddOpts::default().priority(5_000), &mut now);
    state.add(3, AddOpts::default().priority(5_000), &mut now);
    for priority in 0..10_000 {
        state.add(1, AddOpts::default().priority(priority), &mut now);
    }
    assert_eq!(state.len(), 3);
    assert!(
        state.ready_slots() <= 2 * state.len() + 64,
        "{} places kept in the ready queue for three queued keys",
        state.ready_slots()
    );
    let mut order = Vec::new();
    while let Some((key, _)) = state.pop(&mut now) {
        order.push(key);
    }
    assert_eq!(order, [1, 2, 3], "priority first, then FIFO");
}

#[tokio::test]
async fn higher_priority_runs_first_and_fifo_within_a_priority() {
    let q = queue();
    q.add_with("low1", AddOpts::default().priority(-1));
    q.add("mid1");
    q.add_with("high1", AddOpts::default().priority(5));
    q.add("mid2");
    q.add_with("high2", AddOpts::default().priority(5));
    q.add_with("low2", AddOpts::default().priority(-1));
    assert_eq!(
        drain_ready(&q).await,
        ["high1", "high2", "mid1", "mid2", "low1", "low2"]
    );
}

#[tokio::test]
async fn adding_a_queued_key_with_a_higher_priority_moves_it_up() {
    let q = queue();
    q.add("a");
    q.add("b");
    q.add_with("b", AddOpts::default().priority(1));
    q.add_with("a", AddOpts::default().priority(-1)); // lower: keeps its place
    assert_eq!(q.len(), 2);
    assert_eq!(drain_ready(&q).await, ["b", "a"]);
}

#[tokio::test]
async fn many_priorities_keep_their_order() {
    let q: Queue<i32> = Queue::new();
    for p in [3, -7, 12, 0, 5, -2, 9, 1, 4, 11, -5, 8] {
        q.add_with(p, AddOpts::default().priority(p));
    }
    let mut got = Vec::new();
    while !q.is_empty() {
        let k = q.get().await.unwrap();
        q.done(&k);
        got.push(k);
    }
    assert_eq!(got, [12, 11, 9, 8, 5, 4, 3, 1, 0, -2, -5, -7]);
}

#[tokio::test]
async fn a_dirty_key_keeps_the_priority_it_was_added_with() {
    let q = queue();
    q.add("a");
    let key = q.get().await.unwrap();
    q.add_with("a", AddOpts::default().priority(9));
    q.add("b");
    q.done(&key);
    assert_eq!(drain_ready(&q).await, ["a", "b"]);
}

#[tokio::test]
async fn shut_down_drains_queued_keys_then_returns_none_and_drops_delayed_ones() {
    let q = queue();
    q.add("a");
    q.add_after("later", ms(1));
    q.shut_down();
    q.add("ignored");
    assert!(q.is_shutting_down());
    assert_eq!(q.get().await, Some("a"));
    assert_eq!(q.get().await, None);
}

#[tokio::test]
async fn a_key_dirty_at_shutdown_is_still_handed_out() {
    let q = queue();
    q.add("a");
    let key = q.get().await.unwrap();
    q.add("a");
    q.shut_down();
    q.done(&key);
    assert_eq!(
        q.get().await,
        Some("a"),
        "nothing added before shutdown is lost"
    );
    q.done(&"a");
    assert_eq!(q.get().await, None);
}

/// A key marked dirty before shutdown but backing off when it is done would run
/// later, i.e. it is delayed, and shutdown drops delayed keys: once `get` has
/// said the queue is closed, it never hands the key out later.
#[tokio::test(start_paused = true)]
async fn a_dirty_key_backing_off_at_done_after_shutdown_is_dropped_like_any_delayed_key() {
    let q = queue();
    q.add("a");
    let key = q.get().await.unwrap();
    q.add("a"); // an event while processing...
    q.add_rate_limited("a"); // ...and processing failed: run again after 100 ms
    q.shut_down();
    q.done(&key);
    assert_eq!(q.get().await, None, "nothing queued: closed");
    advance(ms(200)).await;
    assert_eq!(q.len(), 0, "no key reappears after shutdown");
    assert_eq!(q.get().await, None, "a closed queue stays closed");
}

#[tokio::test(start_paused = true)]
async fn shut_down_with_drain_waits_for_in_flight_keys() {
    let q = queue();
    q.add("a");
    let key = q.get().await.unwrap();
    let drained = tokio::spawn({
        let q = q.clone();
        async move { q.shut_down_with_drain().await }
    });
    tokio::task::yield_now().await;
    assert!(!drained.is_finished());
    advance(ms(50)).await;
    assert!(
        !drained.is_finished(),
        "still waiting for the in-flight key"
    );
    q.done(&key);
    drained.await.unwrap();
}

#[tokio::test]
async fn a_waiting_get_wakes_when_a_key_is_added() {
    let q = queue();
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::task::yield_now().await;
    q.add("a");
    assert_eq!(waiter.await.unwrap(), Some("a"));
}

#[tokio::test]
async fn waiting_gets_wake_with_none_at_shutdown() {
    let q = queue();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        })
        .collect();
    tokio::task::yield_now().await;
    q.shut_down();
    for w in waiters {
        assert_eq!(w.await.unwrap(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn a_sleeping_get_wakes_for_an_earlier_timer() {
    let q = queue();
    let start = Instant::now();
    q.add_after("late", ms(1000));
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { (q.get().await, start.elapsed()) }
    });
    tokio::task::yield_now().await;
    q.add_after("soon", ms(10));
    assert_eq!(waiter.await.unwrap(), (Some("soon"), ms(10)));
}

/// Two idle workers, two delayed keys: the worker that slept until the first
/// timer takes that key and leaves; the other must then sleep until the second
/// timer rather than wait for an add that may never come.
#[tokio::test(start_paused = true)]
async fn a_later_timer_is_handed_out_after_the_waiter_for_the_earlier_one_leaves() {
    let q = queue();
    let start = Instant::now();
    let spawn_get = || {
        let q = q.clone();
        tokio::spawn(async move { (q.get().await, start.elapsed()) })
    };
    let (first, second) = (spawn_get(), spawn_get());
    tokio::task::yield_now().await; // both wait, with no timer to sleep until
    q.add_after("soon", ms(10));
    q.add_after("later", ms(20));
    let mut got = vec![first.await.unwrap(), second.await.unwrap()];
    got.sort_unstable();
    assert_eq!(got, [(Some("later"), ms(20)), (Some("soon"), ms(10))]);
}

/// A `get` sleeping until a timer is dropped: another waiting `get` takes
/// over that timer.
#[tokio::test(start_paused = true)]
async fn a_timer_is_handed_out_after_the_get_sleeping_until_it_is_dropped() {
    let q = queue();
    let start = Instant::now();
    let spawn_get = || {
        let q = q.clone();
        tokio::spawn(async move { (q.get().await, start.elapsed()) })
    };
    let (dropped, waiting) = (spawn_get(), spawn_get());
    tokio::task::yield_now().await;
    // Wakes the longest waiting one (tokio's `notify_one` is FIFO), which goes
    // back to sleep until the timer; the other waits for a wake-up only.
    q.add_after("a", ms(10));
    tokio::task::yield_now().await;
    dropped.abort();
    let _ = dropped.await;
    let woken = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    assert_eq!(
        woken
            .expect("the remaining get sleeps until the timer")
            .unwrap(),
        (Some("a"), ms(10))
    );
}

#[tokio::test(start_paused = true)]
async fn keys_made_ready_together_wake_every_waiter() {
    let q = queue();
    q.add_after("a", ms(10));
    q.add_after("b", ms(10));
    q.add_after("c", ms(10));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        })
        .collect();
    let mut got = Vec::new();
    for w in waiters {
        got.push(w.await.unwrap().unwrap());
    }
    got.sort_unstable();
    assert_eq!(got, ["a", "b", "c"]);
}

#[tokio::test]
async fn dropping_a_get_future_loses_no_key() {
    let q = queue();
    {
        let pending = q.get();
        drop(pending);
    }
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { tokio::time::timeout(ms(10), q.get()).await }
    });
    tokio::task::yield_now().await;
    waiter.abort();
    q.add("a");
    assert_eq!(q.get().await, Some("a"));
}

#[tokio::test]
async fn an_add_wakes_the_get_still_waiting_after_another_was_dropped() {
    let q = queue();
    let spawn_get = || {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    let (dropped, waiting) = (spawn_get(), spawn_get());
    // Both are parked in `get` once the (current-thread) runtime comes back here.
    tokio::task::yield_now().await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    q.add("a");
    let woken = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    assert_eq!(
        woken.expect("the add wakes the waiting get").unwrap(),
        Some("a")
    );
    // A key added with nobody waiting is still there for the next get.
    q.add("b");
    assert_eq!(q.get().await, Some("b"));
}

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn metric_line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

/// Asserts that the scrape `text` gives the series `metric` of the queue
/// named `jobs` the value `value` (as the exposition writes it).
fn assert_jobs_metric(text: &str, metric: &str, value: &str) {
    assert_eq!(
        metric_line(text, &format!("{metric}{{")),
        format!("{metric}{{name=\"jobs\"}} {value}")
    );
}

#[tokio::test(start_paused = true)]
async fn a_named_queue_reports_client_go_metrics() {
    let mut registry = Registry::default();
    let metrics = QueueMetrics::new(&mut registry);
    let q: Queue<&str> = Queue::builder().name("jobs").metrics(&metrics).build();
    q.add("a");
    q.add("a");
    q.add("b");
    let text = scrape(&registry);
    assert_jobs_metric(&text, "workqueue_depth", "2");
    assert_jobs_metric(&text, "workqueue_adds_total", "2");

    advance(ms(250)).await;
    let a = q.get().await.unwrap();
    advance(Duration::from_secs(3)).await;
    let b = q.get().await.unwrap();
    advance(Duration::from_secs(1)).await;
    let text = scrape(&registry);
    assert_jobs_metric(&text, "workqueue_unfinished_work_seconds", "5.0");
    assert_jobs_metric(&text, "workqueue_longest_running_processor_seconds", "4.0");
    assert_jobs_metric(&text, "workqueue_queue_duration_seconds_sum", "3.5");

    q.add_rate_limited(a);
    q.done(&a);
    q.done(&b);
    let text = scrape(&registry);
    assert_jobs_metric(&text, "workqueue_retries_total", "1");
    assert_jobs_metric(&text, "workqueue_work_duration_seconds_count", "2");
    assert_jobs_metric(&text, "workqueue_work_duration_seconds_sum", "5.0");
    assert_jobs_metric(&text, "workqueue_unfinished_work_seconds", "0.0");
}

/// client-go counts an add that marks a processing key dirty, and not the
/// re-queue at `done` that follows from it: one add, one count.
#[tokio::test(start_paused = true)]
async fn an_add_while_processing_counts_once_in_adds_total() {
    let mut registry = Registry::default();
    let metrics = QueueMetrics::new(&mut registry);
    let q: Queue<&str> = Queue::builder().name("jobs").metrics(&metrics).build();
    q.add("a");
    let a = q.get().await.unwrap();
    q.add("a");
    q.add("a"); // coalesced with the one before
    q.done(&a);
    assert_jobs_metric(&scrape(&registry), "workqueue_adds_total", "2");
    assert_jobs_metric(&scrape(&registry), "workqueue_depth", "1");

    // A delayed add whose timer fires while the key is processing: one add.
    let a = q.get().await.unwrap();
    q.add_after("a", ms(10));
    advance(ms(20)).await;
    assert!(
        q.is_empty(),
        "the key is processing: marked dirty, not queued"
    );
    q.done(&a);
    let text = scrape(&registry);
    assert_jobs_metric(&text, "workqueue_adds_total", "3");
    assert_jobs_metric(&text, "workqueue_depth", "1");
}

/// After shutdown a rate-limited add is ignored, as every add is, so it is no
/// retry (client-go counts a retry only for an add it accepts).
#[tokio::test]
async fn a_rate_limited_add_after_shutdown_is_not_a_retry() {
    let mut registry = Registry::default();
    let metrics = QueueMetrics::new(&mut registry);
    let q: Queue<&str> = Queue::builder().name("jobs").metrics(&metrics).build();
    q.add("a");
    let a = q.get().await.unwrap();
    q.add_rate_limited(a); // a retry: counted
    q.shut_down();
    q.add_rate_limited(a); // ignored
    q.done(&a);
    assert_eq!(q.get().await, None);
    let text = scrape(&registry);
    assert_jobs_metric(&text, "workqueue_retries_total", "1");
    assert_jobs_metric(&text, "workqueue_adds_total", "1");
}

/// A delayed key is ready from its timer on, as if a thread had added it then
/// (client-go's): the time until a busy worker takes it is queue time, even
/// when nothing touched the queue in between.
#[tokio::test(start_paused = true)]
async fn a_delayed_key_waits_in_the_queue_from_its_timer_on() {
    let mut registry = Registry::default();
    let metrics = QueueMetrics::new(&mut registry);
    let q: Queue<&str> = Queue::builder().name("jobs").metrics(&metrics).build();
    q.add_after("a", ms(500));
    advance(Duration::from_secs(3)).await; // every worker busy: nobody looks
    assert_eq!(q.get().await, Some("a"));
    assert_jobs_metric(
        &scrape(&registry),
        "workqueue_queue_duration_seconds_sum",
        "2.5",
    );
}

#[tokio::test]
async fn a_dropped_queue_leaves_the_scrape() {
    let mut registry = Registry::default();
    let metrics = QueueMetrics::new(&mut registry);
    let q: Queue<u8> = Queue::builder().name("gone").metrics(&metrics).build();
    assert!(scrape(&registry).contains(r#"workqueue_unfinished_work_seconds{name="gone"}"#));
    drop(q);
    assert!(!scrape(&registry).contains(r#"workqueue_unfinished_work_seconds{name="gone"}"#));
}
