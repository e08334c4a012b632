//! The plugin's JSON config: parsing with named-key errors, defaults and validation.

use serde::Deserialize;

use cairn_plugin_sdk::{PluginError, Result};

use crate::questions::{Kind, SplitBy};
use crate::search::MAX_PASSAGE_WORDS;

/// Smallest non-zero `context_budget`: the instructions, a question and one short passage.
pub const MIN_CONTEXT_BUDGET: u32 = 48;
/// Largest `max_turns`.
pub const MAX_TURNS: u32 = 64;
/// Largest `top_k`.
pub const MAX_TOP_K: u32 = 10;

/// How an answer is scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// 1 for a normalised exact match, else 0.
    ExactMatch,
    /// SQuAD token F1 in `[0, 1]`.
    F1,
}

/// The search-qa config. Every key is optional; unknown keys are an error.
///
/// ```json
/// {"corpus": "data/my-elements.txt", "kinds": ["atomic_number", "discoverer_by_number"],
///  "train_tasks": 100, "test_tasks": 20, "max_turns": 6, "top_k": 3, "passage_words": 40,
///  "context_budget": 0, "history": true, "reward": "exact_match", "split_by": "element"}
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchQaConfig {
    /// A corpus file in the dict-elements text format (relative paths from the working
    /// directory of the process); absent: the built-in copy of Debian's `dict-elements`.
    pub corpus: Option<String>,
    /// The question kinds to generate (names from [`Kind::name`]), taken in turn in task order.
    pub kinds: Vec<String>,
    /// Training tasks used (the first ones of the split); absent: all that the kinds give.
    pub train_tasks: Option<u64>,
    /// Held-out tasks used; absent: all.
    pub test_tasks: Option<u64>,
    /// Turn limit: at this turn an unanswered episode ends with reward 0. 1 to 64.
    pub max_turns: u32,
    /// Passages a search returns. 1 to 10.
    pub top_k: u32,
    /// Most whitespace-separated words of an entry's prose in a passage, chosen by sentences
    /// (the header is always shown). 4 to 400.
    pub passage_words: u32,
    /// Most whitespace-separated words of an observation; 0: no limit. The oldest history
    /// is dropped first to fit. 0, or 48 to 100000.
    pub context_budget: u32,
    /// Show the earlier turns in each observation. `false`: only the latest search's results
    /// (with the instructions and the question), for a memory plugin such as `echo` whose
    /// records are then the only history.
    pub history: bool,
    /// `exact_match` or `f1`.
    pub reward: RewardKind,
    /// `element` (every question about a held-out element is held out) or `question` (each
    /// question hashed on its own).
    pub split_by: SplitBy,
}

impl Default for SearchQaConfig {
    fn default() -> Self {
        SearchQaConfig {
            corpus: None,
            kinds: Kind::ALL.iter().map(|k| k.name().to_string()).collect(),
            train_tasks: None,
            test_tasks: None,
            max_turns: 6,
            top_k: 3,
            passage_words: 40,
            context_budget: 0,
            history: true,
            reward: RewardKind::ExactMatch,
            split_by: SplitBy::Element,
        }
    }
}

fn fail<T>(key: &str, why: impl std::fmt::Display) -> Result<T> {
    Err(PluginError::config(format!(
        "search-qa config key `{key}`: {why}"
    )))
}

impl SearchQaConfig {
    /// Parses a config from JSON text; empty text or `null` gives the defaults. An error names
    /// the offending key (an unknown key, with the allowed ones).
    pub fn from_json(text: &str) -> Result<SearchQaConfig> {
        let value: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(text).map_err(|e| {
                PluginError::config(format!("search-qa config is not valid JSON: {e}"))
            })?
        };
        let map = match value {
            serde_json::Value::Null => return Ok(SearchQaConfig::default()),
            serde_json::Value::Object(map) => map,
            other => {
                return Err(PluginError::config(format!(
                    "search-qa config must be a JSON object, got `{other}`"
                )))
            }
        };
        // Key by key first, so a type error names its key.
        for (key, item) in &map {
            let single =
                serde_json::Value::Object([(key.clone(), item.clone())].into_iter().collect());
            if let Err(e) = serde_json::from_value::<SearchQaConfig>(single) {
                return Err(PluginError::config(format!(
                    "search-qa config key `{key}`: {e}"
                )));
            }
        }
        let config: SearchQaConfig = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(|e| PluginError::config(format!("search-qa config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks each value's range (the task counts are checked against the corpus later).
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_TURNS).contains(&self.max_turns) {
            return fail(
                "max_turns",
                format!("is {}, must be from 1 to {MAX_TURNS}", self.max_turns),
            );
        }
        if !(1..=MAX_TOP_K).contains(&self.top_k) {
            return fail(
                "top_k",
                format!("is {}, must be from 1 to {MAX_TOP_K}", self.top_k),
            );
        }
        if !(4..=MAX_PASSAGE_WORDS).contains(&self.passage_words) {
            return fail(
                "passage_words",
                format!(
                    "is {}, must be from 4 to {MAX_PASSAGE_WORDS}",
                    self.passage_words
                ),
            );
        }
        if self.context_budget != 0
            && !(MIN_CONTEXT_BUDGET..=100_000).contains(&self.context_budget)
        {
            return fail(
                "context_budget",
                format!(
                    "is {}, must be 0 (no limit) or from {MIN_CONTEXT_BUDGET} to 100000 words",
                    self.context_budget
                ),
            );
        }
        if self.kinds.is_empty() {
            return fail("kinds", "must name at least one question kind");
        }
        for (i, name) in self.kinds.iter().enumerate() {
            if Kind::from_name(name).is_none() {
                let allowed: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                return fail(
                    "kinds",
                    format!(
                        "unknown kind `{name}`, expected one of {}",
                        allowed.join(", ")
                    ),
                );
            }
            if self.kinds[..i].contains(name) {
                return fail("kinds", format!("`{name}` is listed twice"));
            }
        }
        for (key, value) in [
            ("train_tasks", self.train_tasks),
            ("test_tasks", self.test_tasks),
        ] {
            if value == Some(0) {
                return fail(key, "must be at least 1 (leave it out for all tasks)");
            }
        }
        if let Some(path) = &self.corpus {
            if path.trim().is_empty() {
                return fail("corpus", "is empty; give a file path or leave the key out");
            }
        }
        Ok(())
    }

    /// The configured kinds, parsed (call after [`SearchQaConfig::validate`]).
    pub fn kinds(&self) -> Vec<Kind> {
        self.kinds
            .iter()
            .filter_map(|k| Kind::from_name(k))
            .collect()
    }
}
