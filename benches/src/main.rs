//! `cairn-bench`: the Cairn side of the benchmark suite (`scripts/bench/run.sh`).
//!
//! Four commands, each printing one JSON result line on stdout:
//!
//! - `cairn-bench run SPEC.json`: one model benchmark (`generate`, `score` or `train`) on a
//!   Hugging Face model directory and an inputs file that `scripts/bench/suite.py` wrote, and
//!   that the Python reference (`scripts/bench/reference.py`) reads too; see [`work`].
//! - `cairn-bench pipeline`: the main job's trainer over the real actors and plugins, with the
//!   null backend (kernel overhead alone) or the tch backend (a real step), with every backend
//!   and plugin call timed; see [`pipeline`].
//! - `cairn-bench bank`: experience-bank retrieval latency (median, p95 of top-k queries) at
//!   10³, 10⁴ and 10⁵ entries; see [`bank`].
//! - `cairn-bench bank-actor --batch FILE`: the bank actor's share of a step (the `RecordBatch`
//!   hop, recording off and on, and the `CheckpointBank` snapshot); see [`bank_actor`].
//!
//! Nothing here is a test: timings are only reported, and the suite computes medians and
//! ratios across processes.

mod bank;
mod bank_actor;
mod measure;
mod pipeline;
mod probes;
mod spec;
mod work;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cairn-bench",
    about = "Cairn's side of the benchmark suite (scripts/bench)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one model benchmark described by a spec file; prints one JSON line.
    Run { spec: PathBuf },
    /// Run the trainer's RL steps with timed backend and plugin calls; prints one JSON line.
    Pipeline(pipeline::PipelineArgs),
    /// Time experience-bank retrieval at several bank sizes; prints one JSON line.
    Bank(bank::BankArgs),
    /// Time the bank actor's per-step and per-checkpoint messages; prints one JSON line.
    BankActor(bank_actor::BankActorArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run { spec } => work::run(&spec),
        Command::Pipeline(args) => pipeline::run(&args),
        Command::Bank(args) => bank::run(&args),
        Command::BankActor(args) => bank_actor::run(&args),
    }
}
