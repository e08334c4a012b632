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
//!
//! Teacher terms ([`TokenLoss::teacher_requests`]): per micro-batch, a live teacher is a
//! no-grad forward of the **current** weights on `context_ids ++ response_ids` (the same code
//! as [`PolicyBackend::score_top_k`], so it equals a plain score of that sequence), run before
//! the micro-batch's forward with grad; a top-k request then gathers the student's log-probs
//! at the teacher's ids from the with-grad `[B, R, V]` log-probs, and `Σ g_top · s_top` joins
//! the back-propagated objective.
//!
//! Past versions ([`PolicyBackend::retain_versions`]): with `n > 1`, each optimizer step first
//! copies the weights it is about to change into a ring of `n − 1` snapshots (reusing the
//! oldest one's storage), so [`Weights::Version`] can score any of the last `n` versions. The
//! snapshots are not checkpointed: after [`PolicyBackend::load`] only the live version is
//! available until new steps refill the ring.

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;

use cairn_kernel::backend::{
    version_unavailable, Generation, OptimizerSettings, PolicyBackend, SamplingParams, Sequence,
    StepReport, TokenSink, Weights,
};
use cairn_kernel::loss::{TeacherRequest, TeacherScores, TokenLoss, TokenScores};
use cairn_plugin_sdk::Scored;
use tch::{Device, Kind, Tensor};

use crate::batch::ResponseBatch;
use crate::checkpoint;
use crate::config::{BackendConfig, ModelSource};
use crate::error::{Error, Result};
use crate::logprobs::{self, logit_temperature, response_scores};
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
    /// Versions [`Weights::Version`] can score, the live one included (≥ 1).
    retained_versions: usize,
    /// Frozen copies of past versions, oldest first, at most `retained_versions − 1`.
    versions: VecDeque<(u64, CausalLm)>,
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
            CausalLm::uninitialized(policy.config(), policy.device(), policy.dtype())?;
        reference.var_store_mut().copy(policy.var_store())?;
        reference.var_store_mut().freeze();
        let optimizer = AdamW::new(policy.named_parameters(), optimizer, warmup_steps)?;
        Ok(TorchBackend {
            policy,
            reference,
            optimizer,
            policy_version: 0,
            score_batch_size: score_batch_size.max(1),
            retained_versions: 1,
            versions: VecDeque::new(),
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
            let requests = loss.teacher_requests(range.clone())?;
            let mut answers = self.live_teachers(sequences, range, &requests, temperature)?;
            let batch = ResponseBatch::new(rows, vocab_size, device)?;
            if batch.r_max == 0 {
                // No response tokens: nothing to differentiate, but the loss sees the rows.
                let empty: Vec<Vec<f32>> = rows.iter().map(|_| Vec::new()).collect();
                let scores = TokenScores {
                    logp: &empty,
                    entropy: &empty,
                    teacher: &answers,
                };
                loss.grads(range.clone(), &scores)?;
                continue;
            }
            let with_entropy = loss.needs_entropy();
            let with_top = requests.iter().any(|r| r.top_k > 0);
            let scores =
                response_scores(&self.policy, &batch, temperature, with_entropy, with_top)?;
            let logp_rows = batch.unpad(&scores.logp.detach())?;
            let entropy_rows = match &scores.entropy {
                Some(h) => batch.unpad(&h.detach())?,
                None => Vec::new(),
            };
            // The student's log-probs at each top-k request's ids, with grad.
            let mut gathered: Vec<(usize, Tensor)> = Vec::new();
            if let Some(all) = &scores.logp_all {
                for (i, request) in requests.iter().enumerate().filter(|(_, r)| r.top_k > 0) {
                    let b = request.row - range.start;
                    let (len, k) = (batch.response_lens[b], request.top_k as usize);
                    let ids = match request.context_ids {
                        Some(_) => &answers[i].top_ids,
                        None => &request.ids,
                    };
                    if ids.len() != len * k {
                        return Err(Error::input(
                            "teacher request",
                            format!(
                                "sequence {}: {} top-k ids for {len} response tokens and k = {k}",
                                request.row,
                                ids.len()
                            ),
                        ));
                    }
                    crate::batch::check_ids(ids, vocab_size, "teacher top-k ids")?;
                    if len == 0 {
                        continue;
                    }
                    let ids: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
                    let ids = Tensor::from_slice(&ids)
                        .view([len as i64, k as i64])
                        .to_device(device);
                    let at = all
                        .get(b as i64)
                        .narrow(0, (batch.r_max - len) as i64, len as i64)
                        .gather(1, &ids, false);
                    answers[i].student_top_logprobs =
                        Vec::try_from(at.detach().to_device(Device::Cpu).contiguous().view([-1]))?;
                    gathered.push((i, at));
                }
            }
            let token_scores = TokenScores {
                logp: &logp_rows,
                entropy: &entropy_rows,
                teacher: &answers,
            };
            let grads = loss.grads(range.clone(), &token_scores)?;
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
            for (i, at) in &gathered {
                let w = grads.teacher.get(*i).filter(|w| w.len() == at.numel());
                let Some(w) = w else {
                    return Err(Error::input(
                        "loss gradient (teacher)",
                        format!(
                            "no gradient of the right length for teacher request {i} (sequence {})",
                            requests[*i].row
                        ),
                    ));
                };
                let w = Tensor::from_slice(w)
                    .view(at.size().as_slice())
                    .to_device(device);
                objective += (at * w).sum(Kind::Float);
            }
            objective.backward();
            tokens += batch.response_lens.iter().sum::<usize>();
        }
        Ok(tokens)
    }

    /// Answers the live requests of a micro-batch (no grad, current weights, `temperature`):
    /// the teacher's log-probs of the row's response after `context_ids`, and its top-k ids and
    /// log-probs. Fixed requests get an empty answer, filled by the gather later.
    fn live_teachers(
        &self,
        sequences: &[Sequence],
        range: &Range<usize>,
        requests: &[TeacherRequest],
        temperature: f64,
    ) -> Result<Vec<TeacherScores>> {
        let mut answers = vec![TeacherScores::default(); requests.len()];
        let mut live = Vec::new();
        let mut teacher_seqs = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if !range.contains(&r.row) {
                return Err(Error::input(
                    "teacher request",
                    format!("sequence {} is outside the micro-batch {range:?}", r.row),
                ));
            }
            if let Some(context) = &r.context_ids {
                live.push(i);
                teacher_seqs.push(Sequence {
                    prompt_ids: context.clone(),
                    response_ids: sequences[r.row].response_ids.clone(),
                });
            }
        }
        if live.is_empty() {
            return Ok(answers);
        }
        let k_max = live.iter().map(|&i| requests[i].top_k).max().unwrap_or(0);
        let scored = self.score_with(&self.policy, &teacher_seqs, temperature, k_max)?;
        for (&i, s) in live.iter().zip(scored) {
            let k = requests[i].top_k as usize;
            answers[i] = TeacherScores {
                top_ids: first_k(&s.top_ids, k_max as usize, k),
                top_logprobs: first_k(&s.top_logprobs, k_max as usize, k),
                logprobs: s.logprobs,
                student_top_logprobs: Vec::new(),
            };
        }
        Ok(answers)
    }

    /// The accumulated gradients by parameter name (f32 copies).
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        self.optimizer.gradients()
    }

    /// Clips, steps AdamW on the accumulated gradients, clears them and bumps the version.
    pub fn optimizer_step(&mut self, tokens: usize) -> Result<StepReport> {
        if self.retained_versions > 1 {
            self.keep_current_version()?;
        }
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

    /// Copies the live weights into the version ring (before a step changes them), reusing
    /// the oldest snapshot's storage once the ring is full.
    fn keep_current_version(&mut self) -> Result<()> {
        let reuse = if self.versions.len() + 1 >= self.retained_versions {
            self.versions.pop_front().map(|(_, m)| m)
        } else {
            None
        };
        let mut model = match reuse {
            Some(model) => model,
            None => CausalLm::uninitialized(
                self.policy.config(),
                self.policy.device(),
                self.policy.dtype(),
            )?,
        };
        model.var_store_mut().copy(self.policy.var_store())?;
        model.var_store_mut().freeze();
        self.versions.push_back((self.policy_version, model));
        Ok(())
    }

    /// The versions [`Weights::Version`] can score now, oldest first.
    pub fn kept_versions(&self) -> Vec<u64> {
        let mut kept: Vec<u64> = self.versions.iter().map(|(v, _)| *v).collect();
        kept.push(self.policy_version);
        kept
    }

    fn model(&self, weights: Weights) -> cairn_kernel::Result<&CausalLm> {
        match weights {
            Weights::Current => Ok(&self.policy),
            Weights::Reference => Ok(&self.reference),
            Weights::Version(v) if v == self.policy_version => Ok(&self.policy),
            Weights::Version(v) => self
                .versions
                .iter()
                .find(|(kept, _)| *kept == v)
                .map(|(_, m)| m)
                .ok_or_else(|| {
                    version_unavailable(
                        v,
                        self.policy_version,
                        &self.kept_versions(),
                        self.retained_versions,
                    )
                }),
        }
    }

    /// Log-probs of each response, and with `top_k > 0` the top-k ids and log-probs per
    /// position, under `model`, no grad; CPU and CUDA run the same code.
    fn score_with(
        &self,
        model: &CausalLm,
        sequences: &[Sequence],
        temperature: f64,
        top_k: u32,
    ) -> Result<Vec<Scored>> {
        let _guard = tch::no_grad_guard();
        let vocab = model.config().vocab_size;
        let k = top_k as usize;
        if k > vocab {
            return Err(Error::input(
                "top_k",
                format!("{k} is larger than the vocabulary ({vocab} ids)"),
            ));
        }
        let mut out = Vec::with_capacity(sequences.len());
        for chunk in sequences.chunks(self.score_batch_size) {
            let batch = ResponseBatch::new(chunk, vocab, model.device())?;
            if batch.r_max == 0 {
                out.extend(chunk.iter().map(|_| Scored::default()));
                continue;
            }
            let scores = response_scores(model, &batch, temperature, false, k > 0)?;
            let logp = batch.unpad(&scores.logp)?;
            match &scores.logp_all {
                Some(all) => {
                    let (values, ids) = logprobs::top_k(all, k);
                    let values: Vec<Vec<f32>> = batch.unpad_k(&values.to_kind(Kind::Float), k)?;
                    let ids: Vec<Vec<i64>> = batch.unpad_k(&ids.to_kind(Kind::Int64), k)?;
                    out.extend(
                        logp.into_iter()
                            .zip(values)
                            .zip(ids)
                            .map(|((lp, v), i)| Scored {
                                logprobs: lp,
                                top_ids: i.into_iter().map(|id| id as u32).collect(),
                                top_logprobs: v,
                            }),
                    );
                }
                None => out.extend(logp.into_iter().map(|lp| Scored {
                    logprobs: lp,
                    ..Default::default()
                })),
            }
        }
        Ok(out)
    }
}

/// The first `k` of every `k_max` entries of a row-major `[L, k_max]` list (top-k lists are
/// sorted, so these are the top `k`).
fn first_k<T: Copy>(values: &[T], k_max: usize, k: usize) -> Vec<T> {
    if k == 0 {
        return Vec::new();
    }
    values
        .chunks(k_max)
        .flat_map(|c| c[..k].iter().copied())
        .collect()
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

    fn generate_streaming(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        sink: &mut dyn TokenSink,
    ) -> cairn_kernel::Result<Vec<Generation>> {
        let _span = tracing::debug_span!(
            "generate_streaming",
            prompts = prompts.len(),
            version = self.policy_version
        )
        .entered();
        Ok(crate::sampling::generate_with(
            &self.policy,
            prompts,
            params,
            Some(sink),
        )?)
    }

    fn score(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> cairn_kernel::Result<Vec<Vec<f32>>> {
        let _span = tracing::debug_span!("score", sequences = sequences.len(), ?weights).entered();
        let t = logit_temperature(temperature)?;
        let scored = self.score_with(self.model(weights)?, sequences, t, 0)?;
        Ok(scored.into_iter().map(|s| s.logprobs).collect())
    }

    fn score_top_k(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
        top_k: u32,
    ) -> cairn_kernel::Result<Vec<Scored>> {
        let _span =
            tracing::debug_span!("score_top_k", sequences = sequences.len(), ?weights, top_k)
                .entered();
        let t = logit_temperature(temperature)?;
        Ok(self.score_with(self.model(weights)?, sequences, t, top_k)?)
    }

    fn retain_versions(&mut self, n: usize) -> cairn_kernel::Result<()> {
        self.retained_versions = n.max(1);
        while self.versions.len() + 1 > self.retained_versions {
            self.versions.pop_front();
        }
        Ok(())
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
        // Snapshots of another timeline's versions must not answer for this one's.
        self.versions.clear();
        Ok(())
    }

    fn export(&self, tokenizer_dir: &Path, dir: &Path) -> cairn_kernel::Result<Vec<String>> {
        TorchBackend::export(self, tokenizer_dir, dir).map_err(Into::into)
    }

    fn load_weights(&mut self, dir: &Path, version: u64) -> cairn_kernel::Result<()> {
        // Every tensor is checked (present, shape, dtype) before the first is copied.
        crate::weights::load_model_dir(&self.policy, dir)?;
        self.policy_version = version;
        self.versions.clear();
        Ok(())
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
