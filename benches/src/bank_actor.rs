//! `cairn-bench bank-actor`: what the experience-bank actor costs a training step.
//!
//! Every checkpoint sends the bank actor one `CheckpointBank` (a consistent SQLite snapshot
//! into the checkpoint directory). This command sends it to a running
//! [`ExperienceBankActor`] on its own `SyncArbiter` thread, as the pipeline does, and times
//! each round trip, with the bank as a default-config run leaves it (empty: `grpo` stores
//! nothing). Trajectories are no longer the bank actor's (the data pool's actor writes them:
//! `cairn-bench pool`). Retrieval latency over filled banks is `cairn-bench bank`'s.

use std::path::PathBuf;
use std::time::Instant;

use actix::prelude::*;
use anyhow::Result;
use cairn_kernel::actors::bank::{CheckpointBank, ExperienceBankActor};
use cairn_stores::bank::{bank_path, Bank};
use serde_json::json;

use crate::measure::median;

#[derive(Debug, clap::Args)]
pub struct BankActorArgs {
    /// Timed round trips of each message (after 3 untimed ones).
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// Scratch directory (created; holds the bank and its snapshots).
    #[arg(long, default_value = "target/bench/bank-actor")]
    dir: PathBuf,
}

const WARM_UP: usize = 3;

/// Median and max of `f`'s round trips, in seconds.
async fn time<F, Fut>(repeats: usize, mut f: F) -> Result<(f64, f64)>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut secs = Vec::with_capacity(repeats);
    for i in 0..WARM_UP + repeats {
        let started = Instant::now();
        f(i).await?;
        if i >= WARM_UP {
            secs.push(started.elapsed().as_secs_f64());
        }
    }
    let max = secs.iter().copied().fold(0.0, f64::max);
    let med = median(&secs).expect("at least one timed round trip: repeats >= 1");
    Ok((med, max))
}

fn start(bank: Bank) -> Addr<ExperienceBankActor> {
    let slot = std::sync::Mutex::new(Some(bank));
    SyncArbiter::start(1, move || {
        let bank = slot
            .lock()
            .expect("the factory runs on one thread")
            .take()
            .expect("the bank actor is built once");
        ExperienceBankActor::new(bank)
    })
}

pub fn run(args: &BankActorArgs) -> Result<()> {
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir)?;
    }
    std::fs::create_dir_all(&args.dir)?;
    let repeats = args.repeats.max(1);
    let run = args.dir.clone();
    let result: Result<serde_json::Value> = actix::System::new().block_on(async move {
        let mut out = serde_json::Map::new();
        let addr = start(Bank::open(&bank_path(&run))?);
        let (med, max) = time(repeats, |i| {
            let addr = addr.clone();
            let dir = run.join(format!("checkpoints/step-{i:06}"));
            async move {
                addr.send(CheckpointBank { dir }).await??;
                Ok(())
            }
        })
        .await?;
        out.insert("checkpoint_bank_empty_median_s".into(), json!(med));
        out.insert("checkpoint_bank_empty_max_s".into(), json!(max));
        out.insert("repeats".into(), json!(repeats));
        actix::System::current().stop();
        Ok(serde_json::Value::Object(out))
    });
    println!("{}", serde_json::to_string(&result?)?);
    Ok(())
}
