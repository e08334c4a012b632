//! The seam between the optimizer's objective and the backend's autograd.
//!
//! Every loss Cairn trains with is a sum over response tokens of a function of that token's
//! current log-prob (and optionally its entropy), with weights fixed by the data: the
//! aggregation normalisers are computed over the whole step before any micro-batch runs. So the
//! backend only needs, per micro-batch, `g_l = ∂L/∂ℓ_l` and `h_l = ∂L/∂H_l`; it back-propagates
//! `Σ g·ℓ + Σ h·H`. The loss value, its gradient and every metric are therefore independent of
//! how the step is split into micro-batches, by construction.

use std::ops::Range;

use crate::error::Result;

/// Per-token gradient weights for one micro-batch, shaped like its responses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenGrads {
    /// `∂L/∂ℓ_l` for each response token, `[rows][L_r]`.
    pub logp: Vec<Vec<f32>>,
    /// `∂L/∂H_l` for each response token, `[rows][L_r]`; empty when entropy is not used.
    pub entropy: Vec<Vec<f32>>,
}

/// A token-decomposable loss (see the module docs).
pub trait TokenLoss {
    /// Whether [`TokenLoss::grads`] needs per-token entropies (costs a full-vocab reduction).
    fn needs_entropy(&self) -> bool {
        false
    }

    /// Given the current log-probs `logp[r][l]` (and entropies, same shape, or empty) of the
    /// micro-batch `rows` (indices into the step's sequences), records the micro-batch's loss
    /// contribution and metrics, and returns the gradient weights.
    fn grads(
        &mut self,
        rows: Range<usize>,
        logp: &[Vec<f32>],
        entropy: &[Vec<f32>],
    ) -> Result<TokenGrads>;
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
    fn grads(
        &mut self,
        rows: Range<usize>,
        logp: &[Vec<f32>],
        _entropy: &[Vec<f32>],
    ) -> Result<TokenGrads> {
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
            entropy: Vec::new(),
        })
    }
}
