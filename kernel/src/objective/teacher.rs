//! Teacher-target terms: distillation toward a teacher distribution with live gradients
//! through the student (docs/algorithms/objective.md, "Teacher terms").
//!
//! Three per-token forms ([`TeacherForm`]), each weighted by the target's `w_l ≥ 0` and summed
//! over the term's *active* tokens (mask 1 and `w_l > 0`) with the objective's aggregation,
//! whose normalisers come from the whole step's active tokens:
//!
//! * sampled reverse KL (EDGE): `x_l = w_l · sg(ℓ^S_l − ℓ^T_l) · ℓ^S_l`, so
//!   `∂x/∂ℓ^S = w_l (ℓ^S_l − ℓ^T_l)`, the score-function estimator of
//!   `∇ KL(π_θ(·|x) ‖ π_T(·|x'))` on the policy's own samples;
//! * top-k reverse KL: with the student's log-probs `s_v` and the teacher's `t_v` at the
//!   teacher's top-k ids, both renormalised over those ids (`q = s − lse(s)`,
//!   `τ = t − lse(t)`, `p = e^q`): `x_l = w_l Σ_v p_v (q_v − τ_v)`, and
//!   `∂x/∂s_j = w_l p_j (q_j − τ_j − Σ_v p_v (q_v − τ_v))`;
//! * top-k forward KL (UCOB's top-k OPD): on the same renormalised support, with `P = e^τ`,
//!   `x_l = w_l Σ_v P_v (τ_v − q_v)`, and, since `∂q_v/∂s_j = δ_vj − p_j` and `Σ_v P_v = 1`,
//!   `∂x/∂s_j = w_l (p_j Σ_v P_v − P_j) = w_l (p_j − P_j)`.
//!
//! The teacher side is detached in every form.
//!
//! This module holds the resolved targets of one step ([`StepTeacher`]), the per-token math,
//! and the running sums; [`super::RlLoss`] drives it.

use cairn_plugin_sdk::{TeacherForm, TeacherSource, TeacherTerm};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::loss::{TeacherRequest, TeacherScores};

/// What a term reports for one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TeacherReport {
    pub name: String,
    /// `coef · agg(x)`: the term's share of the total loss.
    pub loss: f64,
    /// Token mean over the active tokens of the unweighted divergence: `ℓ^S − ℓ^T` (sampled
    /// form, a k1 estimate of the reverse KL) or the renormalised top-k KL (reverse or
    /// forward, as the form says).
    pub kl: f64,
    /// Active tokens (mask 1, weight > 0) processed so far.
    pub active_tokens: usize,
}

/// One target, resolved to a row of the step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StepTarget {
    /// Index among the step's rows (the backend's sequence index).
    pub row: usize,
    /// `w_l`, `[L]`; read only where the row's mask is 1.
    pub weights: Vec<f32>,
    pub source: TeacherSource,
}

/// One teacher term of a step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StepTeacher {
    pub name: String,
    pub coef: f64,
    pub form: TeacherForm,
    pub targets: Vec<StepTarget>,
}

fn input_error(message: String) -> Error {
    Error::Other(format!("objective input: {message}"))
}

impl StepTeacher {
    /// Resolves `term`'s targets on the rows of this step: `position[i]` is the step index of
    /// row `i` of `batch.rows ++ extra_rows` (None: not in this step). Targets on other rows
    /// are left to the step that trains them.
    pub fn resolve(term: &TeacherTerm, position: &[Option<usize>]) -> Result<StepTeacher> {
        if !term.coef.is_finite() {
            return Err(input_error(format!(
                "teacher term `{}` has coefficient {}; give a finite number",
                term.name, term.coef
            )));
        }
        match term.form {
            TeacherForm::TopKReverseKl { k: 0 } => {
                return Err(input_error(format!(
                    "teacher term `{}`: top_k_reverse_kl needs k ≥ 1 (EDGE uses 20)",
                    term.name
                )))
            }
            TeacherForm::TopKForwardKl { k: 0 } => {
                return Err(input_error(format!(
                    "teacher term `{}`: top_k_forward_kl needs k ≥ 1",
                    term.name
                )))
            }
            _ => {}
        }
        let mut seen = std::collections::HashSet::new();
        let mut targets = Vec::new();
        for t in &term.targets {
            if !seen.insert(t.row) {
                return Err(input_error(format!(
                    "teacher term `{}` targets row {} twice; give one target per row",
                    term.name, t.row
                )));
            }
            if let Some(&Some(step_row)) = position.get(t.row) {
                if let TeacherSource::Context { context_ids } = &t.source {
                    if context_ids.is_empty() {
                        return Err(input_error(format!(
                            "teacher term `{}`: row {} has an empty teacher context; the first \
                             response token needs at least one context token",
                            term.name, t.row
                        )));
                    }
                }
                targets.push(StepTarget {
                    row: step_row,
                    weights: t.weights.clone(),
                    source: t.source.clone(),
                });
            }
        }
        Ok(StepTeacher {
            name: term.name.clone(),
            coef: f64::from(term.coef),
            form: term.form,
            targets,
        })
    }

    /// `k` of the top-k form, 0 for the sampled form.
    pub fn k(&self) -> usize {
        match self.form {
            TeacherForm::TopKReverseKl { k } | TeacherForm::TopKForwardKl { k } => k as usize,
            TeacherForm::SampledReverseKl => 0,
        }
    }

    /// Checks the targets against their rows' masks: weights finite and ≥ 0 on mask-1 tokens,
    /// fixed teacher values finite on active tokens. Returns each target's active mask.
    pub fn active_masks(&self, masks: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let k = self.k();
        self.targets
            .iter()
            .map(|t| {
                let mask = masks[t.row];
                let mut active = vec![0u8; mask.len()];
                for l in (0..mask.len()).filter(|&l| mask[l] == 1) {
                    let w = t.weights[l];
                    if !(w.is_finite() && w >= 0.0) {
                        return Err(input_error(format!(
                            "teacher term `{}`, step row {}, token {l}: weight {w}; teacher \
                             weights are finite and ≥ 0 (0: not distilled)",
                            self.name, t.row
                        )));
                    }
                    active[l] = u8::from(w > 0.0);
                    if w > 0.0 {
                        if let TeacherSource::Fixed {
                            logprobs,
                            top_logprobs,
                            ..
                        } = &t.source
                        {
                            let bad = if k == 0 {
                                logprobs.get(l).filter(|x| !x.is_finite())
                            } else {
                                top_logprobs[l * k..(l + 1) * k]
                                    .iter()
                                    .find(|x| !x.is_finite())
                            };
                            if let Some(x) = bad {
                                return Err(input_error(format!(
                                    "teacher term `{}`, step row {}, token {l}: fixed teacher \
                                     log-prob {x} on an active token",
                                    self.name, t.row
                                )));
                            }
                        }
                    }
                }
                Ok(active)
            })
            .collect()
    }

    /// The backend request of target `t`, or None when it needs no teacher pass (a fixed
    /// sampled-token target).
    pub fn request(&self, t: &StepTarget, active: &[u8]) -> Option<TeacherRequest> {
        let k = self.k();
        match &t.source {
            TeacherSource::Context { context_ids } => Some(TeacherRequest {
                row: t.row,
                context_ids: Some(context_ids.clone()),
                top_k: k as u32,
                ids: Vec::new(),
            }),
            TeacherSource::Fixed { .. } if k == 0 => None,
            TeacherSource::Fixed { top_ids, .. } => Some(TeacherRequest {
                row: t.row,
                context_ids: None,
                top_k: k as u32,
                // Inactive slots may hold anything (an id outside the vocabulary included);
                // they never reach the backend.
                ids: active
                    .iter()
                    .enumerate()
                    .flat_map(|(l, &a)| {
                        (0..k).map(move |j| if a == 1 { top_ids[l * k + j] } else { 0 })
                    })
                    .collect(),
            }),
        }
    }
}

/// One target's contribution in one micro-batch.
#[derive(Debug, Default)]
pub(crate) struct TargetOutcome {
    /// `Σ_active W·x_l` (before the term's coefficient).
    pub weighted: f64,
    /// `Σ_active` divergence (unweighted), for the `kl` metric.
    pub divergence: f64,
    pub active_tokens: usize,
    /// `∂L/∂s`, `[L·k]` (top-k form only), coefficient and aggregation weight included.
    pub top_grads: Vec<f32>,
}

fn shape(what: &str, name: &str, row: usize, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Shape {
            what: "teacher scores",
            detail: format!(
                "teacher term `{name}`, step row {row}: {what} has {got} entries, expected {want}"
            ),
        })
    }
}

fn finite(x: f32, what: &str, name: &str, row: usize, l: usize) -> Result<f64> {
    if x.is_finite() {
        Ok(f64::from(x))
    } else {
        Err(input_error(format!(
            "teacher term `{name}`, step row {row}, token {l}: {what} is {x} on an active token"
        )))
    }
}

/// `log Σ e^x`, stabilised by the max.
fn log_sum_exp(x: &[f64]) -> f64 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

/// `(KL_k, ∂KL_k/∂s)` of the student's log-probs `s` against the teacher's `t` at the same `k`
/// ids, both renormalised over them.
pub fn top_k_reverse_kl(s: &[f64], t: &[f64]) -> (f64, Vec<f64>) {
    let (ls, lt) = (log_sum_exp(s), log_sum_exp(t));
    let q: Vec<f64> = s.iter().map(|v| v - ls).collect();
    let tau: Vec<f64> = t.iter().map(|v| v - lt).collect();
    let kl: f64 = q.iter().zip(&tau).map(|(q, t)| q.exp() * (q - t)).sum();
    let grad = q
        .iter()
        .zip(&tau)
        .map(|(q, t)| q.exp() * (q - t - kl))
        .collect();
    (kl, grad)
}

/// `(KL_k, ∂KL_k/∂s)` of the teacher's log-probs `t` against the student's `s` at the same
/// `k` ids (the forward direction, `KL(p^T ‖ p^S)` on the renormalised support; UCOB's top-k
/// OPD). `∂KL_k/∂s_j = p^S_j − p^T_j`: the teacher is detached.
pub fn top_k_forward_kl(s: &[f64], t: &[f64]) -> (f64, Vec<f64>) {
    let (ls, lt) = (log_sum_exp(s), log_sum_exp(t));
    let q: Vec<f64> = s.iter().map(|v| v - ls).collect();
    let tau: Vec<f64> = t.iter().map(|v| v - lt).collect();
    let kl: f64 = q.iter().zip(&tau).map(|(q, t)| t.exp() * (t - q)).sum();
    // p_j · Σ_v P_v − P_j; Σ_v P_v is 1 up to rounding, kept so the gradient is exactly the
    // derivative of the value computed above.
    let mass: f64 = tau.iter().map(|t| t.exp()).sum();
    let grad = q
        .iter()
        .zip(&tau)
        .map(|(q, t)| q.exp() * mass - t.exp())
        .collect();
    (kl, grad)
}

/// Computes one target's values and gradients. `logp` is the row's current log-probs;
/// `scores` the backend's answer to the target's request (None for a fixed sampled target);
/// `row_weight` the target's aggregation weight `W`; `grad` the row's `∂L/∂ℓ`, which the
/// sampled form adds to.
pub(crate) fn target_grads(
    term: &StepTeacher,
    target: &StepTarget,
    active: &[u8],
    row_weight: f64,
    logp: &[f32],
    scores: Option<&TeacherScores>,
    grad: &mut [f32],
) -> Result<TargetOutcome> {
    let (name, row, len, k) = (term.name.as_str(), target.row, active.len(), term.k());
    let mut out = TargetOutcome::default();
    // Where the teacher's values are: the request's answer (live) or the target (fixed).
    let (teacher_lp, teacher_top): (&[f32], &[f32]) = match (&target.source, scores) {
        (TeacherSource::Context { .. }, Some(s)) => {
            if k == 0 {
                shape("teacher log-probs", name, row, s.logprobs.len(), len)?;
            } else {
                shape(
                    "teacher top-k log-probs",
                    name,
                    row,
                    s.top_logprobs.len(),
                    len * k,
                )?;
            }
            (&s.logprobs, &s.top_logprobs)
        }
        (
            TeacherSource::Fixed {
                logprobs,
                top_logprobs,
                ..
            },
            _,
        ) => (logprobs, top_logprobs),
        (TeacherSource::Context { .. }, None) => {
            return Err(Error::Other(format!(
                "teacher term `{name}`, step row {row}: the backend returned no teacher scores \
                 for a live teacher"
            )))
        }
    };
    let student_top: &[f32] = match scores {
        Some(s) if k > 0 => {
            shape(
                "student top-k log-probs",
                name,
                row,
                s.student_top_logprobs.len(),
                len * k,
            )?;
            &s.student_top_logprobs
        }
        None if k > 0 => {
            return Err(Error::Other(format!(
                "teacher term `{name}`, step row {row}: the backend returned no student top-k \
                 log-probs for a top-k target"
            )))
        }
        _ => &[],
    };
    if k > 0 {
        out.top_grads = vec![0.0; len * k];
    }
    let scale = term.coef * row_weight;
    for l in (0..len).filter(|&l| active[l] == 1) {
        let w = f64::from(target.weights[l]);
        let divergence = if k == 0 {
            let ls = finite(logp[l], "the student log-prob", name, row, l)?;
            let lt = finite(teacher_lp[l], "the teacher log-prob", name, row, l)?;
            let d = ls - lt;
            out.weighted += row_weight * w * d * ls;
            grad[l] += (scale * w * d) as f32;
            d
        } else {
            let span = l * k..(l + 1) * k;
            let s = student_top[span.clone()]
                .iter()
                .map(|&x| finite(x, "a student top-k log-prob", name, row, l))
                .collect::<Result<Vec<f64>>>()?;
            let t = teacher_top[span.clone()]
                .iter()
                .map(|&x| finite(x, "a teacher top-k log-prob", name, row, l))
                .collect::<Result<Vec<f64>>>()?;
            let (kl, dkl) = match term.form {
                TeacherForm::TopKForwardKl { .. } => top_k_forward_kl(&s, &t),
                _ => top_k_reverse_kl(&s, &t),
            };
            out.weighted += row_weight * w * kl;
            for (g, d) in out.top_grads[span].iter_mut().zip(dkl) {
                *g = (scale * w * d) as f32;
            }
            kl
        };
        out.divergence += divergence;
        out.active_tokens += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use cairn_plugin_sdk::{Signals, TeacherTarget, TurnRow};

    use super::*;
    use crate::loss::{TokenLoss, TokenScores};
    use crate::objective::config::Aggregation;
    use crate::objective::{LossReport, ObjectiveConfig, RlLoss};

    #[test]
    fn top_k_kl_matches_an_independent_evaluation_and_finite_differences() {
        // Teacher logits [2, 1, 0], student logits [1, 1.5, 0] (renormalisation makes log-probs
        // and logits interchangeable). KL(p^S ‖ p^T) computed independently: 0.245251092 (the
        // forward direction, KL(p^T ‖ p^S), would be 0.239401).
        let t = [2.0, 1.0, 0.0];
        let s = [1.0, 1.5, 0.0];
        let (kl, grad) = top_k_reverse_kl(&s, &t);
        assert!((kl - 0.245_251_092).abs() < 1e-8, "{kl}");
        for j in 0..3 {
            let h = 1e-6;
            let (mut up, mut down) = (s, s);
            up[j] += h;
            down[j] -= h;
            let fd = (top_k_reverse_kl(&up, &t).0 - top_k_reverse_kl(&down, &t).0) / (2.0 * h);
            assert!((grad[j] - fd).abs() < 1e-8, "∂/∂s_{j}: {} vs {fd}", grad[j]);
        }
        // Shifting all student log-probs by a constant changes nothing (renormalisation).
        let shifted: Vec<f64> = s.iter().map(|v| v - 3.0).collect();
        assert!((top_k_reverse_kl(&shifted, &t).0 - kl).abs() < 1e-12);
        assert!(grad.iter().sum::<f64>().abs() < 1e-12);
    }

    #[test]
    fn top_k_forward_kl_matches_ucobs_toy_and_finite_differences() {
        // UCOB's toy: teacher logits [2, 1, 0] → log p^T = [−0.4076, −1.4076, −2.4076];
        // student [1, 1.5, 0] → log p^S = [−1.1041, −0.6041, −2.1041]; the forward KL over
        // those three ids is d = Σ p^T (log p^T − log p^S) = 0.2394.
        let t = [2.0, 1.0, 0.0];
        let s = [1.0, 1.5, 0.0];
        let lse = |x: &[f64]| x.iter().map(|v| v.exp()).sum::<f64>().ln();
        let tau: Vec<f64> = t.iter().map(|v| v - lse(&t)).collect();
        let q: Vec<f64> = s.iter().map(|v| v - lse(&s)).collect();
        for (got, want) in tau.iter().zip([-0.4076, -1.4076, -2.4076]) {
            assert!((got - want).abs() < 5e-5, "log p^T {got}");
        }
        for (got, want) in q.iter().zip([-1.1041, -0.6041, -2.1041]) {
            assert!((got - want).abs() < 5e-5, "log p^S {got}");
        }
        let (d, grad) = top_k_forward_kl(&s, &t);
        assert!((d - 0.2394).abs() < 5e-5, "{d}");
        assert!((d - 0.239_401_361).abs() < 1e-8, "{d}");
        // ∂d/∂s_j = p^S_j − p^T_j (the teacher detached): [−0.3337, 0.3018, 0.0319].
        for (j, want) in [-0.333_742, 0.301_821, 0.031_921].iter().enumerate() {
            assert!((grad[j] - want).abs() < 1e-6, "∂/∂s_{j}: {}", grad[j]);
            let p_minus_p = q[j].exp() - tau[j].exp();
            assert!((grad[j] - p_minus_p).abs() < 1e-12);
            let h = 1e-6;
            let (mut up, mut down) = (s, s);
            up[j] += h;
            down[j] -= h;
            let fd = (top_k_forward_kl(&up, &t).0 - top_k_forward_kl(&down, &t).0) / (2.0 * h);
            assert!((grad[j] - fd).abs() < 1e-8, "∂/∂s_{j}: {} vs {fd}", grad[j]);
        }
        // Renormalisation: a constant shift of either side changes nothing; the gradient sums
        // to 0; the reverse direction is the other number of the pair.
        let shifted: Vec<f64> = s.iter().map(|v| v - 3.0).collect();
        let t_shifted: Vec<f64> = t.iter().map(|v| v + 1.5).collect();
        assert!((top_k_forward_kl(&shifted, &t_shifted).0 - d).abs() < 1e-12);
        assert!(grad.iter().sum::<f64>().abs() < 1e-12);
        assert!((top_k_reverse_kl(&s, &t).0 - 0.245_251_092).abs() < 1e-8);
        // Equal distributions: no divergence, no gradient.
        let (zero, g0) = top_k_forward_kl(&t, &t);
        assert!(zero.abs() < 1e-15 && g0.iter().all(|g| g.abs() < 1e-15));
    }

    /// The forward form through the loss, a fixed teacher at k = 3 on one token: the loss is
    /// `coef · d` (token mean over one active token) and `∂L/∂s = coef · (p^S − p^T)`.
    #[test]
    fn top_k_forward_kl_through_the_loss_fixed_teacher() {
        let row = turn_row(1, &[5, 6], &[1, 1], &[-0.5, -1.0]);
        let t = [-0.407_606_f32, -1.407_606, -2.407_606];
        let signals = Signals {
            advantages: vec![vec![0.0; 2]],
            teacher: vec![term(
                "ucob-opd",
                0.5,
                TeacherForm::TopKForwardKl { k: 3 },
                vec![TeacherTarget {
                    row: 0,
                    weights: vec![0.0, 2.0],
                    source: TeacherSource::Fixed {
                        logprobs: vec![],
                        top_ids: vec![0, 0, 0, 11, 12, 13],
                        top_logprobs: [[0.0; 3], t].concat(),
                    },
                }],
            )],
            ..Signals::default()
        };
        let mut loss =
            RlLoss::from_rows(&ObjectiveConfig::default(), &[&row], &signals, &[0]).unwrap();
        let requests = loss.teacher_requests(0..1).unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].ids, vec![0, 0, 0, 11, 12, 13]);
        // The student's log-probs at the three ids (unnormalised: the form renormalises).
        let answer = |_: &TeacherRequest| TeacherScores {
            student_top_logprobs: vec![f32::NAN, f32::NAN, f32::NAN, -2.0, -1.5, -3.0],
            ..Default::default()
        };
        let (report, g, top) = drive(&mut loss, &[vec![-0.5, -1.0]], &whole(1), &answer).unwrap();
        let r = &report.teacher[0];
        assert_eq!(r.active_tokens, 1);
        // One active token with w = 2, coef 0.5: loss = 0.5 · (1 · 2 · d) = d.
        assert!((r.loss - 0.2394).abs() < 5e-5, "{}", r.loss);
        assert!((r.kl - 0.2394).abs() < 5e-5, "{}", r.kl);
        assert_eq!(g, vec![vec![0.0, 0.0]], "the top-k form leaves ∂L/∂ℓ alone");
        for (j, want) in [-0.333_742, 0.301_821, 0.031_921].iter().enumerate() {
            // coef · W · w = 0.5 · 1 · 2 = 1.
            assert!(
                (f64::from(top[0].1[3 + j]) - want).abs() < 1e-5,
                "{:?}",
                top[0].1
            );
        }
        assert!(top[0].1[..3].iter().all(|&x| x == 0.0));
        // k = 0 is refused by name.
        let mut k0 = signals.clone();
        k0.teacher[0].form = TeacherForm::TopKForwardKl { k: 0 };
        k0.teacher[0].targets.clear();
        let e = RlLoss::from_rows(&ObjectiveConfig::default(), &[&row], &k0, &[0])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("teacher term `ucob-opd`: top_k_forward_kl needs k ≥ 1"),
            "{e}"
        );
    }

    fn turn_row(trajectory: u64, response: &[u32], mask: &[u8], old: &[f32]) -> TurnRow {
        TurnRow {
            trajectory_id: trajectory,
            prompt_ids: vec![1, 2],
            response_ids: response.to_vec(),
            response_logprobs: old.to_vec(),
            response_mask: mask.to_vec(),
            old_logprobs: old.to_vec(),
            ..TurnRow::default()
        }
    }

    fn fixed(logprobs: &[f32]) -> TeacherSource {
        TeacherSource::Fixed {
            logprobs: logprobs.to_vec(),
            top_ids: vec![],
            top_logprobs: vec![],
        }
    }

    fn term(name: &str, coef: f32, form: TeacherForm, targets: Vec<TeacherTarget>) -> TeacherTerm {
        TeacherTerm {
            name: name.into(),
            coef,
            form,
            targets,
        }
    }

    /// One micro-batch of `n` rows.
    fn whole(n: usize) -> Vec<Range<usize>> {
        std::iter::once(0..n).collect()
    }

    /// Runs a whole step: `answer` serves each teacher request; returns the report, `∂L/∂ℓ`
    /// per step row and the top-k gradients per request (with the request).
    #[allow(clippy::type_complexity)]
    fn drive(
        loss: &mut RlLoss,
        logp: &[Vec<f32>],
        split: &[Range<usize>],
        answer: &dyn Fn(&TeacherRequest) -> TeacherScores,
    ) -> crate::Result<(LossReport, Vec<Vec<f32>>, Vec<(TeacherRequest, Vec<f32>)>)> {
        let (mut g, mut top) = (Vec::new(), Vec::new());
        for mb in split {
            let requests = loss.teacher_requests(mb.clone())?;
            let answers: Vec<TeacherScores> = requests.iter().map(answer).collect();
            let out = loss.grads(
                mb.clone(),
                &TokenScores {
                    logp: &logp[mb.clone()],
                    entropy: &[],
                    teacher: &answers,
                },
            )?;
            g.extend(out.logp);
            assert_eq!(out.teacher.len(), requests.len());
            top.extend(requests.into_iter().zip(out.teacher));
        }
        loss.check_complete()?;
        Ok((loss.report(), g, top))
    }

    /// The EDGE worked example: ℓ^S = [−0.5, −2.0, −0.1], ℓ^T = [−0.3, −0.8, −0.1], weights 1:
    /// per-token values sg(ℓ^S − ℓ^T)·ℓ^S = [0.1, 2.4, 0], token-mean 0.8333, gradient
    /// coefficients on ℓ^S [−0.2, −1.2, 0] (then × 1/3 for the token mean).
    #[test]
    fn edge_worked_example_fixed_and_live_exact() {
        let student = [-0.5f32, -2.0, -0.1];
        let teacher = [-0.3f32, -0.8, -0.1];
        let row = turn_row(1, &[5, 6, 7], &[1, 1, 1], &student);
        for live in [false, true] {
            let source = if live {
                TeacherSource::Context {
                    context_ids: vec![9, 9, 1, 2],
                }
            } else {
                fixed(&teacher)
            };
            let signals = Signals {
                advantages: vec![vec![0.0; 3]],
                teacher: vec![term(
                    "edge",
                    1.0,
                    TeacherForm::SampledReverseKl,
                    vec![TeacherTarget {
                        row: 0,
                        weights: vec![1.0; 3],
                        source,
                    }],
                )],
                ..Signals::default()
            };
            let config = ObjectiveConfig::default();
            let mut loss = RlLoss::from_rows(&config, &[&row], &signals, &[0]).unwrap();
            let serve = |r: &TeacherRequest| {
                assert_eq!(
                    (r.row, r.context_ids.clone(), r.top_k),
                    (0, Some(vec![9, 9, 1, 2]), 0)
                );
                TeacherScores {
                    logprobs: teacher.to_vec(),
                    ..Default::default()
                }
            };
            let (report, g, top) =
                drive(&mut loss, &[student.to_vec()], &whole(1), &serve).unwrap();
            assert_eq!(top.len(), usize::from(live));
            let t = &report.teacher[0];
            assert_eq!((t.name.as_str(), t.active_tokens), ("edge", 3));
            assert!((t.loss - 2.5 / 3.0).abs() < 1e-6, "{}", t.loss);
            assert!((report.loss - 0.833_333_3).abs() < 1e-6);
            assert!((t.kl - (-1.4 / 3.0)).abs() < 1e-6, "{}", t.kl);
            for (l, want) in [-0.2, -1.2, 0.0].iter().enumerate() {
                let got = f64::from(g[0][l]) * 3.0;
                assert!((got - want).abs() < 1e-6, "live {live} token {l}: {got}");
            }
            let metrics = report.metrics();
            let names: Vec<&str> = metrics.iter().map(|(n, _)| n.as_str()).collect();
            assert!(names.contains(&"teacher/edge/loss"));
            assert!(names.contains(&"teacher/edge/active_tokens"));
        }
    }

    /// A synthetic model: logits `z[r][l][v]` (V = 5) give the student's log-probs at
    /// temperature `T`; a live teacher has its own fixed logits `zt`.
    #[derive(Clone)]
    struct Toy {
        temperature: f64,
        z: Vec<Vec<[f64; 5]>>,
        zt: Vec<Vec<[f64; 5]>>,
        ids: Vec<Vec<u32>>,
    }

    fn log_softmax(z: &[f64; 5], t: f64) -> [f64; 5] {
        let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b / t));
        let lse = m + z.iter().map(|v| (v / t - m).exp()).sum::<f64>().ln();
        z.map(|v| v / t - lse)
    }

    impl Toy {
        fn logp(&self) -> Vec<Vec<f32>> {
            self.z
                .iter()
                .zip(&self.ids)
                .map(|(zr, ids)| {
                    zr.iter()
                        .zip(ids)
                        .map(|(z, &y)| log_softmax(z, self.temperature)[y as usize] as f32)
                        .collect()
                })
                .collect()
        }

        fn answer(&self, r: &TeacherRequest) -> TeacherScores {
            let k = r.top_k as usize;
            let (z, zt) = (&self.z[r.row], &self.zt[r.row]);
            let mut out = TeacherScores::default();
            let ids: Vec<u32> = match &r.context_ids {
                Some(_) => {
                    for (l, zt) in zt.iter().enumerate() {
                        let lt = log_softmax(zt, self.temperature);
                        out.logprobs.push(lt[self.ids[r.row][l] as usize] as f32);
                        let mut order: Vec<usize> = (0..5).collect();
                        order.sort_by(|&a, &b| lt[b].total_cmp(&lt[a]));
                        for &v in order.iter().take(k) {
                            out.top_ids.push(v as u32);
                            out.top_logprobs.push(lt[v] as f32);
                        }
                    }
                    out.top_ids.clone()
                }
                None => r.ids.clone(),
            };
            for (l, chunk) in ids.chunks(k.max(1)).enumerate().filter(|_| k > 0) {
                let ls = log_softmax(&z[l], self.temperature);
                out.student_top_logprobs
                    .extend(chunk.iter().map(|&v| ls[v as usize] as f32));
            }
            out
        }
    }

    /// Two rows (3 and 2 tokens), PG + six teacher terms: fixed sampled, live sampled, fixed
    /// top-k reverse, live top-k reverse, fixed top-k forward, live top-k forward.
    fn toy_step() -> (Toy, Vec<TurnRow>, Signals) {
        let z = vec![
            vec![
                [0.3, -0.2, 1.1, 0.0, -0.7],
                [1.5, 0.2, -0.4, 0.9, 0.1],
                [-0.3, 0.8, 0.5, -1.2, 0.0],
            ],
            vec![[0.0, 0.4, -0.9, 1.3, 0.2], [0.7, 0.7, -0.1, 0.0, -0.5]],
        ];
        let zt = vec![
            vec![
                [1.0, 0.0, 0.5, -0.5, 0.2],
                [0.1, 0.9, -0.2, 1.4, 0.0],
                [0.0, 0.3, 1.2, -0.8, 0.6],
            ],
            vec![[0.5, -0.3, 0.1, 0.8, 1.1], [-0.2, 1.0, 0.4, 0.3, 0.0]],
        ];
        let toy = Toy {
            temperature: 0.7,
            z,
            zt,
            ids: vec![vec![2, 3, 1], vec![3, 0]],
        };
        let lp = toy.logp();
        let old = |r: usize| -> Vec<f32> { lp[r].iter().map(|x| x + 0.05).collect() };
        let rows = vec![
            turn_row(1, &toy.ids[0], &[1, 1, 1], &old(0)),
            turn_row(2, &toy.ids[1], &[1, 1], &old(1)),
        ];
        let live = |row| TeacherTarget {
            row,
            weights: if row == 0 {
                vec![1.0, 0.5, 2.0]
            } else {
                vec![1.0, 1.5]
            },
            source: TeacherSource::Context {
                context_ids: vec![3, 4],
            },
        };
        let signals = Signals {
            advantages: vec![vec![0.4, -0.3, 0.2], vec![-0.5, 0.6]],
            teacher: vec![
                term(
                    "fixed-sampled",
                    0.7,
                    TeacherForm::SampledReverseKl,
                    vec![TeacherTarget {
                        row: 1,
                        weights: vec![2.0, 1.0],
                        source: fixed(&[-1.0, -2.5]),
                    }],
                ),
                term(
                    "live-sampled",
                    0.5,
                    TeacherForm::SampledReverseKl,
                    vec![live(0), live(1)],
                ),
                term(
                    "fixed-top3",
                    1.3,
                    TeacherForm::TopKReverseKl { k: 3 },
                    vec![TeacherTarget {
                        row: 0,
                        weights: vec![1.0, 0.0, 1.0],
                        source: TeacherSource::Fixed {
                            logprobs: vec![],
                            top_ids: vec![0, 2, 4, 9, 9, 9, 1, 2, 0],
                            top_logprobs: vec![-0.5, -1.5, -2.0, 0.0, 0.0, 0.0, -0.2, -2.2, -3.0],
                        },
                    }],
                ),
                term(
                    "live-top2",
                    0.9,
                    TeacherForm::TopKReverseKl { k: 2 },
                    vec![live(1), live(0)],
                ),
                term(
                    "fixed-forward-top3",
                    0.8,
                    TeacherForm::TopKForwardKl { k: 3 },
                    vec![TeacherTarget {
                        row: 1,
                        weights: vec![1.5, 1.0],
                        source: TeacherSource::Fixed {
                            logprobs: vec![],
                            top_ids: vec![3, 1, 4, 1, 0, 2],
                            top_logprobs: vec![-0.4, -1.1, -2.6, -0.3, -1.9, -2.4],
                        },
                    }],
                ),
                term(
                    "live-forward-top2",
                    1.1,
                    TeacherForm::TopKForwardKl { k: 2 },
                    vec![live(0), live(1)],
                ),
            ],
            ..Signals::default()
        };
        (toy, rows, signals)
    }

    /// `∂L/∂z` from the loss's gradients by the chain rule through `log_softmax(z/T)`.
    fn chain_rule(
        toy: &Toy,
        g: &[Vec<f32>],
        top: &[(TeacherRequest, Vec<f32>)],
    ) -> Vec<Vec<[f64; 5]>> {
        let t = toy.temperature;
        let mut dz: Vec<Vec<[f64; 5]>> = toy.z.iter().map(|r| vec![[0.0; 5]; r.len()]).collect();
        let mut add = |r: usize, l: usize, id: usize, weight: f64| {
            let p = log_softmax(&toy.z[r][l], t).map(f64::exp);
            for v in 0..5 {
                dz[r][l][v] += weight * (f64::from(u8::from(v == id)) - p[v]) / t;
            }
        };
        for (r, gr) in g.iter().enumerate() {
            for (l, &w) in gr.iter().enumerate() {
                add(r, l, toy.ids[r][l] as usize, f64::from(w));
            }
        }
        for (request, grads) in top {
            let k = request.top_k as usize;
            let ids = toy.answer(request);
            let ids = if request.context_ids.is_some() {
                ids.top_ids
            } else {
                request.ids.clone()
            };
            for (j, &w) in grads.iter().enumerate() {
                add(request.row, j / k, ids[j] as usize, f64::from(w));
            }
        }
        dz
    }

    /// The function whose gradient the step's gradient is. The sampled form's reported value
    /// is EDGE's surrogate `w·sg(ℓ^S − ℓ^T)·ℓ^S`, whose own derivative also hits the stopped
    /// factor; its gradient `w(ℓ^S − ℓ^T)∇ℓ^S` is exactly that of `w·½(ℓ^S − ℓ^T)²` with the
    /// teacher held. So: the reported loss with each sampled term's value swapped for that
    /// potential (computed here independently; all masks of `toy_step` are 1).
    fn potential(
        report: &LossReport,
        toy: &Toy,
        signals: &Signals,
        aggregation: Aggregation,
    ) -> f64 {
        let lp = toy.logp();
        let mut value = report.loss;
        for (term, reported) in signals.teacher.iter().zip(&report.teacher) {
            if term.form != TeacherForm::SampledReverseKl {
                continue;
            }
            value -= reported.loss;
            let active = |t: &TeacherTarget| t.weights.iter().filter(|&&w| w > 0.0).count();
            let total: usize = term.targets.iter().map(active).sum();
            let rows = term.targets.iter().filter(|t| active(t) > 0).count();
            for t in &term.targets {
                let agg = match aggregation {
                    Aggregation::TokenMean => 1.0 / total as f64,
                    Aggregation::SeqMeanTokenMean => 1.0 / (rows * active(t)) as f64,
                    other => panic!("{other:?} is not used here"),
                };
                for (l, &w) in t.weights.iter().enumerate().filter(|(_, &w)| w > 0.0) {
                    let lt = match &t.source {
                        TeacherSource::Fixed { logprobs, .. } => f64::from(logprobs[l]),
                        TeacherSource::Context { .. } => {
                            log_softmax(&toy.zt[t.row][l], toy.temperature)
                                [toy.ids[t.row][l] as usize]
                        }
                    };
                    let d = f64::from(lp[t.row][l]) - lt;
                    value += f64::from(term.coef) * agg * f64::from(w) * 0.5 * d * d;
                }
            }
        }
        value
    }

    #[test]
    fn teacher_gradients_match_finite_differences_through_a_logit_model() {
        let only = |j: usize| {
            let (toy, rows, mut signals) = toy_step();
            signals.teacher = vec![signals.teacher[j].clone()];
            (toy, rows, signals)
        };
        let cases = (0..6).map(|j| (Aggregation::TokenMean, only(j))).chain([
            (Aggregation::TokenMean, toy_step()),
            (Aggregation::SeqMeanTokenMean, toy_step()),
        ]);
        for (aggregation, (toy, rows, signals)) in cases {
            let config = ObjectiveConfig {
                aggregation,
                ..Default::default()
            };
            let terms: Vec<&str> = signals.teacher.iter().map(|t| t.name.as_str()).collect();
            let refs: Vec<&TurnRow> = rows.iter().collect();
            let loss_at = |toy: &Toy| {
                let mut loss = RlLoss::from_rows(&config, &refs, &signals, &[0, 1]).unwrap();
                drive(&mut loss, &toy.logp(), &whole(2), &|r| toy.answer(r))
                    .unwrap()
                    .0
            };
            let mut loss = RlLoss::from_rows(&config, &refs, &signals, &[0, 1]).unwrap();
            let (report, g, top) =
                drive(&mut loss, &toy.logp(), &whole(2), &|r| toy.answer(r)).unwrap();
            if terms.len() == 6 {
                assert_eq!(
                    top.len(),
                    8,
                    "2 live sampled, 1 + 1 fixed top-k, 2 + 2 live top-k (reverse, forward)"
                );
            }
            assert!(
                report.teacher.iter().all(|t| t.loss.abs() > 1e-3),
                "{report:?}"
            );
            let dz = chain_rule(&toy, &g, &top);
            let mut checked = 0;
            for (r, dz_r) in dz.iter().enumerate() {
                for (l, dz_l) in dz_r.iter().enumerate() {
                    for (v, &want) in dz_l.iter().enumerate() {
                        let h = 1e-2;
                        let (mut up, mut down) = (toy.clone(), toy.clone());
                        up.z[r][l][v] += h;
                        down.z[r][l][v] -= h;
                        let (lu, ld) = (loss_at(&up), loss_at(&down));
                        // Skip a coordinate whose perturbation moved a PPO clip branch (the
                        // loss is only piecewise smooth there).
                        if lu.clip_fraction != report.clip_fraction
                            || ld.clip_fraction != report.clip_fraction
                        {
                            continue;
                        }
                        let fd = (potential(&lu, &up, &signals, aggregation)
                            - potential(&ld, &down, &signals, aggregation))
                            / (2.0 * h);
                        assert!(
                            (want - fd).abs() <= 2e-4 * (1.0 + fd.abs()),
                            "{aggregation:?} {terms:?} ∂L/∂z[{r}][{l}][{v}]: chain rule {want} \
                             vs fd {fd}"
                        );
                        checked += 1;
                    }
                }
            }
            assert!(checked >= 20, "{checked} coordinates checked");
        }
    }

    #[test]
    fn teacher_terms_are_split_invariant() {
        let (toy, rows, signals) = toy_step();
        let refs: Vec<&TurnRow> = rows.iter().collect();
        for aggregation in [
            Aggregation::TokenMean,
            Aggregation::SeqMeanTokenSum,
            Aggregation::SeqMeanTokenMean,
            Aggregation::PerRollout,
        ] {
            let config = ObjectiveConfig {
                aggregation,
                ..Default::default()
            };
            let run = |split: &[Range<usize>]| {
                let mut loss = RlLoss::from_rows(&config, &refs, &signals, &[0, 1]).unwrap();
                drive(&mut loss, &toy.logp(), split, &|r| toy.answer(r)).unwrap()
            };
            let (one, g1, t1) = run(&whole(2));
            let (three, g3, t3) = run(&[0..0, 0..1, 1..2]);
            for ((name, a), (_, b)) in one.metrics().iter().zip(three.metrics()) {
                assert!(
                    (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                    "{aggregation:?} {name}: {a} vs {b}"
                );
            }
            assert_eq!(g1, g3);
            // The same requests, in another order only where the split reorders rows.
            assert_eq!(t1, t3);
        }
    }

    #[test]
    fn masked_and_inactive_slots_never_reach_the_teacher_terms() {
        // Token 1 is masked (NaN student log-prob, NaN weight, NaN teacher values, an id far
        // outside any vocabulary); token 2 has weight 0 (NaN teacher values).
        let mut row = turn_row(1, &[5, 6, 7], &[1, 0, 1], &[-0.5, f32::NAN, -1.0]);
        row.old_logprobs = vec![-0.5, f32::NAN, -1.0];
        let nan = f32::NAN;
        let signals = Signals {
            advantages: vec![vec![0.0, nan, 0.0]],
            teacher: vec![
                term(
                    "sampled",
                    1.0,
                    TeacherForm::SampledReverseKl,
                    vec![TeacherTarget {
                        row: 0,
                        weights: vec![1.0, nan, 0.0],
                        source: fixed(&[-0.3, nan, nan]),
                    }],
                ),
                term(
                    "top2",
                    1.0,
                    TeacherForm::TopKReverseKl { k: 2 },
                    vec![TeacherTarget {
                        row: 0,
                        weights: vec![1.0, nan, 0.0],
                        source: TeacherSource::Fixed {
                            logprobs: vec![],
                            top_ids: vec![1, 2, u32::MAX, u32::MAX, 3, 4],
                            top_logprobs: vec![-0.1, -2.0, nan, nan, nan, nan],
                        },
                    }],
                ),
            ],
            ..Signals::default()
        };
        let mut loss =
            RlLoss::from_rows(&ObjectiveConfig::default(), &[&row], &signals, &[0]).unwrap();
        let requests = loss.teacher_requests(0..1).unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(
            requests[0].ids,
            vec![1, 2, 0, 0, 0, 0],
            "inactive ids are zeroed"
        );
        let answer = |_: &TeacherRequest| TeacherScores {
            student_top_logprobs: vec![-1.0, -1.0, nan, nan, nan, nan],
            ..Default::default()
        };
        let (report, g, top) =
            drive(&mut loss, &[vec![-0.5, nan, -1.0]], &whole(1), &answer).unwrap();
        assert!(report.loss.is_finite());
        // Sampled: one active token, x = (−0.5 + 0.3)·(−0.5) = 0.1, ∂ = −0.2.
        assert!((report.teacher[0].loss - 0.1).abs() < 1e-6);
        assert_eq!(report.teacher[0].active_tokens, 1);
        assert!((f64::from(g[0][0]) - -0.2).abs() < 1e-6);
        assert_eq!((g[0][1], g[0][2]), (0.0, 0.0));
        // Top-2 at token 0: student uniform over the two ids, teacher [−0.1, −2.0].
        let (kl, _) = top_k_reverse_kl(&[-1.0, -1.0], &[-0.1, -2.0]);
        assert!((report.teacher[1].loss - kl).abs() < 1e-6);
        assert!(top[0].1[2..].iter().all(|&x| x == 0.0));
        // On an active token, NaN is an error naming the term, row and token.
        let bad = |_: &TeacherRequest| TeacherScores {
            student_top_logprobs: vec![nan, -1.0, 0.0, 0.0, 0.0, 0.0],
            ..Default::default()
        };
        let mut loss =
            RlLoss::from_rows(&ObjectiveConfig::default(), &[&row], &signals, &[0]).unwrap();
        let e = drive(&mut loss, &[vec![-0.5, nan, -1.0]], &whole(1), &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("teacher term `top2`, step row 0, token 0: a student top-k log-prob is NaN"),
            "{e}"
        );
    }

    #[test]
    fn bad_targets_are_errors_naming_the_term() {
        let row = turn_row(1, &[5, 6], &[1, 1], &[-0.5, -1.0]);
        let check = |t: TeacherTerm, want: &str| {
            let signals = Signals {
                advantages: vec![vec![0.0; 2]],
                teacher: vec![t],
                ..Signals::default()
            };
            let e = RlLoss::from_rows(&ObjectiveConfig::default(), &[&row], &signals, &[0])
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        };
        let target = |weights: Vec<f32>, source| TeacherTarget {
            row: 0,
            weights,
            source,
        };
        check(
            term(
                "neg",
                1.0,
                TeacherForm::SampledReverseKl,
                vec![target(vec![1.0, -1.0], fixed(&[0.0, 0.0]))],
            ),
            "teacher term `neg`, step row 0, token 1: weight -1",
        );
        check(
            term("k0", 1.0, TeacherForm::TopKReverseKl { k: 0 }, vec![]),
            "teacher term `k0`: top_k_reverse_kl needs k ≥ 1",
        );
        check(
            term(
                "twice",
                1.0,
                TeacherForm::SampledReverseKl,
                vec![
                    target(vec![1.0; 2], fixed(&[0.0; 2])),
                    target(vec![1.0; 2], fixed(&[0.0; 2])),
                ],
            ),
            "teacher term `twice` targets row 0 twice",
        );
        check(
            term(
                "inf",
                1.0,
                TeacherForm::SampledReverseKl,
                vec![target(vec![1.0; 2], fixed(&[0.0, f32::INFINITY]))],
            ),
            "teacher term `inf`, step row 0, token 1: fixed teacher log-prob inf",
        );
        check(
            term(
                "ctx",
                1.0,
                TeacherForm::SampledReverseKl,
                vec![target(
                    vec![1.0; 2],
                    TeacherSource::Context {
                        context_ids: vec![],
                    },
                )],
            ),
            "teacher term `ctx`: row 0 has an empty teacher context",
        );
        check(
            term(
                "short",
                1.0,
                TeacherForm::SampledReverseKl,
                vec![target(vec![1.0], fixed(&[0.0; 2]))],
            ),
            "teacher term `short`: row 0 has 1 weights for 2 response tokens",
        );
    }
}
