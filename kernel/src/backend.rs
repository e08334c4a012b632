//! The policy backend seam: everything the kernel asks of the model, in plain data.
//!
//! The tch implementation lives in the `cairn-torch` crate and runs on a `SyncArbiter` thread
//! (see [`crate::actors::policy`]); [`NullBackend`] stands in for it in kernel tests and in the
//! kernel-overhead benchmark. No tensor type crosses this seam: token ids, `f32` arrays and
//! paths only.

use std::ops::Range;
use std::path::Path;

use cairn_plugin_sdk::{FinishReason, Scored};

use crate::error::{Error, Result};
use crate::loss::{TeacherScores, TokenLoss, TokenScores};

/// The smallest positive temperature. The sampler divides the f32 logits by the temperature
/// (`logits / t` on the CPU; `logits * (1/t)`, with `1/t` rounded to f32, on CUDA), so a
/// logit `x` becomes infinite once `|x| > t × f32::MAX`, and every log-prob of its row NaN:
/// at `f32::MIN_POSITIVE` (1.2e-38) any logit of 4 or more does (libtorch on the CPU), and
/// on CUDA below `1/f32::MAX` (2.9e-39) every logit does, `1/t` itself overflowing. No bound
/// on `t` alone is exact (it depends on the logits), so Cairn takes `t >= 1e-6`, finite
/// for logits up to 3.4e32, far past any model's, and refuses smaller ones (the config's temperatures, the gateway's requests): such a
/// temperature samples practically the argmax, as `temperature: 0` (greedy) does. SGLang
/// treats temperatures below the same 1e-6 as greedy.
pub const MIN_TEMPERATURE: f32 = 1e-6;

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

/// Receives each token while [`PolicyBackend::generate_streaming`] samples it (the gateway's
/// streaming and cancellation). Called on the policy actor's thread, between decode steps, so
/// it must not block.
pub trait TokenSink: Send {
    /// Sampling starts on the weights of `policy_version`; called once, before any token, by
    /// the policy actor ([`crate::actors::policy::GenerateStream`]).
    fn begin(&mut self, policy_version: u64);

    /// Row `row` (an index into the prompts) sampled `id`, with `log softmax(logits / T)` =
    /// `logprob` nats; `finish` is set when this id ends the row (a stop id, or
    /// `max_new_tokens`). Returns `false` when nobody wants the row's later tokens: the
    /// backend then samples no more for it (its finish reason becomes
    /// [`FinishReason::Aborted`]) and stops the batch once no row is left.
    fn token(&mut self, row: usize, id: u32, logprob: f32, finish: Option<FinishReason>) -> bool;

    /// Continuous batching: requests that join the running batch now, asked before the first
    /// prefill and then between every two decode steps; `live_rows` rows are still being
    /// sampled (before the first prefill: the call's own prompts). Rows are numbered in order of arrival: the call's prompts are rows `0..B`,
    /// then each admission's prompts take the next numbers. An admitted row is sampled with
    /// the call's temperature, top-p and stop ids, but its own length limit and seed, so its
    /// ids do not depend on the rows it shares the batch with (up to the rounding of a
    /// different batch shape). The backend stops asking (and the call returns) once this
    /// answers nothing while no row is live. The default admits nothing.
    fn admit(&mut self, live_rows: usize) -> Vec<Admission> {
        let _ = live_rows;
        Vec::new()
    }

    /// An admission whose rows start at `first_row` could not be sampled (an empty prompt, an
    /// id outside the vocabulary, a prompt past the context window): `message` says which.
    /// None of its rows gets a token.
    fn refuse(&mut self, first_row: usize, message: String) {
        let _ = (first_row, message);
    }
}

/// Prompts joining a running generation ([`TokenSink::admit`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    /// One row per prompt, each non-empty.
    pub prompts: Vec<Vec<u32>>,
    /// Length limit of these rows, in tokens.
    pub max_new_tokens: u32,
    /// Seed of these rows' sampling streams: row `k` of the admission draws from stream `k`,
    /// as row `k` of a call with `SamplingParams::seed = seed` does.
    pub seed: u64,
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
    /// The policy as it was at this version: the live weights when it is the current
    /// version, else one of the snapshots kept by [`PolicyBackend::retain_versions`]. A
    /// version that is not kept is an error, never approximated.
    Version(u64),
    /// The frozen reference policy (the weights at the start of RL).
    Reference,
}

/// The error for a [`Weights::Version`] the backend does not keep: names the version, the
/// kept ones and what to change.
pub fn version_unavailable(version: u64, current: u64, kept: &[u64], retained: usize) -> Error {
    let kept: Vec<String> = kept.iter().map(u64::to_string).collect();
    Error::Model(format!(
        "policy version {version} is not kept: the live version is {current} and the backend \
         keeps [{}] (retain_versions = {retained}); keep more versions (rollout.max_staleness + 1) \
         or score with the current weights",
        kept.join(", ")
    ))
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

    /// [`PolicyBackend::generate`], each sampled id handed to `sink` as it is sampled; a row
    /// the sink refuses stops there (finish reason [`FinishReason::Aborted`]), and the sink's
    /// admissions ([`TokenSink::admit`]) join the batch; the result holds every row, in row
    /// order. The default samples each batch whole, replays it to the sink (no early stop)
    /// and then samples the admissions after it; backends that decode step by step override
    /// it with continuous batching.
    fn generate_streaming(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        sink: &mut dyn TokenSink,
    ) -> Result<Vec<Generation>> {
        let mut out: Vec<Generation> = Vec::new();
        // Without a step-by-step decoder, admissions are sampled one after the other.
        let mut queue = std::collections::VecDeque::from([Admission {
            prompts: prompts.to_vec(),
            max_new_tokens: params.max_new_tokens,
            seed: params.seed,
        }]);
        while let Some(batch) = queue.pop_front() {
            let first = out.len();
            let call = SamplingParams {
                max_new_tokens: batch.max_new_tokens,
                seed: batch.seed,
                ..params.clone()
            };
            let mut generations = match self.generate(&batch.prompts, &call) {
                Ok(g) => g,
                Err(e) if first > 0 => {
                    sink.refuse(first, e.to_string());
                    vec![Generation::default(); batch.prompts.len()]
                }
                Err(e) => return Err(e),
            };
            for (row, g) in generations.iter_mut().enumerate() {
                for k in 0..g.ids.len() {
                    let last = k + 1 == g.ids.len();
                    let wanted = sink.token(
                        first + row,
                        g.ids[k],
                        g.logprobs[k],
                        last.then_some(g.finish_reason),
                    );
                    if !wanted && !last {
                        g.ids.truncate(k + 1);
                        g.logprobs.truncate(k + 1);
                        g.finish_reason = FinishReason::Aborted;
                        break;
                    }
                }
            }
            out.extend(generations);
            if queue.is_empty() {
                queue.extend(sink.admit(0));
            }
        }
        Ok(out)
    }

    /// Log-probs `[L]` of each response token after its prompt, at `temperature`, no grad.
    fn score(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> Result<Vec<Vec<f32>>>;

    /// Like [`PolicyBackend::score`], plus the `top_k` most likely ids per response position
    /// and their log-probs (full-vocabulary softmax at `temperature`), `[L·k]` row-major, most
    /// likely first. A backend that cannot compute them refuses with an error; it never
    /// returns made-up values.
    fn score_top_k(
        &mut self,
        _sequences: &[Sequence],
        _temperature: f32,
        _weights: Weights,
        top_k: u32,
    ) -> Result<Vec<Scored>> {
        Err(Error::Model(format!(
            "this backend cannot return top-{top_k} scores; use a backend with a model \
             (cairn-torch) or a sampled-token teacher form"
        )))
    }

    /// Keep the weights of the last `n` policy versions (the live one included) for
    /// [`Weights::Version`] scoring: `n = 1` keeps only the live weights (no copy); each
    /// extra version costs one copy of the weights. Versions already dropped do not come
    /// back.
    fn retain_versions(&mut self, n: usize) -> Result<()> {
        if n <= 1 {
            Ok(())
        } else {
            Err(Error::Model(format!(
                "this backend keeps no past weights (asked to keep {n} versions); set \
                 rollout.max_staleness = 0"
            )))
        }
    }

    /// One optimizer step over `sequences`, split into `micro_batches` (ranges of sequence
    /// indices, covering every sequence once). For each micro-batch the backend runs the
    /// loss's [`TokenLoss::teacher_requests`] (live teachers: no-grad forwards of the current
    /// weights), computes the current response log-probs (at `temperature`, with grad), when
    /// [`TokenLoss::needs_entropy`] the per-token entropies, and for top-k requests the
    /// student's log-probs at the requested ids; asks `loss` for the gradient weights; and
    /// accumulates `Σ g·logp + Σ h·entropy + Σ g_top·s_top` into the gradient. Then it clips
    /// the gradient norm, steps AdamW and bumps the policy version.
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

    /// Replaces the live weights with those of the HF model directory `dir` (what
    /// [`PolicyBackend::export`] writes: every tensor of the model, by name and shape) and sets
    /// the policy version to `version`; kept versions are dropped. A serving-only step (`cairn
    /// serve` as a rollout engine): the reference weights and the optimizer are left alone. A
    /// directory that does not fit the model is an error and changes nothing.
    fn load_weights(&mut self, dir: &Path, _version: u64) -> Result<()> {
        Err(Error::Model(format!(
            "this backend cannot load the weights in {}",
            dir.display()
        )))
    }
}

/// A backend without a model, for kernel tests and the kernel-overhead benchmark: it "samples"
/// a fixed response and counts steps. Its log-probs are constants that depend on the weights
/// asked for, so a test can tell which weights scored a row (a swapped `ℓ_old` and `ℓ_ref`
/// shows): version `v` scores every token at `ln 0.5 − 0.01·v` (the live weights, in
/// [`PolicyBackend::generate`], `score` and `train_step`, use the current version), the
/// reference at `ln 0.25`. It has no vocabulary, so top-k scoring is refused.
#[derive(Clone, Debug, Default)]
pub struct NullBackend {
    pub version: u64,
    /// The ids every generation returns (empty: a single id 0).
    pub response: Vec<u32>,
    /// How many policy versions [`Weights::Version`] can score (0 or 1: only the live one).
    pub retained_versions: usize,
}

impl NullBackend {
    /// The log-prob every token gets under policy version `version`.
    pub fn version_logprob(version: u64) -> f32 {
        (0.5f64.ln() - 0.01 * version as f64) as f32
    }

    /// The log-prob every token gets under the reference weights.
    pub fn reference_logprob() -> f32 {
        0.25f32.ln()
    }

    /// The entropy every token gets (that of a fair coin).
    pub fn entropy() -> f32 {
        2.0f32.ln()
    }

    /// The constant log-prob of `weights`, or the error for a version it does not keep.
    pub fn logprob(&self, weights: Weights) -> Result<f32> {
        let kept = self.retained_versions.max(1) as u64;
        match weights {
            Weights::Current => Ok(Self::version_logprob(self.version)),
            Weights::Reference => Ok(Self::reference_logprob()),
            Weights::Version(v) if v <= self.version && self.version - v < kept => {
                Ok(Self::version_logprob(v))
            }
            Weights::Version(v) => {
                let oldest = self.version.saturating_sub(kept - 1);
                let kept: Vec<u64> = (oldest..=self.version).collect();
                Err(version_unavailable(
                    v,
                    self.version,
                    &kept,
                    self.retained_versions.max(1),
                ))
            }
        }
    }
}

const NO_VOCABULARY: &str = "the null backend has no vocabulary; top-k scoring needs a model";

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
        let lp = Self::version_logprob(self.version);
        Ok(prompts
            .iter()
            .map(|_| Generation {
                logprobs: vec![lp; ids.len()],
                ids: ids.clone(),
                finish_reason,
            })
            .collect())
    }

    fn score(
        &mut self,
        sequences: &[Sequence],
        _t: f32,
        weights: Weights,
    ) -> Result<Vec<Vec<f32>>> {
        let lp = self.logprob(weights)?;
        Ok(sequences
            .iter()
            .map(|s| vec![lp; s.response_ids.len()])
            .collect())
    }

    fn score_top_k(
        &mut self,
        _sequences: &[Sequence],
        _temperature: f32,
        _weights: Weights,
        _top_k: u32,
    ) -> Result<Vec<Scored>> {
        Err(Error::Model(NO_VOCABULARY.into()))
    }

    fn retain_versions(&mut self, n: usize) -> Result<()> {
        self.retained_versions = n.max(1);
        Ok(())
    }

    fn train_step(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        _temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> Result<StepReport> {
        let lp = Self::version_logprob(self.version);
        let mut tokens = 0;
        for mb in micro_batches {
            let Some(rows) = sequences.get(mb.clone()) else {
                return Err(Error::Shape {
                    what: "micro_batches",
                    detail: format!("range {mb:?} is outside 0..{}", sequences.len()),
                });
            };
            let mut teacher = Vec::new();
            for request in loss.teacher_requests(mb.clone())? {
                if request.top_k > 0 {
                    return Err(Error::Model(NO_VOCABULARY.into()));
                }
                let len = sequences
                    .get(request.row)
                    .map_or(0, |s| s.response_ids.len());
                let logprobs = match request.context_ids {
                    Some(_) => vec![lp; len],
                    None => Vec::new(),
                };
                teacher.push(TeacherScores {
                    logprobs,
                    ..Default::default()
                });
            }
            let logp: Vec<Vec<f32>> = rows
                .iter()
                .map(|s| vec![lp; s.response_ids.len()])
                .collect();
            let entropy: Vec<Vec<f32>> = logp
                .iter()
                .map(|l| vec![Self::entropy(); l.len()])
                .collect();
            tokens += logp.iter().map(Vec::len).sum::<usize>();
            let scores = TokenScores {
                logp: &logp,
                entropy: &entropy,
                teacher: &teacher,
            };
            loss.grads(mb.clone(), &scores)?;
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
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        std::fs::write(
            dir.join("null-backend.json"),
            format!("{{\"version\": {}}}", self.version),
        )
        .map_err(|e| Error::io(dir, e))
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("null-backend.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        self.version = v["version"].as_u64().unwrap_or(0);
        Ok(())
    }

    fn export(&self, _tokenizer_dir: &Path, dir: &Path) -> Result<Vec<String>> {
        Err(Error::Model(format!(
            "the null backend has no weights to export to {}",
            dir.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(lens: &[usize]) -> Vec<Sequence> {
        lens.iter()
            .map(|&l| Sequence {
                prompt_ids: vec![1],
                response_ids: vec![2; l],
            })
            .collect()
    }

    #[test]
    fn null_logprobs_tell_the_weights_apart() {
        let mut b = NullBackend {
            version: 3,
            ..Default::default()
        };
        let s = seqs(&[2]);
        let current = b.score(&s, 1.0, Weights::Current).unwrap();
        let reference = b.score(&s, 1.0, Weights::Reference).unwrap();
        assert_eq!(current, vec![vec![(0.5f64.ln() - 0.03) as f32; 2]]);
        assert_eq!(reference, vec![vec![0.25f32.ln(); 2]]);
        assert_ne!(current, reference);
        assert_eq!(b.score(&s, 1.0, Weights::Version(3)).unwrap(), current);
        // Only the live version is kept by default.
        let e = b
            .score(&s, 1.0, Weights::Version(2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("policy version 2 is not kept")
                && e.contains("keeps [3] (retain_versions = 1)"),
            "{e}"
        );
        b.retain_versions(3).unwrap();
        assert_eq!(
            b.score(&s, 1.0, Weights::Version(1)).unwrap(),
            vec![vec![(0.5f64.ln() - 0.01) as f32; 2]]
        );
        let e = b
            .score(&s, 1.0, Weights::Version(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("keeps [1, 2, 3]"), "{e}");
        let e = b
            .score(&s, 1.0, Weights::Version(4))
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy version 4 is not kept"), "{e}");
        // Generation reports the live weights' log-probs, so recomputing ℓ_old gives ρ = 1.
        let g = b
            .generate(
                &[vec![1]],
                &SamplingParams {
                    temperature: 1.0,
                    top_p: 1.0,
                    max_new_tokens: 4,
                    stop_ids: vec![],
                    seed: 0,
                },
            )
            .unwrap();
        assert_eq!(g[0].logprobs, vec![(0.5f64.ln() - 0.03) as f32]);
    }

    #[test]
    fn null_backend_trains_the_objective_and_shows_swapped_logprobs() {
        use cairn_plugin_sdk::{
            Signals, TeacherForm, TeacherSource, TeacherTarget, TeacherTerm, TurnRow,
        };

        use crate::objective::{KlEstimator, ObjectiveConfig, RlLoss};

        let mut b = NullBackend {
            version: 2,
            ..Default::default()
        };
        let s = seqs(&[2, 1]);
        let old = b.score(&s, 1.0, Weights::Current).unwrap();
        let reference = b.score(&s, 1.0, Weights::Reference).unwrap();
        let rows: Vec<TurnRow> = s
            .iter()
            .zip(old.iter().zip(&reference))
            .map(|(seq, (o, r))| TurnRow {
                prompt_ids: seq.prompt_ids.clone(),
                response_ids: seq.response_ids.clone(),
                response_logprobs: o.clone(),
                response_mask: vec![1; o.len()],
                old_logprobs: o.clone(),
                ref_logprobs: r.clone(),
                ..TurnRow::default()
            })
            .collect();
        let live = TeacherTarget {
            row: 1,
            weights: vec![1.0],
            source: TeacherSource::Context {
                context_ids: vec![3],
            },
        };
        let signals = Signals {
            advantages: vec![vec![1.0, 1.0], vec![1.0]],
            teacher: vec![TeacherTerm {
                name: "self".into(),
                coef: 1.0,
                form: TeacherForm::SampledReverseKl,
                targets: vec![live],
            }],
            ..Signals::default()
        };
        let config = ObjectiveConfig {
            kl_coef: 0.1,
            kl_estimator: KlEstimator::K1,
            ..Default::default()
        };
        let run = |rows: &[TurnRow], b: &mut NullBackend| {
            let refs: Vec<&TurnRow> = rows.iter().collect();
            let mut loss = RlLoss::from_rows(&config, &refs, &signals, &[0, 1]).unwrap();
            b.train_step(&s, &[0..1, 1..2], 1.0, &mut loss).unwrap();
            loss.check_complete().unwrap();
            loss.report()
        };
        let report = run(&rows, &mut b.clone());
        // ρ = 1 and k1 = ℓ − ℓ_ref = (ln 0.5 − 0.02) − ln 0.25 = ln 2 − 0.02 on every token.
        let k1 = 2f64.ln() - 0.02;
        assert!((report.kl.unwrap() - k1).abs() < 1e-6, "{report:?}");
        assert!((report.pg_loss - -1.0).abs() < 1e-6);
        // The live teacher is the same constant model: no divergence.
        assert_eq!(report.teacher[0].active_tokens, 1);
        assert!(report.teacher[0].kl.abs() < 1e-7);
        // Swapped ℓ_old and ℓ_ref change both the ratio and the KL.
        let swapped: Vec<TurnRow> = rows
            .iter()
            .map(|r| TurnRow {
                old_logprobs: r.ref_logprobs.clone(),
                ref_logprobs: r.old_logprobs.clone(),
                ..r.clone()
            })
            .collect();
        let bad = run(&swapped, &mut b.clone());
        // ℓ_ref = ℓ now (k1 = 0), and ρ = 0.5·e^−0.02 / 0.25 = 1.96 is clipped at 1.2.
        assert!(bad.kl.unwrap().abs() < 1e-6, "{bad:?}");
        assert!((bad.ratio_mean - 2.0 * (-0.02f64).exp()).abs() < 1e-6);
        assert_eq!(bad.clip_fraction, 1.0);
        assert!((bad.pg_loss - -1.2).abs() < 1e-6);
        // A top-k teacher needs a vocabulary.
        let mut topk = signals.clone();
        topk.teacher[0].form = TeacherForm::TopKReverseKl { k: 2 };
        let refs: Vec<&TurnRow> = rows.iter().collect();
        let mut loss = RlLoss::from_rows(&config, &refs, &topk, &[0, 1]).unwrap();
        let e = b
            .train_step(&s, std::slice::from_ref(&(0..2)), 1.0, &mut loss)
            .unwrap_err()
            .to_string();
        assert!(e.contains("top-k scoring needs a model"), "{e}");
    }

    #[test]
    fn null_backend_refuses_top_k() {
        let mut b = NullBackend::default();
        let e = b
            .score_top_k(&seqs(&[1]), 1.0, Weights::Current, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the null backend has no vocabulary; top-k scoring needs a model"),
            "{e}"
        );
    }
}
