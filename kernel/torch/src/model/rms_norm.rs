//! RMSNorm as transformers computes it (`Qwen3RMSNorm`, `LlamaRMSNorm`).

use tch::{nn, Kind, Tensor};

use crate::error::Result;

/// Root-mean-square norm over the last dimension with a learned scale `weight` `[D]`.
///
/// Numerics match transformers exactly: the input is cast to f32, normalised there, cast back
/// to the input dtype, and only then multiplied by `weight` (in the weight/input dtype).
#[derive(Debug)]
pub struct RmsNorm {
    /// `[D]`, HF name `<prefix>.weight`, initialised to 1.
    pub weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Creates `<vs>.weight` of size `[dim]`. Errors: libtorch cannot allocate it.
    pub fn new(vs: nn::Path<'_>, dim: i64, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: vs.f_var("weight", &[dim], nn::Init::Const(1.0))?,
            eps,
        })
    }

    /// `[.., D]` → `[.., D]`, same dtype as `xs`.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let dtype = xs.kind();
        let x = xs.to_kind(Kind::Float);
        let variance = x.pow_tensor_scalar(2).mean_dim(-1, true, None);
        let x = x * (variance + self.eps).rsqrt();
        &self.weight * x.to_kind(dtype)
    }

    /// [`RmsNorm::forward`] with libtorch's fused `rms_norm` (two kernels instead of seven),
    /// inference only: under no grad its values equal `forward`'s bit for bit in f32 and bf16
    /// (the test below), but its backward rounds differently, so training keeps `forward`.
    pub fn forward_no_grad(&self, xs: &Tensor) -> Tensor {
        let dtype = xs.kind();
        let d = xs.size()[xs.dim() - 1];
        let mut x = xs
            .to_kind(Kind::Float)
            .rms_norm([d], None::<Tensor>, self.eps)
            .to_kind(dtype);
        let _ = x.g_mul_(&self.weight);
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn the_fused_norm_equals_the_op_by_op_norm_bit_for_bit() {
        let _guard = tch::no_grad_guard();
        for kind in [Kind::Float, Kind::BFloat16] {
            let mut vs = nn::VarStore::new(Device::Cpu);
            let norm = RmsNorm::new(vs.root(), 64, 1e-6).unwrap();
            vs.set_kind(kind);
            let mut weight = norm.weight.shallow_clone();
            weight.copy_(&(Tensor::randn([64], (Kind::Float, Device::Cpu)) + 1.0));
            let x = (Tensor::randn([3, 5, 64], (Kind::Float, Device::Cpu)) * 7.0).to_kind(kind);
            let (want, got) = (norm.forward(&x), norm.forward_no_grad(&x));
            assert_eq!(got.kind(), kind);
            assert!(got.equal(&want), "{kind:?}");
        }
    }

    #[test]
    fn normalises_rows_to_unit_rms() {
        let vs = nn::VarStore::new(Device::Cpu);
        let norm = RmsNorm::new(vs.root(), 4, 1e-6).unwrap();
        let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0, 0.5, 0.5, 0.5, 0.5]).view([2, 4]);
        let y = norm.forward(&x);
        let rms = y.pow_tensor_scalar(2).mean_dim(-1, false, Kind::Float);
        let rms: Vec<f32> = Vec::try_from(rms).unwrap();
        for r in rms {
            assert!((r - 1.0).abs() < 1e-5, "{r}");
        }
    }
}
