//! [`BackendConfig`]: what [`crate::TorchBackend::new`] builds.
//!
//! Deserialises from the `[backend]` table of a pipeline config, for example:
//!
//! ```toml
//! [backend]
//! device = "auto"          # "cpu" | "cuda" | "auto"
//! dtype = "f32"            # "f32" | "bf16"; default: the checkpoint's torch_dtype
//! seed = 0                 # init seed for `init = "random"`
//! threads = 2              # libtorch intra-op threads (tch::set_num_threads)
//! warmup_steps = 0
//! score_batch_size = 32
//! model = { init = "pretrained", dir = "models/qwen3-0.6b" }
//! # or: [backend.model] init = "random" with [backend.model.config] holding config.json keys
//! [backend.optimizer]
//! lr = 1e-6
//! betas = [0.9, 0.999]
//! eps = 1e-8
//! weight_decay = 0.0
//! max_grad_norm = 1.0
//! ```

use std::path::PathBuf;

use cairn_kernel::backend::OptimizerSettings;
use tch::Device;

use crate::error::{Error, Result};
use crate::model::{Dtype, ModelConfig};

/// Where the initial weights come from. Serde: internally tagged by `init`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "init", rename_all = "snake_case")]
pub enum ModelSource {
    /// A HF model directory: `config.json` plus `model.safetensors` or a sharded index.
    Pretrained { dir: PathBuf },
    /// A fresh model from a config (in `config.json` form), initialised from `seed`.
    Random { config: Box<ModelConfig> },
}

/// Which device runs the model. Serde: `"cpu"`, `"cuda"`, `"auto"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceOption {
    Cpu,
    /// The first CUDA device; an error when libtorch sees none.
    Cuda,
    /// CUDA when available, else CPU.
    #[default]
    Auto,
}

impl DeviceOption {
    /// The device to use, checked at run time with `tch::Cuda::is_available()`.
    pub fn resolve(self) -> Result<Device> {
        match self {
            DeviceOption::Cpu => Ok(Device::Cpu),
            DeviceOption::Cuda if tch::Cuda::is_available() => Ok(Device::Cuda(0)),
            DeviceOption::Cuda => Err(Error::Device {
                requested: "cuda".into(),
                reason: "libtorch sees no CUDA device (no GPU or driver, or a CPU-only libtorch, or a binary \
                         linked without `-Wl,--no-as-needed -ltorch`; see kernel/torch/build/link_libtorch.rs); \
                         use device = \"cpu\" or \"auto\""
                    .into(),
            }),
            DeviceOption::Auto => Ok(Device::cuda_if_available()),
        }
    }
}

/// Everything needed to construct a [`crate::TorchBackend`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub model: ModelSource,
    #[serde(default)]
    pub device: DeviceOption,
    /// Weight and activation dtype; `None`: bf16 when the model's `torch_dtype` is bfloat16,
    /// else f32. Log-probs and losses are f32 either way.
    #[serde(default)]
    pub dtype: Option<Dtype>,
    /// Seed of the random init (`init = "random"`).
    #[serde(default)]
    pub seed: u64,
    /// libtorch intra-op threads; `None` leaves libtorch's default.
    #[serde(default)]
    pub threads: Option<usize>,
    #[serde(default)]
    pub optimizer: OptimizerSettings,
    /// Linear learning-rate warmup, in optimizer steps counted from the last
    /// `configure_optimizer` (0: none).
    #[serde(default)]
    pub warmup_steps: u64,
    /// Sequences per forward in `score` (bounds the `[B, R, V]` f32 logits).
    #[serde(default = "default_score_batch_size")]
    pub score_batch_size: usize,
}

fn default_score_batch_size() -> usize {
    32
}

impl BackendConfig {
    /// A CPU, f32 config for a fresh model (tests, from-scratch training).
    pub fn random(config: ModelConfig, seed: u64) -> BackendConfig {
        BackendConfig {
            model: ModelSource::Random {
                config: Box::new(config),
            },
            device: DeviceOption::Cpu,
            dtype: Some(Dtype::F32),
            seed,
            threads: None,
            optimizer: OptimizerSettings::default(),
            warmup_steps: 0,
            score_batch_size: default_score_batch_size(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_random_and_pretrained_sources() {
        let cfg: BackendConfig = serde_json::from_value(serde_json::json!({
            "model": {"init": "random", "config": {
                "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}},
            "device": "cpu", "dtype": "bf16", "optimizer": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "max_grad_norm": 1.0}
        }))
        .unwrap();
        assert!(
            matches!(cfg.model, ModelSource::Random { ref config } if config.hidden_size == 32)
        );
        assert_eq!(
            (cfg.device, cfg.dtype, cfg.optimizer.betas),
            (DeviceOption::Cpu, Some(Dtype::Bf16), (0.9, 0.95))
        );
        let cfg: BackendConfig = serde_json::from_value(
            serde_json::json!({"model": {"init": "pretrained", "dir": "m"}}),
        )
        .unwrap();
        assert_eq!(cfg.device, DeviceOption::Auto);
        assert_eq!(cfg.score_batch_size, 32);
        let err = serde_json::from_value::<BackendConfig>(
            serde_json::json!({"model": {"init": "random", "config": {"model_type": "gpt2"}}}),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("gpt2"), "{err}");
    }

    #[test]
    fn cpu_always_resolves() {
        assert_eq!(DeviceOption::Cpu.resolve().unwrap(), Device::Cpu);
        assert!(DeviceOption::Auto.resolve().is_ok());
    }
}
