//! The bank's SQLite schema, its version, the checks [`super::Bank::open`] makes before it
//! writes anything (the file is SQLite, intact, and either empty or a bank of a schema version
//! this kernel reads), and the migration of older versions. Also maps SQLite errors onto the
//! kernel's typed errors.
//!
//! # Versions
//!
//! - **1**: the first bank.
//! - **2**: `entries.trajectory_id` (nullable `INTEGER`, indexed): the trajectory an entry is
//!   scoped to (ECHO's memory records). [`migrate`] brings a version-1 bank up to 2 when it is
//!   opened for writing (or restored into a live bank): it adds the column, scopes each
//!   existing `memory_record` entry that names exactly one source trajectory to that
//!   trajectory, and retires any other `memory_record` entry (no trajectory to scope it to, so
//!   it must not reach other trajectories' queries); nothing else changes. A read-only opening
//!   (`cairn bank`) never migrates: it reads a version-1 file as it is, every entry unscoped.

use std::io::Read;
use std::path::Path;

use rusqlite::{Connection, ErrorCode};

use crate::error::{Error, Result};

/// Version of the schema below, stored in `meta.schema_version`. Bump it with any change to
/// the tables, and teach [`check_bank`] to refuse (or [`migrate`]) the older versions.
pub const SCHEMA_VERSION: u32 = 2;

/// The oldest schema version [`migrate`] brings up to [`SCHEMA_VERSION`].
pub const OLDEST_READABLE: u32 = 1;

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

/// The first 16 bytes of every SQLite 3 database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// What [`check_bank`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// No tables at all: a new (or zero-length) file, to be given the schema.
    Empty,
    /// A bank of this schema version ([`OLDEST_READABLE`] ..= [`SCHEMA_VERSION`]).
    Bank(u32),
}

/// Refuses a non-empty file that does not start with SQLite's magic header, before SQLite
/// opens it: SQLite would refuse it too, but only at the first read, and this way nothing but
/// a read ever touches a foreign file. A missing or zero-length file passes (a new bank).
pub fn check_header(path: &Path) -> Result<()> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut head = Vec::with_capacity(SQLITE_MAGIC.len());
    (&mut file)
        .take(SQLITE_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    if head.is_empty() || head == SQLITE_MAGIC {
        Ok(())
    } else {
        Err(Error::BankCorrupt {
            path: path.to_path_buf(),
            detail: "not an SQLite database: its first bytes are not the SQLite header".into(),
        })
    }
}

/// Checks an open database read-only: intact (`PRAGMA quick_check`), and either empty or a
/// bank of a schema version this kernel reads (older ones are migrated by [`migrate`]).
pub fn check_bank(conn: &Connection, path: &Path) -> Result<Found> {
    let verdict: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(sql(path, "checking the file"))?;
    if verdict != "ok" {
        return Err(Error::BankCorrupt {
            path: path.to_path_buf(),
            detail: format!("SQLite integrity check: {verdict}"),
        });
    }
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'",
            [],
            |r| r.get(0),
        )
        .map_err(sql(path, "reading the schema"))?;
    if tables == 0 {
        return Ok(Found::Empty);
    }
    let has_meta: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get(0),
        )
        .map_err(sql(path, "reading the schema"))?;
    if has_meta == 0 {
        return Err(Error::BankCorrupt {
            path: path.to_path_buf(),
            detail: "an SQLite database, but not a Cairn experience bank (no `meta` table)".into(),
        });
    }
    let found: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .map(Some)
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e),
        })
        .map_err(sql(path, "reading the schema version"))?;
    match found.as_deref().map(str::parse::<u32>) {
        Some(Ok(v)) if (OLDEST_READABLE..=SCHEMA_VERSION).contains(&v) => Ok(Found::Bank(v)),
        _ => Err(Error::BankSchema {
            path: path.to_path_buf(),
            found: found.unwrap_or_else(|| "(none)".into()),
            expected: SCHEMA_VERSION,
        }),
    }
}

/// Creates the schema in an empty database (inside the caller's transaction).
pub fn create(conn: &Connection, path: &Path) -> Result<()> {
    conn.execute_batch(SCHEMA)
        .map_err(sql(path, "creating the schema"))?;
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('schema_version', ?1), ('created_by', ?2)",
        (
            SCHEMA_VERSION.to_string(),
            concat!("cairn-kernel ", env!("CARGO_PKG_VERSION")),
        ),
    )
    .map_err(sql(path, "creating the schema"))?;
    Ok(())
}

/// Brings a bank of schema version `from` up to [`SCHEMA_VERSION`] (inside the caller's
/// transaction; see the module docs for what each step does). A bank already at the current
/// version is left alone.
pub fn migrate(conn: &Connection, path: &Path, from: u32) -> Result<()> {
    if from < 2 {
        conn.execute_batch(
            "ALTER TABLE entries ADD COLUMN trajectory_id INTEGER;
             CREATE INDEX entries_trajectory ON entries(trajectory_id);
             UPDATE entries SET trajectory_id = json_extract(source_trajectories, '$[0]')
                 WHERE kind = 'memory_record' AND json_array_length(source_trajectories) = 1;
             UPDATE entries SET status = 'retired'
                 WHERE kind = 'memory_record' AND trajectory_id IS NULL;",
        )
        .map_err(sql(path, "migrating the bank to schema version 2"))?;
    }
    if from < SCHEMA_VERSION {
        conn.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'schema_version'",
            [SCHEMA_VERSION.to_string()],
        )
        .map_err(sql(path, "migrating the bank"))?;
    }
    Ok(())
}

/// Maps an SQLite error to the kernel's: busy/locked → [`Error::BankLocked`], not-a-database
/// or corrupt → [`Error::BankCorrupt`], anything else → [`Error::Bank`] saying what the bank
/// was `doing`.
pub fn sql<'a>(path: &'a Path, doing: &'static str) -> impl Fn(rusqlite::Error) -> Error + 'a {
    move |e| {
        let code = e.sqlite_error_code();
        match code {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Error::BankLocked {
                path: path.to_path_buf(),
                detail: e.to_string(),
            },
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => Error::BankCorrupt {
                path: path.to_path_buf(),
                detail: e.to_string(),
            },
            _ => Error::Bank {
                path: path.to_path_buf(),
                doing,
                detail: e.to_string(),
            },
        }
    }
}
