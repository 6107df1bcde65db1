//! When a worker gives its session up: by its own clock, before the database
//! can give the session's leases away (DESIGN.md rule 6).
//!
//! The database sets a session's deadline to `now + ttl` on its own clock while
//! it runs a heartbeat, which is after the worker *sent* it. So the instant
//! taken just before sending is a lower bound on when the database counted
//! from, whatever the network did to the request or to its answer. The worker
//! holds its session until that instant + ttl − [`safety_margin`]; a timer (not
//! the end of a heartbeat attempt) fires then, whether or not a heartbeat is in
//! flight, and every run under the session is cancelled and its command killed.
//! A later successful heartbeat moves the timer forward from *its* send instant.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout};

use crate::store::StoreError;

/// The smallest [`safety_margin`]: 250 ms.
///
/// What the margin must cover, between the worker's timer and the database's
/// deadline: the timer's lateness (tokio's 1 ms resolution plus the time the
/// keeper task waits for a thread on a busy runtime: milliseconds, tens under
/// heavy load), then stopping every run (a reconcile watching
/// [`Task::cancelled`](super::Task::cancelled) gets [`STOP_GRACE`] to return,
/// then its future is dropped; `drover work --exec` kills the command's process group
/// and waits for it to be reaped, a few milliseconds). 100 ms of grace plus
/// lateness and kill stays well inside 250 ms. The database side only adds
/// slack: its deadline counts from when it ran the heartbeat, after the send,
/// and another node still has to reclaim the lease and claim the key.
pub const MIN_SAFETY_MARGIN: Duration = Duration::from_millis(250);

/// How long a cancelled reconcile may take to return on its own (to kill and
/// reap what it started) before its future is dropped. Part of the
/// [`MIN_SAFETY_MARGIN`].
pub const STOP_GRACE: Duration = Duration::from_millis(100);

/// The shortest session TTL a controller accepts: 750 ms, three times the
/// [`MIN_SAFETY_MARGIN`], so that the margin never takes more than a third of
/// the TTL and a worker gets a heartbeat and a retry before it gives up.
pub const MIN_TTL: Duration = Duration::from_millis(750);

/// How long before the database could give a session's leases away its worker
/// gives them up: the larger of [`MIN_SAFETY_MARGIN`] and a tenth of `ttl`.
///
/// The tenth scales with the TTL for what grows with it: the drift between the
/// worker's and the database's clock rates (at most a few hundred parts per
/// million on an NTP-disciplined host, 0.5 ms per second) and a long TTL's
/// users, who chose it for slow or distant databases. A session with a 10 s TTL
/// is given up 9 s after its last heartbeat was sent; one with a 2 s TTL after
/// 1.75 s.
#[must_use]
pub fn safety_margin(ttl: Duration) -> Duration {
    MIN_SAFETY_MARGIN.max(ttl / 10)
}

/// Why [`hold`] stopped holding the session.
#[derive(Debug)]
pub(crate) enum Held<T> {
    /// The session must be given up: the timer fired, or the database said it
    /// has expired.
    Lost,
    /// `until` completed first, with this value.
    Until(T),
}

/// Heartbeats every `ttl / 3` from `sent` (the instant taken before the session
/// started) until the session is lost or `until` completes; see the module doc.
///
/// A failed or timed-out heartbeat is retried every `ttl / 10`; it never
/// extends the session, and neither does one whose answer is still on its way
/// when the timer fires.
pub(crate) async fn hold<B, Fut, U>(
    ttl: Duration,
    sent: Instant,
    mut beat: B,
    until: U,
) -> Held<U::Output>
where
    B: FnMut() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
    U: Future,
{
    let margin = safety_margin(ttl);
    let lapse = sleep_until(sent + ttl.saturating_sub(margin));
    tokio::pin!(lapse, until);
    let mut next = sent + ttl / 3;
    loop {
        let attempt = async {
            sleep_until(next).await;
            let sent = Instant::now();
            (sent, timeout(ttl / 3, beat()).await)
        };
        let (sent, result) = tokio::select! {
            biased;
            () = &mut lapse => {
                tracing::warn!(?ttl, ?margin, "no heartbeat succeeded in time; giving the session up");
                return Held::Lost;
            }
            value = &mut until => return Held::Until(value),
            attempt = attempt => attempt,
        };
        match result {
            Ok(Ok(())) => {
                lapse.as_mut().reset(sent + ttl.saturating_sub(margin));
                next = sent + ttl / 3;
                continue;
            }
            Ok(Err(StoreError::SessionExpired { .. })) => return Held::Lost,
            Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed; retrying"),
            Err(_) => tracing::warn!("heartbeat timed out; retrying"),
        }
        next = Instant::now() + ttl / 10;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    use super::*;
    use crate::store::SessionId;

    const TTL: Duration = Duration::from_secs(3);

    type Beat = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A heartbeat answering each call with the next of `answers` after
    /// `delay`; past the end of `answers` it never answers.
    fn scripted(
        delay: Duration,
        answers: Vec<Result<(), StoreError>>,
    ) -> (impl FnMut() -> Beat, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let mut answers = answers.into_iter();
        let beat = move || {
            counted.fetch_add(1, SeqCst);
            let answer = answers.next();
            Box::pin(async move {
                match answer {
                    Some(answer) => {
                        tokio::time::sleep(delay).await;
                        answer
                    }
                    None => std::future::pending().await,
                }
            }) as Beat
        };
        (beat, calls)
    }

    async fn lost_after(delay: Duration, answers: Vec<Result<(), StoreError>>) -> (Duration, u32) {
        let start = Instant::now();
        let (beat, calls) = scripted(delay, answers);
        let held = hold(TTL, start, beat, std::future::pending::<()>()).await;
        assert!(matches!(held, Held::Lost));
        (start.elapsed(), calls.load(SeqCst))
    }

    #[test]
    fn the_margin_is_a_tenth_of_the_ttl_but_at_least_250_ms() {
        assert_eq!(safety_margin(Duration::from_secs(1)), ms(250));
        assert_eq!(safety_margin(Duration::from_secs(2)), ms(250));
        assert_eq!(
            safety_margin(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert!(safety_margin(MIN_TTL) * 3 <= MIN_TTL);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_whose_first_heartbeat_hangs_is_given_up_ttl_minus_margin_after_its_start() {
        let (elapsed, calls) = lost_after(ms(0), vec![]).await;
        assert_eq!(elapsed, TTL - safety_margin(TTL));
        assert_eq!(
            calls, 2,
            "sent at TTL/3, timed out at 2 TTL/3, retried TTL/10 later"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_counts_from_when_the_last_good_heartbeat_was_sent_not_answered() {
        // Two heartbeats succeed, each answered 900 ms after it was sent; the
        // third hangs. The second was sent at 2 TTL/3 and answered 900 ms later.
        let (elapsed, _) = lost_after(ms(900), vec![Ok(()), Ok(())]).await;
        let sent = TTL * 2 / 3;
        assert_eq!(elapsed, sent + TTL - safety_margin(TTL));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_heartbeats_are_retried_but_never_extend_the_session() {
        let failed = || Err(StoreError::InvalidArgument("database unavailable".into()));
        let answers = (0..100).map(|_| failed()).collect();
        let (elapsed, calls) = lost_after(ms(10), answers).await;
        assert_eq!(elapsed, TTL - safety_margin(TTL));
        assert!(calls > 3, "retried every TTL/10, got {calls} attempts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_heartbeat_gives_the_session_up_at_once() {
        let expired = Err(StoreError::SessionExpired {
            session: SessionId(7),
        });
        let (elapsed, calls) = lost_after(ms(5), vec![expired]).await;
        assert_eq!(elapsed, TTL / 3 + ms(5));
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_whose_heartbeats_succeed_is_held_until_asked_to_stop() {
        let start = Instant::now();
        let answers = (0..1000).map(|_| Ok(())).collect();
        let (beat, calls) = scripted(ms(50), answers);
        let stop = tokio::time::sleep(TTL * 20);
        let held = hold(TTL, start, beat, stop).await;
        assert!(matches!(held, Held::Until(())));
        assert_eq!(start.elapsed(), TTL * 20);
        assert!(
            calls.load(SeqCst) >= 57,
            "a heartbeat every TTL/3 plus its answer time"
        );
    }
}
