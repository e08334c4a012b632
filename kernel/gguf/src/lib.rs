//! `cairn-gguf`: imports a llama.cpp GGUF file as a Hugging Face model directory that
//! transformers and Cairn (`cairn-torch`) load.
//!
//! - [`gguf`]: the GGUF reader (the format's spec is its doc comment): header, metadata,
//!   tensor infos, tensor data ranges.
//! - [`dequant`]: the tensor types read (F32, F16, BF16, Q8_0, Q4_0, Q4_1) and their
//!   dequantization to `f32`.
//! - [`llama`]: the `llama` architecture's hyper-parameters, Hugging Face tensor names and the
//!   undoing of llama.cpp's q/k row permutation.
//! - [`tokenizer`]: `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`
//!   from the `tokenizer.*` metadata (byte-level BPE).
//! - [`import_gguf`] puts them together and writes the directory.
//!
//! Caller: the `cairn import gguf FILE OUT_DIR` command (`hosts/cairn/src/import.rs`); tests of
//! `cairn-torch` import the real GGUF into temporary directories. No libtorch here.

pub mod dequant;
mod error;
pub mod gguf;
mod import;
pub mod llama;
pub mod tokenizer;

pub use error::{GgufError, Part, Result};
pub use import::{
    import_gguf, import_gguf_with_progress, ImportOptions, ImportReport, OutDtype, TensorProgress,
};
