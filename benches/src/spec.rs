//! The files `scripts/bench/suite.py` writes for one benchmark case, read identically by
//! `cairn-bench run` and `scripts/bench/reference.py`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cairn_kernel::backend::{OptimizerSettings, Sequence};
use cairn_kernel::objective::ObjectiveConfig;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// One benchmark case (`spec.json`).
#[derive(Clone, Debug, Deserialize)]
pub struct Spec {
    pub kind: Kind,
    /// Which implementation the suite asked for (`cairn` here); echoed in the result.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Hugging Face model directory (`config.json`, `model.safetensors`).
    pub model: PathBuf,
    /// The inputs file of this kind (see [`GenerateInputs`], [`ScoreInputs`], [`TrainInputs`]).
    pub inputs: PathBuf,
    /// libtorch intra-op threads.
    pub threads: usize,
    pub warmup: usize,
    pub reps: usize,
    /// `cpu` or `cuda`.
    #[serde(default = "default_device")]
    pub device: String,
}

fn default_device() -> String {
    "cpu".into()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Generate,
    Score,
    Train,
}

/// Batched sampling: one response per prompt, exactly `max_new_tokens` each (no stop ids).
#[derive(Clone, Debug, Deserialize)]
pub struct GenerateInputs {
    pub prompts: Vec<Vec<u32>>,
    pub max_new_tokens: u32,
    /// 0 for greedy decoding (argmax), as `SamplingParams::temperature`.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

/// A (prompt, response) pair as the inputs files spell it.
#[derive(Clone, Debug, Deserialize)]
pub struct Pair {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
}

impl Pair {
    pub fn sequence(&self) -> Sequence {
        Sequence {
            prompt_ids: self.prompt.clone(),
            response_ids: self.response.clone(),
        }
    }
}

/// Log-probs of responses after their prompts, in chunks of `batch_size` sequences.
#[derive(Clone, Debug, Deserialize)]
pub struct ScoreInputs {
    pub sequences: Vec<Pair>,
    pub batch_size: usize,
    pub temperature: f32,
}

/// One GRPO update: every sequence trained on (mask all ones), per-token advantages and old
/// log-probs, micro-batches of `micro_batch_rows` consecutive sequences.
#[derive(Clone, Debug, Deserialize)]
pub struct TrainInputs {
    pub sequences: Vec<Pair>,
    pub advantages: Vec<Vec<f32>>,
    pub old_logp: Vec<Vec<f32>>,
    pub micro_batch_rows: usize,
    pub temperature: f32,
    /// Keys of the pipeline config's `[objective]` table.
    pub objective: ObjectiveConfig,
    /// AdamW settings, spelled as [`OptimizerSettings`]'s fields.
    pub optimizer: OptimizerSettings,
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_inputs_take_objective_keys() {
        let inputs: TrainInputs = serde_json::from_value(serde_json::json!({
            "sequences": [{"prompt": [1, 2], "response": [3]}],
            "advantages": [[0.5]],
            "old_logp": [[-1.0]],
            "micro_batch_rows": 4,
            "temperature": 1.0,
            "objective": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0,
                          "log_ratio_clamp": 20.0, "aggregation": "token-mean"},
            "optimizer": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                          "weight_decay": 0.0, "max_grad_norm": 1.0}
        }))
        .unwrap();
        assert_eq!(inputs.objective.clip_high, 0.28);
        assert_eq!(inputs.sequences[0].sequence().response_ids, vec![3]);
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "kind": "train", "impl": "cairn", "model": "m", "inputs": "i.json",
            "threads": 2, "warmup": 1, "reps": 3
        }))
        .unwrap();
        assert_eq!((spec.kind, spec.device.as_str()), (Kind::Train, "cpu"));
    }
}
