//! Full training checkpoints: everything needed to resume a run where it stopped.
//!
//! A checkpoint directory is also a HF model directory (transformers loads it as is):
//!
//! | file                    | contents                                                    |
//! |-------------------------|-------------------------------------------------------------|
//! | `model.safetensors`     | live weights, HF names, model dtype                         |
//! | `config.json`           | HF model config                                             |
//! | `reference.safetensors` | frozen reference weights, same names                        |
//! | `optimizer.safetensors` | AdamW moments, f32: `exp_avg.<param>`, `exp_avg_sq.<param>` |
//! | `trainer_state.json`    | policy version, optimizer step count and settings           |
//!
//! There is no RNG state to save: sampling draws from a fresh RNG seeded by each call's
//! `SamplingParams::seed`, and the init seed only matters at construction.
//!
//! Every file is written under a temporary name and renamed into place, `trainer_state.json`
//! last, so a directory with a `trainer_state.json` holds a complete checkpoint. Loading
//! checks every tensor of all three weight files (presence, shape) before copying any, so a
//! bad checkpoint leaves the backend unchanged, and the error names the tensor, the expected
//! and found shapes and the file.

use std::path::Path;

use cairn_kernel::backend::OptimizerSettings;

use crate::error::{Error, Result};
use crate::model::{CausalLm, Dtype};
use crate::optim::AdamW;
use crate::weights::{save_model_dir, write_atomic, write_safetensors, Catalog, MODEL_FILE};

pub const REFERENCE_FILE: &str = "reference.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";
/// Version of the layout above, stored in `trainer_state.json`.
const FORMAT: u32 = 1;

/// `trainer_state.json`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct TrainerState {
    format: u32,
    policy_version: u64,
    optimizer_step: u64,
    optimizer: OptimizerSettings,
    warmup_steps: u64,
    dtype: Dtype,
}

/// The parts of a backend a checkpoint covers.
pub(crate) struct Parts<'a> {
    pub policy: &'a CausalLm,
    pub reference: &'a CausalLm,
    pub optimizer: &'a AdamW,
    pub policy_version: u64,
}

/// Writes a checkpoint into `dir` (created if needed).
pub(crate) fn save(dir: &Path, parts: &Parts<'_>) -> Result<()> {
    save_model_dir(parts.policy, dir)?;
    write_safetensors(
        &dir.join(REFERENCE_FILE),
        &parts.reference.named_parameters(),
    )?;
    write_safetensors(&dir.join(OPTIMIZER_FILE), &parts.optimizer.state_tensors())?;
    let state = TrainerState {
        format: FORMAT,
        policy_version: parts.policy_version,
        optimizer_step: parts.optimizer.step_count(),
        optimizer: parts.optimizer.settings().clone(),
        warmup_steps: parts.optimizer.warmup_steps(),
        dtype: parts.policy.dtype(),
    };
    let text = serde_json::to_string_pretty(&state).expect("TrainerState always serialises");
    write_atomic(&dir.join(STATE_FILE), text.as_bytes())
}

/// Restores a checkpoint from `dir` into the given models and optimizer; returns the policy
/// version. Nothing is modified unless every file checks out.
pub(crate) fn load(
    dir: &Path,
    policy: &CausalLm,
    reference: &CausalLm,
    optimizer: &mut AdamW,
) -> Result<u64> {
    let state_path = dir.join(STATE_FILE);
    if !state_path.is_file() {
        return Err(Error::Checkpoint {
            path: dir.to_path_buf(),
            reason: format!("no {STATE_FILE}, so this is not a complete cairn-torch checkpoint"),
        });
    }
    let text = std::fs::read_to_string(&state_path).map_err(|e| Error::io(&state_path, e))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: state_path.clone(),
        reason: format!("unreadable: {e}"),
    })?;
    if state.format != FORMAT {
        return Err(Error::Checkpoint {
            path: state_path,
            reason: format!("format {} (this build reads format {FORMAT})", state.format),
        });
    }
    let plans = [
        Catalog::file(&dir.join(MODEL_FILE))?.plan(policy.named_parameters())?,
        Catalog::file(&dir.join(REFERENCE_FILE))?.plan(reference.named_parameters())?,
        Catalog::file(&dir.join(OPTIMIZER_FILE))?.plan(optimizer.state_tensors())?,
    ];
    for plan in plans {
        plan.execute()?;
    }
    optimizer.restore(state.optimizer, state.warmup_steps, state.optimizer_step);
    Ok(state.policy_version)
}
