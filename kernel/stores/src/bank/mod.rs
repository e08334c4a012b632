//! The experience bank: the run's persistent store of text knowledge that algorithms inject
//! into prompts (experiences, skills, scaffolds, evidence cards, memory records), with the
//! provenance and utility statistics of every entry. Plugins reach it through the SDK's plain
//! types ([`cairn_plugin_sdk::bank`]) and the `Host` callbacks; no SQL crosses the ABI.
//!
//! [`Bank`] is synchronous and owns one SQLite connection;
//! the kernel's `ExperienceBankActor` owns the run's bank and answers the messages,
//! and `cairn bank list|show|export` reads one. See `docs/bank.md`.
//!
//! # Storage
//!
//! One SQLite file, `<run>/bank.sqlite` ([`BANK_FILE`]), through `rusqlite` with SQLite
//! compiled in (`bundled`: no system library, and FTS5 is on). WAL mode; every write is one
//! transaction; the schema is versioned in a `meta` table ([`schema::SCHEMA_VERSION`]; an older
//! version is migrated when the bank is opened for writing, see `schema.rs`). A file that is
//! not a bank, is damaged, has a schema version this kernel does not read or is write-locked by
//! another process is refused at open with a typed error naming it, and is never written.
//!
//! # Trajectory scope
//!
//! An entry may belong to one trajectory (`trajectory_id`; memory records always do, a put
//! without one fails). A query sees the entries of the trajectory it names, or with none only
//! unscoped entries, so a trajectory's memory never reaches another trajectory or task.
//!
//! # Retrieval
//!
//! BM25 through SQLite's own FTS5 index (`retrieval.rs` documents the tokenisation). Chosen
//! over tantivy or a BM25 crate because the index then lives in the same file and the same
//! transactions as the entries: a put is searchable as soon as it commits, a failed put leaves
//! no stray index rows, and a snapshot copies entries and index together, so a resumed run
//! ranks exactly as it did at its checkpoint. A separate index would need its own persistence
//! and crash consistency with the table, or a rebuild on every open. FTS5 also keeps the
//! filters (kind, task, status) in the same query. `BENCHMARKS.md` has the latency at 10³ to
//! 10⁵ entries.
//!
//! # Checkpoints
//!
//! [`Bank::snapshot_to`] writes a consistent copy into a checkpoint directory
//! ([`SNAPSHOT_FILE`]); [`Bank::restore_from`] makes the live bank exactly that copy again, so
//! a resumed run sees the bank as it was at its checkpoint, whatever was written after.

mod retrieval;
mod row;
mod schema;
mod store;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use retrieval::MAX_QUERY_TERMS;
pub use schema::{OLDEST_READABLE, SCHEMA_VERSION};
pub use store::{Bank, EntryFilter, DEFAULT_BUSY_TIMEOUT};

/// The live bank's file name in a run directory.
pub const BANK_FILE: &str = "bank.sqlite";

/// The bank snapshot's file name in a checkpoint directory.
pub const SNAPSHOT_FILE: &str = "bank.sqlite";

/// `<run>/bank.sqlite`.
pub fn bank_path(run_root: &Path) -> PathBuf {
    run_root.join(BANK_FILE)
}

/// `<checkpoint>/bank.sqlite`.
pub fn snapshot_path(checkpoint_dir: &Path) -> PathBuf {
    checkpoint_dir.join(SNAPSHOT_FILE)
}
