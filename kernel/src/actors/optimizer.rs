//! The optimizer actor: recomputes old and reference log-probs, runs the algorithm plugin's
//! signals, builds the f32 RL objective and has the policy actor take the optimizer step(s).
//!
//! It runs on a `SyncArbiter` thread: the plugin's host callbacks (re-scoring, generation)
//! block on the policy actor, which lives on another thread.

use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;
use cairn_plugin_sdk::{
    Algorithm, Batch, GenerateRequest, Generation, Host, PluginError, ScoreRequest, Signals,
};
use parking_lot::Mutex;

use crate::actors::policy::{call, Generate, Score, TrainStep};
use crate::backend::{SamplingParams, Sequence, StepReport, Weights};
use crate::error::{Error, Result};
use crate::objective::{KlMode, LossReport, ObjectiveConfig, ObjectiveRow, RlLoss};
use crate::rollout::prompt::TextCodec;

pub struct OptimizerActor {
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub score: Recipient<Score>,
    pub generate: Recipient<Generate>,
    pub train: Recipient<TrainStep<RlLoss>>,
    pub codec: Arc<dyn TextCodec>,
    pub objective: ObjectiveConfig,
    /// Rows per micro-batch.
    pub micro_batch_rows: usize,
    /// Optimizer steps per batch (mini-batches); 1 is plain on-policy.
    pub updates_per_batch: usize,
    /// Rollout temperature: scoring and training use it too (trl #4159).
    pub temperature: f32,
}

impl Actor for OptimizerActor {
    type Context = SyncContext<Self>;
}

/// A batch ready for the update: signals plus the log-probs they were computed with.
#[derive(Debug, Default)]
pub struct Prepared {
    pub batch: Batch,
    pub signals: Signals,
    /// `ℓ_old` per row, `[rows][L]`, recomputed by the trainer before the update.
    pub old_logp: Vec<Vec<f32>>,
    /// `ℓ_ref` per row when the objective uses KL.
    pub ref_logp: Option<Vec<Vec<f32>>>,
    /// Metrics from the plugin (its `Signals::metrics` and host `log_metric` calls) and from
    /// the preparation itself.
    pub metrics: Vec<(String, f64)>,
}

/// Recompute log-probs, apply KL-in-reward if configured, and run the plugin's signals.
#[derive(Message)]
#[rtype(result = "Result<Prepared>")]
pub struct PrepareBatch {
    pub batch: Batch,
}

impl Handler<PrepareBatch> for OptimizerActor {
    type Result = Result<Prepared>;
    fn handle(&mut self, msg: PrepareBatch, _: &mut Self::Context) -> Self::Result {
        let mut batch = msg.batch;
        batch.validate()?;
        let sequences = sequences(&batch);
        let old_logp = call(
            &self.score,
            Score {
                sequences: sequences.clone(),
                temperature: self.temperature,
                weights: Weights::Current,
            },
        )??;
        // The reference is scored even when the KL is not in the objective, so the `kl`
        // metric (how far RL has moved the policy) is always reported.
        let ref_logp = Some(call(
            &self.score,
            Score {
                sequences,
                temperature: self.temperature,
                weights: Weights::Reference,
            },
        )??);
        let mut metrics = logprob_mismatch(&batch, &old_logp);
        if let (KlMode::Reward, Some(reference)) = (self.objective.kl_mode, &ref_logp) {
            crate::objective::apply_kl_to_rewards(
                &self.objective,
                &mut batch,
                &old_logp,
                reference,
            )?;
        }
        let host = PolicyHost {
            score: &self.score,
            generate: &self.generate,
            codec: self.codec.as_ref(),
            temperature: self.temperature,
            metrics: Mutex::new(Vec::new()),
        };
        let signals = self.algorithm.lock().signals(&batch, &host)?;
        signals.validate_against(&batch)?;
        metrics.extend(signals.metrics.iter().cloned());
        metrics.extend(host.metrics.into_inner());
        Ok(Prepared {
            batch,
            signals,
            old_logp,
            ref_logp,
            metrics,
        })
    }
}

/// Take the optimizer step(s) for a prepared batch.
#[derive(Message)]
#[rtype(result = "Result<Optimised>")]
pub struct Optimise {
    pub prepared: Prepared,
}

/// What the update did.
#[derive(Debug, Default)]
pub struct Optimised {
    /// One per optimizer step (mini-batch).
    pub steps: Vec<StepReport>,
    /// The loss of each optimizer step.
    pub losses: Vec<LossReport>,
    /// Rows trained on (rows of dropped groups excluded).
    pub rows: usize,
}

impl Handler<Optimise> for OptimizerActor {
    type Result = Result<Optimised>;
    fn handle(&mut self, msg: Optimise, _: &mut Self::Context) -> Self::Result {
        let p = msg.prepared;
        let dropped: std::collections::HashSet<u64> =
            p.signals.dropped_groups.iter().copied().collect();
        let keep: Vec<usize> = (0..p.batch.rows.len())
            .filter(|&i| !dropped.contains(&p.batch.rows[i].group_id))
            .collect();
        if keep.is_empty() {
            return Ok(Optimised::default());
        }
        let mut out = Optimised {
            rows: keep.len(),
            ..Default::default()
        };
        for mini in split_even(&keep, self.updates_per_batch) {
            let mut rows = Vec::with_capacity(mini.len());
            let mut seqs = Vec::with_capacity(mini.len());
            for &i in &mini {
                let row = &p.batch.rows[i];
                rows.push(ObjectiveRow {
                    mask: row.response_mask.clone(),
                    advantages: p.signals.advantages[i].clone(),
                    old_logp: p.old_logp[i].clone(),
                    ref_logp: p.ref_logp.as_ref().map(|r| r[i].clone()),
                    rollout_id: row.trajectory_id,
                    aux: p
                        .signals
                        .aux
                        .iter()
                        .map(|t| t.coefficients[i].clone())
                        .collect(),
                });
                seqs.push(Sequence {
                    prompt_ids: row.prompt_ids.clone(),
                    response_ids: row.response_ids.clone(),
                });
            }
            let aux_coefs = p
                .signals
                .aux
                .iter()
                .map(|t| (t.name.clone(), t.coef))
                .collect();
            let loss = RlLoss::new(&self.objective, rows, aux_coefs)?;
            let micro_batches = micro_batches(seqs.len(), self.micro_batch_rows);
            let (report, loss) = call(
                &self.train,
                TrainStep {
                    sequences: seqs,
                    micro_batches,
                    temperature: self.temperature,
                    loss,
                },
            )??;
            out.steps.push(report);
            out.losses.push(loss.report());
        }
        Ok(out)
    }
}

fn sequences(batch: &Batch) -> Vec<Sequence> {
    batch
        .rows
        .iter()
        .map(|r| Sequence {
            prompt_ids: r.prompt_ids.clone(),
            response_ids: r.response_ids.clone(),
        })
        .collect()
}

/// Consecutive ranges of at most `size` rows covering `0..n`.
pub fn micro_batches(n: usize, size: usize) -> Vec<Range<usize>> {
    let size = size.max(1);
    (0..n).step_by(size).map(|s| s..(s + size).min(n)).collect()
}

/// Splits `items` into `parts` contiguous, nearly equal chunks (fewer when there are fewer
/// items).
fn split_even(items: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let parts = parts.clamp(1, items.len().max(1));
    let base = items.len() / parts;
    let extra = items.len() % parts;
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for p in 0..parts {
        let len = base + usize::from(p < extra);
        out.push(items[start..start + len].to_vec());
        start += len;
    }
    out
}

/// How far the trainer's recomputed log-probs are from the sampled ones, over masked tokens:
/// `logprob_mismatch/mean_abs` and `/max_abs`. Large values mean rollout and trainer disagree
/// (temperature, numerics, or wrong ids) and every importance ratio is off.
fn logprob_mismatch(batch: &Batch, recomputed: &[Vec<f32>]) -> Vec<(String, f64)> {
    let (mut sum, mut max, mut n) = (0.0f64, 0.0f64, 0usize);
    for (row, lp) in batch.rows.iter().zip(recomputed) {
        for ((&m, &sampled), &now) in row.response_mask.iter().zip(&row.response_logprobs).zip(lp) {
            if m == 1 {
                let d = f64::from((sampled - now).abs());
                sum += d;
                max = max.max(d);
                n += 1;
            }
        }
    }
    let mean = if n == 0 { 0.0 } else { sum / n as f64 };
    vec![
        ("logprob_mismatch/mean_abs".into(), mean),
        ("logprob_mismatch/max_abs".into(), max),
    ]
}

/// The host callbacks a plugin gets during `signals`.
struct PolicyHost<'a> {
    score: &'a Recipient<Score>,
    generate: &'a Recipient<Generate>,
    codec: &'a dyn TextCodec,
    temperature: f32,
    metrics: Mutex<Vec<(String, f64)>>,
}

fn host_error(e: Error) -> PluginError {
    PluginError::host(e.to_string())
}

impl Host for PolicyHost<'_> {
    fn score(&self, requests: &[ScoreRequest]) -> cairn_plugin_sdk::Result<Vec<Vec<f32>>> {
        let sequences = requests
            .iter()
            .map(|r| Sequence {
                prompt_ids: r.context_ids.clone(),
                response_ids: r.response_ids.clone(),
            })
            .collect();
        call(
            self.score,
            Score {
                sequences,
                temperature: self.temperature,
                weights: Weights::Current,
            },
        )
        .and_then(|r| r)
        .map_err(host_error)
    }

    fn generate(&self, requests: &[GenerateRequest]) -> cairn_plugin_sdk::Result<Vec<Generation>> {
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let params = SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                max_new_tokens: r.max_new_tokens,
                stop_ids: Vec::new(),
                seed: r.seed,
            };
            let g = call(
                self.generate,
                Generate {
                    prompts: vec![r.prompt_ids.clone()],
                    params,
                },
            )
            .and_then(|r| r)
            .map_err(host_error)?;
            out.extend(g.generations.into_iter().map(|g| Generation {
                ids: g.ids,
                logprobs: g.logprobs,
                finish_reason: g.finish_reason,
            }));
        }
        Ok(out)
    }

    fn tokenize(&self, text: &str) -> cairn_plugin_sdk::Result<Vec<u32>> {
        self.codec.encode(text).map_err(host_error)
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().push((name.to_string(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_cover_every_row_once() {
        assert_eq!(micro_batches(5, 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(micro_batches(0, 3), Vec::<Range<usize>>::new());
    }

    #[test]
    fn split_even_balances_parts() {
        assert_eq!(
            split_even(&[1, 2, 3, 4, 5], 2),
            vec![vec![1, 2, 3], vec![4, 5]]
        );
        assert_eq!(split_even(&[1], 4), vec![vec![1]]);
    }
}
