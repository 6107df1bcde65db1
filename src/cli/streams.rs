//! drover's own stdout and stderr for the long-running commands, each written
//! by a thread of its own, so that no runtime thread ever waits on a reader
//! (a terminal paused with ^S, a journal that is throttling, a pipe into a
//! pager nobody scrolls). A runtime thread blocked in `write(2)` stops
//! everything on it: the heartbeat, and the timer that kills a worker's
//! commands before its session can lapse (DESIGN.md rule 6). The session
//! then lapses, another worker takes the keys, and the blocked worker's
//! commands run on beside theirs once its output moves again.
//!
//! Log lines (drover's, tracing's, a command's relayed stderr) are lossy: a
//! line the stream cannot take now is dropped and counted, and the count is
//! written once the stream moves again. A command's relayed stdout waits for
//! room instead (its output is data, not a log): the relay stops reading,
//! and the command waits on its own pipe, as it would writing to the stream
//! itself. A stream whose reader has gone takes everything and writes
//! nothing.

use std::io::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

/// The bytes a stream holds before lines are dropped (or a relay waits): a
/// bound on memory, whatever the size of each line.
const HELD_BYTES: usize = 1 << 20;

/// How long the end of a command waits for its last lines to be written.
const FLUSH: Duration = Duration::from_secs(2);

/// What the writing thread is sent.
#[derive(Debug)]
enum Message {
    /// Bytes to write, and the room they took (given back once written).
    Bytes(Vec<u8>, u32),
    /// Answered once every message before it is written.
    Flush(std::sync::mpsc::Sender<()>),
}

/// One of drover's standard streams, written by its own thread.
#[derive(Debug)]
pub(crate) struct Stream {
    tx: mpsc::UnboundedSender<Message>,
    /// A permit per byte the stream may still hold ([`HELD_BYTES`] in all).
    room: Arc<Semaphore>,
    /// Lines dropped since the last one that went through.
    dropped: AtomicU64,
}

impl Stream {
    /// Starts the thread that writes to `out` (when the thread cannot start,
    /// every line is dropped).
    fn start(name: &str, out: fn() -> Box<dyn io::Write>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
        let room = Arc::new(Semaphore::new(HELD_BYTES));
        let given_back = Arc::clone(&room);
        let spawned = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut out = out();
                let mut open = true;
                while let Some(message) = rx.blocking_recv() {
                    match message {
                        Message::Bytes(bytes, took) => {
                            if open {
                                open = out.write_all(&bytes).and_then(|()| out.flush()).is_ok();
                            }
                            given_back.add_permits(took as usize);
                        }
                        Message::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        drop(spawned);
        Self {
            tx,
            room,
            dropped: AtomicU64::new(0),
        }
    }

    /// The room `bytes` take: their length, but no more than the whole.
    fn room_for(bytes: &[u8]) -> u32 {
        u32::try_from(bytes.len().min(HELD_BYTES)).unwrap_or(u32::MAX)
    }

    /// Writes `line` (with its newline) unless the stream is full: then it is
    /// dropped and counted. Never waits.
    pub(crate) fn lossy(&self, line: String) {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        self.lossy_counted(dropped, line);
    }

    /// [`lossy`](Self::lossy), with the count of lines dropped before it.
    fn lossy_counted(&self, dropped: u64, mut line: String) {
        if dropped > 0 {
            line = format!("{}{line}", dropped_notice(dropped));
        }
        let bytes = line.into_bytes();
        let took = Self::room_for(&bytes);
        let sent = match self.room.try_acquire_many(took) {
            Ok(permit) => {
                permit.forget();
                self.put(bytes, took)
            }
            Err(_) => false,
        };
        if !sent {
            self.dropped.fetch_add(dropped + 1, Ordering::Relaxed);
        }
    }

    /// Writes `bytes`, waiting (without blocking a thread) for room.
    pub(crate) async fn send(&self, bytes: Vec<u8>) {
        let took = Self::room_for(&bytes);
        if let Ok(permit) = self.room.acquire_many(took).await {
            permit.forget();
            self.put(bytes, took);
        }
    }

    /// Hands `bytes`, which took `took` of the room, to the writing thread;
    /// `false` (the room given back) when there is no such thread.
    fn put(&self, bytes: Vec<u8>, took: u32) -> bool {
        let sent = self.tx.send(Message::Bytes(bytes, took)).is_ok();
        if !sent {
            self.room.add_permits(took as usize);
        }
        sent
    }

    /// Waits until `deadline` at most for every message sent before to be
    /// written, the count of lines dropped last included. Called outside
    /// the runtime, as the command ends.
    fn flush(&self, deadline: Instant) {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            // Past the bound: the last line, and a short one.
            let notice = dropped_notice(dropped).into_bytes();
            let _ = self.tx.send(Message::Bytes(notice, 0));
        }
        let (done, written) = std::sync::mpsc::channel();
        if self.tx.send(Message::Flush(done)).is_ok() {
            let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        }
    }
}

/// The line that says `dropped` lines were dropped.
fn dropped_notice(dropped: u64) -> String {
    format!("drover: {dropped} line(s) of output dropped: this stream was not keeping up\n")
}

/// drover's stdout.
pub(crate) fn stdout() -> &'static Stream {
    static STDOUT: OnceLock<Stream> = OnceLock::new();
    STDOUT.get_or_init(|| Stream::start("drover-stdout", || Box::new(io::stdout())))
}

/// drover's stderr.
pub(crate) fn stderr() -> &'static Stream {
    static STDERR: OnceLock<Stream> = OnceLock::new();
    STDERR.get_or_init(|| Stream::start("drover-stderr", || Box::new(io::stderr())))
}

/// Writes out what both streams hold, waiting at most `within` for both, so
/// the lines a command wrote last reach their readers before the process
/// exits.
pub(crate) fn flush_within(within: Duration) {
    let deadline = Instant::now() + within;
    stdout().flush(deadline);
    stderr().flush(deadline);
}

/// Flushes both streams ([`FLUSH`] at most) when dropped: held by
/// `cli::main` for its whole run, so every way out of it (a return, an
/// error, a panic) writes out the last lines.
#[derive(Debug)]
pub(crate) struct FlushOnDrop;

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        flush_within(FLUSH);
    }
}

/// tracing's writer: each event is one lossy write to [`stderr`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogWriter;

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        stderr().lossy(String::from_utf8_lossy(buf).into_owned());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, MutexGuard, PoisonError};

    use super::*;

    /// Held by the test while the stream must not move.
    static GATE: Mutex<()> = Mutex::new(());
    /// What the gated writer wrote.
    static WRITTEN: Mutex<Vec<u8>> = Mutex::new(Vec::new());

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A writer that waits for [`GATE`] before each write.
    struct Gated;

    impl io::Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            drop(lock(&GATE));
            lock(&WRITTEN).extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A stream that does not move never makes its writer wait: what it
    /// cannot hold is dropped, counted, and the count written with the
    /// next line that goes through; nothing else is lost.
    /// A line of exactly 1 KiB, numbered `n`.
    fn kib_line(n: usize) -> String {
        let mut line = format!("line {n} ");
        line.push_str(&"x".repeat(1023 - line.len()));
        line.push('\n');
        line
    }

    /// A stream that does not move never makes its writer wait: what it
    /// cannot hold ([`HELD_BYTES`]) is dropped and counted, the count
    /// written with the next line that goes through, or by the flush that
    /// ends the command when none does; nothing else is lost.
    #[test]
    fn a_stream_that_does_not_move_drops_and_counts_and_never_waits() {
        let gate = lock(&GATE);
        let stream = Stream::start("drover-test", || Box::new(Gated));
        let sent = HELD_BYTES / 1024 + 10;
        let started = Instant::now();
        for n in 0..sent {
            stream.lossy(kib_line(n));
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the writer waited"
        );
        drop(gate);
        stream.flush(Instant::now() + Duration::from_secs(30));
        let written = String::from_utf8(lock(&WRITTEN).clone()).expect("text");
        let lines = written.lines().filter(|l| l.starts_with("line ")).count();
        let dropped: usize = written
            .lines()
            .find_map(|l| l.strip_prefix("drover: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count of dropped lines after {lines} lines"));
        assert_eq!(
            (lines, dropped),
            (sent - 10, 10),
            "every line written or counted"
        );
    }
}
