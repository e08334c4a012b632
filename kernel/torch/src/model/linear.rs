//! A linear layer with HF parameter names and `torch.nn.functional.linear` numerics.
//!
//! `tch::nn::Linear` computes `x.matmul(w.tr()) + b`, which can round differently from
//! transformers' `F.linear` (one fused `addmm`); this wrapper calls `F.linear` itself.

use tch::{nn, Tensor};

/// `y = x Wᵀ + b`.
#[derive(Debug)]
pub struct Linear {
    /// `[out, in]`, HF name `<prefix>.weight`.
    pub weight: Tensor,
    /// `[out]`, HF name `<prefix>.bias`, when the layer has one.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Creates `<vs>.weight` `[out_dim, in_dim]` (and `<vs>.bias` `[out_dim]` when `bias`).
    /// Values are placeholders until [`crate::model::init`] or a weight loader fills them.
    pub fn new(vs: nn::Path<'_>, in_dim: i64, out_dim: i64, bias: bool) -> Linear {
        let weight = vs.var("weight", &[out_dim, in_dim], nn::Init::Const(0.0));
        let bias = bias.then(|| vs.var("bias", &[out_dim], nn::Init::Const(0.0)));
        Linear { weight, bias }
    }

    /// Wraps an existing weight (tied embeddings), without a bias.
    pub fn from_weight(weight: Tensor) -> Linear {
        Linear { weight, bias: None }
    }

    /// `[.., in]` → `[.., out]`.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        xs.linear(&self.weight, self.bias.as_ref())
    }
}
