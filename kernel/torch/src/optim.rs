//! AdamW with global gradient-norm clipping and linear warmup, with state that checkpoints.
//!
//! Implemented here rather than with `tch::nn::Optimizer` because the checkpoint must hold the
//! moments and step count (tch does not expose them). The update is PyTorch's
//! `torch.optim.AdamW` (decoupled weight decay on every parameter, bias-corrected moments,
//! `eps` added after the square root), and clipping is `clip_grad_norm_` (coefficient
//! `max_norm / (norm + 1e-6)`, applied when below 1). Moments are kept in f32 whatever the
//! parameter dtype, and bf16 parameters are updated in f32 then rounded back (there is no f32
//! master copy, so very small updates to bf16 weights round away).

use cairn_kernel::backend::OptimizerSettings;
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// AdamW over a fixed list of named parameters.
#[derive(Debug)]
pub struct AdamW {
    settings: OptimizerSettings,
    /// Steps over which the learning rate ramps linearly from `lr / warmup_steps` to `lr`.
    warmup_steps: u64,
    /// `(name, parameter)`, shallow clones of the model's variables, sorted by name.
    params: Vec<(String, Tensor)>,
    /// First moments, f32, one per parameter.
    exp_avg: Vec<Tensor>,
    /// Second moments, f32, one per parameter.
    exp_avg_sq: Vec<Tensor>,
    /// Steps taken since construction or the last [`AdamW::reset`].
    step: u64,
}

/// What [`AdamW::step`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimStep {
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f64,
    /// Learning rate applied (after warmup).
    pub lr: f64,
}

impl AdamW {
    /// Errors: libtorch cannot allocate the moments (two f32 copies of the parameters).
    pub fn new(
        params: Vec<(String, Tensor)>,
        settings: OptimizerSettings,
        warmup_steps: u64,
    ) -> Result<AdamW> {
        let zeros = |p: &Tensor| Tensor::f_zeros(p.size(), (Kind::Float, p.device()));
        let exp_avg = params
            .iter()
            .map(|(_, p)| zeros(p))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let exp_avg_sq = params
            .iter()
            .map(|(_, p)| zeros(p))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(AdamW {
            settings,
            warmup_steps,
            params,
            exp_avg,
            exp_avg_sq,
            step: 0,
        })
    }

    pub fn settings(&self) -> &OptimizerSettings {
        &self.settings
    }

    pub fn warmup_steps(&self) -> u64 {
        self.warmup_steps
    }

    /// Steps taken since construction or the last reset.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// New hyper-parameters; moments and step count start over.
    pub fn reset(&mut self, settings: OptimizerSettings) {
        let _guard = tch::no_grad_guard();
        for m in self.exp_avg.iter_mut().chain(self.exp_avg_sq.iter_mut()) {
            let _ = m.zero_();
        }
        self.settings = settings;
        self.step = 0;
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&mut self) {
        for (_, p) in &mut self.params {
            p.zero_grad();
        }
    }

    /// Named gradients (f32 copies; zeros for a parameter without a gradient).
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .map(|(name, p)| {
                let g = p.grad();
                let g = if g.defined() {
                    g.to_kind(Kind::Float)
                } else {
                    Tensor::zeros(p.size(), (Kind::Float, p.device()))
                };
                (name.clone(), g)
            })
            .collect()
    }

    /// Global L2 norm of all gradients, accumulated in f32.
    pub fn grad_norm(&self) -> f64 {
        let _guard = tch::no_grad_guard();
        let norms: Vec<Tensor> = self
            .params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .map(|g| g.to_kind(Kind::Float).norm())
            .collect();
        if norms.is_empty() {
            return 0.0;
        }
        Tensor::stack(&norms, 0).norm().double_value(&[])
    }

    /// Clips the gradient to `max_grad_norm` (when positive), applies one AdamW update and
    /// clears the gradients. A non-finite gradient norm leaves the weights and moments
    /// untouched and returns an error.
    pub fn step(&mut self) -> Result<OptimStep> {
        let _guard = tch::no_grad_guard();
        let grad_norm = self.grad_norm();
        if !grad_norm.is_finite() {
            self.zero_grad();
            return Err(Error::input(
                "train_step",
                format!("gradient norm is {grad_norm}; weights left unchanged"),
            ));
        }
        let s = &self.settings;
        let clip = if s.max_grad_norm > 0.0 {
            s.max_grad_norm / (grad_norm + 1e-6)
        } else {
            1.0
        };
        self.step += 1;
        let lr = if self.warmup_steps > 0 {
            s.lr * (self.step as f64 / self.warmup_steps as f64).min(1.0)
        } else {
            s.lr
        };
        let (beta1, beta2) = s.betas;
        let bias_correction1 = 1.0 - beta1.powi(self.step as i32);
        let bias_correction2_sqrt = (1.0 - beta2.powi(self.step as i32)).sqrt();
        let step_size = lr / bias_correction1;
        for (((_, p), m), v) in self
            .params
            .iter_mut()
            .zip(&mut self.exp_avg)
            .zip(&mut self.exp_avg_sq)
        {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut g = g.to_kind(Kind::Float);
            if clip < 1.0 {
                g *= clip;
            }
            let mut w = p.to_kind(Kind::Float);
            if s.weight_decay != 0.0 {
                w *= 1.0 - lr * s.weight_decay;
            }
            let _ = m.lerp_(&g, 1.0 - beta1);
            *v *= beta2;
            *v += &g * &g * (1.0 - beta2);
            let denom = v.sqrt() / bias_correction2_sqrt + s.eps;
            w -= &*m / &denom * step_size;
            p.copy_(&w);
        }
        self.zero_grad();
        Ok(OptimStep { grad_norm, lr })
    }

    /// The moments as named f32 tensors: `exp_avg.<param>` and `exp_avg_sq.<param>`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let avg = self
            .params
            .iter()
            .zip(&self.exp_avg)
            .map(|((n, _), m)| (format!("exp_avg.{n}"), m.shallow_clone()));
        let sq = self
            .params
            .iter()
            .zip(&self.exp_avg_sq)
            .map(|((n, _), v)| (format!("exp_avg_sq.{n}"), v.shallow_clone()));
        avg.chain(sq).collect()
    }

    /// Restores the settings and step count saved with [`AdamW::state_tensors`] (whose
    /// tensors the caller copies into place).
    pub(crate) fn restore(&mut self, settings: OptimizerSettings, warmup_steps: u64, step: u64) {
        self.settings = settings;
        self.warmup_steps = warmup_steps;
        self.step = step;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// One AdamW step on a scalar against the closed form of torch.optim.AdamW.
    #[test]
    fn matches_torch_adamw_on_a_scalar() {
        let settings = OptimizerSettings {
            lr: 0.1,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: 0.0,
        };
        let p = Tensor::from_slice(&[1.0f32]).set_requires_grad(true);
        let mut opt = AdamW::new(vec![("w".into(), p.shallow_clone())], settings, 0).unwrap();
        (&p * 3.0).sum(Kind::Float).backward();
        let report = opt.step().unwrap();
        assert_eq!(report.grad_norm, 3.0);
        // m̂ = g, v̂ = g², update = lr · g/(|g| + eps) ≈ lr; decay first: 1 · (1 − lr·wd)
        let want = 1.0 * (1.0 - 0.1 * 0.01) - 0.1 * 3.0 / (3.0 + 1e-8);
        assert!(
            (p.double_value(&[0]) - want).abs() < 1e-6,
            "{} vs {want}",
            p.double_value(&[0])
        );
        assert!(!p.grad().defined() || p.grad().abs().sum(Kind::Float).double_value(&[]) == 0.0);
    }

    #[test]
    fn clips_to_max_norm_and_warms_up() {
        let settings = OptimizerSettings {
            lr: 1.0,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        };
        let p = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let mut opt = AdamW::new(vec![("w".into(), p.shallow_clone())], settings, 4).unwrap();
        (&p * Tensor::from_slice(&[3.0f32, 4.0]))
            .sum(Kind::Float)
            .backward();
        let report = opt.step().unwrap();
        assert_eq!(report.grad_norm, 5.0);
        assert_eq!(report.lr, 0.25);
        let nan = Tensor::from_slice(&[f32::NAN, 0.0]);
        (&p * nan).sum(Kind::Float).backward();
        let before = Vec::<f32>::try_from(&p).unwrap();
        assert!(opt.step().is_err());
        assert_eq!(Vec::<f32>::try_from(&p).unwrap(), before);
    }
}
