//! The one error type of the importer. Every variant names the file, and the key, tensor or
//! directory at fault, and says what to do where there is something to do.

use std::fmt;
use std::path::PathBuf;

/// `Result` with [`GgufError`].
pub type Result<T> = std::result::Result<T, GgufError>;

/// Where in a GGUF file a read ran out or found something malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Magic, version and the two counts (the first 24 bytes).
    Header,
    /// The key of metadata entry `index` (0-based), before its name is known.
    KeyName { index: u64 },
    /// The value of metadata key `key`.
    Value { key: String },
    /// Tensor info `index` (0-based): name, dims, type and offset.
    TensorInfo { index: u64 },
    /// The data of tensor `name`.
    TensorData { name: String },
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Header => write!(f, "the header"),
            Part::KeyName { index } => write!(f, "metadata entry {index}"),
            Part::Value { key } => write!(f, "metadata key `{key}`"),
            Part::TensorInfo { index } => write!(f, "tensor info {index}"),
            Part::TensorData { name } => write!(f, "tensor `{name}`"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Reading the GGUF or writing the output. (`error`, not `source`: the message already
    /// holds it, and `anyhow`'s `{:#}` would print it twice.)
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    #[error(
        "{}: not a GGUF file: it starts with {found:?}, not the magic \"GGUF\"",
        file.display()
    )]
    BadMagic { file: PathBuf, found: Vec<u8> },

    #[error("{}: GGUF version {version}; supported: 2, 3", file.display())]
    UnsupportedVersion { file: PathBuf, version: u32 },

    #[error(
        "{}: a big-endian GGUF (version {version} byte-swapped); only little-endian files are \
         supported",
        file.display()
    )]
    BigEndian { file: PathBuf, version: u32 },

    #[error(
        "{part} needs bytes {start}..{end} but {} has {len} bytes; the file is truncated, \
         re-download it",
        file.display()
    )]
    Truncated {
        file: PathBuf,
        part: Part,
        start: u64,
        end: u64,
        len: u64,
    },

    #[error("{}: {part}: {reason}", file.display())]
    Malformed {
        file: PathBuf,
        part: Part,
        reason: String,
    },

    #[error("{}: required key `{key}` is missing", file.display())]
    MissingKey { file: PathBuf, key: String },

    #[error("{}: key `{key}` holds {found}, expected {expected}", file.display())]
    KeyType {
        file: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("{}: key `general.architecture` = '{found}', supported: llama", file.display())]
    UnsupportedArchitecture { file: PathBuf, found: String },

    /// A key whose value the importer does not handle (`tokenizer.ggml.pre` = `qwen2`, a RoPE
    /// scaling type, a value out of range).
    #[error("{}: key `{key}` = {value}; supported: {supported}", file.display())]
    UnsupportedValue {
        file: PathBuf,
        key: String,
        value: String,
        supported: String,
    },

    /// A key present in the file that would change the model in a way the import cannot carry.
    #[error("{}: key `{key}` is not supported: {reason}", file.display())]
    UnsupportedKey {
        file: PathBuf,
        key: String,
        reason: String,
    },

    #[error(
        "{}: tensor `{tensor}` has type {type_name}, supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1",
        file.display()
    )]
    UnsupportedTensorType {
        file: PathBuf,
        tensor: String,
        type_name: String,
    },

    #[error("{}: tensor `{tensor}` has no Hugging Face name in the llama mapping", file.display())]
    UnknownTensor { file: PathBuf, tensor: String },

    #[error("{}: tensor `{tensor}` is missing", file.display())]
    MissingTensor { file: PathBuf, tensor: String },

    /// Shapes in ggml order (`ne[0]` first, the fastest-varying dimension).
    #[error(
        "{}: tensor `{tensor}` has dims {found:?} (ggml order), expected {expected:?} from the \
         metadata",
        file.display()
    )]
    TensorShape {
        file: PathBuf,
        tensor: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },

    #[error("{}: tokenizer: {reason}", file.display())]
    Tokenizer { file: PathBuf, reason: String },

    #[error("{} exists and is not empty; pass an empty or new directory", dir.display())]
    OutDirNotEmpty { dir: PathBuf },

    #[error("{} exists and is not a directory; pass an empty or new directory", path.display())]
    OutDirNotADirectory { path: PathBuf },

    #[error(
        "{} exists, left by an interrupted import; delete it and run again",
        dir.display()
    )]
    PartialExists { dir: PathBuf },

    /// The safetensors writer refused the tensors (its I/O errors are [`GgufError::Io`]).
    #[error("{}: {error}", path.display())]
    Safetensors {
        path: PathBuf,
        error: safetensors::SafeTensorError,
    },
}
