//! The stores' error type: every variant names the file and says what to do.

use std::path::{Path, PathBuf};

/// Everything that can go wrong in the experience bank or the data pool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The I/O error is part of the message, not a `source` (callers print chains with `{:#}`
    // and would show it twice).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// A store file that does not exist, where one must.
    #[error("{path} not found: {error}")]
    FileNotFound {
        path: PathBuf,
        error: std::io::Error,
    },

    /// An experience bank file that is not a readable bank (not SQLite, damaged, or another
    /// program's database). The bank never writes to such a file.
    #[error("{path}: not a readable experience bank ({detail}); the file was left as it is: move it aside to start an empty bank, or copy a checkpoint's `bank.sqlite` in its place")]
    BankCorrupt { path: PathBuf, detail: String },

    /// Another connection holds the bank's write lock for longer than the busy timeout.
    #[error("{path}: the experience bank is locked by another connection ({detail}); stop the other process using it (another `cairn train` on this run directory?), or give this run its own run directory")]
    BankLocked { path: PathBuf, detail: String },

    /// A bank written with another schema version.
    #[error("{path}: experience bank schema version {found}, but this cairn reads version {expected}; open it with the cairn that wrote it, or move it aside to start an empty bank")]
    BankSchema {
        path: PathBuf,
        found: String,
        expected: u32,
    },

    /// A bank request naming an entry the bank does not hold; nothing was changed.
    #[error("{path}: no entry {id} in the experience bank; nothing was changed")]
    BankNoEntry { path: PathBuf, id: u64 },

    /// A bank request with an invalid value (`what` names it); nothing was changed.
    #[error("{path}: {what}: {detail}; nothing was changed")]
    BankInvalid {
        path: PathBuf,
        what: String,
        detail: String,
    },

    /// Any other failure of the bank's SQLite database (`doing` says what it was doing).
    #[error("{path}: experience bank, {doing}: {detail}")]
    Bank {
        path: PathBuf,
        doing: &'static str,
        detail: String,
    },

    /// A run directory without a data pool (`<run>/pool.sqlite`), for a command that reads one.
    #[error("no data pool in {} (no pool.sqlite): the run was not trained yet, or by a cairn from before the data pool; run `cairn train` on it first (the pool is written as it trains)", run.display())]
    NoPool { run: PathBuf },
    /// A path given as a run directory that does not exist or is not a directory.
    #[error("{}: {what}; give a run directory (the config's `run.dir`, e.g. runs/household-grpo)", run.display())]
    NotARunDir {
        run: PathBuf,
        /// `no such directory` or `not a directory`.
        what: &'static str,
    },

    /// A data-pool file written with another schema version.
    #[error("{path}: data pool schema version {found}, but this cairn reads version {expected}; open it with the cairn that wrote it, or move it aside (a new run starts an empty pool)")]
    PoolSchema {
        path: PathBuf,
        found: String,
        expected: u32,
    },

    /// Any other failure of the data pool's SQLite database (`doing` says what it was doing).
    #[error("{path}: data pool, {doing}: {detail}")]
    Pool {
        path: PathBuf,
        doing: &'static str,
        detail: String,
    },
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            error: source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
