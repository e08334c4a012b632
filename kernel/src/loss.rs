//! The seam between the optimizer's objective and the backend's autograd.
//!
//! Every loss Cairn trains with is a sum over response tokens of a function of that token's
//! current log-prob (and optionally its entropy, and for top-k teacher terms the student's
//! log-probs at a few given ids), with weights fixed by the data: the aggregation normalisers
//! are computed over the whole step before any micro-batch runs. So the backend only needs,
//! per micro-batch, `g_l = ∂L/∂ℓ_l`, `h_l = ∂L/∂H_l` and, per top-k teacher request,
//! `∂L/∂s_{l,v}`; it back-propagates `Σ g·ℓ + Σ h·H + Σ g_top·s`. The loss value, its gradient
//! and every metric are therefore independent of how the step is split into micro-batches, by
//! construction.
//!
//! Teacher passes ([`TeacherRequest`]): before scoring a micro-batch with grad, the backend
//! asks the loss what teacher values it needs ([`TokenLoss::teacher_requests`]). A *live*
//! request (`context_ids` set) is a no-grad forward of the **current** weights on
//! `context_ids ++ response_ids` at the train temperature, run inside the train step so it
//! never goes stale across several updates per batch; a top-k request also needs the student's
//! (with-grad) log-probs gathered at `k` ids per position. The answers come back in
//! [`TokenScores::teacher`], one per request, in order.

use std::ops::Range;

use crate::error::Result;

/// A teacher pass the backend runs for one row of a micro-batch (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TeacherRequest {
    /// Index of the row among the step's sequences.
    pub row: usize,
    /// `Some(ids)`: a live teacher. Score the row's response after `ids` with the current
    /// weights, no grad, at the train temperature. `None`: the teacher values are fixed and
    /// the loss holds them; no teacher forward runs.
    pub context_ids: Option<Vec<u32>>,
    /// `k > 0`: the top-k form. A live teacher then also returns its top-k ids and log-probs,
    /// and the backend gathers the student's log-probs at those ids. 0: sampled tokens only.
    pub top_k: u32,
    /// Fixed top-k only: the ids `[L·k]`, row-major, at which to gather the student's
    /// log-probs (inactive slots hold 0). Empty otherwise.
    pub ids: Vec<u32>,
}

/// The backend's answer to one [`TeacherRequest`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TeacherScores {
    /// Live teacher: `ℓ^T` of each response id, `[L]`, nats. Empty for a fixed one.
    pub logprobs: Vec<f32>,
    /// Live top-k teacher: its `k` most likely ids per position, `[L·k]`, most likely first.
    pub top_ids: Vec<u32>,
    /// Their log-probs, `[L·k]` (full-vocabulary softmax at the train temperature).
    pub top_logprobs: Vec<f32>,
    /// Top-k: the student's log-probs `s`, `[L·k]`, at the request's `ids` (fixed) or at
    /// `top_ids` (live). The backend keeps them with grad; these are detached copies.
    pub student_top_logprobs: Vec<f32>,
}

/// What the backend computed for one micro-batch, shaped like its responses.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenScores<'a> {
    /// Current log-probs `ℓ`, `[rows][L_r]`.
    pub logp: &'a [Vec<f32>],
    /// Entropies `H`, `[rows][L_r]`; empty unless [`TokenLoss::needs_entropy`].
    pub entropy: &'a [Vec<f32>],
    /// One answer per [`TokenLoss::teacher_requests`] entry of the micro-batch, in order.
    pub teacher: &'a [TeacherScores],
}

impl<'a> TokenScores<'a> {
    /// Log-probs only (no entropy, no teacher).
    pub fn logp(logp: &'a [Vec<f32>]) -> Self {
        TokenScores {
            logp,
            ..Default::default()
        }
    }
}

/// Per-token gradient weights for one micro-batch, shaped like its responses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenGrads {
    /// `∂L/∂ℓ_l` for each response token, `[rows][L_r]`.
    pub logp: Vec<Vec<f32>>,
    /// `∂L/∂H_l` for each response token, `[rows][L_r]`; empty when entropy is not used.
    pub entropy: Vec<Vec<f32>>,
    /// Per teacher request, `∂L/∂s` for the student's gathered log-probs, `[L·k]`; empty for a
    /// sampled-token request (its gradient is part of `logp`). Empty when there are no
    /// requests.
    pub teacher: Vec<Vec<f32>>,
}

/// A token-decomposable loss (see the module docs).
pub trait TokenLoss {
    /// Whether [`TokenLoss::grads`] needs per-token entropies (costs a full-vocab reduction).
    fn needs_entropy(&self) -> bool {
        false
    }

    /// The teacher passes the micro-batch `rows` needs, asked before its forward. The answers
    /// go to [`TokenLoss::grads`] in this order.
    fn teacher_requests(&self, _rows: Range<usize>) -> Result<Vec<TeacherRequest>> {
        Ok(Vec::new())
    }

    /// Given what the backend computed for the micro-batch `rows` (indices into the step's
    /// sequences), records the micro-batch's loss contribution and metrics, and returns the
    /// gradient weights.
    fn grads(&mut self, rows: Range<usize>, scores: &TokenScores<'_>) -> Result<TokenGrads>;
}

/// Supervised fine-tuning: token-mean negative log-likelihood of the masked response tokens,
/// normalised over the whole step (so it too is split-invariant).
#[derive(Clone, Debug)]
pub struct SftLoss {
    masks: Vec<Vec<u8>>,
    total_tokens: f64,
    /// Σ −ℓ over masked tokens seen so far this step.
    nll_sum: f64,
}

impl SftLoss {
    /// `masks[r][l]`: 1 on the tokens to imitate.
    pub fn new(masks: Vec<Vec<u8>>) -> Self {
        let total_tokens = masks.iter().flatten().filter(|&&m| m == 1).count() as f64;
        SftLoss {
            masks,
            total_tokens,
            nll_sum: 0.0,
        }
    }

    /// Token-mean NLL over the step, nats per token.
    pub fn mean_nll(&self) -> f64 {
        if self.total_tokens == 0.0 {
            0.0
        } else {
            self.nll_sum / self.total_tokens
        }
    }
}

impl TokenLoss for SftLoss {
    fn grads(&mut self, rows: Range<usize>, scores: &TokenScores<'_>) -> Result<TokenGrads> {
        let logp = scores.logp;
        let scale = if self.total_tokens == 0.0 {
            0.0
        } else {
            1.0 / self.total_tokens
        };
        let mut out = Vec::with_capacity(logp.len());
        for (r, lp) in rows.zip(logp) {
            let mask = &self.masks[r];
            if mask.len() != lp.len() {
                return Err(crate::Error::Shape {
                    what: "sft mask",
                    detail: format!(
                        "row {r}: mask has {} entries, response {}",
                        mask.len(),
                        lp.len()
                    ),
                });
            }
            out.push(
                lp.iter()
                    .zip(mask)
                    .map(|(&l, &m)| {
                        if m == 1 {
                            self.nll_sum -= f64::from(l);
                            -scale as f32
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            );
        }
        Ok(TokenGrads {
            logp: out,
            ..Default::default()
        })
    }
}
