//! The transformer: a config-driven decoder-only LM in the Qwen3 layout.
//!
//! One concept per file, after candle-nn: [`config`] (HF `config.json`), [`linear`],
//! [`rms_norm`], [`rotary`] (RoPE), [`mask`] (padding-aware causal masks), [`attention`]
//! (GQA), [`mlp`] (SwiGLU), [`kv_cache`], [`init`] (seeded fresh weights), [`packed`] (bf16
//! projections through oneDNN with weights packed once per generation pass), `row_decode` (a
//! one-row bf16 decode step on the CPU written out in Rust) and [`decoder`]
//! ([`CausalLm`], the model). Numerics follow transformers op for op, so log-probs match
//! `AutoModelForCausalLM` to float tolerance. Without grad (sampling, scoring, the gateway)
//! [`CausalLm::hidden_states`] takes a leaner path: RoPE tables shaped once, SDPA's own GQA
//! instead of copying K/V per layer, an additive mask made once, fused RMSNorm and in-place
//! elementwise ops. Its values equal the training path's bit for bit (a test checks every
//! layout in f32 and bf16), so rollout log-probs stay those the trainer recomputes. Callers: [`crate::backend::TorchBackend`], and
//! tests that need a bare forward.

pub mod attention;
pub mod config;
pub mod decoder;
pub mod init;
pub mod kv_cache;
pub mod linear;
pub mod mask;
pub mod mlp;
pub mod packed;
pub mod rms_norm;
pub mod rotary;
pub(crate) mod row_decode;

pub use config::{Dtype, ModelConfig, ModelType, RopeScaling};
pub use decoder::CausalLm;
pub use kv_cache::KvCache;
pub use packed::{Packed, PackedWeights};
