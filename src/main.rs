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
    no_transparent_huge_pages();
    cli::main()
}

/// Turns transparent huge pages off for this process, before anything is
/// allocated. mimalloc asks for them (`MADV_HUGEPAGE`) on the regions it takes
/// from the OS, so the first touch of each region made the kernel zero two
/// megabytes where a few kilobytes were wanted: 14–17 % of a SQLite
/// burn-down's samples were `clear_page_erms` under mimalloc's page faults,
/// most on SQLite's connection thread, and with the pages off a burn-down of
/// 100,000 keys was faster in six alternating rounds of six (median +10 %).
/// This is what mimalloc's own `MIMALLOC_ALLOW_THP=0` does, set in code so a
/// user need not know it. A kernel that refuses costs only that speed, so a
/// refusal is not reported (it would be printed by every command).
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_thp_disable(true).ok();
}
