//! Retrieval: [`Bank::query`] ranks entries by BM25 relevance of a query text (a task
//! description or an observation) to the entries' text and trigger, through the FTS5 index.
//!
//! **Query text is data, not FTS5 syntax.** An observation holds `-`, `:`, quotes, `AND`, ...
//! that the FTS5 query language would read as operators, so the query is cut into terms
//! ([`cairn_plugin_sdk::bank::query_terms`]: maximal runs of Unicode letters and digits,
//! lower-cased; the same boundaries the index's `unicode61` tokeniser uses) and each term is
//! passed as a quoted string, joined with `OR` ([`cairn_plugin_sdk::bank::fts5_any`]).
//! An entry matching more, and rarer, terms ranks higher; one matching none is not returned.
//! The index's `porter` stemmer applies to the quoted terms too, so `mugs` finds `mug`.
//!
//! **Short texts.** Entries are a sentence or a few; FTS5's BM25 (k1 = 1.2, b = 0.75)
//! normalises by each entry's length against the mean, which suits a corpus of short, uneven
//! texts. No stop-word list: in a bank of a few thousand lessons `the` has a near-zero IDF
//! already, and a list would drop words (`on`, `off`, `in`) that household actions hinge on.
//! The trigger column weighs twice the text: a trigger is the entry's own statement of when it
//! applies, so a query that hits it is the stronger evidence.
//!
//! **Bounds.** At most [`MAX_QUERY_TERMS`] distinct terms are used (the first ones), so a long
//! observation costs a bounded query. Filters (kind, task, trajectory, status) are applied in
//! the same SQL statement; ties in score go to the older entry (lower id), so results are
//! deterministic.
//!
//! **Trajectory scope.** A query that names a trajectory (`BankQuery::trajectory_id`) sees only
//! the entries scoped to it; a query that names none sees only unscoped entries. So a memory
//! record (always scoped) reaches no other trajectory, task or plugin query.

use cairn_plugin_sdk::bank::{fts5_any, query_terms, BankQuery, EntryStatus, Retrieved};
use rusqlite::types::Value;

use super::row::{entry_from_row, COLUMN_COUNT};
use super::schema::sql;
use super::store::{push_in, Bank};
use crate::error::Result;

/// Distinct query terms used at most.
pub const MAX_QUERY_TERMS: usize = 64;

/// BM25 weights of the FTS columns (`text`, `trigger_pattern`).
const COLUMN_WEIGHTS: &str = "1.0, 2.0";

/// Statuses a query with an empty `statuses` list returns.
const DEFAULT_STATUSES: [EntryStatus; 2] = [EntryStatus::Active, EntryStatus::UnderTest];

impl Bank {
    /// The top `query.k` entries for `query`, best first, each with its score (BM25, higher
    /// is more relevant; 0 for a query without terms, which returns the newest matching
    /// entries instead).
    pub fn query(&self, query: &BankQuery) -> Result<Vec<Retrieved>> {
        if query.k == 0 {
            return Ok(Vec::new());
        }
        let terms = query_terms(&query.text, MAX_QUERY_TERMS);
        let mut params = Vec::new();
        let mut filters = Vec::new();
        if !terms.is_empty() {
            params.push(Value::Text(fts5_any(&terms)));
            filters.push("entries_fts MATCH ?1".to_string());
        }
        push_in(
            &mut filters,
            &mut params,
            "e.kind",
            query.kinds.iter().map(|k| k.as_str()),
        );
        let statuses = if query.statuses.is_empty() {
            &DEFAULT_STATUSES[..]
        } else {
            &query.statuses[..]
        };
        push_in(
            &mut filters,
            &mut params,
            "e.status",
            statuses.iter().map(|s| s.as_str()),
        );
        if self.schema_version() >= 2 {
            match query.trajectory_id.map(i64::try_from) {
                Some(Ok(t)) => {
                    params.push(Value::Integer(t));
                    filters.push(format!("e.trajectory_id = ?{}", params.len()));
                }
                // Above the bank's limit: no entry can be scoped to it.
                Some(Err(_)) => filters.push("0".into()),
                None => filters.push("e.trajectory_id IS NULL".into()),
            }
        } else if query.trajectory_id.is_some() {
            // A version-1 bank (read-only, not migrated) holds no scoped entry.
            filters.push("0".into());
        }
        if let Some(task) = &query.task_id {
            params.push(Value::Text(task.clone()));
            let n = params.len();
            filters.push(if query.include_general {
                format!("(e.task_id = ?{n} OR e.task_id IS NULL)")
            } else {
                format!("e.task_id = ?{n}")
            });
        }
        params.push(Value::Integer(i64::try_from(query.k).unwrap_or(i64::MAX)));
        let limit = params.len();
        let filters = if filters.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", filters.join(" AND "))
        };
        let columns = self.columns();
        let statement = if terms.is_empty() {
            format!(
                "SELECT {columns}, 0.0 FROM entries e {filters} ORDER BY e.id DESC LIMIT ?{limit}"
            )
        } else {
            format!(
                "SELECT {columns}, bm25(entries_fts, {COLUMN_WEIGHTS}) AS rank \
                 FROM entries_fts JOIN entries e ON e.id = entries_fts.rowid \
                 {filters} ORDER BY rank, e.id LIMIT ?{limit}"
            )
        };
        let path = self.path();
        let mut stmt = self
            .conn()
            .prepare_cached(&statement)
            .map_err(sql(path, "querying"))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |row| {
                let rank: f64 = row.get(COLUMN_COUNT)?;
                Ok((entry_from_row(row, path), rank))
            })
            .map_err(sql(path, "querying"))?;
        let mut out = Vec::new();
        for row in rows {
            let (entry, rank) = row.map_err(sql(path, "querying"))?;
            // FTS5's bm25() is negated so that ascending order is best first.
            let score = if rank == 0.0 { 0.0 } else { -rank };
            out.push(Retrieved {
                entry: entry?,
                score,
            });
        }
        Ok(out)
    }
}
