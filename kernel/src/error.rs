//! The kernel's error type.

use std::path::{Path, PathBuf};

use cairn_plugin_sdk::PluginError;

/// Everything that can go wrong in the kernel. Each variant names the file, key or plugin
/// involved, so the message tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another process holds the run directory's lock.
    #[error(
        "run directory {} is in use by another process (pid {holder}): two runs in one \
         directory would interleave its metrics and checkpoints; wait for it to finish, or give \
         this run another --run-dir",
        dir.display()
    )]
    RunLocked { dir: PathBuf, holder: String },

    /// The run was stopped by a signal (SIGINT, SIGTERM) at a step boundary; `message` says
    /// where it stopped and that the same command resumes it.
    #[error("{message}")]
    Interrupted { message: String },
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
    Load(#[from] cairn_plugin_sdk::host::foreign::LoadError),

    #[error("no {kind} plugin named `{name}` in {dirs}; available: {available}. Build it (cargo build -p cairn-{name}) or add its directory to `plugins.dirs`")]
    MissingPlugin {
        kind: &'static str,
        name: String,
        dirs: String,
        available: String,
    },

    /// A plugin of the other kind has the name (an environment named as an algorithm).
    #[error("`{name}` is an {is} plugin, not an {wanted} plugin: name it where an {is} goes (`[environment]` for an environment, `[algorithm]` or `[[algorithm.stack]]` for an algorithm)")]
    WrongPluginKind {
        name: String,
        is: &'static str,
        wanted: &'static str,
    },

    /// Displayed as the plugin error itself (and not also as its source), so a chain printed
    /// with `{:#}` says it once.
    #[error(transparent)]
    Plugin(#[from] PluginError),

    /// An algorithm plugin needs a host service (`Requirements` flag `flag`) that this host
    /// does not offer (`config::check_services`).
    #[error("algorithm `{plugin}` sets `requirements.{flag}` (it calls {need}), but {host} offers no such service; run it in a training pipeline (`cairn train`) with a policy model, or turn that part of the plugin off")]
    UnmetRequirement {
        plugin: String,
        flag: &'static str,
        need: &'static str,
        host: &'static str,
    },

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

    #[error("{what}: {detail}")]
    Shape { what: &'static str, detail: String },

    /// The skill creator holds `skills.queue` reflections already (queued or in flight).
    #[error("skill creator: {pending} reflections are queued or in flight and {asked} more were asked for, but `skills.queue` is {capacity}; ask again at a later step, or raise `skills.queue`")]
    ReflectionQueueFull {
        pending: usize,
        asked: usize,
        capacity: usize,
    },

    /// A plugin call that gave no reply within its deadline (`key` sets it). The call is
    /// abandoned, still running on its own thread, and the run stops: the plugin's state
    /// cannot be trusted after it.
    #[error("the {actor} actor: {plugin} gave no reply to `{call}` ({context}) within {seconds} s (`{key}`); the call was abandoned and the run stops, since the plugin's state cannot be trusted after it. Fix the plugin (or raise `{key}` if the call is only slow) and run the same command: it resumes from the last checkpoint")]
    PluginHang {
        /// `rollout` or `optimizer`.
        actor: &'static str,
        /// The plugin, as "algorithm `name`" or "environment `name`".
        plugin: String,
        /// The plugin method (`plan_group`, `signals`, ...).
        call: &'static str,
        /// The step, group, task or trajectory the call was for.
        context: String,
        seconds: f64,
        key: &'static str,
    },

    /// The algorithm's `signals` failed at an RL step (an error or a caught panic); the
    /// weights are untouched, since the update did not run. The trainer checkpoints the last
    /// good step and stops with it.
    #[error("RL step {step}: the algorithm's signals failed: {error}")]
    Signals { step: u64, error: PluginError },

    #[error("actor mailbox: {0}")]
    Mailbox(String),

    /// The external rollout engine at `url` failed or answered something unusable
    /// (`[rollout.engine]`, docs/engine.md). In a rollout it fails the turn's episodes (kind
    /// `engine`), and the run goes on.
    #[error("rollout engine {url}: {message}")]
    Engine { url: String, message: String },

    #[error("{0}")]
    Other(String),
    /// The experience bank or the data pool ([`cairn_stores`]).
    #[error(transparent)]
    Store(#[from] cairn_stores::Error),
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
