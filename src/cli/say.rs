//! Lines for whoever reads drover's output, which may have gone away: a
//! `drover history | head` that has read enough, a log shipper that died
//! under `drover work`. `println!` and `eprintln!` panic when their stream
//! is a pipe nobody reads. A panic there would stop `drover serve`'s signal
//! task before it starts the shutdown (a SIGTERM then stops nothing), and
//! would fail every run of `drover work --exec` whose command writes a line
//! it relays. So a command's own output stops the command quietly when its
//! reader has gone ([`outln!`]), and the lines of a long-running command (its
//! banner, warnings, a run's relayed output) are written if they can be,
//! and lost otherwise ([`sayln!`], [`errln!`], through
//! [`streams`](super::streams), so they never wait either).

use std::fmt;
use std::io::{self, Write as _};

/// The reader of stdout has gone (a broken pipe): the command stops and
/// exits 0, as `head` meant it to.
#[derive(Debug)]
pub(crate) struct Gone;

impl fmt::Display for Gone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for Gone {}

/// Writes one line of a command's output to stdout: [`Gone`] when its reader
/// has gone, any other failure (a full disk) as an error saying so.
pub(crate) fn out(line: fmt::Arguments<'_>) -> anyhow::Result<()> {
    match writeln!(io::stdout().lock(), "{line}") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(Gone.into()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot write to stdout")),
    }
}

/// The output of a command that acts on several things and writes a line
/// for each: every one is acted on whatever becomes of the output, and the
/// first failed write ([`Gone`], or a full disk) is the command's result at
/// the end.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    failed: Option<anyhow::Error>,
}

impl Lines {
    /// Writes `line` to stdout unless a write has failed already.
    pub(crate) fn line(&mut self, line: fmt::Arguments<'_>) {
        if self.failed.is_none() {
            self.failed = out(line).err();
        }
    }

    /// The first failed write, if any.
    pub(crate) fn finish(self) -> anyhow::Result<()> {
        self.failed.map_or(Ok(()), Err)
    }
}

/// Writes one line to stdout if it can, never waiting for it (see
/// [`streams`](super::streams)): a long-running command's banner must not
/// stop it.
pub(crate) fn say(line: fmt::Arguments<'_>) {
    super::streams::stdout().lossy(format!("{line}\n"));
}

/// Writes one line to stderr if it can, never waiting for it.
pub(crate) fn err(line: fmt::Arguments<'_>) {
    super::streams::stderr().lossy(format!("{line}\n"));
}

/// `println!` for a command's own output: evaluates to
/// `anyhow::Result<()>`, [`Gone`] when stdout's reader has gone.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::say::out(::std::format_args!($($arg)*))
    };
}

/// `println!` that never panics nor waits: the line is lost when stdout
/// cannot take it.
macro_rules! sayln {
    ($($arg:tt)*) => {
        $crate::cli::say::say(::std::format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics nor waits: the line is lost when stderr
/// cannot take it.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::say::err(::std::format_args!($($arg)*))
    };
}

pub(crate) use {errln, outln, sayln};
