//! The model benchmarks: the exact calls the kernel makes on [`TorchBackend`] during an RL
//! step, on inputs shared with the Python reference.
//!
//! - `generate`: [`PolicyBackend::generate`] (batched sampling with the preallocated KV cache,
//!   log-prob of every sampled token; greedy at temperature 0, with the generated ids in the
//!   result's `check.ids`).
//! - `score`: [`PolicyBackend::score`] with the live weights (the optimizer's `ℓ_old` pass and
//!   the teacher re-scoring path).
//! - `train`: [`RlLoss::from_rows`] plus [`PolicyBackend::train_step`] (forward with grad per
//!   micro-batch, the objective's per-token weights, backward, clipping, AdamW), as the
//!   optimizer actor runs it.
//!
//! Each prints one JSON line: the kind, the seconds of every timed call, the work done, the
//! resident set size after set-up and at the end, and values the suite compares with the
//! reference's to show both did the same work.

use std::path::Path;

use anyhow::Result;
use cairn_kernel::actors::optimizer::micro_batches;
use cairn_kernel::backend::{OptimizerSettings, PolicyBackend, SamplingParams, Sequence, Weights};
use cairn_kernel::objective::RlLoss;
use cairn_plugin_sdk::{Signals, TurnRow};
use cairn_torch::{BackendConfig, DeviceOption, Dtype, ModelSource, TorchBackend};
use serde_json::{json, Value};

use crate::measure::{median, rss_kb, timed, Times};
use crate::spec::{read_json, GenerateInputs, Kind, ScoreInputs, Spec, TrainInputs};

/// Runs the case in `spec_path` and prints its result line.
pub fn run(spec_path: &Path) -> Result<()> {
    let spec: Spec = read_json(spec_path)?;
    // libtorch reads OMP_NUM_THREADS for its OpenMP pool; the suite sets it for both sides,
    // and `BackendConfig::threads` sets the intra-op count explicitly as well.
    let (times, work, check) = match spec.kind {
        Kind::Generate => generate(&spec)?,
        Kind::Score => score(&spec)?,
        Kind::Train => train(&spec)?,
    };
    let (rss_end, hwm) = rss_kb();
    let out = json!({
        "kind": spec.kind,
        "impl": spec.implementation,
        "median_s": median(&times.0.wall_s),
        "median_cpu_s": median(&times.0.cpu_s),
        "times_s": times.0.wall_s,
        "cpu_s": times.0.cpu_s,
        "work": work,
        "rss_setup_kb": times.1,
        "rss_end_kb": rss_end,
        "hwm_kb": hwm,
        "check": check,
    });
    println!("{out}");
    Ok(())
}

/// Timed seconds and the RSS (KiB) after set-up.
type Timing = (Times, u64);

fn backend(
    spec: &Spec,
    score_batch_size: usize,
    optimizer: OptimizerSettings,
) -> Result<TorchBackend> {
    let device = match spec.device.as_str() {
        "cuda" => DeviceOption::Cuda,
        _ => DeviceOption::Cpu,
    };
    let config = BackendConfig {
        model: ModelSource::Pretrained {
            dir: spec.model.clone(),
        },
        device,
        dtype: Some(Dtype::F32),
        seed: 0,
        threads: Some(spec.threads),
        optimizer,
        warmup_steps: 0,
        score_batch_size,
    };
    Ok(TorchBackend::new(&config)?)
}

fn generate(spec: &Spec) -> Result<(Timing, Value, Value)> {
    let inputs: GenerateInputs = read_json(&spec.inputs)?;
    let mut backend = backend(spec, 1, OptimizerSettings::default())?;
    let setup_rss = rss_kb().0;
    let mut seed = inputs.seed;
    let (times, last) = timed(spec.warmup, spec.reps, || {
        let params = SamplingParams {
            temperature: inputs.temperature,
            top_p: inputs.top_p,
            max_new_tokens: inputs.max_new_tokens,
            stop_ids: Vec::new(),
            seed,
        };
        seed += 1;
        Ok(backend.generate(&inputs.prompts, &params)?)
    })?;
    let tokens: usize = last.iter().map(|g| g.ids.len()).sum();
    // Greedy decoding is deterministic, so the suite can check that every engine generated
    // the same ids; sampled ids depend on each side's RNG and are not compared.
    let check = if inputs.temperature == 0.0 {
        json!({"ids": last.iter().map(|g| &g.ids).collect::<Vec<_>>()})
    } else {
        json!({})
    };
    Ok(((times, setup_rss), json!({"new_tokens": tokens}), check))
}

fn score(spec: &Spec) -> Result<(Timing, Value, Value)> {
    let inputs: ScoreInputs = read_json(&spec.inputs)?;
    let mut backend = backend(spec, inputs.batch_size, OptimizerSettings::default())?;
    let sequences: Vec<Sequence> = inputs.sequences.iter().map(|p| p.sequence()).collect();
    let setup_rss = rss_kb().0;
    let (times, logps) = timed(spec.warmup, spec.reps, || {
        Ok(backend.score(&sequences, inputs.temperature, Weights::Current)?)
    })?;
    let tokens: usize = sequences
        .iter()
        .map(|s| s.prompt_ids.len() + s.response_ids.len())
        .sum();
    let flat: Vec<f64> = logps.iter().flatten().map(|&x| f64::from(x)).collect();
    Ok((
        (times, setup_rss),
        json!({"tokens": tokens, "response_tokens": flat.len()}),
        json!({
            "logp_sum": flat.iter().sum::<f64>(),
            "logp_first": logps.first().map(|r| r.iter().take(4).copied().collect::<Vec<_>>()),
        }),
    ))
}

fn train(spec: &Spec) -> Result<(Timing, Value, Value)> {
    let inputs: TrainInputs = read_json(&spec.inputs)?;
    let mut backend = backend(spec, 1, inputs.optimizer.clone())?;
    inputs.objective.validate()?;
    let sequences: Vec<Sequence> = inputs.sequences.iter().map(|p| p.sequence()).collect();
    // The step's rows as the optimizer sees them: ℓ_old on each row, advantages in the
    // signals, every token trained.
    let rows: Vec<TurnRow> = sequences
        .iter()
        .enumerate()
        .map(|(i, s)| TurnRow {
            trajectory_id: i as u64,
            prompt_ids: s.prompt_ids.clone(),
            response_ids: s.response_ids.clone(),
            response_logprobs: inputs.old_logp[i].clone(),
            response_mask: vec![1; s.response_ids.len()],
            old_logprobs: inputs.old_logp[i].clone(),
            ..TurnRow::default()
        })
        .collect();
    let row_refs: Vec<&TurnRow> = rows.iter().collect();
    let signals = Signals {
        advantages: inputs.advantages.clone(),
        ..Signals::default()
    };
    let indices: Vec<usize> = (0..rows.len()).collect();
    let micro = micro_batches(sequences.len(), inputs.micro_batch_rows);
    let setup_rss = rss_kb().0;
    let mut losses = Vec::new();
    let (times, _) = timed(spec.warmup, spec.reps, || {
        // The optimizer actor builds the loss from the step's rows, then the policy actor
        // runs the step: both are part of one update.
        let mut loss = RlLoss::from_rows(&inputs.objective, &row_refs, &signals, &indices)?;
        let report = backend.train_step(&sequences, &micro, inputs.temperature, &mut loss)?;
        losses.push(loss.report().loss);
        Ok(report)
    })?;
    let tokens: usize = sequences
        .iter()
        .map(|s| s.prompt_ids.len() + s.response_ids.len())
        .sum();
    let response_tokens: usize = sequences.iter().map(|s| s.response_ids.len()).sum();
    Ok((
        (times, setup_rss),
        json!({"tokens": tokens, "response_tokens": response_tokens, "micro_batches": micro.len()}),
        json!({"first_loss": losses.first()}),
    ))
}
