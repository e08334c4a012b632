//! Rotary position embeddings (RoPE) in transformers' `rotate_half` convention.
//!
//! The inverse frequencies are computed once, in f32, with the same libtorch ops and order as
//! `LlamaRotaryEmbedding.compute_default_rope_parameters` and
//! `_compute_llama3_parameters`, so the cos/sin tables match transformers bit for bit.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use super::config::{ModelConfig, RopeScaling};

/// Inverse frequencies `[D/2]` (f32) and the cos/sin tables they give at given positions.
#[derive(Debug)]
pub struct RotaryEmbedding {
    /// `[D/2]`, f32, on the model's device.
    inv_freq: Tensor,
}

impl RotaryEmbedding {
    pub fn new(config: &ModelConfig, device: Device) -> RotaryEmbedding {
        let dim = config.head_dim as i64;
        let exponent = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / dim as f64;
        let inv_freq = Tensor::pow_scalar(config.rope_theta, &exponent).reciprocal();
        let inv_freq = match &config.rope_scaling {
            RopeScaling::Default => inv_freq,
            RopeScaling::Linear { factor } => inv_freq / *factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => llama3_inv_freq(
                &inv_freq,
                *factor,
                *low_freq_factor,
                *high_freq_factor,
                *original_max_position_embeddings,
            ),
        };
        RotaryEmbedding { inv_freq }
    }

    /// The inverse frequencies `[D/2]` (scaling applied), as f32 values.
    pub(crate) fn inv_freq(&self) -> Vec<f32> {
        Vec::try_from(&self.inv_freq.to_device(tch::Device::Cpu)).unwrap_or_default()
    }

    /// `(cos, sin)`, each `[B, T, D]` in `kind`, for positions `[B, T]` (int64).
    pub fn cos_sin(&self, position_ids: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = position_ids.unsqueeze(-1).to_kind(Kind::Float) * &self.inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (emb.cos().to_kind(kind), emb.sin().to_kind(kind))
    }
}

/// Applies RoPE to `xs` `[B, H, T, D]` with `cos`/`sin` `[B, T, D]`: `x·cos + rotate_half(x)·sin`.
pub fn apply_rotary(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let cos = cos.unsqueeze(1);
    let sin = sin.unsqueeze(1);
    xs * cos + rotate_half(xs) * sin
}

/// The RoPE tables of one no-grad forward, shaped once for every layer.
///
/// `rotate_half(x)·sin` equals `roll(x, D/2)·sin±` with `sin± = [-sin₁, sin₂]`, bit for bit
/// (negating a factor or the product rounds the same), so [`RopeTables::apply`] gives
/// [`apply_rotary`]'s values in four kernels instead of seven (no `narrow`, `neg`, `cat`).
#[derive(Debug)]
pub struct RopeTables {
    /// `[B, 1, T, D]`.
    cos: Tensor,
    /// `[B, 1, T, D]`: `[-sin[..D/2], sin[D/2..]]`.
    sin_signed: Tensor,
    half: i64,
}

impl RopeTables {
    /// From `cos`/`sin` `[B, T, D]` as [`RotaryEmbedding::cos_sin`] gives them.
    pub fn new(cos: &Tensor, sin: &Tensor) -> RopeTables {
        let half = sin.size()[2] / 2;
        let sin_signed = Tensor::cat(&[-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)], -1);
        RopeTables {
            cos: cos.unsqueeze(1),
            sin_signed: sin_signed.unsqueeze(1),
            half,
        }
    }

    /// [`apply_rotary`] for `xs` `[B, H, T, D]`, inference only (the sum is formed in place).
    pub fn apply(&self, xs: &Tensor) -> Tensor {
        let mut out = xs * &self.cos;
        let _ = out.g_add_(&(xs.roll([self.half], [-1]) * &self.sin_signed));
        out
    }
}

/// `[x1, x2]` → `[-x2, x1]` over the last dimension.
fn rotate_half(xs: &Tensor) -> Tensor {
    let half = xs.size()[xs.dim() - 1] / 2;
    let x1 = xs.narrow(-1, 0, half);
    let x2 = xs.narrow(-1, half, half);
    Tensor::cat(&[&(-x2), &x1], -1)
}

/// Llama 3.1 rescaling, op for op as transformers' `_compute_llama3_parameters`.
fn llama3_inv_freq(
    inv_freq: &Tensor,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    old_context_len: f64,
) -> Tensor {
    let low_freq_wavelen = old_context_len / low_freq_factor;
    let high_freq_wavelen = old_context_len / high_freq_factor;
    // Python's `scalar / tensor` is `tensor.reciprocal() * scalar`.
    let wavelen = inv_freq.reciprocal() * (2.0 * PI);
    let inv_freq_llama = (inv_freq / factor).where_self(&wavelen.gt(low_freq_wavelen), inv_freq);
    let smooth_factor = (wavelen.reciprocal() * old_context_len - low_freq_factor)
        / (high_freq_factor - low_freq_factor);
    let smoothed =
        (-&smooth_factor + 1.0) * &inv_freq_llama / factor + &smooth_factor * &inv_freq_llama;
    let is_medium =
        wavelen.lt(high_freq_wavelen).logical_not() * wavelen.gt(low_freq_wavelen).logical_not();
    smoothed.where_self(&is_medium, &inv_freq_llama)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inv_freq_matches_the_closed_form() {
        let mut config = ModelConfig::qwen3(16, 32, 64, 1, 4, 2);
        config.rope_theta = 10_000.0;
        let rope = RotaryEmbedding::new(&config, Device::Cpu);
        let got: Vec<f32> = Vec::try_from(&rope.inv_freq).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = 1.0 / 10_000f64.powf(2.0 * i as f64 / 8.0);
            assert!(
                (f64::from(*g) - want).abs() < 1e-6 * want.max(1e-3),
                "{i}: {g} vs {want}"
            );
        }
    }

    #[test]
    fn rotation_preserves_norm_and_is_identity_at_zero() {
        let config = ModelConfig::qwen3(16, 32, 64, 1, 4, 2);
        let rope = RotaryEmbedding::new(&config, Device::Cpu);
        let x = Tensor::randn([1, 2, 3, 8], (Kind::Float, Device::Cpu));
        let pos = Tensor::from_slice(&[0i64, 5, 9]).view([1, 3]);
        let (cos, sin) = rope.cos_sin(&pos, Kind::Float);
        let y = apply_rotary(&x, &cos, &sin);
        let d0 = (y.narrow(2, 0, 1) - x.narrow(2, 0, 1))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d0 < 1e-7);
        let dn = (y.norm() - x.norm()).abs().double_value(&[]);
        assert!(dn < 1e-4);
    }

    #[test]
    fn the_tables_rotate_bit_for_bit_as_rotate_half_does() {
        let config = ModelConfig::qwen3(16, 32, 64, 1, 4, 2);
        let rope = RotaryEmbedding::new(&config, Device::Cpu);
        let pos = Tensor::from_slice(&[0i64, 5, 9, 3, 4, 100]).view([2, 3]);
        for kind in [Kind::Float, Kind::BFloat16] {
            let x = Tensor::randn([2, 4, 3, 8], (Kind::Float, Device::Cpu)).to_kind(kind);
            let (cos, sin) = rope.cos_sin(&pos, kind);
            let want = apply_rotary(&x, &cos, &sin);
            let got = RopeTables::new(&cos, &sin).apply(&x);
            assert!(got.equal(&want), "{kind:?}");
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let mut config = ModelConfig::qwen3(16, 32, 64, 1, 1, 1);
        config.head_dim = 32;
        config.rope_theta = 500_000.0;
        config.rope_scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let scaled: Vec<f32> =
            Vec::try_from(&RotaryEmbedding::new(&config, Device::Cpu).inv_freq).unwrap();
        config.rope_scaling = RopeScaling::Default;
        let plain: Vec<f32> =
            Vec::try_from(&RotaryEmbedding::new(&config, Device::Cpu).inv_freq).unwrap();
        assert_eq!(scaled[0], plain[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-12);
    }
}
