//! [`Bank`]: the entries table, its writes (put, update, retire), reads (get, list, export),
//! and whole-bank snapshots (checkpoint and restore).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_plugin_sdk::bank::{
    BankEntry, EntryKind, EntryStats, EntryStatus, NewEntry, Provenance, StatsUpdate,
};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::row::{entry_from_row, json, to_i64, COLUMNS, COLUMNS_V1};
use super::schema::{sql, BANK, SCHEMA_VERSION};
use crate::error::{Error, Result};

/// How long a write waits for another connection's lock before failing with
/// [`Error::BankLocked`] (`[bank] busy_timeout_ms` overrides it).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Which entries [`Bank::list`] and [`Bank::export`] return (an operator's view: unlike a
/// [`cairn_plugin_sdk::BankQuery`], no filter here hides trajectory-scoped entries). Empty
/// lists and `None` mean "any".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryFilter {
    pub kinds: Vec<EntryKind>,
    pub statuses: Vec<EntryStatus>,
    /// Only entries for this task (general entries excluded).
    pub task_id: Option<String>,
    /// Only entries scoped to this trajectory.
    pub trajectory_id: Option<u64>,
}

/// The experience bank: one SQLite database (a file in the run directory, or in memory).
///
/// Synchronous and single-connection; the kernel's `ExperienceBankActor` owns one
/// and serialises access to it. Every write is one transaction, so a failed request (a
/// missing id, a bad value) changes nothing.
pub struct Bank {
    conn: Connection,
    /// The database file, named in every error (`:memory:` for an in-memory bank).
    path: PathBuf,
    /// The file's schema version: [`SCHEMA_VERSION`] for every bank that can be
    /// written (older ones are migrated at open), possibly older for a read-only one.
    schema: u32,
}

impl std::fmt::Debug for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bank").field("path", &self.path).finish()
    }
}

impl Bank {
    /// Opens the bank at `path`, creating it (and the schema) if the file is absent or empty.
    /// See [`Bank::open_with`].
    pub fn open(path: &Path) -> Result<Bank> {
        Bank::open_with(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// Opens the bank at `path`, waiting up to `busy_timeout` for another connection's lock.
    ///
    /// Before anything is written the file is checked (by the stores' shared SQLite helper,
    /// `kernel/stores/src/sqlite.rs`): not SQLite, damaged, another program's database →
    /// [`Error::BankCorrupt`]; a newer or unknown schema version → [`Error::BankSchema`];
    /// write-locked by another connection → [`Error::BankLocked`]. In each case the file is
    /// left byte for byte as it was. Then it is put in WAL mode (readers such as
    /// `cairn bank list` never block the writer) with `synchronous = NORMAL`: a killed process
    /// loses no committed write, and a power cut loses at most the last commits, which a
    /// resume replaces with its checkpoint's snapshot anyway. An older schema version is then
    /// migrated, in the transaction that takes the write lock.
    pub fn open_with(path: &Path, busy_timeout: Duration) -> Result<Bank> {
        Ok(Bank {
            conn: BANK.open(path, busy_timeout)?,
            path: path.to_path_buf(),
            schema: SCHEMA_VERSION,
        })
    }

    /// Opens an existing bank for reading only (`cairn bank`); refuses a missing file rather
    /// than creating one. An older schema version is read as it is, never migrated.
    pub fn open_read_only(path: &Path) -> Result<Bank> {
        let (conn, schema) = BANK.open_read_only(path, DEFAULT_BUSY_TIMEOUT)?;
        Ok(Bank {
            conn,
            path: path.to_path_buf(),
            schema,
        })
    }

    /// A bank that lives in memory only (evaluation, benchmarks, tests).
    pub fn in_memory() -> Result<Bank> {
        Ok(Bank {
            conn: BANK.open_in_memory()?,
            path: PathBuf::from(":memory:"),
            schema: SCHEMA_VERSION,
        })
    }

    /// The database file (`:memory:` for an in-memory bank).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The file's schema version (see [`Bank::open_read_only`]).
    pub fn schema_version(&self) -> u32 {
        self.schema
    }

    /// The entry columns to select from this file ([`COLUMNS`], or [`COLUMNS_V1`] for a
    /// version-1 bank read without migrating).
    pub(super) fn columns(&self) -> &'static str {
        if self.schema < 2 {
            COLUMNS_V1
        } else {
            COLUMNS
        }
    }

    /// Inserts `entries` in one transaction and returns their ids, in order.
    ///
    /// Provenance left empty on an entry (`step` 0, `policy_version` 0, `writer` empty) takes
    /// the value of `defaults`, so every stored entry names its step, policy version and
    /// writer. An entry with a `parent` gets the parent's version + 1; a parent that is not in
    /// the bank, an empty text, or a memory record without a `trajectory_id` (memory records
    /// are always scoped to their trajectory) fails the whole put.
    pub fn put(&mut self, entries: &[NewEntry], defaults: &Provenance) -> Result<Vec<u64>> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql(&path, "starting a put"))?;
        let mut ids = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let invalid = |detail: String| Error::BankInvalid {
                path: path.clone(),
                what: format!("entry {i} of the put"),
                detail,
            };
            if entry.text.trim().is_empty() {
                return Err(invalid("its text is empty".into()));
            }
            if entry.kind == EntryKind::MemoryRecord && entry.trajectory_id.is_none() {
                return Err(invalid(
                    "it is a memory record without a `trajectory_id`; a memory record belongs \
                     to one trajectory, so set the trajectory it records"
                        .into(),
                ));
            }
            let version = match entry.parent {
                None => 1,
                Some(parent) => {
                    let parent_version: Option<i64> = tx
                        .query_row(
                            "SELECT version FROM entries WHERE id = ?1",
                            [to_i64(&path, "parent", parent)?],
                            |r| r.get(0),
                        )
                        .optional()
                        .map_err(sql(&path, "reading a parent entry"))?;
                    match parent_version {
                        Some(v) => v + 1,
                        None => {
                            return Err(invalid(format!("its parent {parent} is not in the bank")))
                        }
                    }
                }
            };
            let p = &entry.provenance;
            let step = if p.step == 0 { defaults.step } else { p.step };
            let policy_version = if p.policy_version == 0 {
                defaults.policy_version
            } else {
                p.policy_version
            };
            let writer = if p.writer.is_empty() {
                &defaults.writer
            } else {
                &p.writer
            };
            let stats = EntryStats::default();
            tx.execute(
                "INSERT INTO entries (kind, text, trigger_pattern, task_id, version, parent, \
                 status, step, policy_version, source_trajectories, writer, exposures, \
                 successes, utility_ema, beta_alpha, beta_beta, negative_streak, \
                 last_negative_step, extra, trajectory_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
                 ?17, ?18, ?19, ?20)",
                rusqlite::params![
                    entry.kind.as_str(),
                    entry.text,
                    entry.trigger,
                    entry.task_id,
                    version,
                    entry
                        .parent
                        .map(|p| to_i64(&path, "parent", p))
                        .transpose()?,
                    entry.status.as_str(),
                    to_i64(&path, "provenance.step", step)?,
                    to_i64(&path, "provenance.policy_version", policy_version)?,
                    json(&p.source_trajectories),
                    writer,
                    0i64,
                    0i64,
                    stats.utility_ema,
                    stats.beta_alpha,
                    stats.beta_beta,
                    0i64,
                    None::<i64>,
                    json(&entry.extra),
                    entry
                        .trajectory_id
                        .map(|t| to_i64(&path, "trajectory_id", t))
                        .transpose()?,
                ],
            )
            .map_err(sql(&path, "inserting an entry"))?;
            ids.push(tx.last_insert_rowid() as u64);
        }
        tx.commit().map_err(sql(&path, "committing a put"))?;
        Ok(ids)
    }

    /// Applies statistics and status updates in one transaction: an update naming an entry
    /// the bank does not hold, or an invalid statistics block, fails them all.
    ///
    /// Per update: `set` replaces the whole statistics block (the additions are then ignored,
    /// as [`StatsUpdate`] documents); otherwise `add_exposures` and `add_successes` are added.
    /// `status` replaces the status.
    pub fn update(&mut self, updates: &[StatsUpdate]) -> Result<()> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql(&path, "starting an update"))?;
        for u in updates {
            let id = to_i64(&path, "id", u.id)?;
            let current = tx
                .query_row(
                    &format!("SELECT {COLUMNS} FROM entries e WHERE e.id = ?1"),
                    [id],
                    |row| Ok(entry_from_row(row, &path)),
                )
                .optional()
                .map_err(sql(&path, "reading an entry"))?;
            let Some(current) = current else {
                return Err(Error::BankNoEntry { path, id: u.id });
            };
            let current = current?;
            let stats = match &u.set {
                Some(set) => set.clone(),
                None => {
                    let mut s = current.stats.clone();
                    let overflow = |what: &str| Error::BankInvalid {
                        path: path.clone(),
                        what: format!("update of entry {}", u.id),
                        detail: format!("{what} would overflow"),
                    };
                    s.exposures = s
                        .exposures
                        .checked_add(u.add_exposures)
                        .ok_or_else(|| overflow("exposures"))?;
                    s.successes = s
                        .successes
                        .checked_add(u.add_successes)
                        .ok_or_else(|| overflow("successes"))?;
                    s
                }
            };
            check_stats(&path, u.id, &stats)?;
            let status = u.status.unwrap_or(current.status);
            tx.execute(
                "UPDATE entries SET exposures = ?2, successes = ?3, utility_ema = ?4, \
                 beta_alpha = ?5, beta_beta = ?6, negative_streak = ?7, \
                 last_negative_step = ?8, status = ?9 WHERE id = ?1",
                rusqlite::params![
                    id,
                    to_i64(&path, "exposures", stats.exposures)?,
                    to_i64(&path, "successes", stats.successes)?,
                    stats.utility_ema,
                    stats.beta_alpha,
                    stats.beta_beta,
                    stats.negative_streak,
                    stats
                        .last_negative_step
                        .map(|s| to_i64(&path, "last_negative_step", s))
                        .transpose()?,
                    status.as_str(),
                ],
            )
            .map_err(sql(&path, "updating an entry"))?;
        }
        tx.commit().map_err(sql(&path, "committing an update"))
    }

    /// Retires entries (kept for provenance; no longer retrieved by default). A missing id
    /// fails them all.
    pub fn retire(&mut self, ids: &[u64]) -> Result<()> {
        let updates: Vec<StatsUpdate> = ids
            .iter()
            .map(|&id| StatsUpdate {
                id,
                status: Some(EntryStatus::Retired),
                ..Default::default()
            })
            .collect();
        self.update(&updates)
    }

    /// Deletes every entry and restarts ids at 1, in one transaction: the bank of a run that
    /// starts over (no checkpoint to resume from) is then exactly a new one.
    pub fn reset(&mut self) -> Result<()> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql(&path, "starting a reset"))?;
        tx.execute_batch(
            "DELETE FROM entries; DELETE FROM sqlite_sequence WHERE name = 'entries';",
        )
        .map_err(sql(&path, "deleting the entries"))?;
        tx.commit().map_err(sql(&path, "committing a reset"))
    }

    /// The id of the run this bank belongs to (`meta.run_id`), if one was stamped.
    pub fn run_id(&self) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        self.conn
            .query_row("SELECT value FROM meta WHERE key = 'run_id'", [], |r| {
                r.get::<_, String>(0)
            })
            .optional()
            .map_err(sql(&self.path, "reading the run id"))
    }

    /// Stamps the bank with the run it belongs to (a fresh run stamps its new id; snapshots
    /// carry it into checkpoints, where a resume checks it).
    pub fn set_run_id(&mut self, run_id: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO meta (key, value) VALUES ('run_id', ?1) \
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [run_id],
            )
            .map_err(sql(&self.path, "writing the run id"))?;
        Ok(())
    }

    /// The entry with this id, if the bank holds it.
    pub fn get(&self, id: u64) -> Result<Option<BankEntry>> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(None);
        };
        self.conn
            .query_row(
                &format!("SELECT {} FROM entries e WHERE e.id = ?1", self.columns()),
                [id],
                |row| Ok(entry_from_row(row, &self.path)),
            )
            .optional()
            .map_err(sql(&self.path, "reading an entry"))?
            .transpose()
    }

    /// Entries matching `filter`, by id.
    pub fn list(&self, filter: &EntryFilter) -> Result<Vec<BankEntry>> {
        let mut entries = Vec::new();
        self.for_each(filter, |e| {
            entries.push(e);
            Ok(())
        })?;
        Ok(entries)
    }

    /// Number of entries matching `filter`.
    pub fn count(&self, filter: &EntryFilter) -> Result<u64> {
        let (clause, params) = where_clause(filter, self.schema);
        let n: i64 = self
            .conn
            .query_row(
                &format!("SELECT count(*) FROM entries e {clause}"),
                rusqlite::params_from_iter(params),
                |r| r.get(0),
            )
            .map_err(sql(&self.path, "counting entries"))?;
        Ok(n as u64)
    }

    /// Writes the entries matching `filter` to `out` as JSON lines (one [`BankEntry`] per
    /// line, by id); `out_name` names `out` in errors. Returns the number written.
    pub fn export(
        &self,
        filter: &EntryFilter,
        out: &mut dyn Write,
        out_name: &Path,
    ) -> Result<usize> {
        let mut n = 0;
        self.for_each(filter, |entry| {
            let line = serde_json::to_string(&entry).map_err(|e| Error::Bank {
                path: self.path.clone(),
                doing: "serialising an entry",
                detail: e.to_string(),
            })?;
            writeln!(out, "{line}").map_err(|e| Error::io(out_name, e))?;
            n += 1;
            Ok(())
        })?;
        out.flush().map_err(|e| Error::io(out_name, e))?;
        Ok(n)
    }

    fn for_each(
        &self,
        filter: &EntryFilter,
        mut f: impl FnMut(BankEntry) -> Result<()>,
    ) -> Result<()> {
        let (clause, params) = where_clause(filter, self.schema);
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {} FROM entries e {clause} ORDER BY e.id",
                self.columns()
            ))
            .map_err(sql(&self.path, "listing entries"))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |row| {
                Ok(entry_from_row(row, &self.path))
            })
            .map_err(sql(&self.path, "listing entries"))?;
        for row in rows {
            f(row.map_err(sql(&self.path, "listing entries"))??)?;
        }
        Ok(())
    }

    /// Writes a consistent copy of the whole bank to `path` (a checkpoint's `bank.sqlite`).
    ///
    /// `VACUUM INTO` a temporary file beside `path` (a compact copy as of one read
    /// transaction), switched to a rollback journal so the copy is one self-contained file,
    /// synced, then renamed into place: a kill at any moment leaves either the old file or
    /// the new one, never a partial copy under `path`.
    pub fn snapshot_to(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("sqlite.tmp");
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&tmp, e)),
        }
        let Some(tmp_name) = tmp.to_str() else {
            return Err(Error::Bank {
                path: tmp.clone(),
                doing: "writing a snapshot",
                detail: "SQLite needs a UTF-8 path here; use a run directory with a UTF-8 path"
                    .into(),
            });
        };
        self.conn
            .execute("VACUUM INTO ?1", [tmp_name])
            .map_err(sql(&self.path, "writing a snapshot"))?;
        {
            let copy = Connection::open(&tmp).map_err(sql(&tmp, "finishing a snapshot"))?;
            let _: String = copy
                .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
                .map_err(sql(&tmp, "finishing a snapshot"))?;
        }
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }

    /// Makes the live bank exactly the snapshot at `path` (written by [`Bank::snapshot_to`]):
    /// every entry and statistic after the snapshot is gone.
    ///
    /// The snapshot is opened read-only and checked like [`Bank::open`] checks a file, then
    /// copied page by page into the live database with SQLite's online backup API, which
    /// writes the destination in one transaction: a failure leaves the live bank as it was.
    pub fn restore_from(&mut self, path: &Path) -> Result<()> {
        let source = Bank::open_read_only(path)?;
        let version = source.schema;
        {
            let backup = rusqlite::backup::Backup::new(&source.conn, &mut self.conn)
                .map_err(sql(&self.path, "restoring a snapshot"))?;
            backup
                .run_to_completion(i32::MAX, Duration::from_millis(10), None)
                .map_err(sql(&self.path, "restoring a snapshot"))?;
        }
        if self.path != Path::new(":memory:") {
            BANK.configure(&self.conn, &self.path)?;
        }
        // A snapshot of an older schema (a checkpoint written before an upgrade) is migrated
        // in the live bank; the snapshot file itself is never written.
        self.schema = version;
        if version < SCHEMA_VERSION {
            let live = self.path.clone();
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql(&live, "migrating a restored snapshot"))?;
            BANK.migrate(&tx, &live, version)?;
            tx.commit()
                .map_err(sql(&live, "migrating a restored snapshot"))?;
            self.schema = SCHEMA_VERSION;
        }
        Ok(())
    }
}

/// `WHERE` clause (possibly empty) and its parameters for a filter over `entries e` of a bank
/// of schema version `schema` (a version-1 bank has no scoped entries).
fn where_clause(filter: &EntryFilter, schema: u32) -> (String, Vec<Value>) {
    let mut terms = Vec::new();
    let mut params = Vec::new();
    push_in(
        &mut terms,
        &mut params,
        "e.kind",
        filter.kinds.iter().map(|k| k.as_str()),
    );
    push_in(
        &mut terms,
        &mut params,
        "e.status",
        filter.statuses.iter().map(|s| s.as_str()),
    );
    if let Some(task) = &filter.task_id {
        params.push(Value::Text(task.clone()));
        terms.push(format!("e.task_id = ?{}", params.len()));
    }
    if let Some(trajectory) = filter.trajectory_id {
        // No stored id is above i64::MAX (puts refuse them), and a version-1 bank has no
        // scoped entry: either way nothing matches.
        match i64::try_from(trajectory) {
            Ok(t) if schema >= 2 => {
                params.push(Value::Integer(t));
                terms.push(format!("e.trajectory_id = ?{}", params.len()));
            }
            _ => terms.push("0".into()),
        }
    }
    if terms.is_empty() {
        (String::new(), params)
    } else {
        (format!("WHERE {}", terms.join(" AND ")), params)
    }
}

/// Appends `column IN (?i, ...)` for a non-empty list of values.
pub(super) fn push_in<'a>(
    terms: &mut Vec<String>,
    params: &mut Vec<Value>,
    column: &str,
    values: impl Iterator<Item = &'a str>,
) {
    let mut slots = Vec::new();
    for v in values {
        params.push(Value::Text(v.to_string()));
        slots.push(format!("?{}", params.len()));
    }
    if !slots.is_empty() {
        terms.push(format!("{column} IN ({})", slots.join(", ")));
    }
}

/// Refuses statistics no posterior or counter can hold.
fn check_stats(path: &Path, id: u64, s: &EntryStats) -> Result<()> {
    let bad = |detail: &str| {
        Err(Error::BankInvalid {
            path: path.to_path_buf(),
            what: format!("update of entry {id}"),
            detail: detail.to_string(),
        })
    };
    if !(s.beta_alpha > 0.0 && s.beta_alpha.is_finite()) {
        return bad("`beta_alpha` must be finite and > 0");
    }
    if !(s.beta_beta > 0.0 && s.beta_beta.is_finite()) {
        return bad("`beta_beta` must be finite and > 0");
    }
    if !s.utility_ema.is_finite() {
        return bad("`utility_ema` must be finite");
    }
    if s.successes > s.exposures {
        return bad("`successes` cannot exceed `exposures`");
    }
    Ok(())
}
