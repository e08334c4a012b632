//! A linear layer with HF parameter names and `torch.nn.functional.linear` numerics.
//!
//! `tch::nn::Linear` computes `x.matmul(w.tr()) + b`, which can round differently from
//! transformers' `F.linear` (one fused `addmm`); this wrapper calls `F.linear` itself.

use tch::{nn, Tensor};

use crate::error::Result;

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
    /// Errors: libtorch cannot allocate the weight (a size the device cannot hold).
    pub fn new(vs: nn::Path<'_>, in_dim: i64, out_dim: i64, bias: bool) -> Result<Linear> {
        let weight = vs.f_var("weight", &[out_dim, in_dim], nn::Init::Const(0.0))?;
        let bias = if bias {
            Some(vs.f_var("bias", &[out_dim], nn::Init::Const(0.0))?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
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
