//! The pre-flight memory estimate: what a pipeline's model and batch sizes need on the training
//! device, so that `cairn check` (and `cairn train` before it allocates anything) refuses a
//! config that cannot fit, with the numbers, instead of panicking or aborting in an allocation.
//!
//! [`MemoryEstimate::of`] adds up, in bytes (as `f64`, so absurd sizes such as 10¹² rows do not
//! overflow):
//! - the policy weights, its frozen reference copy (the backend always keeps one), the
//!   gradients (all in the model dtype) and the AdamW moments (two f32 copies);
//! - the larger of the two phases that do not overlap: training one micro-batch (stored
//!   activations and f32 logits with their log-softmax) and sampling a step (every episode of
//!   the step is decoded in one batch, with a key/value cache of the whole window, and the f32
//!   logits of a scoring batch);
//! - the episodes' token data on the host (ids, log-probs, masks, advantages).
//!
//! The sequence length is the tokens the policy may write in one episode
//! (`max_turns × max_new_tokens`, at most the context window): prompts are unknown before the
//! run, so the estimate is a floor for long prompts, not a ceiling. Activations use a
//! per-token, per-layer count of the tensors a decoder layer keeps for the backward pass
//! (`10 · hidden + 4 · intermediate + 2 · heads · length` values; Korthikanti et al. 2022
//! count about the same for a transformer layer without recomputation).
//!
//! The host supplies the model's dimensions ([`ModelShape`]) and the device's memory; see
//! `hosts/cairn/src/setup.rs`.

use crate::config::PipelineConfig;

/// 2³⁰ bytes.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The dimensions of a decoder-only model that set its memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// The output projection shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Positions the model takes (`max_position_embeddings`).
    pub context_window: usize,
    /// Bytes per weight value: 4 for f32, 2 for bf16.
    pub dtype_bytes: usize,
}

impl ModelShape {
    /// Parameters: embeddings (twice when untied), per layer the attention projections
    /// (q, k, v, o), the SwiGLU MLP (gate, up, down) and its norms, and the final norm.
    pub fn parameters(&self) -> f64 {
        let f = |x: usize| x as f64;
        let (h, kv, q) = (
            f(self.hidden_size),
            f(self.num_key_value_heads * self.head_dim),
            f(self.num_attention_heads) * f(self.head_dim),
        );
        let embeddings = f(self.vocab_size) * h * if self.tie_word_embeddings { 1.0 } else { 2.0 };
        let attention = h * q + 2.0 * h * kv + q * h + 2.0 * f(self.head_dim);
        let mlp = 3.0 * h * f(self.intermediate_size);
        let norms = 2.0 * h;
        embeddings + f(self.num_hidden_layers) * (attention + mlp + norms) + h
    }
}

/// What a pipeline needs, in bytes, by part.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryEstimate {
    /// Parameters of the policy (a count, not bytes).
    pub parameters: f64,
    /// The policy's weights.
    pub weights: f64,
    /// The frozen reference copy.
    pub reference: f64,
    /// Gradients and the AdamW moments.
    pub optimizer: f64,
    /// Training one micro-batch: activations and f32 logits.
    pub training: f64,
    /// Sampling one step: the key/value cache of every episode and a scoring batch's logits
    /// (0 with an external rollout engine, which samples elsewhere).
    pub sampling: f64,
    /// The step's episodes as token data on the host.
    pub episodes: f64,
}

/// Bytes of host data per token of a row: id (u32), sampled and scored log-probs (2 × f32),
/// advantage (f32) and mask (u8), rounded up.
const HOST_BYTES_PER_TOKEN: f64 = 20.0;

/// Rows of one scoring forward pass (the backend's `score_batch_size`).
const SCORE_ROWS: f64 = 64.0;

impl MemoryEstimate {
    /// The estimate for `config` with a model of `shape`.
    pub fn of(config: &PipelineConfig, shape: &ModelShape) -> MemoryEstimate {
        let f = |x: usize| x as f64;
        let r = &config.rollout;
        let b = f(shape.dtype_bytes);
        let parameters = shape.parameters();
        let weights = parameters * b;
        let optimizer = parameters * b + 2.0 * parameters * 4.0;
        let length = (f64::from(r.max_turns) * f64::from(r.max_new_tokens))
            .min(f(shape.context_window))
            .max(1.0);
        let rows = f(r.tasks_per_step) * f(r.group_size);
        let micro = f(config.optimizer.micro_batch_rows).min(rows);
        let (h, layers, vocab) = (
            f(shape.hidden_size),
            f(shape.num_hidden_layers),
            f(shape.vocab_size),
        );
        let per_token_layer = 10.0 * h
            + 4.0 * f(shape.intermediate_size)
            + 2.0 * f(shape.num_attention_heads) * length;
        // Logits, their log-softmax and its gradient, in f32.
        let logits = |rows: f64| rows * length * vocab * 4.0 * 3.0;
        let training = micro * length * layers * per_token_layer * b + logits(micro);
        let sampling = if r.engine.is_some() {
            0.0
        } else {
            let kv = rows * layers * 2.0 * f(shape.num_key_value_heads * shape.head_dim) * length;
            kv * b + logits(SCORE_ROWS.min(rows))
        };
        MemoryEstimate {
            parameters,
            weights,
            reference: weights,
            optimizer,
            training,
            sampling,
            episodes: rows * length * HOST_BYTES_PER_TOKEN,
        }
    }

    /// Bytes on the training device: the model's state and the larger phase.
    pub fn device(&self) -> f64 {
        self.weights + self.reference + self.optimizer + self.training.max(self.sampling)
    }

    /// Bytes on the host when the device is not the host (the episodes).
    pub fn host(&self) -> f64 {
        self.episodes
    }

    /// The config key to change first when `limit` bytes are too few: the model when its
    /// state alone exceeds them, else the batch part that dominates.
    pub fn key(&self, config: &PipelineConfig, limit: f64) -> &'static str {
        let state = self.weights + self.reference + self.optimizer;
        let model = if config.model.path.is_some() {
            "model.path"
        } else {
            "model.scratch"
        };
        if state > limit || state >= self.training.max(self.sampling).max(self.episodes) {
            model
        } else if self.training >= self.sampling.max(self.episodes) {
            "optimizer.micro_batch_rows"
        } else {
            "rollout.tasks_per_step"
        }
    }

    /// "~X GiB: parameters …" — the parts, for error messages.
    pub fn describe(&self, on_host: bool) -> String {
        let gib = |bytes: f64| format_gib(bytes);
        let total = if on_host {
            self.device() + self.host()
        } else {
            self.device()
        };
        let mut text = format!(
            "~{} ({:.3e} parameters: weights {}, reference copy {}, gradients and AdamW state {}; \
             training a micro-batch {}; sampling a step {}",
            gib(total),
            self.parameters,
            gib(self.weights),
            gib(self.reference),
            gib(self.optimizer),
            gib(self.training),
            gib(self.sampling),
        );
        if on_host {
            text.push_str(&format!("; episode data {}", gib(self.episodes)));
        }
        text.push(')');
        text
    }
}

/// `bytes` in GiB, with enough digits for small and absurd sizes alike.
pub fn format_gib(bytes: f64) -> String {
    let g = bytes / GIB;
    if g >= 1e6 {
        format!("{g:.2e} GiB")
    } else if g >= 10.0 {
        format!("{g:.0} GiB")
    } else if g >= 0.01 {
        format!("{g:.2} GiB")
    } else {
        format!("{g:.2e} GiB")
    }
}

/// Where the model trains, and how much memory there is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceMemory {
    /// Bytes of the training device (`None`: unknown, not compared).
    pub device: Option<f64>,
    /// Bytes of host RAM (`None`: unknown, not compared).
    pub host: Option<f64>,
    /// The device is the host (`cpu`): the episodes count against the same memory.
    pub device_is_host: bool,
}

impl PipelineConfig {
    /// Refuses a config whose [`MemoryEstimate`] exceeds `memory`, naming the key to change
    /// and every part of the estimate. `model.memory_gib`, when set, replaces the device's
    /// size.
    pub fn check_memory(&self, shape: &ModelShape, memory: &DeviceMemory) -> crate::Result<()> {
        let estimate = MemoryEstimate::of(self, shape);
        let (device_bytes, device_name) = match self.model.memory_gib {
            Some(gib) => (Some(gib * GIB), "`model.memory_gib` allows"),
            None if memory.device_is_host => (memory.device, "this machine has"),
            None => (memory.device, "the device has"),
        };
        let needed = if memory.device_is_host {
            estimate.device() + estimate.host()
        } else {
            estimate.device()
        };
        let fix = "make the model or the batch smaller (`rollout.tasks_per_step`, \
                   `rollout.group_size`, `optimizer.micro_batch_rows`), or set `model.memory_gib` \
                   if the device has more memory than detected";
        if let Some(limit) = device_bytes {
            if needed > limit {
                return Err(self.error(
                    estimate.key(self, limit),
                    format!(
                        "the model and batch need {}; {device_name} {}; {fix}",
                        estimate.describe(memory.device_is_host),
                        format_gib(limit)
                    ),
                ));
            }
        }
        if let (false, Some(host)) = (memory.device_is_host, memory.host) {
            if estimate.host() > host {
                return Err(self.error(
                    "rollout.tasks_per_step",
                    format!(
                        "a step's episodes need ~{} of host memory; this machine has {}; {fix}",
                        format_gib(estimate.host()),
                        format_gib(host)
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;

    fn shape(hidden: usize, layers: usize) -> ModelShape {
        ModelShape {
            vocab_size: 1000,
            hidden_size: hidden,
            intermediate_size: 2 * hidden,
            num_hidden_layers: layers,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: hidden / 2,
            tie_word_embeddings: true,
            context_window: 1024,
            dtype_bytes: 4,
        }
    }

    const CPU_8_GIB: DeviceMemory = DeviceMemory {
        device: Some(8.0 * GIB),
        host: Some(8.0 * GIB),
        device_is_host: true,
    };

    fn config(text: &str) -> PipelineConfig {
        PipelineConfig::parse(text, "test.toml").unwrap()
    }

    #[test]
    fn parameters_count_every_matrix() {
        // hidden 32, 1 layer, 2 heads of 16, 1 kv head, mlp 64, vocab 1000, tied:
        // embed 32000; q 1024 + k,v 2·512 + o 1024 + q/k norms 32; mlp 6144; norms 64; final 32.
        let s = shape(32, 1);
        assert_eq!(
            s.parameters(),
            32000.0 + 1024.0 + 1024.0 + 1024.0 + 32.0 + 6144.0 + 64.0 + 32.0
        );
        let untied = ModelShape {
            tie_word_embeddings: false,
            ..s
        };
        assert_eq!(untied.parameters() - s.parameters(), 32000.0);
    }

    #[test]
    fn a_small_model_fits_and_an_absurd_one_is_refused_with_the_numbers() {
        let c = config(MINIMAL);
        assert!(c.check_memory(&shape(32, 1), &CPU_8_GIB).is_ok());
        let e = c
            .check_memory(&shape(1_000_000_000_000, 1), &CPU_8_GIB)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `model.scratch`, line 15")
                && e.contains("weights ")
                && e.contains("gradients and AdamW state")
                && e.contains("this machine has 8.00 GiB"),
            "{e}"
        );
        let e = c
            .check_memory(&shape(32, 100_000_000), &CPU_8_GIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `model.scratch`"), "{e}");
    }

    #[test]
    fn absurd_batches_name_the_batch_key() {
        let rows = config(&MINIMAL.replace("tasks_per_step = 2", "tasks_per_step = 1000000000000"));
        let e = rows
            .check_memory(&shape(32, 1), &CPU_8_GIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `rollout.tasks_per_step`"), "{e}");
        let e = config(&MINIMAL.replace("group_size = 4", "group_size = 1000000000000"))
            .check_memory(&shape(32, 1), &CPU_8_GIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `rollout.tasks_per_step`"), "{e}");
        // On a GPU whose size is unknown the episodes still count against the host's RAM.
        let gpu = DeviceMemory {
            device: None,
            host: Some(8.0 * GIB),
            device_is_host: false,
        };
        let e = rows
            .check_memory(&shape(32, 1), &gpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("of host memory"), "{e}");
        assert!(config(MINIMAL).check_memory(&shape(32, 1), &gpu).is_ok());
    }

    #[test]
    fn memory_gib_replaces_the_detected_size() {
        let c = config(&MINIMAL.replace("[model]\n", "[model]\nmemory_gib = 0.0001\n"));
        let e = c
            .check_memory(&shape(32, 1), &CPU_8_GIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`model.memory_gib` allows 1.00e-4 GiB"), "{e}");
        let unknown = DeviceMemory {
            device: None,
            host: None,
            device_is_host: false,
        };
        assert!(c.check_memory(&shape(32, 1), &unknown).is_err());
        assert!(config(MINIMAL)
            .check_memory(&shape(32, 1), &unknown)
            .is_ok());
    }

    #[test]
    fn an_external_engine_takes_the_sampling_off_the_device() {
        let s = shape(32, 1);
        let own = MemoryEstimate::of(&config(MINIMAL), &s);
        assert!(own.sampling > 0.0);
        let text = MINIMAL.replace(
            "max_turns = 8\n\n[optimizer]",
            "max_turns = 8\n\n[rollout.engine]\nkind = \"vllm\"\nbase_urls = [\"http://127.0.0.1:8000\"]\n\n[optimizer]",
        );
        assert_eq!(MemoryEstimate::of(&config(&text), &s).sampling, 0.0);
    }
}
