//! [`TorchBackend`]: the tch implementation of the kernel's [`PolicyBackend`].
//!
//! It owns the live policy, a frozen reference copy (taken at construction and by
//! `snapshot_reference`), the AdamW state and the policy version, all on one device. The
//! kernel's policy actor calls it from its `SyncArbiter` thread; nothing here is shared.
//!
//! Training follows the [`TokenLoss`] contract: per micro-batch, one forward with grad gives
//! the response log-probs `ℓ` (and entropies `H` when the loss asks), the loss turns them into
//! per-token weights `g`, `h`, and `(ℓ·g).sum() + (H·h).sum()` is back-propagated, accumulating
//! into the parameters' gradients. Because `g` and `h` are `∂L/∂ℓ` and `∂L/∂H` of a loss whose
//! normalisers are fixed for the whole step, the accumulated gradient is the gradient of the
//! step's loss however the batch is split. Then the global norm is clipped, AdamW steps, and
//! the version is bumped.

use std::ops::Range;
use std::path::Path;

use cairn_kernel::backend::{
    Generation, OptimizerSettings, PolicyBackend, SamplingParams, Sequence, StepReport, Weights,
};
use cairn_kernel::loss::TokenLoss;
use tch::{Device, Kind, Tensor};

use crate::batch::ResponseBatch;
use crate::checkpoint;
use crate::config::{BackendConfig, ModelSource};
use crate::error::{Error, Result};
use crate::logprobs::{logit_temperature, response_scores};
use crate::model::{CausalLm, Dtype};
use crate::optim::AdamW;

/// The policy model, its reference copy and its optimizer; see the module docs.
#[derive(Debug)]
pub struct TorchBackend {
    policy: CausalLm,
    /// Frozen (`requires_grad = false`) copy of the policy.
    reference: CausalLm,
    optimizer: AdamW,
    policy_version: u64,
    score_batch_size: usize,
}

impl TorchBackend {
    /// Builds the model (loaded or freshly initialised), the reference copy and the optimizer.
    /// Sets libtorch's thread count when `config.threads` is given (process-wide).
    pub fn new(config: &BackendConfig) -> Result<TorchBackend> {
        if let Some(threads) = config.threads {
            tch::set_num_threads(threads as i32);
        }
        let device = config.device.resolve()?;
        let policy = match &config.model {
            ModelSource::Pretrained { dir } => {
                let model_config =
                    crate::model::ModelConfig::from_file(&dir.join(crate::weights::CONFIG_FILE))?;
                let dtype = config.dtype.unwrap_or_else(|| default_dtype(&model_config));
                CausalLm::from_pretrained(dir, device, dtype)?
            }
            ModelSource::Random {
                config: model_config,
            } => {
                let dtype = config.dtype.unwrap_or_else(|| default_dtype(model_config));
                CausalLm::random(model_config, device, dtype, config.seed)?
            }
        };
        tracing::info!(
            model_type = policy.config().model_type.as_str(),
            params = policy.named_parameters().iter().map(|(_, t)| t.numel()).sum::<usize>(),
            device = ?device,
            dtype = ?policy.dtype(),
            "policy model ready"
        );
        TorchBackend::from_model(
            policy,
            config.optimizer.clone(),
            config.warmup_steps,
            config.score_batch_size,
        )
    }

    /// Wraps an already-built policy: the reference starts as a copy of it.
    pub fn from_model(
        policy: CausalLm,
        optimizer: OptimizerSettings,
        warmup_steps: u64,
        score_batch_size: usize,
    ) -> Result<TorchBackend> {
        let mut reference =
            CausalLm::uninitialized(policy.config(), policy.device(), policy.dtype());
        reference.var_store_mut().copy(policy.var_store())?;
        reference.var_store_mut().freeze();
        let optimizer = AdamW::new(policy.named_parameters(), optimizer, warmup_steps);
        Ok(TorchBackend {
            policy,
            reference,
            optimizer,
            policy_version: 0,
            score_batch_size: score_batch_size.max(1),
        })
    }

    pub fn policy(&self) -> &CausalLm {
        &self.policy
    }

    pub fn reference(&self) -> &CausalLm {
        &self.reference
    }

    pub fn device(&self) -> Device {
        self.policy.device()
    }

    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// Clears the gradients, then runs forward and backward over every micro-batch,
    /// accumulating the gradient of the step's loss (see the module docs). Returns the number
    /// of response tokens processed. Weights are not changed; [`TorchBackend::optimizer_step`]
    /// applies the gradient. `train_step` is these two calls.
    pub fn accumulate_gradients(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> Result<usize> {
        check_cover(micro_batches, sequences.len())?;
        let temperature = logit_temperature(temperature)?;
        let device = self.device();
        let vocab_size = self.policy.config().vocab_size;
        self.optimizer.zero_grad();
        let mut tokens = 0;
        for range in micro_batches {
            let rows = &sequences[range.clone()];
            let batch = ResponseBatch::new(rows, vocab_size, device)?;
            if batch.r_max == 0 {
                // No response tokens: nothing to differentiate, but the loss sees the rows.
                let empty: Vec<Vec<f32>> = rows.iter().map(|_| Vec::new()).collect();
                loss.grads(range.clone(), &empty, &empty)?;
                continue;
            }
            let with_entropy = loss.needs_entropy();
            let scores = response_scores(&self.policy, &batch, temperature, with_entropy)?;
            let logp_rows = batch.unpad(&scores.logp.detach())?;
            let entropy_rows = match &scores.entropy {
                Some(h) => batch.unpad(&h.detach())?,
                None => Vec::new(),
            };
            let grads = loss.grads(range.clone(), &logp_rows, &entropy_rows)?;
            let g = batch.pad(&grads.logp, "loss gradient (logp)", device)?;
            let mut objective = (&scores.logp * &g).sum(Kind::Float);
            if let Some(h) = &scores.entropy {
                if !grads.entropy.is_empty() {
                    let w = batch.pad(&grads.entropy, "loss gradient (entropy)", device)?;
                    objective += (h * &w).sum(Kind::Float);
                }
            } else if !grads.entropy.is_empty() && grads.entropy.iter().any(|r| !r.is_empty()) {
                return Err(Error::input(
                    "loss gradient (entropy)",
                    "the loss returned entropy weights but needs_entropy() is false",
                ));
            }
            objective.backward();
            tokens += batch.response_lens.iter().sum::<usize>();
        }
        Ok(tokens)
    }

    /// The accumulated gradients by parameter name (f32 copies).
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        self.optimizer.gradients()
    }

    /// Clips, steps AdamW on the accumulated gradients, clears them and bumps the version.
    pub fn optimizer_step(&mut self, tokens: usize) -> Result<StepReport> {
        let step = self.optimizer.step()?;
        self.policy_version += 1;
        Ok(StepReport {
            grad_norm: step.grad_norm as f32,
            lr: step.lr,
            policy_version: self.policy_version,
            tokens,
        })
    }

    /// Writes the live weights as a HF model directory (`model.safetensors`, `config.json`),
    /// without tokenizer files; [`TorchBackend::export`] writes a servable directory.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        crate::weights::save_model_dir(&self.policy, dir)
    }

    /// Exports the live weights with the tokenizer of `tokenizer_dir` as a HF model directory
    /// that transformers loads and vLLM/SGLang serve; see [`crate::export`]. Returns the names
    /// of the files written.
    pub fn export(&self, tokenizer_dir: &Path, dir: &Path) -> Result<Vec<String>> {
        crate::export::export_model_dir(&self.policy, tokenizer_dir, dir)
    }

    fn score_impl(
        &self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> Result<Vec<Vec<f32>>> {
        let _guard = tch::no_grad_guard();
        let temperature = logit_temperature(temperature)?;
        let model = match weights {
            Weights::Current => &self.policy,
            Weights::Reference => &self.reference,
        };
        let mut out = Vec::with_capacity(sequences.len());
        for chunk in sequences.chunks(self.score_batch_size) {
            let batch = ResponseBatch::new(chunk, model.config().vocab_size, model.device())?;
            if batch.r_max == 0 {
                out.extend(chunk.iter().map(|_| Vec::new()));
                continue;
            }
            let scores = response_scores(model, &batch, temperature, false)?;
            out.extend(batch.unpad(&scores.logp)?);
        }
        Ok(out)
    }
}

/// bf16 when the config's `torch_dtype` says so, else f32.
fn default_dtype(config: &crate::model::ModelConfig) -> Dtype {
    match config.torch_dtype.as_deref() {
        Some("bfloat16") => Dtype::Bf16,
        _ => Dtype::F32,
    }
}

/// Errors unless `ranges` cover `0..n` exactly once.
fn check_cover(ranges: &[Range<usize>], n: usize) -> Result<()> {
    let mut seen = vec![false; n];
    for r in ranges {
        if r.end > n || r.start > r.end {
            return Err(Error::input(
                "micro_batches",
                format!("range {r:?} is outside 0..{n}"),
            ));
        }
        for i in r.clone() {
            if std::mem::replace(&mut seen[i], true) {
                return Err(Error::input(
                    "micro_batches",
                    format!("sequence {i} is in more than one micro-batch"),
                ));
            }
        }
    }
    match seen.iter().position(|&s| !s) {
        Some(i) => Err(Error::input(
            "micro_batches",
            format!("sequence {i} is in no micro-batch"),
        )),
        None => Ok(()),
    }
}

impl PolicyBackend for TorchBackend {
    fn policy_version(&self) -> u64 {
        self.policy_version
    }

    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> cairn_kernel::Result<Vec<Generation>> {
        let _span = tracing::debug_span!(
            "generate",
            prompts = prompts.len(),
            version = self.policy_version
        )
        .entered();
        Ok(crate::sampling::generate(&self.policy, prompts, params)?)
    }

    fn score(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> cairn_kernel::Result<Vec<Vec<f32>>> {
        let _span = tracing::debug_span!("score", sequences = sequences.len(), ?weights).entered();
        Ok(self.score_impl(sequences, temperature, weights)?)
    }

    fn train_step(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> cairn_kernel::Result<StepReport> {
        let _span = tracing::info_span!(
            "train_step",
            version = self.policy_version,
            sequences = sequences.len()
        )
        .entered();
        let tokens = self.accumulate_gradients(sequences, micro_batches, temperature, loss)?;
        let report = self.optimizer_step(tokens)?;
        tracing::debug!(
            grad_norm = report.grad_norm,
            lr = report.lr,
            tokens,
            "optimizer step"
        );
        Ok(report)
    }

    fn snapshot_reference(&mut self) -> cairn_kernel::Result<()> {
        self.reference
            .var_store_mut()
            .copy(self.policy.var_store())
            .map_err(Error::from)?;
        Ok(())
    }

    fn configure_optimizer(&mut self, settings: &OptimizerSettings) -> cairn_kernel::Result<()> {
        self.optimizer.reset(settings.clone());
        Ok(())
    }

    fn save(&self, dir: &Path) -> cairn_kernel::Result<()> {
        let parts = checkpoint::Parts {
            policy: &self.policy,
            reference: &self.reference,
            optimizer: &self.optimizer,
            policy_version: self.policy_version,
        };
        Ok(checkpoint::save(dir, &parts)?)
    }

    fn load(&mut self, dir: &Path) -> cairn_kernel::Result<()> {
        self.policy_version =
            checkpoint::load(dir, &self.policy, &self.reference, &mut self.optimizer)?;
        Ok(())
    }

    fn export(&self, tokenizer_dir: &Path, dir: &Path) -> cairn_kernel::Result<Vec<String>> {
        TorchBackend::export(self, tokenizer_dir, dir).map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_must_cover_once() {
        assert!(check_cover(&[0..2, 2..5], 5).is_ok());
        assert!(check_cover(&[0..2, 1..5], 5)
            .unwrap_err()
            .to_string()
            .contains("sequence 1"));
        assert!(check_cover(std::slice::from_ref(&(0..2)), 3)
            .unwrap_err()
            .to_string()
            .contains("sequence 2 is in no"));
        assert!(check_cover(std::slice::from_ref(&(0..4)), 3).is_err());
    }
}
