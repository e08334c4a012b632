//! The kernel's error type.

use std::path::{Path, PathBuf};

use cairn_plugin_sdk::PluginError;

/// Everything that can go wrong in the kernel. Each variant names the file, key or plugin
/// involved, so the message tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The I/O error is part of the message, not a `source` (callers print chains with `{:#}`
    // and would show it twice).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// A pipeline config that does not parse or validate. `key` is the dotted key path.
    #[error("{file}: {message}")]
    Config { file: String, message: String },

    #[error(transparent)]
    Load(#[from] cairn_plugin_sdk::foreign::LoadError),

    #[error("no {kind} plugin named `{name}` in {dirs}; available: {available}. Build it (cargo build -p cairn-{name}) or add its directory to `plugins.dirs`")]
    MissingPlugin {
        kind: &'static str,
        name: String,
        dirs: String,
        available: String,
    },

    #[error("{0}")]
    Plugin(#[from] PluginError),

    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },

    #[error("model: {0}")]
    Model(String),

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// A required file (a model directory's `tokenizer.json`, ...) that is absent or unreadable.
    #[error("{path} not found: {error}")]
    FileNotFound {
        path: PathBuf,
        error: std::io::Error,
    },

    /// A file that exists but does not parse, or lacks or contradicts a required entry.
    #[error("{path}: {detail}")]
    BadFile { path: PathBuf, detail: String },

    /// A chat template that fails to compile or render. `line` is the template line, when known;
    /// `detail` is the Jinja error.
    #[error("chat template `{name}`{}: {detail}", line_suffix(.line))]
    Template {
        name: String,
        line: Option<usize>,
        detail: String,
    },

    /// Misuse of a multi-turn token trace (e.g. an observation with no sampled turn before it).
    #[error("token trace: {0}")]
    Trace(String),

    #[error("{what}: {detail}")]
    Shape { what: &'static str, detail: String },

    #[error("actor mailbox: {0}")]
    Mailbox(String),

    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            error: source,
        }
    }
}

impl From<actix::MailboxError> for Error {
    fn from(e: actix::MailboxError) -> Self {
        Error::Mailbox(e.to_string())
    }
}

fn line_suffix(line: &Option<usize>) -> String {
    line.map(|line| format!(", line {line}"))
        .unwrap_or_default()
}

/// `Result` with the kernel's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
