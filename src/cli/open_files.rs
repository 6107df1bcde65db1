//! The open-file limit of the long-running commands: each connection `serve`
//! accepts and each command `work` runs holds descriptors, and the usual
//! soft limit (1,024) holds far fewer than either may be asked to.

use std::sync::OnceLock;

/// The soft and hard limits as the process found them, before [`raise`].
static FOUND: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises the soft open-file limit, to the hard one (commonly 1,024 soft
/// against 524,288 hard) or where that is refused (macOS takes no more than
/// 10,240) to 10,240, and returns the limit now in force (`None` when it
/// cannot be read).
pub(super) fn raise() -> Option<usize> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let _ = FOUND.set((soft, hard));
    let limit = [hard, hard.min(10_240)]
        .into_iter()
        .filter(|&raised| raised > soft)
        .find(|&raised| setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok())
        .unwrap_or(soft);
    Some(usize::try_from(limit).unwrap_or(usize::MAX))
}

/// The descriptors kept back from a limit of `limit` for what every command
/// holds beside its connections or runs (the database's connections,
/// SQLite's files, listeners, standard streams): a quarter, between 32 and
/// 256.
pub(super) fn reserve(limit: usize) -> usize {
    (limit / 4).clamp(32, 256)
}

/// The limits as the process found them, once [`raise`] has run: what the
/// commands `work` starts are given back (a program that `select()`s or
/// closes every descriptor up to its limit expects the usual one).
pub(super) fn found() -> Option<(u64, u64)> {
    FOUND.get().copied()
}
