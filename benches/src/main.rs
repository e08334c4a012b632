//! `cairn-bench`: the Cairn side of the benchmark suite (`scripts/bench/run.sh`).
//!
//! Six commands, each printing one JSON result line on stdout:
//!
//! - `cairn-bench run SPEC.json`: one model benchmark (`generate`, `score` or `train`) on a
//!   Hugging Face model directory and an inputs file that `scripts/bench/suite.py` wrote, and
//!   that the Python reference (`scripts/bench/reference.py`) reads too; see [`work`].
//! - `cairn-bench pipeline`: the main job's trainer over the real actors and plugins, with the
//!   null backend (kernel overhead alone) or the tch backend (a real step), with every backend
//!   and plugin call timed; see [`pipeline`].
//! - `cairn-bench bank`: experience-bank retrieval latency (median, p95 of top-k queries) at
//!   10³, 10⁴ and 10⁵ entries; see [`bank`].
//! - `cairn-bench bank-actor`: the bank actor's `CheckpointBank` snapshot; see [`bank_actor`].
//! - `cairn-bench pool --run RUN_DIR`: the data pool's write cost per step (a run's own steps
//!   written again) and its size, and queries over 10⁶ synthetic turn rows; see [`pool`].
//! - `cairn-bench env-calls`: the cost of the environment calls' deadline worker per turn;
//!   see [`env_calls`].
//!
//! Nothing here is a test: timings are only reported, and the suite computes medians and
//! ratios across processes.

mod bank;
mod bank_actor;
mod env_calls;
mod measure;
mod pipeline;
mod pool;
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
    /// Time the bank actor's per-checkpoint snapshot; prints one JSON line.
    BankActor(bank_actor::BankActorArgs),
    /// Time data-pool writes (a run's steps) and queries over 10⁶ rows; prints one JSON line.
    Pool(pool::PoolArgs),
    /// Time the deadline worker of environment calls against inline calls; prints one JSON line.
    EnvCalls(env_calls::EnvCallsArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run { spec } => work::run(&spec),
        Command::Pipeline(args) => pipeline::run(&args),
        Command::Bank(args) => bank::run(&args),
        Command::BankActor(args) => bank_actor::run(&args),
        Command::Pool(args) => pool::run(&args),
        Command::EnvCalls(args) => env_calls::run(&args),
    }
}
