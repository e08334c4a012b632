//! The bank's SQLite schema, its version and the migration of older versions, as a
//! [`crate::sqlite::Schema`]: the shared helper opens and checks the file (SQLite, intact, and
//! either empty or a bank of a schema version this kernel reads) and maps SQLite errors onto
//! the kernel's typed errors ([`sql`]).
//!
//! # Versions
//!
//! - **1**: the first bank.
//! - **2**: `entries.trajectory_id` (nullable `INTEGER`, indexed): the trajectory an entry is
//!   scoped to (ECHO's memory records). [`TO_2`] brings a version-1 bank up to 2 when it is
//!   opened for writing (or restored into a live bank): it adds the column, scopes each
//!   existing `memory_record` entry that names exactly one source trajectory to that
//!   trajectory, and retires any other `memory_record` entry (no trajectory to scope it to, so
//!   it must not reach other trajectories' queries); nothing else changes. A read-only opening
//!   (`cairn bank`) never migrates: it reads a version-1 file as it is, every entry unscoped.

use std::path::Path;

use crate::error::Error;
use crate::sqlite::{Migration, Schema, Store};

/// Version of the schema below, stored in `meta.schema_version`. Bump it with any change to
/// the tables, with a [`Migration`] to it in [`BANK`].
pub const SCHEMA_VERSION: u32 = 2;

/// The oldest schema version the migrations bring up to [`SCHEMA_VERSION`].
pub const OLDEST_READABLE: u32 = 1;

/// The bank's file: its tables, its version in `meta.schema_version`, its migrations, and the
/// integrity check at every open (a bank is small).
pub const BANK: Schema = Schema {
    store: Store::Bank,
    version_key: "schema_version",
    version: SCHEMA_VERSION,
    tables: SCHEMA,
    migrations: &[TO_2],
    quick_check: true,
};

/// Version 1 → 2: the `trajectory_id` column and its index; each `memory_record` naming
/// exactly one source trajectory is scoped to it, any other is retired.
pub const TO_2: Migration = Migration {
    to: 2,
    doing: "migrating the bank to schema version 2",
    sql: "ALTER TABLE entries ADD COLUMN trajectory_id INTEGER;
          CREATE INDEX entries_trajectory ON entries(trajectory_id);
          UPDATE entries SET trajectory_id = json_extract(source_trajectories, '$[0]')
              WHERE kind = 'memory_record' AND json_array_length(source_trajectories) = 1;
          UPDATE entries SET status = 'retired'
              WHERE kind = 'memory_record' AND trajectory_id IS NULL;",
};

/// The tables. Ids are `AUTOINCREMENT` so a retired-then-deleted id is never reused (entries
/// are only retired today, but lineage and provenance refer to ids). Counters are `INTEGER`
/// (i64); the bank refuses a `u64` above `i64::MAX` rather than wrapping it.
///
/// `entries_fts` is an FTS5 index over `text` and `trigger_pattern` with `entries` as its
/// external content, kept in step by the triggers, so the index is written in the same
/// transaction as the entry and copied with it by snapshots. Tokeniser: `unicode61` (splits at
/// anything that is not a Unicode letter or digit, folds case, strips diacritics) under the
/// `porter` stemmer, so `mugs` / `mug` and `cleaning` / `clean` match; see `retrieval.rs`.
pub const SCHEMA: &str = "
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    trigger_pattern TEXT,
    task_id TEXT,
    trajectory_id INTEGER,
    version INTEGER NOT NULL,
    parent INTEGER REFERENCES entries(id),
    status TEXT NOT NULL,
    step INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    source_trajectories TEXT NOT NULL,
    writer TEXT NOT NULL,
    exposures INTEGER NOT NULL,
    successes INTEGER NOT NULL,
    utility_ema REAL NOT NULL,
    beta_alpha REAL NOT NULL,
    beta_beta REAL NOT NULL,
    negative_streak INTEGER NOT NULL,
    last_negative_step INTEGER,
    extra TEXT NOT NULL
);
CREATE INDEX entries_kind_status ON entries(kind, status);
CREATE INDEX entries_task ON entries(task_id);
CREATE INDEX entries_trajectory ON entries(trajectory_id);
CREATE VIRTUAL TABLE entries_fts USING fts5(
    text, trigger_pattern,
    content = 'entries', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER entries_fts_insert AFTER INSERT ON entries BEGIN
    INSERT INTO entries_fts(rowid, text, trigger_pattern)
        VALUES (new.id, new.text, new.trigger_pattern);
END;
CREATE TRIGGER entries_fts_delete AFTER DELETE ON entries BEGIN
    INSERT INTO entries_fts(entries_fts, rowid, text, trigger_pattern)
        VALUES ('delete', old.id, old.text, old.trigger_pattern);
END;
CREATE TRIGGER entries_fts_update AFTER UPDATE OF text, trigger_pattern ON entries BEGIN
    INSERT INTO entries_fts(entries_fts, rowid, text, trigger_pattern)
        VALUES ('delete', old.id, old.text, old.trigger_pattern);
    INSERT INTO entries_fts(rowid, text, trigger_pattern)
        VALUES (new.id, new.text, new.trigger_pattern);
END;
";

/// Maps an SQLite error to the kernel's: busy/locked → [`Error::BankLocked`], not-a-database
/// or corrupt → [`Error::BankCorrupt`], anything else → [`Error::Bank`] saying what the bank
/// was `doing`.
pub fn sql<'a>(path: &'a Path, doing: &'static str) -> impl Fn(rusqlite::Error) -> Error + 'a {
    Store::Bank.sql(path, doing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migrations_reach_the_current_version_from_the_oldest_readable() {
        assert_eq!(BANK.oldest_readable(), OLDEST_READABLE);
        let steps: Vec<u32> = BANK.migrations.iter().map(|m| m.to).collect();
        let expected: Vec<u32> = (OLDEST_READABLE + 1..=SCHEMA_VERSION).collect();
        assert_eq!(steps, expected);
    }
}
