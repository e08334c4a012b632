//! `cairn-bench bank-actor`: what the experience-bank actor costs a training step.
//!
//! Every RL step sends the bank actor one `RecordBatch` (the rollout chain's last hop, with a
//! clone of the finalised batch), and every checkpoint sends one `CheckpointBank` (a consistent
//! SQLite snapshot into the checkpoint directory). This command sends those two messages to a
//! running [`ExperienceBankActor`] on its own `SyncArbiter` thread, as the pipeline does, with
//! a real recorded batch (`<run>/trajectories/step-NNNNNN.json` of a run with
//! `run.record_trajectories = true`), and times each round trip: `RecordBatch` with recording
//! off (the default: the hop alone) and on (JSON serialisation plus an atomic file write), and
//! `CheckpointBank` of the bank as a default-config run leaves it (empty: `grpo` stores
//! nothing). Retrieval latency over filled banks is `cairn-bench bank`'s.

use std::path::PathBuf;
use std::time::Instant;

use actix::prelude::*;
use anyhow::{Context, Result};
use cairn_kernel::actors::bank::{CheckpointBank, ExperienceBankActor, RecordBatch};
use cairn_kernel::bank::{bank_path, Bank};
use cairn_plugin_sdk::Batch;
use serde_json::json;

use crate::measure::median;

#[derive(Debug, clap::Args)]
pub struct BankActorArgs {
    /// A recorded batch in the documented JSON form (`<run>/trajectories/step-NNNNNN.json`).
    #[arg(long)]
    batch: PathBuf,
    /// Timed round trips of each message (after 3 untimed ones).
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// Scratch directory (created; holds the bank, recorded batches and snapshots).
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

fn start(bank: Bank, record_dir: Option<PathBuf>) -> Addr<ExperienceBankActor> {
    let slot = std::sync::Mutex::new(Some((bank, record_dir)));
    SyncArbiter::start(1, move || {
        let (bank, record_dir) = slot
            .lock()
            .expect("the factory runs on one thread")
            .take()
            .expect("the bank actor is built once");
        ExperienceBankActor::new(bank, record_dir)
    })
}

pub fn run(args: &BankActorArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.batch)
        .with_context(|| format!("reading {}", args.batch.display()))?;
    let batch: Batch = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as a batch", args.batch.display()))?;
    let rows = batch.rows.len();
    let tokens: usize = batch
        .rows
        .iter()
        .map(|r| r.prompt_ids.len() + r.response_ids.len())
        .sum();
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir)
            .with_context(|| format!("clearing {}", args.dir.display()))?;
    }
    std::fs::create_dir_all(&args.dir)?;
    let repeats = args.repeats.max(1);
    let dir = args.dir.clone();

    let result: Result<serde_json::Value> = actix::System::new().block_on(async move {
        let mut out = serde_json::Map::new();
        for (label, record) in [("record_off", false), ("record_on", true)] {
            let run = dir.join(label);
            std::fs::create_dir_all(&run)?;
            let bank = Bank::open(&bank_path(&run))?;
            let addr = start(bank, record.then(|| run.join("trajectories")));
            let (med, max) = time(repeats, |i| {
                // The rollout chain sends a clone of the finalised batch (it keeps the
                // original for the optimizer), so the clone is part of the hop's cost.
                let mut b = batch.clone();
                b.step = i as u64;
                let addr = addr.clone();
                async move {
                    addr.send(RecordBatch { batch: b }).await??;
                    Ok(())
                }
            })
            .await?;
            out.insert(format!("record_batch_{label}_median_s"), json!(med));
            out.insert(format!("record_batch_{label}_max_s"), json!(max));
            if !record {
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
            }
        }
        out.insert("batch_rows".into(), json!(rows));
        out.insert("batch_tokens".into(), json!(tokens));
        out.insert("batch_json_bytes".into(), json!(text.len()));
        out.insert("repeats".into(), json!(repeats));
        actix::System::current().stop();
        Ok(serde_json::Value::Object(out))
    });
    println!("{}", serde_json::to_string(&result?)?);
    Ok(())
}
