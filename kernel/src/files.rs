//! Writing a file so that a crash never leaves half of it: to a temporary name, synced, then
//! renamed into place; with the test hook that makes checkpoint writes fail like a full disk.
//! A leaf module: the run directory, the text exports and the torch backend's checkpoint all
//! write through it.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically (temporary file + rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}tmp",
        path.extension()
            .map(|e| format!("{}.", e.to_string_lossy()))
            .unwrap_or_default()
    ));
    write_file(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// The test hook's environment variable: see [`write_file`].
pub const FAULT_WRITE_ENV: &str = "CAIRN_FAULT_WRITE_FAIL_AFTER";

/// Creates `path`, writes `bytes` and syncs it to disk. Every checkpoint file (the kernel's
/// and the torch backend's) is written through here or checked by [`injected_write_fault`].
///
/// # Errors
/// The I/O error of creating, writing or syncing the file (the caller names the path), or the
/// test hook's injected one.
pub fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    injected_write_fault(path)
}

/// **Test hook**, called after a checkpoint file was written to its temporary name. With
/// `CAIRN_FAULT_WRITE_FAIL_AFTER=N` in the environment (read once per process), the first `N`
/// files written under a `checkpoints/` directory pass and every later one fails like a full
/// disk: the file is cut to half its length and the call returns an error saying "No space
/// left on device". The tests use it to check that a failed checkpoint is never taken for a
/// good one. Without the variable it does nothing.
///
/// # Errors
/// The injected error (or the I/O error of cutting the file).
pub fn injected_write_fault(path: &Path) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    static WRITTEN: AtomicU64 = AtomicU64::new(0);
    let limit = *LIMIT.get_or_init(|| {
        std::env::var(FAULT_WRITE_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    let Some(limit) = limit else {
        return Ok(());
    };
    if !path.components().any(|c| c.as_os_str() == "checkpoints")
        || WRITTEN.fetch_add(1, Ordering::SeqCst) < limit
    {
        return Ok(());
    }
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    let len = f.metadata()?.len();
    f.set_len(len / 2)?;
    Err(std::io::Error::other(format!(
        "No space left on device (injected by the test hook {FAULT_WRITE_ENV}={limit})"
    )))
}
