//! Plain-data types of the experience bank, as plugins see it through [`crate::Host`].
//!
//! The bank is the kernel's persistent store of text knowledge used as a training-time
//! scaffold: experiences, skills, scaffolds, evidence cards and memory records. Each entry has
//! provenance (who wrote it, from which trajectories, at which step and policy version) and
//! utility statistics that plugins update. An entry may be scoped to one trajectory (memory
//! records always are): only a query naming that trajectory sees it. No SQL crosses the ABI:
//! plugins query, put, update and retire entries with these types, and the kernel stores them
//! (SQLite in the run directory, checkpointed with the run).

use serde::{Deserialize, Serialize};

/// What an entry is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A lesson learned from trajectories (EDGE's experiences).
    #[default]
    Experience,
    /// A reusable procedure, optionally fired by a trigger (ReSkill, SEED/OPID).
    Skill,
    /// A training-time scaffold (Pats).
    Scaffold,
    /// Evidence distilled from a rollout group (Pats' evidence cards).
    EvidenceCard,
    /// A memory record of one turn of one trajectory (ECHO); always scoped to its trajectory
    /// ([`NewEntry::trajectory_id`]).
    MemoryRecord,
}

impl EntryKind {
    pub const ALL: [EntryKind; 5] = [
        EntryKind::Experience,
        EntryKind::Skill,
        EntryKind::Scaffold,
        EntryKind::EvidenceCard,
        EntryKind::MemoryRecord,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Experience => "experience",
            EntryKind::Skill => "skill",
            EntryKind::Scaffold => "scaffold",
            EntryKind::EvidenceCard => "evidence_card",
            EntryKind::MemoryRecord => "memory_record",
        }
    }
}

/// Where an entry is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryStatus {
    #[default]
    Active,
    /// Being tried (e.g. a new skill version under A/B assignment).
    UnderTest,
    /// No longer retrieved; kept for provenance.
    Retired,
}

impl EntryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryStatus::Active => "active",
            EntryStatus::UnderTest => "under_test",
            EntryStatus::Retired => "retired",
        }
    }
}

/// Who wrote an entry, and from what.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Provenance {
    /// Training step at which the entry was written.
    pub step: u64,
    /// Policy version at that step.
    pub policy_version: u64,
    /// Trajectories the entry was derived from (ids of the rows' `trajectory_id`).
    pub source_trajectories: Vec<u64>,
    /// The plugin (or `"skill-creator:<reflector>"`) that wrote it.
    pub writer: String,
}

/// Utility statistics, updated by plugins through [`StatsUpdate`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EntryStats {
    /// Times the entry was shown to a rollout.
    pub exposures: u64,
    /// Exposures whose trajectory succeeded.
    pub successes: u64,
    /// Exponential moving average of the utility credits the entry received.
    pub utility_ema: f64,
    /// Beta posterior `(α, β)` over the entry's success probability (Thompson sampling).
    pub beta_alpha: f64,
    pub beta_beta: f64,
    /// Consecutive management windows with a negative mean credit.
    pub negative_streak: u32,
    /// Step of the last window with a negative credit (for streak continuity).
    pub last_negative_step: Option<u64>,
}

impl Default for EntryStats {
    fn default() -> Self {
        EntryStats {
            exposures: 0,
            successes: 0,
            utility_ema: 0.0,
            beta_alpha: 1.0,
            beta_beta: 1.0,
            negative_streak: 0,
            last_negative_step: None,
        }
    }
}

/// A stored entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BankEntry {
    /// Unique id, assigned by the bank.
    pub id: u64,
    pub kind: EntryKind,
    /// The text injected into prompts.
    pub text: String,
    /// When the entry applies (a ReSkill trigger pattern); `None`: always eligible.
    pub trigger: Option<String>,
    /// The task this entry is specific to; `None`: general.
    pub task_id: Option<String>,
    /// The one trajectory this entry belongs to (ECHO's memory records); `None`: not scoped.
    /// A scoped entry is returned only to a [`BankQuery`] that names its trajectory.
    pub trajectory_id: Option<u64>,
    /// Version of this entry's lineage, from 1; `parent` is the entry it revises.
    pub version: u32,
    pub parent: Option<u64>,
    pub status: EntryStatus,
    pub provenance: Provenance,
    pub stats: EntryStats,
    /// Plugin-defined data, a JSON object.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for BankEntry {
    fn default() -> Self {
        BankEntry {
            id: 0,
            kind: EntryKind::default(),
            text: String::new(),
            trigger: None,
            task_id: None,
            trajectory_id: None,
            version: 1,
            parent: None,
            status: EntryStatus::default(),
            provenance: Provenance::default(),
            stats: EntryStats::default(),
            extra: Default::default(),
        }
    }
}

/// An entry to insert: everything but the id and the statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NewEntry {
    pub kind: EntryKind,
    pub text: String,
    pub trigger: Option<String>,
    pub task_id: Option<String>,
    /// Scopes the entry to one trajectory (the rows' `trajectory_id`, unique within a run):
    /// only a query naming that trajectory returns it. Required for
    /// [`EntryKind::MemoryRecord`], whose put fails without it, so a memory record is never
    /// shared across trajectories or tasks.
    pub trajectory_id: Option<u64>,
    /// The entry this one revises (its version is then the parent's + 1).
    pub parent: Option<u64>,
    pub status: EntryStatus,
    /// `step`, `policy_version` and `writer` are filled in by the kernel when left empty.
    pub provenance: Provenance,
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A retrieval query: top-`k` entries ranked by BM25 relevance of `text` to the entry texts
/// (and triggers), filtered by kind, task, trajectory and status. An empty `text` returns the
/// newest matching entries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BankQuery {
    pub text: String,
    pub k: usize,
    /// Only these kinds (empty: all).
    pub kinds: Vec<EntryKind>,
    /// Only entries for this task, plus general ones when `include_general`.
    pub task_id: Option<String>,
    pub include_general: bool,
    /// `Some(t)`: only the entries scoped to trajectory `t` ([`NewEntry::trajectory_id`]);
    /// `None`: only unscoped entries. A trajectory's entries (memory records) are therefore
    /// never returned to a query that does not name it.
    pub trajectory_id: Option<u64>,
    /// Only these statuses (empty: active and under test).
    pub statuses: Vec<EntryStatus>,
}

impl Default for BankQuery {
    fn default() -> Self {
        BankQuery {
            text: String::new(),
            k: 8,
            kinds: Vec::new(),
            task_id: None,
            include_general: true,
            trajectory_id: None,
            statuses: Vec::new(),
        }
    }
}

/// A retrieved entry with its relevance score (BM25; 0 for an empty query).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Retrieved {
    pub entry: BankEntry,
    pub score: f64,
}

/// A change to one entry's statistics. Every field is optional; the bank applies them in one
/// transaction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsUpdate {
    pub id: u64,
    /// Added to the exposure and success counters.
    pub add_exposures: u64,
    pub add_successes: u64,
    /// Replaces the whole statistics block (after the additions above are ignored).
    pub set: Option<EntryStats>,
    /// New status (e.g. `UnderTest` → `Active` on accept).
    pub status: Option<EntryStatus>,
}

/// A request to the skill creator: reflect on trajectories and write an entry. The answer
/// arrives as a bank entry at a later step (never blocking an RL step); the plugin finds it by
/// querying the bank, or in [`crate::StepReport::new_entries`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReflectionRequest {
    /// Kind of entry to write.
    pub kind: EntryKind,
    /// The reflection prompt (what to analyse and how to answer), rendered by the plugin.
    pub prompt: String,
    /// Trajectories the reflection is about (provenance of the resulting entry).
    pub trajectories: Vec<u64>,
    pub task_id: Option<String>,
    /// The entry a revision replaces.
    pub parent: Option<u64>,
    /// Status the new entry gets (`UnderTest` for a version to be tried).
    pub status: EntryStatus,
    /// Plugin data copied onto the entry's `extra`.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The text a plugin injects into a prompt for some bank entries: the `header` line, then one
/// `- {text}` line per entry (its text trimmed), in the given order. With an empty `header`,
/// the entries' trimmed texts alone, joined by newlines (no bullets); no entries give the
/// header alone (or `""` with an empty header).
pub fn injection(header: &str, entries: &[BankEntry]) -> String {
    if header.is_empty() {
        let texts: Vec<&str> = entries.iter().map(|e| e.text.trim()).collect();
        return texts.join("\n");
    }
    let mut out = String::from(header);
    for e in entries {
        out.push_str("\n- ");
        out.push_str(e.text.trim());
    }
    out
}

/// The distinct terms of a full-text query, in order of first appearance: maximal runs of
/// alphanumeric characters, lower-cased, at most `max` (the first ones). The boundaries are
/// those of SQLite FTS5's `unicode61` tokeniser, so a term is what the index holds; match the
/// terms with [`fts5_any`], never as FTS5 syntax (a query text holds `-`, `:`, quotes, `AND`).
/// The kernel's bank retrieval and the search-qa environment's search tool both cut their
/// queries with it.
pub fn query_terms(text: &str, max: usize) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if terms.len() == max {
            break;
        }
        if word.is_empty() {
            continue;
        }
        let word = word.to_lowercase();
        if !terms.contains(&word) {
            terms.push(word);
        }
    }
    terms
}

/// The FTS5 `MATCH` expression that any of `terms` satisfies: each term a quoted string
/// (inner quotes doubled), joined by `OR`.
pub fn fts5_any(terms: &[String]) -> String {
    terms
        .iter()
        .map(|t| format!("\"{}\"", t.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" OR ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_text_becomes_distinct_quoted_terms() {
        let terms = query_terms("You see: a Mug-1, the mug; \"AND\" NEAR(x) ÉCLAIR 2x", 64);
        assert_eq!(
            terms,
            ["you", "see", "a", "mug", "1", "the", "and", "near", "x", "éclair", "2x"]
        );
        assert_eq!(fts5_any(&terms[..3]), r#""you" OR "see" OR "a""#);
        assert_eq!(fts5_any(&["say \"hi\"".to_string()]), r#""say ""hi""""#);
        assert!(query_terms(" -- :: ", 64).is_empty());
        assert_eq!(query_terms("a b a c", 2), ["a", "b"]);
        assert!(query_terms("a b", 0).is_empty());
    }

    #[test]
    fn an_injection_is_the_header_then_one_bullet_per_trimmed_text_or_the_texts_alone() {
        let entries: Vec<BankEntry> = [" wash it first ", "then dry it\n"]
            .into_iter()
            .map(|text| BankEntry {
                text: text.into(),
                ..BankEntry::default()
            })
            .collect();
        assert_eq!(
            injection("Skills:", &entries),
            "Skills:\n- wash it first\n- then dry it"
        );
        assert_eq!(injection("", &entries), "wash it first\nthen dry it");
        assert_eq!(injection("Skills:", &[]), "Skills:");
        assert_eq!(injection("", &[]), "");
    }

    /// The bank types cross the ABI as JSON (`Host::call_json`): the trajectory scope travels
    /// in it, and JSON written without it (an older writer) reads as unscoped.
    #[test]
    fn the_trajectory_scope_crosses_as_json_and_defaults_to_none() {
        let put = NewEntry {
            kind: EntryKind::MemoryRecord,
            text: "[0] search[iron] => 26".into(),
            trajectory_id: Some(17),
            ..NewEntry::default()
        };
        let text = serde_json::to_string(&put).unwrap();
        assert!(text.contains(r#""trajectory_id":17"#), "{text}");
        assert_eq!(serde_json::from_str::<NewEntry>(&text).unwrap(), put);
        let query = BankQuery {
            trajectory_id: Some(17),
            ..BankQuery::default()
        };
        let text = serde_json::to_string(&query).unwrap();
        assert_eq!(serde_json::from_str::<BankQuery>(&text).unwrap(), query);
        let old: BankQuery = serde_json::from_str(r#"{"text": "iron", "k": 3}"#).unwrap();
        assert_eq!((old.trajectory_id, old.k), (None, 3));
        let old: BankEntry = serde_json::from_str(r#"{"id": 4, "text": "x"}"#).unwrap();
        assert_eq!(old.trajectory_id, None);
        let old: NewEntry = serde_json::from_str(r#"{"text": "x"}"#).unwrap();
        assert_eq!(old.trajectory_id, None);
    }
}
