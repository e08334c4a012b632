//! Seeded random initialisation of a fresh model, as transformers' `_init_weights` does it.
//!
//! Values are drawn in Rust (ChaCha8 + Box–Muller) rather than with libtorch's global RNG:
//! the global generator is shared by every thread of the process (parallel tests, other
//! backends), so seeding it would not make one model's init reproducible. Drawing on the host
//! also makes the same seed give the same weights on CPU and CUDA.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{nn, Tensor};

use crate::error::Result;

/// Fills every variable of `vs`: names ending in `norm.weight` with 1, `.bias` with 0, and the
/// rest (linear and embedding weights) with `N(0, std²)`. Variables are visited in name order
/// from one RNG stream seeded by `seed`.
pub fn init_weights(vs: &nn::VarStore, std: f64, seed: u64) -> Result<()> {
    let _guard = tch::no_grad_guard();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, mut var) in vars {
        if name.ends_with("norm.weight") {
            let _ = var.f_fill_(1.0)?;
        } else if name.ends_with(".bias") {
            let _ = var.f_fill_(0.0)?;
        } else {
            let values = normal_f32(&mut rng, var.numel(), std);
            let src = Tensor::f_from_slice(&values)?.f_view(var.size().as_slice())?;
            var.f_copy_(&src)?;
        }
    }
    Ok(())
}

/// `n` draws of `N(0, std²)` by the Box–Muller transform.
fn normal_f32(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1: f64 = 1.0 - rng.gen::<f64>();
        let u2: f64 = rng.gen::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let theta = std::f64::consts::TAU * u2;
        out.push((r * theta.cos()) as f32);
        out.push((r * theta.sin()) as f32);
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_draws_have_the_requested_moments() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let xs = normal_f32(&mut rng, 100_001, 0.02);
        assert_eq!(xs.len(), 100_001);
        let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len() as f64;
        let var = xs
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / xs.len() as f64;
        assert!(mean.abs() < 3e-4, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 3e-4, "{}", var.sqrt());
    }
}
