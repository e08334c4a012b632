//! The error type of `cairn-torch`.
//!
//! Every variant names the file, tensor or input involved, so the message alone tells the user
//! what to fix. [`Error`] converts into [`cairn_kernel::Error`] at the [`PolicyBackend`] seam
//! (see `impl From<Error> for cairn_kernel::Error` below).
//!
//! [`PolicyBackend`]: cairn_kernel::backend::PolicyBackend

use std::fmt;
use std::path::{Path, PathBuf};

/// One tensor whose shape in a file differs from what the model expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// HF tensor name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub expected: Vec<i64>,
    pub found: Vec<i64>,
    /// The file the tensor was read from.
    pub file: PathBuf,
}

impl fmt::Display for ShapeMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` in {}: expected shape {:?}, found {:?}",
            self.name,
            self.file.display(),
            self.expected,
            self.found
        )
    }
}

/// What to do about a [`Error::Checkpoint`].
const CHECKPOINT_HINT: &str = "it was not written by this version of cairn-torch, or the save was \
interrupted: resume from an earlier checkpoint";

/// Everything that can go wrong in the tch backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },

    /// `model_type` in a `config.json` that this crate has no model for.
    #[error("{path}: unsupported model_type `{model_type}`; supported: qwen3, qwen2, llama")]
    UnsupportedModelType { path: PathBuf, model_type: String },

    /// A model config key with a missing, invalid or unsupported value.
    #[error("{path}: `{key}`: {reason}")]
    Config {
        path: PathBuf,
        key: String,
        reason: String,
    },

    /// A model directory without `model.safetensors` or `model.safetensors.index.json`.
    #[error("{dir}: no model.safetensors or model.safetensors.index.json; export the model in safetensors format (save_pretrained(..., safe_serialization=True))")]
    NoWeights { dir: PathBuf },

    /// Shards named by `model.safetensors.index.json` that are not on disk.
    #[error("{index}: shard file(s) {} (holding {tensors} tensors) missing from the directory; the download is incomplete: fetch them again", shards.join(", "))]
    MissingShards {
        index: PathBuf,
        shards: Vec<String>,
        tensors: usize,
    },

    /// A file that exists but is not what it should be (e.g. not a safetensors file).
    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },

    /// Model parameters with no tensor in the weight files. Never filled with random values.
    #[error("{} tensor(s) missing from {source_desc}: {}; the files are incomplete or belong to a different model (check config.json against the weights)", names.len(), names.join(", "))]
    MissingTensors {
        source_desc: String,
        names: Vec<String>,
    },

    /// Tensors whose shapes differ from the model built from `config.json`.
    #[error("{} tensor(s) with the wrong shape: {}; the weights were written for a different config (hidden size, heads, vocab?): load them with their own config.json", mismatches.len(), mismatches.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    ShapeMismatch { mismatches: Vec<ShapeMismatch> },

    #[error("{path}: safetensors: {source}")]
    Safetensors {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },

    /// A tensor dtype this crate cannot load (only float weights are supported).
    #[error("{path}: tensor `{name}` has dtype {dtype}; model weights must be F32, F16 or BF16")]
    UnsupportedDtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },

    /// A tokenizer that can produce ids the model has no embedding row for.
    #[error("{dir}: the tokenizer has {tokenizer_vocab} ids but the model has {model_vocab} embedding rows; export the model with the tokenizer it was trained with")]
    TokenizerMismatch {
        dir: PathBuf,
        tokenizer_vocab: usize,
        model_vocab: usize,
    },

    /// A model directory whose `tokenizer.json` can produce ids at or past the embedding's
    /// rows (`vocab_size` of its `config.json`): refused at load, before any compute.
    #[error("{tokenizer}: the tokenizer's ids go up to {max_id} ({tokenizer_ids} ids), but {config} gives the model {model_vocab} embedding rows (`vocab_size`); the tokenizer belongs to a different model: put the model's own tokenizer files in the directory")]
    TokenizerExceedsEmbedding {
        tokenizer: PathBuf,
        config: PathBuf,
        /// The largest id of the vocabulary, added tokens included.
        max_id: u32,
        tokenizer_ids: usize,
        model_vocab: usize,
    },

    /// A checkpoint file that exists but does not hold what [`crate::checkpoint`] writes.
    #[error("checkpoint {path}: {reason}; {CHECKPOINT_HINT}")]
    Checkpoint { path: PathBuf, reason: String },

    /// The requested device cannot be used.
    #[error("device `{requested}`: {reason}")]
    Device { requested: String, reason: String },

    /// Bad arguments to generate, score or train: empty prompts, ids outside the vocabulary,
    /// invalid temperature, micro-batches that do not cover the batch.
    #[error("{what}: {detail}")]
    Input { what: &'static str, detail: String },

    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),

    /// An error returned by the kernel side, e.g. by a [`cairn_kernel::loss::TokenLoss`].
    #[error(transparent)]
    Kernel(#[from] cairn_kernel::Error),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn input(what: &'static str, detail: impl Into<String>) -> Self {
        Error::Input {
            what,
            detail: detail.into(),
        }
    }
}

impl From<Error> for cairn_kernel::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io { path, source } => cairn_kernel::Error::Io {
                path,
                error: source,
            },
            Error::Kernel(e) => e,
            Error::Checkpoint { path, reason } => cairn_kernel::Error::Checkpoint {
                path,
                reason: format!("{reason}; {CHECKPOINT_HINT}"),
            },
            Error::Input { what, detail } => cairn_kernel::Error::Shape { what, detail },
            other => cairn_kernel::Error::Model(other.to_string()),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
