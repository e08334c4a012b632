//! The pool's SQLite schema and its version (as a [`crate::sqlite::Schema`]: the stores'
//! shared helper opens and checks the file), the codecs (arrays as little-endian BLOBs, an
//! episode's turn texts as zlib-compressed JSON) and the mapping of SQLite errors onto the
//! kernel's.

use std::borrow::Cow;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sqlite::{Schema, Store};

/// How long a write waits for another connection's lock (a `cairn pool exclude` on a live
/// run) before failing; a reader waits as long.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Version of the schema below, stored in `meta.pool_schema_version`. Bump it with any change to
/// the tables, with a migration to it in [`POOL`]; a pool of a newer version is refused at
/// open ([`Error::PoolSchema`]).
pub const SCHEMA_VERSION: u32 = 1;

/// The tables (see the module documentation of [`super`] for what each column holds).
pub const SCHEMA: &str = "
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE steps (
    step INTEGER PRIMARY KEY,
    phase TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    decisions TEXT NOT NULL
);
CREATE TABLE episodes (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    step INTEGER NOT NULL,
    global_step INTEGER NOT NULL,
    round INTEGER NOT NULL,
    trajectory_id INTEGER NOT NULL,
    group_id INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    seed INTEGER,
    harness_episode TEXT,
    variant TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    turns INTEGER NOT NULL,
    episode_reward REAL,
    success INTEGER NOT NULL,
    failure TEXT,
    trained INTEGER NOT NULL,
    skip_reason TEXT
);
CREATE INDEX episodes_step ON episodes(step, source);
CREATE INDEX episodes_global_step ON episodes(global_step);
CREATE INDEX episodes_task ON episodes(task_id);
CREATE INDEX episodes_trajectory ON episodes(trajectory_id);
CREATE INDEX episodes_harness ON episodes(harness_episode) WHERE harness_episode IS NOT NULL;
CREATE TABLE variants (
    id INTEGER PRIMARY KEY,
    label TEXT NOT NULL,
    json TEXT NOT NULL UNIQUE
);
CREATE TABLE turns (
    id INTEGER PRIMARY KEY,
    episode INTEGER NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    prompt_shared INTEGER NOT NULL,
    prompt_ids BLOB NOT NULL,
    train_prompt_ids BLOB,
    response_ids BLOB NOT NULL,
    response_logprobs BLOB NOT NULL,
    response_mask BLOB NOT NULL,
    old_logprobs BLOB,
    ref_logprobs BLOB NOT NULL,
    advantages BLOB,
    finish_reason TEXT NOT NULL,
    turn_reward REAL NOT NULL,
    last_turn INTEGER NOT NULL,
    feedback INTEGER NOT NULL,
    tool_calls INTEGER NOT NULL,
    variant INTEGER NOT NULL REFERENCES variants(id),
    trained INTEGER NOT NULL,
    skip_reason TEXT,
    UNIQUE (episode, turn)
);
CREATE TABLE texts (
    episode INTEGER PRIMARY KEY REFERENCES episodes(id) ON DELETE CASCADE,
    data BLOB NOT NULL
);
CREATE TABLE exclusions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('episode', 'turn', 'task', 'harness')),
    target TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (kind, target)
);
";

/// The pool's file: its tables and its version in `meta.pool_schema_version` (no older
/// version exists, so no migration yet), checked at open without `PRAGMA quick_check`, which
/// would read the whole file, and a pool grows by every step's tokens.
pub const POOL: Schema = Schema {
    store: Store::Pool,
    version_key: "pool_schema_version",
    version: SCHEMA_VERSION,
    tables: SCHEMA,
    migrations: &[],
    quick_check: false,
};

/// Maps an SQLite error to [`Error::Pool`], saying what the pool was `doing`.
pub fn sql<'a>(path: &'a Path, doing: &'static str) -> impl Fn(rusqlite::Error) -> Error + 'a {
    Store::Pool.sql(path, doing)
}

/// `u32` ids as a little-endian BLOB (4 bytes each).
pub fn ids_blob(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `f32` values as a little-endian BLOB (4 bytes each; the bits are kept, so values read
/// back exactly).
pub fn f32_blob(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The inverse of [`ids_blob`]; a length that is not a multiple of 4 is damage.
pub fn blob_ids(bytes: &[u8], path: &Path, what: &str) -> Result<Vec<u32>> {
    chunks4(bytes, path, what).map(|c| c.into_iter().map(u32::from_le_bytes).collect())
}

/// The inverse of [`f32_blob`].
pub fn blob_f32(bytes: &[u8], path: &Path, what: &str) -> Result<Vec<f32>> {
    chunks4(bytes, path, what).map(|c| c.into_iter().map(f32::from_le_bytes).collect())
}

fn chunks4(bytes: &[u8], path: &Path, what: &str) -> Result<Vec<[u8; 4]>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Error::Pool {
            path: path.to_path_buf(),
            doing: "reading a turn",
            detail: format!(
                "`{what}` holds {} bytes, not a whole number of 4-byte values: the file is \
                 damaged",
                bytes.len()
            ),
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect())
}

/// An unsigned counter as SQLite's `INTEGER` (i64); values above `i64::MAX` are refused
/// rather than wrapped.
pub fn to_i64(path: &Path, what: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Pool {
        path: path.to_path_buf(),
        doing: "writing",
        detail: format!(
            "{what} = {v} is above the largest value SQLite stores ({})",
            i64::MAX
        ),
    })
}

/// The text fields of one turn, as stored in its episode's `texts.data` (one JSON object per
/// turn, in a JSON array).
#[derive(Debug, Serialize, Deserialize)]
pub struct TurnText<'a> {
    pub turn: u32,
    pub anchor: Option<Cow<'a, str>>,
    pub observation: Cow<'a, str>,
    pub info: Cow<'a, serde_json::Map<String, serde_json::Value>>,
    pub extra: Cow<'a, serde_json::Map<String, serde_json::Value>>,
}

/// zlib's default level: on the default job's episodes as small as level 9 (and as zstd's
/// level 9), at a third of zstd 9's time (docs/pool.md, "Costs").
const ZLIB_LEVEL: u8 = 6;

/// An episode's turn texts as `texts.data`: the JSON array of [`TurnText`], zlib-compressed
/// (RFC 1950, what Python's `zlib.decompress` reads). Per episode rather than per turn: a
/// turn's texts are short, and an episode's turns repeat each other's words and keys.
pub fn texts_blob(texts: &[TurnText<'_>]) -> Vec<u8> {
    let json = serde_json::to_vec(texts).expect("turn texts serialise");
    miniz_oxide::deflate::compress_to_vec_zlib(&json, ZLIB_LEVEL)
}

/// The inverse of [`texts_blob`] (owned); anything that does not decode is damage.
pub fn blob_texts(bytes: &[u8], path: &Path, episode: u64) -> Result<Vec<TurnText<'static>>> {
    let damaged = |detail: String| Error::Pool {
        path: path.to_path_buf(),
        doing: "reading a turn",
        detail: format!("episode {episode}: the turn texts {detail}: the file is damaged"),
    };
    let json = miniz_oxide::inflate::decompress_to_vec_zlib(bytes)
        .map_err(|e| damaged(format!("do not decompress ({e})")))?;
    serde_json::from_slice(&json).map_err(|e| damaged(format!("are not JSON ({e})")))
}
