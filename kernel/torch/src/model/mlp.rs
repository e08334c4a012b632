//! The SwiGLU feed-forward block (`mlp.gate_proj`, `mlp.up_proj`, `mlp.down_proj`).

use tch::{nn, Tensor};

use super::config::ModelConfig;
use super::linear::Linear;

/// `down_proj(silu(gate_proj(x)) * up_proj(x))`.
///
/// Without gradients (sampling, scoring under `no_grad`) the SiLU and the product are taken
/// in place in the `gate_proj` output: the same kernels and values, two allocations fewer.
/// Whenever either projection requires grad (training), both stay out of place, since autograd
/// saves `gate` for the backward of the product.
#[derive(Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    pub fn new(vs: nn::Path<'_>, config: &ModelConfig) -> Mlp {
        let (h, i) = (config.hidden_size as i64, config.intermediate_size as i64);
        let bias = config.mlp_bias();
        Mlp {
            gate_proj: Linear::new(&vs / "gate_proj", h, i, bias),
            up_proj: Linear::new(&vs / "up_proj", h, i, bias),
            down_proj: Linear::new(&vs / "down_proj", i, h, bias),
        }
    }

    /// `[B, T, hidden]` → `[B, T, hidden]`.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let mut gate = self.gate_proj.forward(xs);
        let up = self.up_proj.forward(xs);
        if gate.requires_grad() || up.requires_grad() {
            return self.down_proj.forward(&(gate.silu() * up));
        }
        let _ = gate.silu_();
        gate *= up;
        self.down_proj.forward(&gate)
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;

    /// The in-place branch (no grad) and the autograd branch give the same values bit for bit.
    #[test]
    fn in_place_and_autograd_branches_agree_bitwise() {
        tch::manual_seed(2);
        let config = ModelConfig::qwen3(16, 32, 64, 1, 4, 2);
        let vs = nn::VarStore::new(Device::Cpu);
        let mlp = Mlp::new(vs.root(), &config);
        tch::no_grad(|| {
            for (_, mut p) in vs.variables() {
                p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.3));
            }
        });
        let x = Tensor::randn([2, 3, 32], (Kind::Float, Device::Cpu));
        let with_grad = mlp.forward(&x);
        assert!(with_grad.requires_grad());
        let without = tch::no_grad(|| mlp.forward(&x));
        assert!(!without.requires_grad());
        assert!(with_grad.detach().equal(&without));
    }
}
