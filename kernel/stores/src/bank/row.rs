//! One `entries` row ↔ [`BankEntry`]: the column list, the checked conversions of counters
//! between `u64` and SQLite's `i64`, and the JSON columns.

use std::path::Path;

use cairn_plugin_sdk::bank::{BankEntry, EntryKind, EntryStats, EntryStatus, Provenance};
use rusqlite::Row;

use crate::error::{Error, Result};

/// The columns of `entries`, in the order [`entry_from_row`] reads them.
pub const COLUMNS: &str = "e.id, e.kind, e.text, e.trigger_pattern, e.task_id, e.version, \
     e.parent, e.status, e.step, e.policy_version, e.source_trajectories, e.writer, e.exposures, \
     e.successes, e.utility_ema, e.beta_alpha, e.beta_beta, e.negative_streak, \
     e.last_negative_step, e.extra, e.trajectory_id";

/// [`COLUMNS`] for a schema-version-1 bank opened read-only (never migrated): no
/// `trajectory_id` column, so every entry reads as unscoped.
pub const COLUMNS_V1: &str = "e.id, e.kind, e.text, e.trigger_pattern, e.task_id, e.version, \
     e.parent, e.status, e.step, e.policy_version, e.source_trajectories, e.writer, e.exposures, \
     e.successes, e.utility_ema, e.beta_alpha, e.beta_beta, e.negative_streak, \
     e.last_negative_step, e.extra, NULL";

/// The number of columns in [`COLUMNS`] (the first index after them, e.g. a query's rank).
pub const COLUMN_COUNT: usize = 21;

/// `value` as SQLite's `i64`; above `i64::MAX` is refused, never wrapped.
pub fn to_i64(path: &Path, what: &str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::BankInvalid {
        path: path.to_path_buf(),
        what: what.to_string(),
        detail: format!("{value} is above the bank's limit {}", i64::MAX),
    })
}

/// The JSON text of a JSON column (an id list, a JSON map).
pub fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("ids and JSON maps always serialise")
}

/// Reads one row of [`COLUMNS`]. The outer `rusqlite::Result` is a column type error; the
/// inner one a stored value this schema never writes (a damaged or hand-edited file).
pub fn entry_from_row(row: &Row<'_>, path: &Path) -> Result<BankEntry> {
    let col = |e: rusqlite::Error| Error::BankCorrupt {
        path: path.to_path_buf(),
        detail: format!("a malformed entry row: {e}"),
    };
    let id: i64 = row.get(0).map_err(col)?;
    let bad = |what: &str, detail: String| Error::BankCorrupt {
        path: path.to_path_buf(),
        detail: format!("entry {id}: {what}: {detail}"),
    };
    let unsigned =
        |what: &str, v: i64| u64::try_from(v).map_err(|_| bad(what, format!("negative value {v}")));
    let kind: String = row.get(1).map_err(col)?;
    let kind = EntryKind::ALL
        .into_iter()
        .find(|k| k.as_str() == kind)
        .ok_or_else(|| bad("kind", format!("unknown kind `{kind}`")))?;
    let status: String = row.get(7).map_err(col)?;
    let status = [
        EntryStatus::Active,
        EntryStatus::UnderTest,
        EntryStatus::Retired,
    ]
    .into_iter()
    .find(|s| s.as_str() == status)
    .ok_or_else(|| bad("status", format!("unknown status `{status}`")))?;
    let sources: String = row.get(10).map_err(col)?;
    let source_trajectories: Vec<u64> =
        serde_json::from_str(&sources).map_err(|e| bad("source_trajectories", e.to_string()))?;
    let extra: String = row.get(19).map_err(col)?;
    let extra = serde_json::from_str(&extra).map_err(|e| bad("extra", e.to_string()))?;
    let version: i64 = row.get(5).map_err(col)?;
    Ok(BankEntry {
        id: unsigned("id", id)?,
        kind,
        text: row.get(2).map_err(col)?,
        trigger: row.get(3).map_err(col)?,
        task_id: row.get(4).map_err(col)?,
        trajectory_id: row
            .get::<_, Option<i64>>(20)
            .map_err(col)?
            .map(|t| unsigned("trajectory_id", t))
            .transpose()?,
        version: u32::try_from(version).map_err(|_| bad("version", version.to_string()))?,
        parent: row
            .get::<_, Option<i64>>(6)
            .map_err(col)?
            .map(|p| unsigned("parent", p))
            .transpose()?,
        status,
        provenance: Provenance {
            step: unsigned("step", row.get(8).map_err(col)?)?,
            policy_version: unsigned("policy_version", row.get(9).map_err(col)?)?,
            source_trajectories,
            writer: row.get(11).map_err(col)?,
        },
        stats: EntryStats {
            exposures: unsigned("exposures", row.get(12).map_err(col)?)?,
            successes: unsigned("successes", row.get(13).map_err(col)?)?,
            utility_ema: row.get(14).map_err(col)?,
            beta_alpha: row.get(15).map_err(col)?,
            beta_beta: row.get(16).map_err(col)?,
            negative_streak: row.get(17).map_err(col)?,
            last_negative_step: row
                .get::<_, Option<i64>>(18)
                .map_err(col)?
                .map(|s| unsigned("last_negative_step", s))
                .transpose()?,
        },
        extra,
    })
}
