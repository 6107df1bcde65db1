//! The `drover` command line: see `drover --help`.

mod cli;

/// mimalloc instead of the system allocator: a worker's rows are allocated on
/// SQLite's connection thread and freed on tokio's, and glibc's arenas met on
/// a lock for those frees. The crate's `override` feature (Cargo.toml) also
/// routes C's `malloc` and `free` to mimalloc, so the bundled SQLite's own
/// allocations (about a tenth of its connection thread's time in a burn-down,
/// in glibc's `_int_malloc` and `_int_free`) take the same allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
