//! `drover bench`: throughput figures, one machine-readable line each.

use clap::{Args as ClapArgs, ValueEnum};

use drover::bench::queue_cycle;

/// Arguments of `drover bench`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// What to measure.
    scenario: Scenario,
    /// Items (keys) per run.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Worker counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    workers: Vec<usize>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    /// The in-memory queue's add/get/done cycles next to a tokio mpsc channel.
    Queue,
}

/// Runs one benchmark scenario and prints a `BENCH …` line per figure.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::Queue => {
            for &workers in &args.workers {
                anyhow::ensure!(workers > 0, "--workers takes counts of at least 1");
                println!("{}", queue_cycle(workers, args.keys, 5).await.figure());
            }
        }
    }
    Ok(())
}
