//! Memory records (the paper's "compact memory record" of each completed turn; its form here
//! is ours, a proposal) and the bounded context rebuilt from them.
//!
//! **A record.** Turn `k` of a trajectory, once the environment has answered it, becomes
//!
//! `[k] <action summary> => <observation digest>`
//!
//! on one line: the action with its selection run removed ([`crate::select::without_selection`]),
//! and the observation that action produced (the next turn's observation) without the lines it
//! shares with the trajectory's first observation (an environment's instructions and question,
//! repeated every turn, would otherwise fill the record before its evidence), whitespace
//! collapsed. The whole line is cut to at most `b = record_tokens` policy tokens (a cut ends in
//! ` …`), so `b` bounds index, summary and digest together. The record is a bank entry of kind
//! `memory_record`, scoped to its trajectory, with `extra = {"idx": k, "tokens": n, "cut":
//! bool, "raw": {"trajectory_id": id, "turn": k}}`: `raw` points at the full turn in the data
//! pool (`cairn pool`), `tokens` is the line's length in policy tokens.
//!
//! **The context of turn `t ≥ 1`** (a [`cairn_plugin_sdk::ContextVariant::inject`] block in
//! front of the environment's observation, rendered by the kernel's prompt builder):
//!
//! ```text
//! <the slot's own inject, if any>
//! Task: <the trajectory's first observation>          (task_block)
//! <header>
//! [i] ...                                             the shown records, by index
//! [j] ...
//! [t-1] <action summary of turn t-1> =>
//! <the current observation: what turn t-1's action produced>
//! ```
//!
//! The shown records are the selection `S_{t-1}` of the previous response, in the policy's
//! order, each taken while the record tokens so far stay within `B = context_budget` (one that
//! does not fit is skipped and counted); without a selection, the most recent records
//! `t-2, t-3, …` while they fit. Record `t-1` is the current observation itself, shown in full.

use cairn_plugin_sdk::{EntryKind, Host, NewEntry, PluginError, Provenance, Result};
use serde_json::{json, Map, Value};

use crate::select::{collapse, without_selection};

/// What a cut record ends with.
pub const CUT_MARK: &str = " …";

/// The digest of a turn whose result is not known (the trajectory's last turn).
pub const ENDED: &str = "(episode ended)";

/// One memory record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The turn it records, `k`.
    pub idx: u32,
    /// The record line, `[k] summary => digest`, at most `b` tokens.
    pub text: String,
    /// The line's length in policy tokens.
    pub tokens: u32,
    /// Whether the line was cut to fit `b`.
    pub cut: bool,
}

/// Number of policy tokens of `text`.
pub fn count(host: &dyn Host, text: &str) -> Result<u32> {
    let n = host.tokenize(text)?.len();
    u32::try_from(n).map_err(|_| PluginError::internal(format!("{n} tokens in one record")))
}

/// The full (uncut) record line of turn `k`: `action` as the policy wrote it, `result` the
/// observation it produced (`None`: not known, the last turn), `task` the trajectory's first
/// observation: a line of `result` equal to one of `task`'s (both trimmed) is left out of the
/// digest.
pub fn line(k: u32, action: &str, result: Option<&str>, task: Option<&str>) -> String {
    let summary = without_selection(action);
    let summary = if summary.is_empty() {
        "(no action)".to_string()
    } else {
        summary
    };
    let shared: Vec<&str> = task
        .map(|t| t.lines().map(str::trim).filter(|l| !l.is_empty()).collect())
        .unwrap_or_default();
    let fresh = |r: &str| -> String {
        let lines: Vec<&str> = r.lines().filter(|l| !shared.contains(&l.trim())).collect();
        collapse(&lines.join("\n"))
    };
    let digest = match result.map(fresh) {
        None => ENDED.to_string(),
        Some(d) if d.is_empty() => "(no observation)".to_string(),
        Some(d) => d,
    };
    format!("[{k}] {summary} => {digest}")
}

/// `text` cut to at most `max` policy tokens: the longest character prefix (ending at a word
/// boundary where one exists) that, followed by [`CUT_MARK`], fits, found by bisection. The
/// first `keep` characters (the `[k]` index) are never cut. Returns the text, its token count
/// and whether it was cut.
pub fn fit(host: &dyn Host, text: &str, max: u32, keep: usize) -> Result<(String, u32, bool)> {
    let n = count(host, text)?;
    if n <= max {
        return Ok((text.to_string(), n, false));
    }
    let chars: Vec<char> = text.chars().collect();
    let cut = |c: usize| -> String {
        let head: String = chars[..c].iter().collect();
        format!("{}{CUT_MARK}", head.trim_end())
    };
    // Invariant: `lo` fits (or is the floor `keep`), `hi` does not.
    let (mut lo, mut hi) = (keep.min(chars.len()), chars.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if count(host, &cut(mid))? <= max {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Back off to the last word boundary, when that still keeps something past the index.
    if let Some(space) = chars[..lo].iter().rposition(|c| c.is_whitespace()) {
        if space > keep && chars.get(lo).is_some_and(|c| !c.is_whitespace()) {
            let text = cut(space);
            let n = count(host, &text)?;
            if n <= max {
                return Ok((text, n, true));
            }
        }
    }
    let text = cut(lo);
    let n = count(host, &text)?;
    Ok((text, n, true))
}

/// The record of turn `k` (see the module docs), cut to `max_tokens`.
pub fn build(
    host: &dyn Host,
    k: u32,
    action: &str,
    result: Option<&str>,
    task: Option<&str>,
    max_tokens: u32,
) -> Result<Record> {
    let full = line(k, action, result, task);
    let keep = format!("[{k}]").chars().count();
    let (text, tokens, cut) = fit(host, &full, max_tokens, keep)?;
    Ok(Record {
        idx: k,
        text,
        tokens,
        cut,
    })
}

impl Record {
    /// The bank entry of this record of trajectory `trajectory` (task `task`).
    pub fn to_entry(&self, trajectory: u64, task: &str) -> NewEntry {
        let mut extra = Map::new();
        extra.insert("idx".into(), json!(self.idx));
        extra.insert("tokens".into(), json!(self.tokens));
        extra.insert("cut".into(), json!(self.cut));
        extra.insert(
            "raw".into(),
            json!({"trajectory_id": trajectory, "turn": self.idx}),
        );
        NewEntry {
            kind: EntryKind::MemoryRecord,
            text: self.text.clone(),
            task_id: Some(task.to_string()),
            trajectory_id: Some(trajectory),
            provenance: Provenance {
                source_trajectories: vec![trajectory],
                ..Provenance::default()
            },
            extra,
            ..NewEntry::default()
        }
    }

    /// The record a bank entry holds; `None` for an entry that is not one of ours (no `idx`
    /// or `tokens` in its `extra`).
    pub fn from_entry(entry: &cairn_plugin_sdk::BankEntry) -> Option<Record> {
        let get = |key: &str| entry.extra.get(key).and_then(Value::as_u64);
        Some(Record {
            idx: u32::try_from(get("idx")?).ok()?,
            text: entry.text.clone(),
            tokens: u32::try_from(get("tokens")?).ok()?,
            cut: entry.extra.get("cut").and_then(Value::as_bool) == Some(true),
        })
    }
}

/// Which records a prompt shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shown {
    /// Indices shown, ascending.
    pub indices: Vec<u32>,
    /// Their summed tokens, `≤ B`.
    pub tokens: u32,
    /// Selected records that did not fit the budget (skipped).
    pub over_budget: usize,
}

/// The records shown at a turn: `selection` (valid indices in the policy's order) first-fit
/// within `budget` tokens, or, with no selection, the most recent of `candidates` (indices
/// below the current observation's record, newest first) while they fit. `tokens_of(k)` is a
/// record's length; a selected index without a record is skipped.
pub fn choose(
    selection: Option<&[u32]>,
    candidates: &[u32],
    budget: u32,
    tokens_of: impl Fn(u32) -> Option<u32>,
) -> Shown {
    let mut shown = Shown::default();
    match selection {
        Some(selected) => {
            for &k in selected {
                let Some(n) = tokens_of(k) else { continue };
                if shown.tokens + n <= budget {
                    shown.indices.push(k);
                    shown.tokens += n;
                } else {
                    shown.over_budget += 1;
                }
            }
        }
        None => {
            for &k in candidates {
                let Some(n) = tokens_of(k) else { continue };
                if shown.tokens + n > budget {
                    break;
                }
                shown.indices.push(k);
                shown.tokens += n;
            }
        }
    }
    shown.indices.sort_unstable();
    shown
}

/// The inject block of a reconstructed prompt (see the module docs).
pub fn inject(
    slot_inject: &str,
    task: Option<&str>,
    header: &str,
    records: &[&Record],
    last: u32,
    last_action: &str,
) -> String {
    let mut lines: Vec<String> = Vec::new();
    if !slot_inject.is_empty() {
        lines.push(slot_inject.to_string());
    }
    if let Some(task) = task {
        lines.push(format!("Task: {}", collapse(task)));
    }
    if !header.is_empty() {
        lines.push(header.to_string());
    }
    lines.extend(records.iter().map(|r| r.text.clone()));
    let summary = without_selection(last_action);
    lines.push(if summary.is_empty() {
        format!("[{last}] (no action) =>")
    } else {
        format!("[{last}] {summary} =>")
    });
    lines.join("\n")
}
