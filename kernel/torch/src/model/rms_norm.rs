//! RMSNorm as transformers computes it (`Qwen3RMSNorm`, `LlamaRMSNorm`).

use tch::{nn, Kind, Tensor};

/// Root-mean-square norm over the last dimension with a learned scale `weight` `[D]`.
///
/// Numerics match transformers exactly: the input is cast to f32, normalised there, cast back
/// to the input dtype, and only then multiplied by `weight` (in the weight/input dtype).
///
/// The normalisation is libtorch's `rms_norm` op (one call from Rust instead of eight), which
/// computes `x · rsqrt(mean(x²) + eps)` in f32 like transformers' `LlamaRMSNorm`. In f32 the
/// weight goes into the same call (it multiplies after the normalisation, as transformers
/// does); in bf16 the op gets the f32 copy of the input and no weight, and the product with
/// the weight stays a separate bf16 multiply, as in transformers. Both are bitwise equal to
/// the op-for-op formula ([`RmsNorm::forward_reference`]; see the tests).
#[derive(Debug)]
pub struct RmsNorm {
    /// `[D]`, HF name `<prefix>.weight`, initialised to 1.
    pub weight: Tensor,
    dim: i64,
    eps: f64,
}

impl RmsNorm {
    /// Creates `<vs>.weight` of size `[dim]`.
    pub fn new(vs: nn::Path<'_>, dim: i64, eps: f64) -> RmsNorm {
        RmsNorm {
            weight: vs.var("weight", &[dim], nn::Init::Const(1.0)),
            dim,
            eps,
        }
    }

    /// `[.., D]` → `[.., D]`, same dtype as `xs`.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let dtype = xs.kind();
        if dtype == Kind::Float && self.weight.kind() == Kind::Float {
            return xs.rms_norm([self.dim], Some(&self.weight), self.eps);
        }
        let x = xs
            .to_kind(Kind::Float)
            .rms_norm([self.dim], None::<&Tensor>, self.eps);
        &self.weight * x.to_kind(dtype)
    }

    /// `[.., D]` → `[.., D]`: transformers' `LlamaRMSNorm.forward` op for op (cast to f32,
    /// `pow(2).mean(-1)`, `+ eps`, `rsqrt`, multiply, cast back, times `weight`). The
    /// reference [`RmsNorm::forward`] must equal.
    pub fn forward_reference(&self, xs: &Tensor) -> Tensor {
        let dtype = xs.kind();
        let x = xs.to_kind(Kind::Float);
        let variance = x.pow_tensor_scalar(2).mean_dim(-1, true, None);
        let x = x * (variance + self.eps).rsqrt();
        &self.weight * x.to_kind(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn normalises_rows_to_unit_rms() {
        let vs = nn::VarStore::new(Device::Cpu);
        let norm = RmsNorm::new(vs.root(), 4, 1e-6);
        let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0, 0.5, 0.5, 0.5, 0.5]).view([2, 4]);
        let y = norm.forward(&x);
        let rms = y.pow_tensor_scalar(2).mean_dim(-1, false, Kind::Float);
        let rms: Vec<f32> = Vec::try_from(rms).unwrap();
        for r in rms {
            assert!((r - 1.0).abs() < 1e-5, "{r}");
        }
    }

    /// The fused op must give transformers' values bit for bit, in f32 and in bf16, with a
    /// non-trivial weight, for hidden-size rows and for per-head rows.
    #[test]
    fn fused_op_equals_the_transformers_formula_bitwise() {
        tch::manual_seed(3);
        for kind in [Kind::Float, Kind::BFloat16] {
            for (shape, eps) in [
                (vec![1i64, 1, 576], 1e-5),
                (vec![8, 39, 576], 1e-6),
                (vec![2, 5, 9, 64], 1e-6),
            ] {
                let mut vs = nn::VarStore::new(Device::Cpu);
                vs.set_kind(kind);
                let dim = *shape.last().unwrap();
                let norm = RmsNorm::new(vs.root(), dim, eps);
                tch::no_grad(|| {
                    norm.weight
                        .shallow_clone()
                        .copy_(&(Tensor::randn([dim], (Kind::Float, Device::Cpu)) + 1.0))
                });
                let x = (Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)) * 3.0)
                    .to_kind(kind);
                let (got, want) = (norm.forward(&x), norm.forward_reference(&x));
                assert_eq!(got.kind(), kind);
                assert!(got.equal(&want), "{kind:?} {shape:?}");
            }
        }
    }
}
