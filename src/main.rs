//! The `drover` command line: see `drover --help`.

mod cli;

/// mimalloc instead of the system allocator: a worker's rows are allocated on
/// SQLite's connection thread and freed on tokio's, and glibc's arenas met on
/// a lock for those frees.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
