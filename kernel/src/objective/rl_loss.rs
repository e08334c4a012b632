//! [`RlLoss`]: the RL objective as a [`TokenLoss`], and its [`LossReport`].
//!
//! Per token `l` of row `r` with mask 1, weight `w_r` ([`row_weights`]), current log-prob `ℓ`,
//! `ρ = exp(clamp(ℓ − ℓ_old, ±log_ratio_clamp))` and behaviour weight `u` (1 without an
//! off-policy correction; see [`OffPolicy`]):
//!
//! | term | value | `∂/∂ℓ` | `∂/∂H` |
//! |------|-------|--------|--------|
//! | surrogate | `w · u · ℓ^pg(ρ, A)` | `w · u · (−A) · ρ` on the unclipped branch, 0 where a clip won or the log-ratio clamp is active | |
//! | KL (loss mode) | `β · w · k(ℓ, ℓ_ref)` | `β · w · ∂k/∂ℓ` | |
//! | entropy | `−c_H · w · H` | | `−c_H · w` |
//! | aux term j | `coef_j · w^aux · c_j · ℓ` | `coef_j · w^aux · c_j` | |
//! | teacher term j | `coef_j · W_j · x_l` on its active tokens ([`super::teacher`]) | sampled form: `coef_j · W_j · w_l (ℓ − ℓ^T)` | |
//!
//! An extra row ([`ObjectiveRow::extra`], from `Signals::extra_rows`) takes no part in the
//! surrogate, the KL or the entropy term and does not count in their normalisers or in the
//! token metrics: `w = 0` there. Only the aux terms (whose weights `w^aux` are computed over
//! every row of the step, [`aux_row_weights`]) and the teacher terms that target it train it.
//!
//! All weights are fixed when the loss is built, from the whole step, so splitting the step
//! into micro-batches (ranges of rows, each passed once to [`TokenLoss::grads`]) changes
//! neither the loss, nor the gradient, nor any metric. Masked slots are skipped before any
//! arithmetic (select-then-reduce): a NaN there cannot reach a sum (OpenRLHF #1240).

use std::ops::Range;

use cairn_plugin_sdk::{Signals, TurnRow};
use serde::Serialize;

use super::config::{KlMode, ObjectiveConfig, OffPolicy};
use super::input::{
    aggregation_weights, aux_row_weights, row_weights, step_parts, ObjectiveRow, StepParts,
};
use super::kl::kl_value_and_grad;
use super::off_policy::behaviour_weight;
use super::surrogate::{clipped_surrogate, ClipBranch, ClipRange};
use super::teacher::{target_grads, StepTeacher, TeacherReport};
use crate::error::{Error, Result};
use crate::loss::{TeacherRequest, TokenGrads, TokenLoss, TokenScores};

/// The loss components and training metrics of one optimizer step. Token means are over the
/// step's mask-1 tokens; they are 0 when the step has no such token.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LossReport {
    /// The total loss: `pg_loss + kl_loss + entropy_loss + Σ aux_losses + Σ teacher losses`.
    pub loss: f64,
    /// `agg(u · ℓ^pg)`, the clipped surrogate (behaviour-weighted with an off-policy
    /// correction) under the configured aggregation.
    pub pg_loss: f64,
    /// `kl_coef · agg(k)` with `kl_mode = loss`; 0 with `kl_mode = reward` (the penalty is then
    /// in the rewards).
    pub kl_loss: f64,
    /// `−entropy_coef · agg(H)`.
    pub entropy_loss: f64,
    /// `coef · agg(c · ℓ)` of each auxiliary term, by name, in the step's order.
    pub aux_losses: Vec<NamedValue>,
    /// Each teacher term's loss, divergence and active tokens, in the step's order.
    pub teacher: Vec<TeacherReport>,
    /// Token mean of the KL estimator `k(ℓ, ℓ_ref)` (the configured one, k3 clamped), whatever
    /// the aggregation and the KL mode; `None` when no reference log-probs were given.
    pub kl: Option<f64>,
    /// Token mean of the per-token entropy `H` (nats); `None` unless the backend passed
    /// entropies for every token.
    pub entropy: Option<f64>,
    /// Fraction of tokens where the ratio clip changed the token's loss: the clipped term
    /// strictly exceeded `−A·ρ` (tokens with `A = 0`, or a ratio inside the range, never count).
    pub clip_fraction: f64,
    /// Fraction of tokens where the dual-clip cap strictly won (`A < 0`, ratio above
    /// `dual_clip`). Disjoint from `clip_fraction`.
    pub dual_clip_fraction: f64,
    /// Token mean of `ρ − 1 − log ρ` (k3 with `ρ = π_θ/π_old`, clamped log-ratio): a
    /// non-negative, unbiased estimate of `KL(π_old ‖ π_θ)` on the old policy's samples.
    pub approx_kl_old_k3: f64,
    /// Token mean of `ρ`.
    pub ratio_mean: f64,
    /// Largest `ρ` over the step's tokens.
    pub ratio_max: f64,
    /// The behaviour weights, with `off_policy = tis | decoupled`; `None` without.
    pub off_policy: Option<OffPolicyReport>,
    /// Mask-1 tokens in the step.
    pub tokens: usize,
    /// Rows of the step with at least one mask-1 token.
    pub rows: usize,
}

/// Statistics of the behaviour importance weights `u` of a step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OffPolicyReport {
    /// Token mean of the applied `u` (after truncation or dropping).
    pub is_weight_mean: f64,
    /// Fraction of tokens whose raw weight `exp(ℓ_old − ℓ_behav)` exceeded `is_cap`.
    pub capped_fraction: f64,
}

/// A named scalar.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NamedValue {
    pub name: String,
    pub value: f64,
}

impl LossReport {
    /// The report as `(name, value)` metrics for the step log.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let mut out = vec![
            ("loss/total".to_string(), self.loss),
            ("loss/pg".to_string(), self.pg_loss),
            ("loss/kl".to_string(), self.kl_loss),
            ("loss/entropy".to_string(), self.entropy_loss),
        ];
        out.extend(
            self.aux_losses
                .iter()
                .map(|a| (format!("loss/aux/{}", a.name), a.value)),
        );
        for t in &self.teacher {
            out.extend([
                (format!("teacher/{}/loss", t.name), t.loss),
                (format!("teacher/{}/kl", t.name), t.kl),
                (
                    format!("teacher/{}/active_tokens", t.name),
                    t.active_tokens as f64,
                ),
            ]);
        }
        if let Some(kl) = self.kl {
            out.push(("actor/kl_ref".into(), kl));
        }
        if let Some(h) = self.entropy {
            out.push(("actor/entropy".into(), h));
        }
        if let Some(o) = &self.off_policy {
            out.extend([
                ("off_policy/is_weight_mean".to_string(), o.is_weight_mean),
                ("off_policy/capped_fraction".to_string(), o.capped_fraction),
            ]);
        }
        out.extend([
            ("actor/clip_fraction".to_string(), self.clip_fraction),
            (
                "actor/dual_clip_fraction".to_string(),
                self.dual_clip_fraction,
            ),
            ("actor/approx_kl_old_k3".to_string(), self.approx_kl_old_k3),
            ("actor/ratio_mean".to_string(), self.ratio_mean),
            ("actor/ratio_max".to_string(), self.ratio_max),
            ("actor/tokens".to_string(), self.tokens as f64),
            ("actor/rows".to_string(), self.rows as f64),
        ]);
        out
    }
}

/// Running sums of one teacher term.
#[derive(Clone, Debug, Default)]
struct TeacherSums {
    /// Σ W·x.
    weighted: f64,
    /// Σ divergence (unweighted).
    divergence: f64,
    active_tokens: usize,
}

/// Running sums over the tokens processed so far.
#[derive(Clone, Debug, Default)]
struct Sums {
    /// Σ w·u·ℓ^pg.
    pg: f64,
    /// Σ w·k (loss mode only).
    kl_weighted: f64,
    /// Σ w·H.
    entropy_weighted: f64,
    /// Σ w·c_j·ℓ per aux term.
    aux_weighted: Vec<f64>,
    teacher: Vec<TeacherSums>,
    /// Σ k, Σ H, and the count of tokens with an entropy.
    kl: f64,
    entropy: f64,
    entropy_tokens: usize,
    /// Σ (ρ − 1 − log ρ), Σ ρ, max ρ.
    approx_kl: f64,
    ratio: f64,
    ratio_max: f64,
    /// Σ u and the count of tokens whose raw behaviour weight exceeded the cap.
    is_weight: f64,
    capped: usize,
    clipped: usize,
    dual_clipped: usize,
    tokens: usize,
}

impl Sums {
    fn new(aux: usize, teacher: usize) -> Self {
        Sums {
            aux_weighted: vec![0.0; aux],
            teacher: vec![TeacherSums::default(); teacher],
            ..Sums::default()
        }
    }

    fn add(&mut self, o: &Sums) {
        self.pg += o.pg;
        self.kl_weighted += o.kl_weighted;
        self.entropy_weighted += o.entropy_weighted;
        for (a, b) in self.aux_weighted.iter_mut().zip(&o.aux_weighted) {
            *a += b;
        }
        for (a, b) in self.teacher.iter_mut().zip(&o.teacher) {
            a.weighted += b.weighted;
            a.divergence += b.divergence;
            a.active_tokens += b.active_tokens;
        }
        self.kl += o.kl;
        self.entropy += o.entropy;
        self.entropy_tokens += o.entropy_tokens;
        self.approx_kl += o.approx_kl;
        self.ratio += o.ratio;
        self.ratio_max = self.ratio_max.max(o.ratio_max);
        self.is_weight += o.is_weight;
        self.capped += o.capped;
        self.clipped += o.clipped;
        self.dual_clipped += o.dual_clipped;
        self.tokens += o.tokens;
    }
}

/// A teacher term with what the step fixed for it.
#[derive(Clone, Debug)]
struct TeacherState {
    term: StepTeacher,
    /// Per target: active mask `[L]` (mask 1 and weight > 0).
    active: Vec<Vec<u8>>,
    /// Per target: aggregation weight `W`, from the term's active tokens over the whole step.
    weights: Vec<f64>,
}

/// The RL objective of one optimizer step (see the module docs). Build one per step (verl: per
/// mini-batch) with [`RlLoss::from_rows`], pass each row to [`TokenLoss::grads`] exactly once
/// (in any micro-batch split), then read [`RlLoss::report`].
#[derive(Clone, Debug)]
pub struct RlLoss {
    config: ObjectiveConfig,
    clip: ClipRange,
    rows: Vec<ObjectiveRow>,
    /// For each step row, the index errors name it by (its index in the rows given).
    labels: Vec<usize>,
    /// `(name, coef)` of each auxiliary term.
    aux: Vec<(String, f64)>,
    teacher: Vec<TeacherState>,
    /// Per step row: `(term, target)` of each teacher target on it, in term order.
    targets_by_row: Vec<Vec<(usize, usize)>>,
    /// Aggregation weight of each row for the surrogate, KL and entropy (0 on extra rows),
    /// fixed for the step.
    weights: Vec<f64>,
    /// Aggregation weight of each row for the aux terms (over batch and extra rows).
    aux_weights: Vec<f64>,
    has_ref: bool,
    active_rows: usize,
    /// Rows already passed to `grads`.
    done: Vec<bool>,
    sums: Sums,
}

fn input_error(message: String) -> Error {
    Error::Other(format!("objective input: {message}"))
}

impl RlLoss {
    /// The objective of one optimizer step: the one builder, used by the optimizer and by
    /// `cairn loss`.
    ///
    /// * `rows`: the batch's rows followed by `signals.extra_rows` ([`super::all_rows`]), the
    ///   indexing of every per-token array of `signals`. Each row in `indices` carries
    ///   `old_logprobs` (`ℓ_old`), `ref_logprobs` when `kl_coef > 0` with `kl_mode = loss`,
    ///   and its sampled `response_logprobs` (`ℓ_behav`, read with an off-policy correction).
    /// * `indices`: the rows of this step (a mini-batch), in the order of the sequences the
    ///   backend trains ([`super::train_sequences`] builds them in this order).
    ///
    /// Validates the config and the rows (shapes, masks, finite values on mask-1 tokens,
    /// teacher targets) and fixes every aggregation weight. Errors name the row by its index in
    /// `rows`.
    pub fn from_rows(
        config: &ObjectiveConfig,
        rows: &[&TurnRow],
        signals: &Signals,
        indices: &[usize],
    ) -> Result<Self> {
        config.validate()?;
        RlLoss::build(config, step_parts(config, rows, signals, indices)?)
    }

    /// From already-built rows, without teacher terms (the unit tests' entry).
    #[cfg(test)]
    pub(crate) fn new(
        config: &ObjectiveConfig,
        rows: Vec<ObjectiveRow>,
        aux: Vec<(String, f32)>,
    ) -> Result<Self> {
        let labels = (0..rows.len()).collect();
        RlLoss::build(
            config,
            StepParts {
                rows,
                aux,
                teacher: Vec::new(),
                labels,
            },
        )
    }

    fn build(config: &ObjectiveConfig, parts: StepParts) -> Result<Self> {
        config.validate()?;
        let config = config.clone();
        let StepParts {
            rows,
            aux,
            teacher,
            labels,
        } = parts;
        for (name, coef) in &aux {
            if !coef.is_finite() {
                return Err(input_error(format!(
                    "aux term `{name}` has coefficient {coef}"
                )));
            }
        }
        let aux: Vec<(String, f64)> = aux.into_iter().map(|(n, c)| (n, f64::from(c))).collect();
        // The KL reads ℓ_ref on batch rows only; an extra row's is never read.
        let batch_rows = rows.iter().filter(|r| !r.extra).count();
        let with_ref = rows
            .iter()
            .filter(|r| !r.extra && r.ref_logp.is_some())
            .count();
        let has_ref = with_ref > 0;
        if has_ref && with_ref < batch_rows {
            let missing = rows
                .iter()
                .position(|r| !r.extra && r.ref_logp.is_none())
                .unwrap_or(0);
            return Err(input_error(format!(
                "{with_ref} of {batch_rows} rows carry reference log-probs but row {} does not; \
                 give them for every row or for none",
                labels[missing]
            )));
        }
        if !has_ref && batch_rows > 0 && config.kl_mode == KlMode::Loss && config.kl_coef > 0.0 {
            return Err(input_error(format!(
                "kl_coef = {} with kl_mode = \"loss\" needs reference log-probs on every row",
                config.kl_coef
            )));
        }
        let behav = config.off_policy != OffPolicy::None;
        for (r, row) in rows.iter().enumerate() {
            check_row(labels[r], row, aux.len(), behav && !row.extra)?;
        }
        let weights = row_weights(&config, &rows);
        let aux_weights = aux_row_weights(&config, &rows);
        let masks: Vec<&[u8]> = rows.iter().map(|r| r.mask.as_slice()).collect();
        let mut targets_by_row = vec![Vec::new(); rows.len()];
        let teacher = teacher
            .into_iter()
            .enumerate()
            .map(|(j, term)| {
                let active = term.active_masks(&masks)?;
                let tokens: Vec<usize> = active
                    .iter()
                    .map(|a| a.iter().filter(|&&x| x == 1).count())
                    .collect();
                let rollouts: Vec<u64> = term
                    .targets
                    .iter()
                    .map(|t| rows[t.row].rollout_id)
                    .collect();
                for (t, target) in term.targets.iter().enumerate() {
                    targets_by_row[target.row].push((j, t));
                }
                Ok(TeacherState {
                    weights: aggregation_weights(&config, &tokens, &rollouts),
                    active,
                    term,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RlLoss {
            clip: ClipRange::from(&config),
            config,
            done: vec![false; rows.len()],
            active_rows: rows.iter().filter(|r| !r.extra && r.tokens() > 0).count(),
            sums: Sums::new(aux.len(), teacher.len()),
            rows,
            labels,
            aux,
            teacher,
            targets_by_row,
            weights,
            aux_weights,
            has_ref,
        })
    }

    /// The aggregation weight of each row for the surrogate, KL and entropy (0 on extra rows).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Checks that every row has been passed to [`TokenLoss::grads`]; the error names the first
    /// missing row.
    pub fn check_complete(&self) -> Result<()> {
        match self.done.iter().position(|d| !d) {
            None => Ok(()),
            Some(r) => Err(Error::Other(format!(
                "objective: row {} ({r} of the step's {}) was never passed to grads this step; \
                 every row must be in exactly one micro-batch",
                self.labels[r],
                self.rows.len()
            ))),
        }
    }

    /// The loss and metrics of the step. Once every row has been processed
    /// ([`RlLoss::check_complete`]) they are the step's; before that, the loss components are
    /// the processed rows' share (with the step's weights) and token means are over the
    /// processed tokens.
    pub fn report(&self) -> LossReport {
        let s = &self.sums;
        let mean = |x: f64, n: usize| if n == 0 { 0.0 } else { x / n as f64 };
        let per_token = |x: f64| mean(x, s.tokens);
        let kl_loss = match self.config.kl_mode {
            KlMode::Loss => self.config.kl_coef * s.kl_weighted,
            KlMode::Reward => 0.0,
        };
        let entropy_loss = -self.config.entropy_coef * s.entropy_weighted;
        let aux_losses: Vec<NamedValue> = self
            .aux
            .iter()
            .zip(&s.aux_weighted)
            .map(|((name, coef), &v)| NamedValue {
                name: name.clone(),
                value: coef * v,
            })
            .collect();
        let teacher: Vec<TeacherReport> = self
            .teacher
            .iter()
            .zip(&s.teacher)
            .map(|(t, sums)| TeacherReport {
                name: t.term.name.clone(),
                loss: t.term.coef * sums.weighted,
                kl: mean(sums.divergence, sums.active_tokens),
                active_tokens: sums.active_tokens,
            })
            .collect();
        let loss = s.pg
            + kl_loss
            + entropy_loss
            + aux_losses.iter().map(|a| a.value).sum::<f64>()
            + teacher.iter().map(|t| t.loss).sum::<f64>();
        LossReport {
            loss,
            pg_loss: s.pg,
            kl_loss,
            entropy_loss,
            aux_losses,
            teacher,
            kl: self.has_ref.then(|| per_token(s.kl)),
            entropy: (s.tokens > 0 && s.entropy_tokens == s.tokens).then(|| per_token(s.entropy)),
            clip_fraction: per_token(s.clipped as f64),
            dual_clip_fraction: per_token(s.dual_clipped as f64),
            approx_kl_old_k3: per_token(s.approx_kl),
            ratio_mean: per_token(s.ratio),
            ratio_max: s.ratio_max,
            off_policy: (self.config.off_policy != OffPolicy::None).then(|| OffPolicyReport {
                is_weight_mean: per_token(s.is_weight),
                capped_fraction: per_token(s.capped as f64),
            }),
            tokens: s.tokens,
            rows: self.active_rows,
        }
    }

    /// One row's gradients and sums; touches no state.
    fn row_grads(
        &self,
        r: usize,
        logp: &[f32],
        entropy: Option<&[f32]>,
        sums: &mut Sums,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let row = &self.rows[r];
        let label = self.labels[r];
        let len = row.mask.len();
        if logp.len() != len || entropy.is_some_and(|h| h.len() != len) {
            return Err(Error::Shape {
                what: "objective grads",
                detail: format!(
                    "row {label}: the step has {len} response tokens but the backend passed {} \
                     log-probs and {} entropies",
                    logp.len(),
                    entropy.map_or(0, <[f32]>::len)
                ),
            });
        }
        let w = self.weights[r];
        let w_aux = self.aux_weights[r];
        let c = self.config.log_ratio_clamp;
        let mut g = vec![0.0f32; len];
        let mut h = vec![0.0f32; if entropy.is_some() { len } else { 0 }];
        for l in (0..len).filter(|&l| row.mask[l] == 1) {
            let lp = f64::from(logp[l]);
            if !lp.is_finite() {
                return Err(input_error(format!(
                    "row {label}, token {l}: current log-prob is {lp} on a trainable token"
                )));
            }
            let aux_terms = |mut grad: f64, sums: &mut Sums| {
                for (j, (_, aux_coef)) in self.aux.iter().enumerate() {
                    let coef = f64::from(row.aux[j][l]);
                    sums.aux_weighted[j] += w_aux * coef * lp;
                    grad += aux_coef * w_aux * coef;
                }
                grad
            };
            if row.extra {
                // No surrogate, KL or entropy on an extra row (and no token metrics).
                g[l] = aux_terms(0.0, sums) as f32;
                continue;
            }
            let old = f64::from(row.old_logp[l]);
            let raw = lp - old;
            let log_ratio = raw.clamp(-c, c);
            let ratio = log_ratio.exp();
            let s = clipped_surrogate(ratio, f64::from(row.advantages[l]), self.clip);
            let u = match (&row.behav_logp, self.config.off_policy) {
                (_, OffPolicy::None) | (None, _) => 1.0,
                (Some(b), _) => {
                    let (u, capped) = behaviour_weight(&self.config, old, f64::from(b[l]));
                    sums.is_weight += u;
                    sums.capped += usize::from(capped);
                    u
                }
            };
            // dρ/dℓ = ρ, and 0 where the log-ratio clamp holds ρ constant.
            let dratio = if raw.abs() > c { 0.0 } else { ratio };
            let mut grad = w * u * s.dloss_dratio * dratio;
            sums.pg += w * u * s.loss;
            match s.branch {
                ClipBranch::Clipped => sums.clipped += 1,
                ClipBranch::DualClipped => sums.dual_clipped += 1,
                ClipBranch::Unclipped => {}
            }
            sums.ratio += ratio;
            sums.ratio_max = sums.ratio_max.max(ratio);
            sums.approx_kl += log_ratio.exp_m1() - log_ratio;
            if let Some(refs) = &row.ref_logp {
                let (k, dk) = kl_value_and_grad(self.config.kl_estimator, lp, f64::from(refs[l]));
                sums.kl += k;
                if self.config.kl_mode == KlMode::Loss {
                    sums.kl_weighted += w * k;
                    grad += self.config.kl_coef * w * dk;
                }
            }
            if let Some(ent) = entropy {
                let e = f64::from(ent[l]);
                if !e.is_finite() {
                    return Err(input_error(format!(
                        "row {label}, token {l}: entropy is {e} on a trainable token"
                    )));
                }
                sums.entropy += e;
                sums.entropy_tokens += 1;
                sums.entropy_weighted += w * e;
                h[l] = (-self.config.entropy_coef * w) as f32;
            }
            let grad = aux_terms(grad, sums);
            sums.tokens += 1;
            g[l] = grad as f32;
        }
        Ok((g, h))
    }
}

/// Shapes, mask values and finiteness of one input row (`label`: its index in the rows given).
fn check_row(label: usize, row: &ObjectiveRow, aux_terms: usize, behav: bool) -> Result<()> {
    let r = label;
    let len = row.mask.len();
    // An extra row's advantages and ℓ_ref / ℓ_behav are never read, so never checked.
    let mut vectors: Vec<(String, &[f32])> = vec![("old_logp".into(), &row.old_logp)];
    if !row.extra {
        vectors.insert(0, ("advantages".into(), &row.advantages));
    }
    if let (Some(refs), false) = (&row.ref_logp, row.extra) {
        vectors.push(("ref_logp".into(), refs));
    }
    match (&row.behav_logp, behav) {
        (Some(b), _) if !row.extra => vectors.push(("response_logprobs (ℓ_behav)".into(), b)),
        (Some(_), _) => {}
        (None, true) => {
            return Err(input_error(format!(
                "row {r}: an off-policy correction needs the row's sampled response_logprobs"
            )))
        }
        (None, false) => {}
    }
    if row.aux.len() != aux_terms {
        return Err(Error::Shape {
            what: "objective input",
            detail: format!(
                "row {r} has {} aux coefficient vectors but the step has {aux_terms} aux terms",
                row.aux.len()
            ),
        });
    }
    vectors.extend(
        row.aux
            .iter()
            .enumerate()
            .map(|(j, c)| (format!("aux term {j}"), c.as_slice())),
    );
    for (what, v) in &vectors {
        if v.len() != len {
            return Err(Error::Shape {
                what: "objective input",
                detail: format!("row {r}: mask has {len} tokens but {what} has {}", v.len()),
            });
        }
    }
    for (l, &m) in row.mask.iter().enumerate() {
        match m {
            0 => {}
            1 => {
                for (what, v) in &vectors {
                    if !v[l].is_finite() {
                        return Err(input_error(format!(
                            "row {r}, token {l}: {what} is {} on a trainable token (mask 1)",
                            v[l]
                        )));
                    }
                }
            }
            m => {
                return Err(input_error(format!(
                    "row {r}, token {l}: mask holds {m}; a mask entry is 0 or 1"
                )))
            }
        }
    }
    Ok(())
}

impl TokenLoss for RlLoss {
    fn needs_entropy(&self) -> bool {
        self.config.needs_entropy()
    }

    /// One request per live target, and per fixed top-k target, on the micro-batch's rows: by
    /// row, then in term order.
    fn teacher_requests(&self, rows: Range<usize>) -> Result<Vec<TeacherRequest>> {
        self.check_range(&rows)?;
        Ok(rows
            .flat_map(|r| &self.targets_by_row[r])
            .filter_map(|&(j, t)| {
                let state = &self.teacher[j];
                state.term.request(&state.term.targets[t], &state.active[t])
            })
            .collect())
    }

    fn grads(&mut self, rows: Range<usize>, scores: &TokenScores<'_>) -> Result<TokenGrads> {
        self.check_range(&rows)?;
        let (logp, entropy) = (scores.logp, scores.entropy);
        let n = rows.len();
        if logp.len() != n || !(entropy.is_empty() || entropy.len() == n) {
            return Err(Error::Shape {
                what: "objective grads",
                detail: format!(
                    "micro-batch rows {rows:?} ({n} rows) came with {} log-prob rows and {} \
                     entropy rows",
                    logp.len(),
                    entropy.len()
                ),
            });
        }
        if entropy.is_empty() && self.needs_entropy() && n > 0 {
            return Err(Error::Other(format!(
                "objective: entropy_coef = {} needs per-token entropies, but the backend passed none",
                self.config.entropy_coef
            )));
        }
        if let Some(r) = rows.clone().find(|&r| self.done[r]) {
            return Err(Error::Other(format!(
                "objective: row {} was already passed to grads this step; each row belongs to \
                 exactly one micro-batch",
                self.labels[r]
            )));
        }
        let requests = self.teacher_requests(rows.clone())?.len();
        if scores.teacher.len() != requests {
            return Err(Error::Shape {
                what: "objective grads",
                detail: format!(
                    "micro-batch rows {rows:?} need {requests} teacher scores but the backend \
                     passed {}",
                    scores.teacher.len()
                ),
            });
        }
        let mut sums = Sums::new(self.aux.len(), self.teacher.len());
        let mut out = TokenGrads {
            logp: Vec::with_capacity(n),
            ..Default::default()
        };
        let mut answers = scores.teacher.iter();
        for (k, r) in rows.clone().enumerate() {
            let ent = entropy.get(k).map(Vec::as_slice);
            let (mut g, h) = self.row_grads(r, &logp[k], ent, &mut sums)?;
            for &(j, t) in &self.targets_by_row[r] {
                let state = &self.teacher[j];
                let target = &state.term.targets[t];
                let answer = match state.term.request(target, &state.active[t]) {
                    Some(_) => answers.next(),
                    None => None,
                };
                let outcome = target_grads(
                    &state.term,
                    target,
                    &state.active[t],
                    state.weights[t],
                    &logp[k],
                    answer,
                    &mut g,
                )?;
                let s = &mut sums.teacher[j];
                s.weighted += outcome.weighted;
                s.divergence += outcome.divergence;
                s.active_tokens += outcome.active_tokens;
                if answer.is_some() {
                    out.teacher.push(outcome.top_grads);
                }
            }
            out.logp.push(g);
            if self.needs_entropy() {
                out.entropy.push(h);
            }
        }
        self.sums.add(&sums);
        for r in rows {
            self.done[r] = true;
        }
        Ok(out)
    }
}

impl RlLoss {
    fn check_range(&self, rows: &Range<usize>) -> Result<()> {
        if rows.end > self.rows.len() || rows.start > rows.end {
            return Err(Error::Shape {
                what: "objective grads",
                detail: format!(
                    "micro-batch rows {rows:?} outside the step's {} rows",
                    self.rows.len()
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::objective::config::{Aggregation, KlEstimator};

    /// A step's rows and aux terms, as the tests build them by hand.
    #[derive(Clone, Debug, Default)]
    struct StepInput {
        rows: Vec<ObjectiveRow>,
        aux: Vec<(String, f32)>,
    }

    /// The outputs of one step: report, `∂L/∂ℓ`, `∂L/∂H` (per row, concatenated over
    /// micro-batches).
    type Outcome = (LossReport, Vec<Vec<f32>>, Vec<Vec<f32>>);

    /// Runs a whole step through `RlLoss` with the given micro-batch split.
    fn run(
        config: &ObjectiveConfig,
        input: &StepInput,
        logp: &[Vec<f32>],
        entropy: &[Vec<f32>],
        split: &[Range<usize>],
    ) -> Result<Outcome> {
        let mut loss = new_loss(config, input)?;
        let (mut g, mut h) = (Vec::new(), Vec::new());
        for mb in split {
            let ent = if entropy.is_empty() {
                &[][..]
            } else {
                &entropy[mb.clone()]
            };
            let scores = TokenScores {
                logp: &logp[mb.clone()],
                entropy: ent,
                teacher: &[],
            };
            let out = loss.grads(mb.clone(), &scores)?;
            g.extend(out.logp);
            h.extend(out.entropy);
        }
        loss.check_complete()?;
        Ok((loss.report(), g, h))
    }

    fn new_loss(config: &ObjectiveConfig, step: &StepInput) -> Result<RlLoss> {
        RlLoss::new(config, step.rows.clone(), step.aux.clone())
    }

    fn whole(n: usize) -> Vec<Range<usize>> {
        std::iter::once(0..n).collect()
    }

    fn row(mask: &[u8], adv: &[f32], old: &[f32]) -> ObjectiveRow {
        ObjectiveRow {
            mask: mask.to_vec(),
            advantages: adv.to_vec(),
            old_logp: old.to_vec(),
            ..Default::default()
        }
    }

    fn input(rows: Vec<ObjectiveRow>) -> StepInput {
        StepInput { rows, aux: vec![] }
    }

    fn close(got: f64, want: f64, tol: f64, what: &str) {
        assert!((got - want).abs() <= tol, "{what}: got {got}, want {want}");
    }

    #[test]
    fn masked_nan_never_leaks_openrlhf_1240() {
        // Case openrlhf-1240-nan-in-masked-slot: logp [0, 0], old [0, NaN], A [1, 1], mask [1, 0].
        let step = input(vec![row(&[1, 0], &[1.0, 1.0], &[0.0, f32::NAN])]);
        let (report, g, _) = run(
            &ObjectiveConfig::default(),
            &step,
            &[vec![0.0, f32::NAN]],
            &[],
            &whole(1),
        )
        .unwrap();
        assert_eq!(
            (report.pg_loss, report.loss, report.approx_kl_old_k3),
            (-1.0, -1.0, 0.0)
        );
        assert_eq!(
            (report.tokens, report.ratio_mean, report.clip_fraction),
            (1, 1.0, 0.0)
        );
        assert_eq!(g, vec![vec![-1.0, 0.0]]);
        // NaN/inf anywhere in masked slots, including advantages and the reference.
        let mut r = row(
            &[0, 1, 0],
            &[f32::NAN, 2.0, f32::INFINITY],
            &[f32::NAN, -1.0, f32::NEG_INFINITY],
        );
        r.ref_logp = Some(vec![f32::NAN, -1.0, f32::NAN]);
        let config = ObjectiveConfig {
            kl_coef: 0.5,
            ..Default::default()
        };
        let (report, g, _) = run(
            &config,
            &input(vec![r]),
            &[vec![f32::NAN, -1.0, f32::INFINITY]],
            &[],
            &whole(1),
        )
        .unwrap();
        assert_eq!((report.loss, report.kl), (-2.0, Some(0.0)));
        assert_eq!(g, vec![vec![0.0, -2.0, 0.0]]);
    }

    #[test]
    fn non_finite_trainable_values_are_errors_naming_row_and_token() {
        let cfg = ObjectiveConfig::default();
        let bad_old = input(vec![
            row(&[1], &[1.0], &[0.0]),
            row(&[0, 1], &[1.0, 1.0], &[0.0, f32::NAN]),
        ]);
        let e = new_loss(&cfg, &bad_old).unwrap_err().to_string();
        assert!(
            e.contains("row 1, token 1: old_logp is NaN on a trainable token"),
            "{e}"
        );
        let bad_adv = input(vec![row(&[1], &[f32::INFINITY], &[0.0])]);
        let e = new_loss(&cfg, &bad_adv).unwrap_err().to_string();
        assert!(e.contains("row 0, token 0: advantages is inf"), "{e}");
        let ok = input(vec![row(&[1, 1], &[1.0, 1.0], &[0.0, 0.0])]);
        let e = run(&cfg, &ok, &[vec![0.0, f32::NAN]], &[], &whole(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 0, token 1: current log-prob is NaN"), "{e}");
        let bad_mask = input(vec![row(&[2], &[1.0], &[0.0])]);
        let e = new_loss(&cfg, &bad_mask).unwrap_err().to_string();
        assert!(e.contains("mask holds 2"), "{e}");
    }

    #[test]
    fn step_bookkeeping_errors() {
        let cfg = ObjectiveConfig::default();
        let step = input(vec![
            row(&[1], &[1.0], &[0.0]),
            row(&[1, 1], &[1.0, 1.0], &[0.0, 0.0]),
        ]);
        let mut loss = new_loss(&cfg, &step).unwrap();
        loss.grads(0..1, &TokenScores::logp(&[vec![0.0]])).unwrap();
        let e = loss.check_complete().unwrap_err().to_string();
        assert!(
            e.contains("row 1 (1 of the step's 2) was never passed to grads"),
            "{e}"
        );
        let e = loss
            .grads(0..2, &TokenScores::logp(&[vec![0.0], vec![0.0, 0.0]]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 0 was already passed"), "{e}");
        let e = loss
            .grads(1..2, &TokenScores::logp(&[vec![0.0]]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 1: the step has 2 response tokens but the backend passed 1"),
            "{e}"
        );
        // A failed call changes nothing: the row can still be processed.
        loss.grads(1..2, &TokenScores::logp(&[vec![0.0, 0.0]]))
            .unwrap();
        loss.check_complete().unwrap();
        assert_eq!(loss.report().tokens, 3);
        let e = loss
            .grads(2..3, &TokenScores::logp(&[vec![]]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the step's 2 rows"), "{e}");

        let kl = ObjectiveConfig {
            kl_coef: 0.01,
            ..Default::default()
        };
        let e = new_loss(&kl, &step).unwrap_err().to_string();
        assert!(e.contains("needs reference log-probs"), "{e}");
        let mut half = step.clone();
        half.rows[0].ref_logp = Some(vec![0.0]);
        let e = new_loss(&cfg, &half).unwrap_err().to_string();
        assert!(
            e.contains("1 of 2 rows carry reference log-probs but row 1 does not"),
            "{e}"
        );
        let ent = ObjectiveConfig {
            entropy_coef: 0.01,
            ..Default::default()
        };
        let mut loss = new_loss(&ent, &step).unwrap();
        assert!(loss.needs_entropy());
        let e = loss
            .grads(0..1, &TokenScores::logp(&[vec![0.0]]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs per-token entropies"), "{e}");
    }

    #[test]
    fn clipped_losses_of_section_1e_through_the_loss() {
        // Five one-token rows, seq-mean-token-sum ×5 = plain sum; ρ = e^{ℓ−ℓ_old}.
        let cases = [
            (1.3f64, 1.0f32, -1.2f64),
            (0.7, 1.0, -0.7),
            (0.7, -1.0, 0.8),
            (1.3, -1.0, 1.3),
            (4.0, -1.0, 3.0),
        ];
        for (ratio, adv, want) in cases {
            let old = -2.0f32;
            let lp = (f64::from(old) + ratio.ln()) as f32;
            let (report, _, _) = run(
                &ObjectiveConfig::default(),
                &input(vec![row(&[1], &[adv], &[old])]),
                &[vec![lp]],
                &[],
                &whole(1),
            )
            .unwrap();
            close(report.pg_loss, want, 1e-6, &format!("(ρ={ratio}, A={adv})"));
        }
    }

    #[test]
    fn clip_fraction_counts_only_masked_tokens_where_clipping_changed_the_loss() {
        // Tokens (ρ, A, mask): counted clip (1.3, +1), (0.7, −1); dual (4.0, −1); not counted:
        // (0.7, +1) inside the winning branch, (5.0, 0) zero advantage, (9.0, +1) masked.
        let tokens = [
            (1.3f64, 1.0f32, 1u8),
            (0.7, -1.0, 1),
            (4.0, -1.0, 1),
            (0.7, 1.0, 1),
            (5.0, 0.0, 1),
            (9.0, 1.0, 0),
        ];
        let mask: Vec<u8> = tokens.iter().map(|t| t.2).collect();
        let adv: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        let old = vec![-1.0f32; tokens.len()];
        let lp: Vec<f32> = tokens.iter().map(|t| (-1.0 + t.0.ln()) as f32).collect();
        let (report, g, _) = run(
            &ObjectiveConfig::default(),
            &input(vec![row(&mask, &adv, &old)]),
            &[lp],
            &[],
            &whole(1),
        )
        .unwrap();
        assert_eq!(report.tokens, 5);
        close(report.clip_fraction, 2.0 / 5.0, 1e-12, "clip fraction");
        close(
            report.dual_clip_fraction,
            1.0 / 5.0,
            1e-12,
            "dual clip fraction",
        );
        close(
            report.ratio_max,
            5.0,
            1e-6,
            "ratio max (masked 9.0 excluded)",
        );
        // Gradient: zero on clipped tokens, −A·ρ·w elsewhere (w = 1/5).
        let want = [0.0, 0.0, 0.0, -0.7 / 5.0, 0.0, 0.0];
        for (l, (&got, want)) in g[0].iter().zip(want).enumerate() {
            close(f64::from(got), want, 1e-6, &format!("grad token {l}"));
        }
    }

    #[test]
    fn loss_normalisation_modes_trl_2995() {
        // Case trl-2995-loss-normalisation: rewards [1, 0], lengths [2, 4], eps 1e-4 (ddof 1),
        // ratio 1, β 0 → A = ±0.707007.
        let a = (0.5 / (std::f64::consts::FRAC_1_SQRT_2 + 1e-4)) as f32;
        close(f64::from(a), 0.707007, 1e-6, "advantage");
        let step = input(vec![
            row(&[1, 1, 0, 0], &[a; 4], &[-1.0; 4]),
            row(&[1, 1, 1, 1], &[-a; 4], &[-1.0; 4]),
        ]);
        let logp = vec![vec![-1.0f32; 4]; 2];
        let check = |aggregation, norm_constant, want: f64| {
            let config = ObjectiveConfig {
                aggregation,
                norm_constant,
                ..Default::default()
            };
            let (report, _, _) = run(&config, &step, &logp, &[], &whole(2)).unwrap();
            close(report.pg_loss, want, 1e-6, aggregation.as_str());
        };
        check(Aggregation::SeqMeanTokenMean, None, 0.0);
        check(Aggregation::TokenMean, None, 0.235669);
        // "seq sum / const" with const = G · L_max = 2 · 4.
        check(Aggregation::SeqMeanTokenSumNorm, Some(8.0), 0.176752);
    }

    #[test]
    fn uniform_groups_give_zero_loss_trl_3857() {
        // Case trl-3857-zero-std-groups: rewards [1,1,1,1, 0,0,0,0], groups of 4, eps 1e-4.
        use cairn_plugin_sdk::stats::{normalise_groups, Normalise, StdKind};
        let rewards = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let groups = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
        let adv = normalise_groups(
            &rewards,
            &groups,
            Normalise::MeanStd {
                eps: 1e-4,
                std: StdKind::Unbiased,
            },
        );
        assert_eq!(adv, vec![0.0; 8]);
        let rows = adv
            .iter()
            .map(|&a| row(&[1, 1], &[a as f32; 2], &[-0.5, -0.7]))
            .collect();
        let (report, g, _) = run(
            &ObjectiveConfig::default(),
            &input(rows),
            &vec![vec![-0.4f32, -0.9]; 8],
            &[],
            &whole(8),
        )
        .unwrap();
        assert_eq!(report.pg_loss, 0.0);
        assert!(g.iter().flatten().all(|&x| x == 0.0));
    }

    /// Loss value of a step with the given current log-probs (fresh `RlLoss`).
    fn loss_at(config: &ObjectiveConfig, step: &StepInput, logp: &[Vec<f32>]) -> f64 {
        run(config, step, logp, &[], &whole(step.rows.len()))
            .unwrap()
            .0
            .loss
    }

    #[test]
    fn kl_gradients_match_openrlhf_1309_and_finite_differences() {
        // Case openrlhf-1309-kl-estimators. A = 0, kl_coef = 1 and seq-mean-token-sum over one
        // row (w = 1): the loss is Σ k and ∂L/∂ℓ is exactly ∂k/∂ℓ.
        let logp = vec![vec![-1.0f32, -2.0, -0.5]];
        let mut r = row(&[1, 1, 1], &[0.0; 3], &[-1.0, -2.0, -0.5]);
        r.ref_logp = Some(vec![-1.5, -1.0, -0.5]);
        let step = input(vec![r]);
        let cases = [
            (KlEstimator::K1, [0.5, -1.0, 0.0], [1.0, 1.0, 1.0]),
            (KlEstimator::K2, [0.125, 0.5, 0.0], [0.5, -1.0, 0.0]),
            (
                KlEstimator::K3,
                [0.106531, 0.718282, 0.0],
                [0.393469, -1.718282, 0.0],
            ),
        ];
        for (kl_estimator, values, grads) in cases {
            let config = ObjectiveConfig {
                kl_coef: 1.0,
                kl_estimator,
                aggregation: Aggregation::SeqMeanTokenSum,
                ..Default::default()
            };
            let (report, g, _) = run(&config, &step, &logp, &[], &whole(1)).unwrap();
            let sum: f64 = values.iter().sum();
            close(report.loss, sum, 1e-6, &format!("{kl_estimator:?} loss"));
            close(
                report.kl.unwrap(),
                sum / 3.0,
                1e-6,
                &format!("{kl_estimator:?} kl metric"),
            );
            for l in 0..3 {
                close(
                    f64::from(g[0][l]),
                    grads[l],
                    1e-6,
                    &format!("{kl_estimator:?} grad {l}"),
                );
                // Central finite difference of the loss value itself (f32 inputs: h = 1e-3).
                let h = 1e-3f32;
                let (mut up, mut down) = (logp.clone(), logp.clone());
                up[0][l] += h;
                down[0][l] -= h;
                let fd = (loss_at(&config, &step, &up) - loss_at(&config, &step, &down))
                    / f64::from(up[0][l] - down[0][l]);
                close(
                    f64::from(g[0][l]),
                    fd,
                    2e-4,
                    &format!("{kl_estimator:?} grad {l} vs finite difference"),
                );
            }
        }
        // kl_mode = reward: no KL in the loss, the metric still reports it.
        let config = ObjectiveConfig {
            kl_coef: 1.0,
            kl_mode: KlMode::Reward,
            kl_estimator: KlEstimator::K1,
            ..Default::default()
        };
        let (report, g, _) = run(&config, &step, &logp, &[], &whole(1)).unwrap();
        assert_eq!((report.loss, report.kl_loss), (0.0, 0.0));
        close(
            report.kl.unwrap(),
            -0.5 / 3.0,
            1e-7,
            "kl metric in reward mode",
        );
        assert_eq!(g, vec![vec![0.0; 3]]);
    }

    #[test]
    fn entropy_and_aux_terms_edge_example_section_3e() {
        // The EDGE worked example (docs/algorithms/objective.md, "Teacher terms"): ℓ^S = [−0.5, −2.0, −0.1], ℓ^T = [−0.3, −0.8, −0.1], c = sg(ℓ^S − ℓ^T)
        // = [−0.2, −1.2, 0]; c·ℓ^S = [0.1, 2.4, 0], token-mean 0.8333, coefficients on ℓ^S are c
        // (per token, before the 1/3 of the token mean).
        let logp = vec![vec![-0.5f32, -2.0, -0.1]];
        let mut r = row(&[1, 1, 1], &[0.0; 3], &[-0.5, -2.0, -0.1]);
        r.aux = vec![vec![-0.2, -1.2, 0.0]];
        let step = StepInput {
            rows: vec![r],
            aux: vec![("edge".into(), 1.0)],
        };
        let config = ObjectiveConfig {
            entropy_coef: 0.01,
            ..Default::default()
        };
        let entropy = vec![vec![1.0f32, 2.0, 3.0]];
        let (report, g, h) = run(&config, &step, &logp, &entropy, &whole(1)).unwrap();
        close(report.aux_losses[0].value, 2.5 / 3.0, 1e-6, "edge aux loss");
        assert_eq!(report.aux_losses[0].name, "edge");
        close(report.entropy.unwrap(), 2.0, 1e-12, "entropy mean");
        close(report.entropy_loss, -0.01 * 2.0, 1e-12, "entropy loss");
        close(report.loss, 2.5 / 3.0 - 0.02, 1e-6, "total");
        for (l, want) in [-0.2, -1.2, 0.0].iter().enumerate() {
            close(f64::from(g[0][l]), want / 3.0, 1e-7, "aux grad");
            close(f64::from(h[0][l]), -0.01 / 3.0, 1e-9, "entropy grad");
        }
    }

    #[test]
    fn per_rollout_mass_section_13e() {
        // Agent Lightning's per-rollout example (docs/algorithms/objective.md, "Aggregation"): rollouts r1 (rows of 5 and 3 tokens), r2 (4), r3 (2), r4 (6);
        // GRPO advantages ±0.8660; N_rows = 5. Each rollout's mass Σ_tokens w·A is ±0.1732.
        let a = (0.5 / (1.0f64 / 3.0).sqrt()) as f32;
        let spec = [
            (1u64, 5usize, a),
            (1, 3, a),
            (2, 4, -a),
            (3, 2, a),
            (4, 6, -a),
        ];
        let rows: Vec<ObjectiveRow> = spec
            .iter()
            .map(|&(id, n, adv)| ObjectiveRow {
                rollout_id: id,
                ..row(&vec![1; n], &vec![adv; n], &vec![-1.0; n])
            })
            .collect();
        let logp: Vec<Vec<f32>> = rows.iter().map(|r| r.old_logp.clone()).collect();
        let config = ObjectiveConfig {
            aggregation: Aggregation::PerRollout,
            ..Default::default()
        };
        let (_, g, _) = run(&config, &input(rows), &logp, &[], &whole(5)).unwrap();
        // At ρ = 1, ∂L/∂ℓ = −A·w, so a rollout's mass is −Σ g.
        let mass = |rows: &[usize]| {
            -rows
                .iter()
                .map(|&r| g[r].iter().map(|&x| f64::from(x)).sum::<f64>())
                .sum::<f64>()
        };
        let per_token = [0.0217, 0.0217, -0.0433, 0.0866, -0.0289];
        for (r, want) in per_token.iter().enumerate() {
            close(
                -f64::from(g[r][0]),
                *want,
                5e-5,
                &format!("row {r} per-token weight × A"),
            );
        }
        close(mass(&[0]), 0.1083, 5e-5, "r1 row 1 mass");
        close(mass(&[1]), 0.0650, 5e-5, "r1 row 2 mass");
        for (rollout, rows, sign) in [
            (1, vec![0, 1], 1.0),
            (2, vec![2], -1.0),
            (3, vec![3], 1.0),
            (4, vec![4], -1.0),
        ] {
            close(
                mass(&rows),
                sign * 0.1732,
                5e-5,
                &format!("rollout r{rollout} mass"),
            );
        }
    }

    /// A random step: 1–12 rows of 0–9 tokens (a fifth of them extra rows), NaN in every
    /// masked slot, two aux terms, reference log-probs, entropies.
    fn random_step(rng: &mut ChaCha8Rng) -> (StepInput, Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let n = rng.gen_range(1..=12);
        let mut rows = Vec::new();
        let (mut logp, mut entropy) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let len = rng.gen_range(0..10);
            let mask: Vec<u8> = (0..len).map(|_| u8::from(rng.gen_bool(0.75))).collect();
            let pick = |rng: &mut ChaCha8Rng, m: u8, lo: f32, hi: f32| {
                if m == 1 {
                    rng.gen_range(lo..hi)
                } else {
                    f32::NAN
                }
            };
            let old: Vec<f32> = mask.iter().map(|&m| pick(rng, m, -4.0, -0.01)).collect();
            let cur: Vec<f32> = old
                .iter()
                .zip(&mask)
                .map(|(&o, &m)| {
                    if m == 1 {
                        o + rng.gen_range(-0.6..0.6)
                    } else {
                        f32::NAN
                    }
                })
                .collect();
            rows.push(ObjectiveRow {
                advantages: mask.iter().map(|&m| pick(rng, m, -2.0, 2.0)).collect(),
                ref_logp: Some(mask.iter().map(|&m| pick(rng, m, -4.0, -0.01)).collect()),
                rollout_id: rng.gen_range(0..4),
                aux: (0..2)
                    .map(|_| mask.iter().map(|&m| pick(rng, m, -1.0, 1.0)).collect())
                    .collect(),
                behav_logp: Some(
                    old.iter()
                        .zip(&mask)
                        .map(|(&o, &m)| {
                            if m == 1 {
                                o + rng.gen_range(-1.0..1.0)
                            } else {
                                f32::NAN
                            }
                        })
                        .collect(),
                ),
                old_logp: old,
                mask: mask.clone(),
                // Some extra rows (aux terms only), so they are split-invariant too.
                extra: rng.gen_bool(0.2),
            });
            logp.push(cur);
            entropy.push(mask.iter().map(|&m| pick(rng, m, 0.0, 3.0)).collect());
        }
        let aux = vec![("a".into(), 0.3), ("b".into(), -0.7)];
        (StepInput { rows, aux }, logp, entropy)
    }

    /// Random contiguous split of `0..n` into micro-batches (empty ones included).
    fn random_split(rng: &mut ChaCha8Rng, n: usize) -> Vec<Range<usize>> {
        let mut cuts: Vec<usize> = (0..rng.gen_range(0..4))
            .map(|_| rng.gen_range(0..=n))
            .collect();
        cuts.extend([0, n]);
        cuts.sort_unstable();
        cuts.windows(2).map(|w| w[0]..w[1]).collect()
    }

    fn rel_close(a: f64, b: f64, what: &str) {
        assert!(
            (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1e-12),
            "{what}: {a} vs {b}"
        );
    }

    #[test]
    fn loss_gradients_and_metrics_are_split_invariant() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let modes = [
            (Aggregation::TokenMean, None),
            (Aggregation::SeqMeanTokenSum, None),
            (Aggregation::SeqMeanTokenMean, None),
            (Aggregation::SeqMeanTokenSumNorm, Some(13.0)),
            (Aggregation::PerRollout, None),
        ];
        for trial in 0..40 {
            let (step, logp, entropy) = random_step(&mut rng);
            let n = step.rows.len();
            let (aggregation, norm_constant) = modes[trial % modes.len()];
            let kl_estimator = [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3][trial % 3];
            let off_policy = [OffPolicy::None, OffPolicy::Tis, OffPolicy::Decoupled][trial % 3];
            let config = ObjectiveConfig {
                off_policy,
                is_cap: 1.5,
                aggregation,
                norm_constant,
                kl_estimator,
                kl_coef: 0.05,
                entropy_coef: 0.01,
                clip_high: 0.28,
                ..Default::default()
            };
            let (base, g1, h1) = run(&config, &step, &logp, &entropy, &whole(n)).unwrap();
            let mut splits = vec![(0..n).map(|r| r..r + 1).collect::<Vec<_>>()];
            splits.extend((0..3).map(|_| random_split(&mut rng, n)));
            for split in splits {
                let (report, g, h) = run(&config, &step, &logp, &entropy, &split).unwrap();
                let what = format!("trial {trial} ({}) split {split:?}", aggregation.as_str());
                let (a, b) = (base.metrics(), report.metrics());
                assert_eq!(a.len(), b.len());
                for ((name, x), (_, y)) in a.iter().zip(&b) {
                    rel_close(*x, *y, &format!("{what}: {name}"));
                }
                for (x, y) in g1
                    .iter()
                    .flatten()
                    .zip(g.iter().flatten())
                    .chain(h1.iter().flatten().zip(h.iter().flatten()))
                {
                    rel_close(f64::from(*x), f64::from(*y), &format!("{what}: gradient"));
                }
            }
            // And the gradient is the derivative of the loss (away from clip boundaries the
            // loss is smooth; check a few tokens by central differences).
            for (r, l) in (0..n)
                .flat_map(|r| (0..step.rows[r].mask.len()).map(move |l| (r, l)))
                .filter(|&(r, l)| step.rows[r].mask[l] == 1)
                .take(3)
            {
                let h = 1e-2f32;
                let (mut up, mut down) = (logp.clone(), logp.clone());
                up[r][l] += h;
                down[r][l] -= h;
                let (lu, ld) = (
                    run(&config, &step, &up, &entropy, &whole(n)).unwrap().0,
                    run(&config, &step, &down, &entropy, &whole(n)).unwrap().0,
                );
                let same_branches = lu.clip_fraction == ld.clip_fraction
                    && lu.dual_clip_fraction == ld.dual_clip_fraction
                    && lu.clip_fraction == base.clip_fraction
                    && lu.dual_clip_fraction == base.dual_clip_fraction;
                if same_branches {
                    let fd = (lu.loss - ld.loss) / f64::from(up[r][l] - down[r][l]);
                    let got = f64::from(g1[r][l]);
                    assert!(
                        (got - fd).abs() <= 1e-3 * (1.0 + fd.abs()),
                        "trial {trial} row {r} token {l}: grad {got} vs fd {fd}"
                    );
                }
            }
        }
    }

    /// A batch row for [`RlLoss::from_rows`].
    fn turn_row(trajectory: u64, old: &[f32], reference: &[f32], behav: &[f32]) -> TurnRow {
        TurnRow {
            group_id: 1,
            trajectory_id: trajectory,
            prompt_ids: vec![1, 2],
            response_ids: (0..old.len() as u32).collect(),
            response_logprobs: behav.to_vec(),
            response_mask: vec![1; old.len()],
            old_logprobs: old.to_vec(),
            ref_logprobs: reference.to_vec(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn an_extra_row_takes_no_part_in_the_surrogate_kl_or_entropy() {
        use cairn_plugin_sdk::{AuxTerm, TeacherForm, TeacherSource, TeacherTarget, TeacherTerm};

        let batch = [
            turn_row(
                1,
                &[-1.0, -0.7, -2.5],
                &[-1.2, -0.9, -2.0],
                &[-1.0, -1.5, -2.0],
            ),
            turn_row(2, &[-0.4, -1.1], &[-0.5, -1.0], &[-0.6, -1.0]),
        ];
        let logp_batch = vec![vec![-1.1f32, -0.6, -2.5], vec![-0.3, -1.3]];
        let entropy_batch = vec![vec![1.0f32, 2.0, 0.5], vec![1.5, 0.25]];
        let plain = Signals {
            advantages: vec![vec![1.0, 1.0, -1.0], vec![-0.5, 0.8]],
            ..Signals::default()
        };
        // The same step with an extra row: the first row's response under another prompt,
        // with large non-zero advantages (never read), no ℓ_ref, NaN behaviour log-probs (never
        // read), the same rollout id as row 0, an aux term and a fixed teacher that target it
        // only (EDGE's example: ℓ^S = [−0.5, −2.0, −0.1], ℓ^T = [−0.3, −0.8, −0.1]).
        let mut extra = turn_row(1, &[-0.4, -1.9, -0.2], &[], &[f32::NAN; 3]);
        extra.train_prompt_ids = Some(vec![9, 9, 9]);
        let mut with_extra = plain.clone();
        with_extra.extra_rows.push(extra.clone());
        with_extra.advantages.push(vec![3.0, -2.0, 5.0]);
        with_extra.aux.push(AuxTerm {
            name: "aux".into(),
            coef: 0.5,
            coefficients: vec![vec![0.0; 3], vec![0.0; 2], vec![1.0, 0.0, -1.0]],
        });
        with_extra.teacher.push(TeacherTerm {
            name: "opd".into(),
            coef: 1.0,
            form: TeacherForm::SampledReverseKl,
            targets: vec![TeacherTarget {
                row: 2,
                weights: vec![1.0; 3],
                source: TeacherSource::Fixed {
                    logprobs: vec![-0.3, -0.8, -0.1],
                    top_ids: vec![],
                    top_logprobs: vec![],
                },
            }],
        });
        let extra_logp = vec![-0.5f32, -2.0, -0.1];
        let rows_plain: Vec<&TurnRow> = batch.iter().collect();
        let rows_extra: Vec<&TurnRow> = batch.iter().chain([&extra]).collect();
        let step = |config: &ObjectiveConfig,
                    rows: &[&TurnRow],
                    signals: &Signals,
                    indices: &[usize],
                    logp: &[Vec<f32>],
                    entropy: &[Vec<f32>]| {
            let mut loss = RlLoss::from_rows(config, rows, signals, indices).unwrap();
            let out = loss
                .grads(
                    0..indices.len(),
                    &TokenScores {
                        logp,
                        entropy,
                        teacher: &[],
                    },
                )
                .unwrap();
            loss.check_complete().unwrap();
            (loss.report(), out.logp, out.entropy)
        };
        for aggregation in [
            Aggregation::TokenMean,
            Aggregation::SeqMeanTokenSum,
            Aggregation::SeqMeanTokenMean,
            Aggregation::PerRollout,
        ] {
            let config = ObjectiveConfig {
                aggregation,
                kl_coef: 0.1,
                entropy_coef: 0.01,
                off_policy: OffPolicy::Tis,
                ..Default::default()
            };
            let (a, ga, ha) = step(
                &config,
                &rows_plain,
                &plain,
                &[0, 1],
                &logp_batch,
                &entropy_batch,
            );
            let mut logp = logp_batch.clone();
            logp.push(extra_logp.clone());
            let mut entropy = entropy_batch.clone();
            entropy.push(vec![f32::NAN; 3]);
            let (b, gb, hb) = step(
                &config,
                &rows_extra,
                &with_extra,
                &[0, 1, 2],
                &logp,
                &entropy,
            );
            let what = aggregation.as_str();
            // The PPO, KL and entropy terms and the token metrics are those of the batch rows,
            // bit for bit: the extra row is not in their normalisers.
            assert_eq!(
                (a.pg_loss, a.kl_loss, a.entropy_loss, a.kl, a.entropy),
                (b.pg_loss, b.kl_loss, b.entropy_loss, b.kl, b.entropy),
                "{what}"
            );
            assert_eq!((a.tokens, a.rows), (5, 2), "{what}");
            assert_eq!((b.tokens, b.rows), (5, 2), "{what}");
            assert_eq!(
                (a.clip_fraction, a.ratio_mean, a.approx_kl_old_k3),
                (b.clip_fraction, b.ratio_mean, b.approx_kl_old_k3),
                "{what}"
            );
            assert_eq!(a.off_policy, b.off_policy, "{what}");
            assert_ne!(a.pg_loss, 0.0);
            assert_eq!(ga[..], gb[..2], "{what}: batch rows' ∂L/∂ℓ");
            assert_eq!(ha[..], hb[..2], "{what}: batch rows' ∂L/∂H");
            assert_eq!(
                hb[2],
                vec![0.0; 3],
                "{what}: no entropy gradient on the extra row"
            );
            // The extra row is trained by its teacher and aux terms only. Teacher: over its own
            // 3 active tokens (one row), values [0.1, 2.4, 0] and ∂ = [−0.2, −1.2, 0], times
            // W = 1/3 (1 under seq-mean-token-sum). Aux: over all 8 tokens of the step, so
            // under token-mean ∂ = 0.5 · [1, 0, −1] / 8.
            let teacher_w = match aggregation {
                Aggregation::SeqMeanTokenSum => 1.0,
                _ => 1.0 / 3.0,
            };
            let t = &b.teacher[0];
            close(t.loss, 2.5 * teacher_w, 1e-6, what);
            let aux_w = match aggregation {
                Aggregation::TokenMean => 1.0 / 8.0,
                Aggregation::SeqMeanTokenSum => 1.0 / 3.0,
                Aggregation::SeqMeanTokenMean => 1.0 / 9.0,
                // Rollout 1 has the 3 + 3 tokens of row 0 and the extra row; 3 rows.
                _ => 1.0 / 18.0,
            };
            let aux_loss = 0.5 * aux_w * (-0.5 + 0.1);
            close(b.aux_losses[0].value, aux_loss, 1e-7, what);
            close(b.loss, a.loss + t.loss + aux_loss, 1e-9, what);
            for (l, (teacher, c)) in [(-0.2, 1.0), (-1.2, 0.0), (0.0, -1.0)]
                .into_iter()
                .enumerate()
            {
                let want = teacher * teacher_w + 0.5 * aux_w * c;
                close(
                    f64::from(gb[2][l]),
                    want,
                    1e-7,
                    &format!("{what} token {l}"),
                );
            }
            assert!(
                gb[2][1] < -0.3,
                "{what}: the teacher raises the token's probability"
            );
        }
        // Without a term targeting it, an extra row gets no gradient at all.
        let mut bare = plain.clone();
        bare.extra_rows.push(extra.clone());
        bare.advantages.push(vec![3.0, -2.0, 5.0]);
        let mut logp = logp_batch.clone();
        logp.push(extra_logp.clone());
        let (report, g, _) = step(
            &ObjectiveConfig::default(),
            &rows_extra,
            &bare,
            &[0, 1, 2],
            &logp,
            &[],
        );
        assert_eq!(g[2], vec![0.0; 3]);
        assert_eq!(report.tokens, 5);
        // Non-finite advantages on an extra row are not read, hence no error.
        bare.advantages[2] = vec![f32::NAN; 3];
        step(
            &ObjectiveConfig::default(),
            &rows_extra,
            &bare,
            &[0, 1, 2],
            &logp,
            &[],
        );
    }

    #[test]
    fn credit_arrays_left_in_signals_compose_like_the_stack() {
        // A^est = 0.8, scale 1.5 on token 1, add 0.2 everywhere → [1.0, 1.4]; the mask-0 token
        // keeps its value. (The stack's answer carries them composed; a batch file given to
        // `cairn loss` may not.)
        let mut row = turn_row(1, &[-1.0, -1.0, -1.0], &[], &[-1.0; 3]);
        row.response_mask = vec![1, 1, 0];
        let signals = Signals {
            advantages: vec![vec![0.8; 3]],
            advantage_scale: vec![vec![1.0, 1.5, 9.0]],
            advantage_add: vec![vec![0.2, 0.2, 9.0]],
            ..Signals::default()
        };
        let config = ObjectiveConfig {
            aggregation: Aggregation::SeqMeanTokenSum,
            ..Default::default()
        };
        let mut loss = RlLoss::from_rows(&config, &[&row], &signals, &[0]).unwrap();
        // At ρ = 1 the gradient is −A · w (w = 1).
        let out = loss
            .grads(0..1, &TokenScores::logp(&[vec![-1.0; 3]]))
            .unwrap();
        assert_eq!(out.logp[0], vec![-1.0, -1.4, 0.0]);
        let mut short = signals.clone();
        short.advantage_add = vec![];
        short.advantage_scale = vec![vec![1.0; 3], vec![1.0]];
        let e = RlLoss::from_rows(&config, &[&row], &short, &[0])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("signals.advantage_scale has 2 rows but the step was given 1"),
            "{e}"
        );
    }
}
