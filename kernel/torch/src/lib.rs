//! `cairn-torch`: Cairn's policy backend on libtorch (through `tch`), CPU or CUDA.
//!
//! [`TorchBackend`] implements the kernel's
//! [`PolicyBackend`](cairn_kernel::backend::PolicyBackend): batched sampling with a KV cache,
//! scoring, token-loss training with AdamW, reference snapshots and resumable checkpoints. It
//! is built from a [`BackendConfig`] by the host (the `cairn` binary), which runs it on the
//! policy actor's `SyncArbiter` thread. This crate and the host are the only ones that name
//! tch types; nothing tch-typed crosses the `PolicyBackend` seam.
//!
//! Main pieces:
//! - [`model`]: the decoder-only transformer ([`model::CausalLm`], Qwen3/Qwen2/Llama 3 by
//!   `config.json`), its KV cache and seeded init.
//! - [`weights`]: HF safetensors loading (single or sharded, strict) and writing;
//!   [`export`]: a servable HF model directory (weights, config, tokenizer files,
//!   `generation_config.json`).
//! - [`sampling`]: batched generation; [`logprobs`]: response log-probs for score and train.
//! - [`optim`]: AdamW with clipping and warmup; [`checkpoint`]: full checkpoint directories.
//! - [`cpu`]: the CPU class (MKL's branch, ATen's capability) a CPU run reproduces on.
//!
//! Every test, example and binary that links this crate needs libtorch at run time; the
//! crate's `build.rs` (logic in `build/link_libtorch.rs`, shared with the host) gives them an
//! rpath, so no `LD_LIBRARY_PATH` is needed.

pub mod backend;
mod batch;
pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod error;
pub mod export;
pub mod logprobs;
pub mod model;
pub mod optim;
pub mod sampling;
pub mod weights;

pub use backend::TorchBackend;
pub use config::{BackendConfig, DeviceOption, ModelSource};
pub use cpu::CpuClass;
pub use error::{Error, Result};
pub use model::{CausalLm, Dtype, KvCache, ModelConfig};
/// The tch version this crate is built against, for the host's device and thread set-up.
pub use tch;
