//! The kernel's error type.

use std::path::{Path, PathBuf};

use cairn_plugin_sdk::PluginError;

/// Everything that can go wrong in the kernel. Each variant names the file, key or plugin
/// involved, so the message tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    /// A pipeline config that does not parse or validate. `key` is the dotted key path.
    #[error("{file}: {message}")]
    Config { file: String, message: String },

    #[error(transparent)]
    Load(#[from] cairn_plugin_sdk::foreign::LoadError),

    #[error("no {kind} plugin named `{name}` in {dirs}; available: {available}. Build it (cargo build -p cairn-{name}) or add its directory to `plugins.dirs`")]
    MissingPlugin { kind: &'static str, name: String, dirs: String, available: String },

    #[error("{0}")]
    Plugin(#[from] PluginError),

    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },

    #[error("model: {0}")]
    Model(String),

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("{what}: {detail}")]
    Shape { what: &'static str, detail: String },

    #[error("actor mailbox: {0}")]
    Mailbox(String),

    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }
}

/// `Result` with the kernel's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
