//! The SwiGLU feed-forward block (`mlp.gate_proj`, `mlp.up_proj`, `mlp.down_proj`).

use tch::{nn, Tensor};

use super::config::ModelConfig;
use super::linear::Linear;
use super::packed::LayerProjs;

/// `down_proj(silu(gate_proj(x)) * up_proj(x))`.
#[derive(Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    /// Errors: libtorch cannot allocate a projection.
    pub fn new(vs: nn::Path<'_>, config: &ModelConfig) -> crate::error::Result<Mlp> {
        let (h, i) = (config.hidden_size as i64, config.intermediate_size as i64);
        let bias = config.mlp_bias();
        Ok(Mlp {
            gate_proj: Linear::new(&vs / "gate_proj", h, i, bias)?,
            up_proj: Linear::new(&vs / "up_proj", h, i, bias)?,
            down_proj: Linear::new(&vs / "down_proj", i, h, bias)?,
        })
    }

    /// `[B, T, hidden]` → `[B, T, hidden]`.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let gate = self.gate_proj.forward(xs).silu();
        self.down_proj.forward(&(gate * self.up_proj.forward(xs)))
    }

    /// [`Mlp::forward`] with `silu` and the product in place (the same values bit for bit,
    /// two fewer allocations), through `projs`' gate, up and down projections (this layer's,
    /// plain or packed, where gate and up are views of one product); inference only.
    pub(crate) fn forward_no_grad(&self, xs: &Tensor, projs: &LayerProjs<'_>) -> Tensor {
        let (mut gate, up) = projs.gate_up(xs);
        let _ = gate.silu_();
        let _ = gate.g_mul_(&up);
        projs.down(&gate)
    }
}
