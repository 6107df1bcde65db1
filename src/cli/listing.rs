//! `--limit N --json`: the options every listing command shares (`drover
//! history`, `drover errors`), so a page's size and its format read the same
//! way in each.

use clap::Args as ClapArgs;

/// How much of a listing to print, and how.
#[derive(Debug, Clone, Copy, ClapArgs)]
pub(crate) struct Listing {
    /// At most this many entries (runs, error groups).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) limit: u32,
    /// Print one JSON array instead of lines.
    #[arg(long)]
    pub(crate) json: bool,
}
