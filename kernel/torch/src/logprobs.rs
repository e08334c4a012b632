//! Response-token log-probs, entropies and top-k log-probs from one batched forward, shared by
//! scoring (no grad) and training (with grad).
//!
//! The log-prob of response token `j` of a row comes from the logits at that row's position
//! `prompt_len + j - 1`; with the batch left-padded (`batch::ResponseBatch`) these
//! are the `R` columns just before the last, for every row at once. Logits are cast to f32
//! before the temperature and the `log_softmax`, whatever the weights' dtype.

use tch::{Kind, Tensor};

use crate::batch::ResponseBatch;
use crate::error::{Error, Result};
use crate::model::CausalLm;

/// The divisor applied to logits for temperature `t`: `t` itself, or 1 when `t == 0`
/// (greedy sampling reports, and the trainer scores, log-probs at temperature 1).
pub fn logit_temperature(t: f32) -> Result<f64> {
    if !t.is_finite() || t < 0.0 {
        return Err(Error::input(
            "temperature",
            format!("{t} is not a finite non-negative number"),
        ));
    }
    Ok(if t == 0.0 { 1.0 } else { f64::from(t) })
}

/// Log-probs and (optionally) entropies of the response tokens of `batch` under `model`.
#[derive(Debug)]
pub(crate) struct ResponseScores {
    /// `[B, R]` f32, right-aligned like [`ResponseBatch::targets`]; padding slots hold the
    /// (finite, meaningless) log-prob of id 0.
    pub logp: Tensor,
    /// `[B, R]` f32 entropies `−Σ_v p_v log p_v` of the tempered next-token distribution.
    pub entropy: Option<Tensor>,
    /// `[B, R, V]` f32 log-probs over the whole vocabulary (kept when asked for: top-k scoring
    /// and top-k teacher terms gather from it).
    pub logp_all: Option<Tensor>,
}

/// Runs the forward; gradient tracking follows the caller's grad mode.
pub(crate) fn response_scores(
    model: &CausalLm,
    batch: &ResponseBatch,
    temperature: f64,
    with_entropy: bool,
    keep_all: bool,
) -> Result<ResponseScores> {
    let padded = &batch.padded;
    let hidden =
        model.hidden_states(&padded.input_ids, &padded.position_ids, &padded.valid, None)?;
    let r = batch.r_max as i64;
    // Every prompt is non-empty, so the widest response leaves at least one column before it.
    let start = padded.width as i64 - r - 1;
    let logits = model
        .logits(&hidden.narrow(1, start, r))
        .to_kind(Kind::Float);
    let logits = if temperature == 1.0 {
        logits
    } else {
        logits / temperature
    };
    let logp_all = logits.log_softmax(-1, Kind::Float);
    let logp = logp_all
        .gather(2, &batch.targets.unsqueeze(-1), false)
        .squeeze_dim(-1);
    let entropy =
        with_entropy.then(|| -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, Kind::Float));
    Ok(ResponseScores {
        logp,
        entropy,
        logp_all: keep_all.then_some(logp_all),
    })
}

/// The `k` largest entries of `logp_all` `[B, R, V]` along the vocabulary, most likely first:
/// `(values [B, R, k] f32, ids [B, R, k] int64)`. Ties keep libtorch's order.
pub(crate) fn top_k(logp_all: &Tensor, k: usize) -> (Tensor, Tensor) {
    logp_all.topk(k as i64, -1, true, true)
}
