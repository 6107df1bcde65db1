//! The `drover` command line: see `drover --help`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
