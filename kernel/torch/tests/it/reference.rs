//! The committed transformers fixtures (`tests/fixtures/fidelity/`, written by
//! `scripts/fidelity/make_fixtures.py`): one tiny HF model directory per architecture, and what
//! transformers computed on it. Read by the fidelity and export tests; no Python at run time.

use std::path::{Path, PathBuf};

use cairn_kernel::backend::{OptimizerSettings, Sequence};
use cairn_torch::{BackendConfig, DeviceOption, ModelSource, TorchBackend};
use serde::Deserialize;
use tch::Device;

/// Every fixture model, in the order the generator writes them.
pub const MODELS: [&str; 5] = ["qwen2", "qwen2.5-sharded", "qwen3", "qwen3-bf16", "llama3"];

/// Max abs log-prob difference allowed against transformers for f32 weights (the bound).
pub const F32_TOLERANCE: f32 = 1e-4;

/// The same for bf16 weights. Both sides round every activation to bf16 (8 significant bits),
/// so a one-ulp difference in a hidden state early on moves a log-prob by about 1e-2; on these
/// fixtures transformers' own `sdpa` and `eager` attention differ by up to 9.3e-2 (recorded
/// in each reference as `made_by.sdpa_vs_eager_max_abs_diff`). Cairn must stay within
/// transformers' own spread.
pub const BF16_TOLERANCE: f32 = 0.1;

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fidelity")
}

/// One fixture: the model directory and transformers' outputs on it.
#[derive(Debug)]
pub struct Fixture {
    pub name: &'static str,
    pub dir: PathBuf,
    pub reference: Reference,
}

impl Fixture {
    pub fn load(name: &'static str) -> Fixture {
        let root = fixtures_dir();
        let path = root.join("reference").join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run scripts/fidelity/make_fixtures.py)",
                path.display()
            )
        });
        let reference: Reference =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(reference.model, name, "{}", path.display());
        Fixture {
            name,
            dir: root.join("models").join(name),
            reference,
        }
    }

    pub fn all() -> Vec<Fixture> {
        MODELS.into_iter().map(Fixture::load).collect()
    }

    /// The log-prob tolerance for this fixture's dtype.
    pub fn tolerance(&self) -> f32 {
        match self.reference.dtype.as_str() {
            "float32" => F32_TOLERANCE,
            "bfloat16" => BF16_TOLERANCE,
            other => panic!("{}: unknown dtype {other}", self.name),
        }
    }

    /// A backend on `device` loaded from the directory, in the checkpoint's dtype (as `cairn
    /// logprobs` and a pretrained pipeline load it).
    pub fn backend(&self, device: Device) -> TorchBackend {
        let config = BackendConfig {
            model: ModelSource::Pretrained {
                dir: self.dir.clone(),
            },
            device: match device {
                Device::Cpu => DeviceOption::Cpu,
                _ => DeviceOption::Cuda,
            },
            dtype: None,
            seed: 0,
            threads: None,
            optimizer: OptimizerSettings::default(),
            warmup_steps: 0,
            score_batch_size: 32,
        };
        TorchBackend::new(&config).unwrap_or_else(|e| panic!("{}: {e}", self.dir.display()))
    }
}

/// CPU, and the first CUDA device when libtorch sees one (CI has none; a GPU machine runs both).
pub fn devices() -> Vec<Device> {
    let mut devices = vec![Device::Cpu];
    if tch::Cuda::is_available() {
        devices.push(Device::Cuda(0));
    }
    devices
}

/// `reference/<model>.json`.
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub model: String,
    /// `float32` or `bfloat16`.
    pub dtype: String,
    /// Unpadded sequences, one forward each.
    pub single: Vec<ScoredSequence>,
    pub chat: Chat,
    pub batch: Batch,
    pub kv_decode: KvDecode,
    pub greedy: Greedy,
}

#[derive(Debug, Deserialize)]
pub struct ScoredSequence {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub temperature: f32,
    /// `log_softmax(logits / temperature)` at each response token.
    pub logprobs: Vec<f32>,
}

impl ScoredSequence {
    pub fn sequence(&self) -> Sequence {
        Sequence {
            prompt_ids: self.prompt_ids.clone(),
            response_ids: self.response_ids.clone(),
        }
    }
}

/// A conversation rendered by `apply_chat_template` and tokenized by `AutoTokenizer`.
#[derive(Debug, Deserialize)]
pub struct Chat {
    pub messages: Vec<serde_json::Value>,
    pub add_generation_prompt: bool,
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
    /// The assistant reply and its end-of-turn token.
    pub response_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// Sequences scored as one left-padded batch (temperature 1).
#[derive(Debug, Deserialize)]
pub struct Batch {
    pub sequences: Vec<Pair>,
    pub logprobs: Vec<Vec<f32>>,
}

impl Batch {
    pub fn sequences(&self) -> Vec<Sequence> {
        self.sequences
            .iter()
            .map(|p| Sequence {
                prompt_ids: p.prompt_ids.clone(),
                response_ids: p.response_ids.clone(),
            })
            .collect()
    }
}

/// A `{prompt_ids, response_ids}` entry, the JSON form `cairn logprobs` reads.
#[derive(Debug, Deserialize)]
pub struct Pair {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

/// Left-padded prompts prefilled into a `DynamicCache`, then teacher-forced one token per step.
#[derive(Debug, Deserialize)]
pub struct KvDecode {
    pub prompts: Vec<Vec<u32>>,
    /// Same length for every row.
    pub continuations: Vec<Vec<u32>>,
    /// `[row][step]`: log-prob of `continuations[row][step]` given everything before it.
    pub logprobs: Vec<Vec<f32>>,
}

/// `generate(do_sample=False, max_new_tokens=32)` on a left-padded batch, no stop ids.
#[derive(Debug, Deserialize)]
pub struct Greedy {
    pub prompts: Vec<Vec<u32>>,
    pub max_new_tokens: u32,
    pub ids: Vec<Vec<u32>>,
    /// `log_softmax(logits)` at each chosen id.
    pub logprobs: Vec<Vec<f32>>,
    /// Smallest gap between the best and second-best logit over all steps.
    pub min_top2_margin: f64,
}

/// The larger of two differences, NaN if either is (`f32::max` would drop a NaN, and a NaN
/// log-prob must fail a comparison, not pass it).
pub fn worst(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Max abs difference of two equally long lists; NaN if any entry is NaN.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, worst)
}

pub fn max_abs_diff_rows(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "row count mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| max_abs_diff(x, y))
        .fold(0.0, worst)
}

/// Whether `diff` (from [`max_abs_diff`]) is within `tolerance`; false for NaN.
pub fn within(diff: f32, tolerance: f32) -> bool {
    diff <= tolerance
}
