//! The memory pre-flight of `cairn check` and `cairn train` ([`crate::setup::checked`]): the
//! model's dimensions (from `[model.scratch]` or the model directory's `config.json`), the
//! training device's memory (the machine's RAM from `/proc/meminfo` for the CPU, the GPU's from
//! `nvidia-smi` for CUDA), and [`PipelineConfig::check_memory`] between them, so a config that
//! cannot fit is refused with the numbers before anything is allocated.

use std::path::Path;

use anyhow::Result;
use cairn_kernel::config::PipelineConfig;
use cairn_kernel::memory::{DeviceMemory, ModelShape, GIB};
use cairn_torch::tch::Device;
use cairn_torch::{Dtype, ModelConfig};

/// Vocabulary counted for a scratch model whose word-level tokenizer is not trained yet: the
/// special tokens and required words every such tokenizer holds (about 40), rounded up. Its
/// real size (up to `WordLevelConfig::max_vocab_size`, 8192) is known only after training on
/// the environment's text, so the estimate takes the floor rather than refuse a config that
/// fits.
const SCRATCH_VOCAB_FLOOR: usize = 64;

/// The vocabulary of a scratch model: its `tokenizer` directory's, when one is given and
/// loads, else [`SCRATCH_VOCAB_FLOOR`].
fn scratch_vocab(tokenizer: Option<&Path>) -> usize {
    tokenizer
        .and_then(|dir| cairn_kernel::text::Tokenizer::from_dir(dir).ok())
        .map_or(SCRATCH_VOCAB_FLOOR, |t| t.vocab_size())
}

/// The model's dimensions, checked (a scratch table with a zero size or heads that do not
/// divide is refused here, naming the key, rather than when the model is built).
pub fn model_config(config: &PipelineConfig) -> Result<ModelConfig> {
    match (&config.model.path, &config.model.scratch) {
        (Some(dir), _) => ModelConfig::from_file(&dir.join("config.json"))
            .map_err(|e| config.error("model.path", e).into()),
        (None, Some(s)) => {
            let mc = crate::scratch::model_config(s, scratch_vocab(s.tokenizer.as_deref()));
            if let Err(cairn_torch::Error::Config { key, reason, .. }) =
                mc.validate(Path::new("model.scratch"))
            {
                return Err(config.error(&format!("model.scratch.{key}"), reason).into());
            }
            Ok(mc)
        }
        (None, None) => unreachable!("config validation requires model.path or model.scratch"),
    }
}

/// Checks that the pipeline fits `device` (see [`cairn_kernel::memory`]).
pub fn check(config: &PipelineConfig, device: Device, dtype: Dtype) -> Result<()> {
    let mc = model_config(config)?;
    let shape = ModelShape {
        vocab_size: mc.vocab_size,
        hidden_size: mc.hidden_size,
        intermediate_size: mc.intermediate_size,
        num_hidden_layers: mc.num_hidden_layers,
        num_attention_heads: mc.num_attention_heads,
        num_key_value_heads: mc.num_key_value_heads,
        head_dim: mc.head_dim,
        tie_word_embeddings: mc.tie_word_embeddings,
        context_window: mc.max_position_embeddings,
        dtype_bytes: match dtype {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        },
    };
    let host = host_memory();
    let memory = match device {
        Device::Cuda(index) => DeviceMemory {
            device: gpu_memory(index),
            host,
            device_is_host: false,
        },
        _ => DeviceMemory {
            device: host,
            host,
            device_is_host: true,
        },
    };
    Ok(config.check_memory(&shape, &memory)?)
}

/// `MemTotal` of `/proc/meminfo`, bytes (`None` where there is no such file).
fn host_memory() -> Option<f64> {
    meminfo_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The `MemTotal:  N kB` line of a `/proc/meminfo` text, in bytes.
fn meminfo_total(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// Total memory of CUDA device `index` as `nvidia-smi` reports it, bytes (`None` when it
/// cannot be asked: libtorch has no such query, so without `nvidia-smi` the device's size is
/// unknown and only `model.memory_gib` bounds it).
fn gpu_memory(index: usize) -> Option<f64> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=memory.total",
            "--format=csv,noheader,nounits",
            &format!("--id={index}"),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mib: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(mib * GIB / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        let text = "MemTotal:       24589264 kB\nMemFree:        17000000 kB\n";
        assert_eq!(meminfo_total(text), Some(24589264.0 * 1024.0));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
    }
}
