//! The policy backend seam: everything the kernel asks of the model, in plain data.
//!
//! The tch implementation lives in the `cairn-torch` crate and runs on a `SyncArbiter` thread
//! (see [`crate::actors::policy`]); [`NullBackend`] stands in for it in kernel tests and in the
//! kernel-overhead benchmark. No tensor type crosses this seam: token ids, `f32` arrays and
//! paths only.

use std::ops::Range;
use std::path::Path;

use cairn_plugin_sdk::FinishReason;

use crate::error::Result;
use crate::loss::TokenLoss;

/// How to sample. `temperature` also applies when scoring for training, so the log-probs the
/// trainer computes are those of the sampling distribution (trl #4159).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (log-probs then reported at temperature 1).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables top-p.
    pub top_p: f32,
    /// Response length limit in tokens.
    pub max_new_tokens: u32,
    /// Generation stops after sampling any of these ids; the stop id is part of the response.
    pub stop_ids: Vec<u32>,
    /// Seed of the sampling RNG for this call.
    pub seed: u64,
}

/// One sampled response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generation {
    /// Sampled ids `[L]`, stop id included when one was sampled. Never altered after sampling:
    /// a response cut by `max_new_tokens` ends on whatever was sampled (no forced EOS).
    pub ids: Vec<u32>,
    /// `log softmax(logits / T)` of each sampled id, `[L]`, nats.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
}

/// A (context, response) pair to score or train on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sequence {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

/// Which weights to score with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// The live policy.
    Current,
    /// The frozen reference policy (the weights at the start of RL).
    Reference,
}

/// What one optimizer step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f32,
    /// Learning rate used.
    pub lr: f64,
    /// Policy version after the step.
    pub policy_version: u64,
    /// Response tokens processed (forward + backward).
    pub tokens: usize,
}

/// AdamW hyper-parameters. Setting them resets the optimizer's moments (a new phase, such as
/// RL after a supervised warm start, starts with a fresh optimizer).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OptimizerSettings {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
}

impl Default for OptimizerSettings {
    fn default() -> Self {
        OptimizerSettings {
            lr: 1e-6,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        }
    }
}

/// The model behind the policy: sampling, scoring, training, checkpoints.
///
/// Implementations own their device, weights, reference weights and optimizer state. Calls are
/// made from one thread at a time (the policy actor's `SyncArbiter` thread).
pub trait PolicyBackend: Send {
    /// Version of the live weights; bumped by every [`PolicyBackend::train_step`].
    fn policy_version(&self) -> u64;

    /// Samples one response per prompt, batched across prompts with a preallocated KV cache.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Generation>>;

    /// Log-probs `[L]` of each response token after its prompt, at `temperature`, no grad.
    fn score(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> Result<Vec<Vec<f32>>>;

    /// One optimizer step over `sequences`, split into `micro_batches` (ranges of sequence
    /// indices, covering every sequence once). For each micro-batch the backend computes the
    /// current response log-probs (at `temperature`, with grad) and, when
    /// [`TokenLoss::needs_entropy`], the per-token entropies; asks `loss` for the per-token
    /// gradient weights; and accumulates `Σ g·logp + Σ h·entropy` into the gradient. Then it
    /// clips the gradient norm, steps AdamW and bumps the policy version.
    fn train_step(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> Result<StepReport>;

    /// Copies the live weights into the reference weights.
    fn snapshot_reference(&mut self) -> Result<()>;

    /// Replaces the optimizer's hyper-parameters and resets its state (moments, step count).
    fn configure_optimizer(&mut self, settings: &OptimizerSettings) -> Result<()>;

    /// Writes weights, optimizer state and version into `dir`.
    fn save(&self, dir: &Path) -> Result<()>;

    /// Restores what [`PolicyBackend::save`] wrote.
    fn load(&mut self, dir: &Path) -> Result<()>;

    /// Writes the live weights as a Hugging Face model directory (`config.json`, safetensors,
    /// the tokenizer files of `tokenizer_dir`, `generation_config.json`) that transformers
    /// loads and vLLM/SGLang can serve. Returns the files written.
    fn export(&self, tokenizer_dir: &Path, dir: &Path) -> Result<Vec<String>>;
}

/// A backend without a model, for kernel tests and the kernel-overhead benchmark: it "samples"
/// a fixed response, scores every token at `ln(0.5)`, and counts steps.
#[derive(Clone, Debug, Default)]
pub struct NullBackend {
    pub version: u64,
    /// The ids every generation returns (empty: a single id 0).
    pub response: Vec<u32>,
}

impl PolicyBackend for NullBackend {
    fn policy_version(&self) -> u64 {
        self.version
    }

    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Generation>> {
        let ids = if self.response.is_empty() {
            vec![0]
        } else {
            self.response.clone()
        };
        let ids: Vec<u32> = ids
            .into_iter()
            .take(params.max_new_tokens.max(1) as usize)
            .collect();
        let finish_reason = if ids.last().is_some_and(|id| params.stop_ids.contains(id)) {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        Ok(prompts
            .iter()
            .map(|_| Generation {
                logprobs: vec![0.5f32.ln(); ids.len()],
                ids: ids.clone(),
                finish_reason,
            })
            .collect())
    }

    fn score(&mut self, sequences: &[Sequence], _t: f32, _w: Weights) -> Result<Vec<Vec<f32>>> {
        Ok(sequences
            .iter()
            .map(|s| vec![0.5f32.ln(); s.response_ids.len()])
            .collect())
    }

    fn train_step(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        _temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> Result<StepReport> {
        let mut tokens = 0;
        for mb in micro_batches {
            let logp: Vec<Vec<f32>> = sequences[mb.clone()]
                .iter()
                .map(|s| vec![0.5f32.ln(); s.response_ids.len()])
                .collect();
            let entropy: Vec<Vec<f32>> = logp
                .iter()
                .map(|l| vec![0.5f32.ln().abs(); l.len()])
                .collect();
            tokens += logp.iter().map(Vec::len).sum::<usize>();
            loss.grads(mb.clone(), &logp, &entropy)?;
        }
        self.version += 1;
        Ok(StepReport {
            grad_norm: 0.0,
            lr: 0.0,
            policy_version: self.version,
            tokens,
        })
    }

    fn snapshot_reference(&mut self) -> Result<()> {
        Ok(())
    }

    fn configure_optimizer(&mut self, _settings: &OptimizerSettings) -> Result<()> {
        Ok(())
    }

    fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
        std::fs::write(
            dir.join("null-backend.json"),
            format!("{{\"version\": {}}}", self.version),
        )
        .map_err(|e| crate::Error::io(dir, e))
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("null-backend.json");
        let text = std::fs::read_to_string(&path).map_err(|e| crate::Error::io(&path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| crate::Error::Checkpoint {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        self.version = v["version"].as_u64().unwrap_or(0);
        Ok(())
    }

    fn export(&self, _tokenizer_dir: &Path, dir: &Path) -> Result<Vec<String>> {
        Err(crate::Error::Model(format!(
            "the null backend has no weights to export to {}",
            dir.display()
        )))
    }
}
