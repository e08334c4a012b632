//! `cairn-search-qa`: question answering with a search tool over the public-domain
//! chemical-elements corpus (Jay F. Kominek's Elements database, as Debian's `dict-elements`
//! ships it; `data/README.md`), exported as a Cairn environment plugin. docs/search-qa.md is
//! the user's page; this is the code's summary.
//!
//! # Tasks
//!
//! Questions are generated from the corpus ([`questions`]): single-hop (`what is the atomic
//! number of iron`, `what is the chemical symbol of iron`, `what is the atomic weight of
//! iron`, `who discovered hydrogen`, `in what year was hydrogen discovered`) and two-hop
//! (`who discovered the element with atomic number 1`, `what is the symbol of the element
//! discovered by Henry Cavendish`, each only where the bridge is unique). The task kinds are
//! the question kinds. Splits are by element (one in five held out, by a fixed hash of the
//! atomic number), so every question about a held-out element is held out; `split_by =
//! "question"` hashes each question instead. `(split, index)`
//! fixes the task and the episode (the seed changes nothing: the dynamics are deterministic).
//!
//! # Actions and tools
//!
//! The response text holds `search[query]`, `answer[text]` or a `<tool_call>` block calling
//! the `search` tool ([`search_schema`]); the first one anywhere in the text wins
//! ([`actions`]). A search returns the `top_k` best entries by BM25 (SQLite FTS5, [`search`]),
//! each as a passage `name | Symbol: .. | Atomic number: .. | Atomic weight: .. | snippet`. An
//! answer ends the episode. A slot with tools off ([`ContextVariant::tools_enabled`] false)
//! is offered no tool, its observations never mention searching, and a search (either form)
//! is **refused**: not run, feedback −1, `tool_calls` 0, `info.refused_tool_call = true`.
//! `tool_calls` is 1 on each executed search.
//!
//! # Rewards, feedback, anchors
//!
//! The answer step's reward is the SQuAD-normalised exact match (`reward = "exact_match"`,
//! the default) or token F1 (`"f1"`) against the gold answer ([`reward`]); success is an exact
//! match; other steps give 0, and at `max_turns` an unanswered episode ends with 0. Feedback:
//! +1 for a search that shows at least one entry not shown before in the episode, or an exact
//! answer; −1 for an invalid or refused action, or an answer with F1 0; 0 otherwise (a search
//! with nothing new, a partly right answer). The anchor key is the question and the terms of
//! the last search (no history), so equal states of one task's trajectories group together.
//!
//! # Observations and the context budget
//!
//! The observation is the instructions, the history of earlier turns (each search with its
//! passages; refused and invalid actions with the reason), the latest search results, then
//! the question and the turns left. With `context_budget = N > 0` the text is cut to at most `N`
//! whitespace-separated words by dropping the **oldest** history turns first (a line says how
//! many are not shown), then the latest results from their end; the instructions and the
//! question are never cut. So evidence found early is lost when later searches fill the
//! budget: the regime ECHO's memory is for. With `history = false` no earlier turn is shown,
//! only the last turn's results (or why it was invalid or refused), so a memory plugin's
//! records are the only history.
//!
//! # Expert
//!
//! [`Episode::expert_action`] searches the question's subject with a query that finds it
//! (`iron atomic number`; for the two-hop `discoverer_by_number`, `atomic number 1` then
//! `hydrogen discovered`), then answers with the gold answer; with tools off it answers at
//! once. Its searches show the answer in their passages for every question (a test checks
//! it), so the demonstrations of a warm start are honest.

pub mod actions;
pub mod config;
pub mod corpus;
pub mod questions;
pub mod reward;
pub mod search;

use std::collections::BTreeSet;
use std::sync::Arc;

use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, Observation, PluginError, Result, Split,
    StepOutcome, TaskInfo, TaskRef,
};
use serde_json::{json, Value as Json};

pub use actions::Action;
pub use config::{RewardKind, SearchQaConfig};
pub use corpus::{Corpus, Discovery, Entry, Verb};
pub use questions::{Kind, Question, SplitBy};
pub use search::{Hit, Index};

/// The `search` tool's OpenAI-style function schema.
pub fn search_schema() -> Json {
    json!({
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search an encyclopedia of the chemical elements; returns the best \
                            matching entries.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "For example \"iron atomic number\"."}
                },
                "required": ["query"]
            }
        }
    })
}

/// The environment's shared parts: the corpus, its index and the config.
#[derive(Debug)]
struct Shared {
    config: SearchQaConfig,
    corpus: Corpus,
    index: Index,
}

/// The search-QA environment.
#[derive(Clone, Debug)]
pub struct SearchQa {
    shared: Arc<Shared>,
    train: Vec<Question>,
    test: Vec<Question>,
}

impl SearchQa {
    /// The plugin's create function: parses and validates the JSON config, loads the corpus
    /// and builds the index. Errors: a config error naming the key; a corpus file that is
    /// missing or corrupt (naming the path and what is wrong); task counts above what the
    /// kinds give.
    pub fn from_config_json(text: &str) -> Result<SearchQa> {
        SearchQa::new(SearchQaConfig::from_json(text)?)
    }

    /// Builds the environment from a config (validated here).
    pub fn new(config: SearchQaConfig) -> Result<SearchQa> {
        config.validate()?;
        let corpus = match &config.corpus {
            None => Corpus::built_in(),
            Some(path) => Corpus::load(path)
                .map_err(|e| PluginError::config(format!("search-qa config key `corpus`: {e}")))?,
        };
        let index = Index::build(&corpus).map_err(PluginError::internal)?;
        let all = questions::generate(&corpus, config.split_by);
        let kinds = config.kinds();
        let mut train = questions::ordered(&all, Split::Train, &kinds);
        let mut test = questions::ordered(&all, Split::Test, &kinds);
        for (key, limit, list, split) in [
            ("train_tasks", config.train_tasks, &mut train, "training"),
            ("test_tasks", config.test_tasks, &mut test, "held-out"),
        ] {
            if list.is_empty() {
                return Err(PluginError::config(format!(
                    "search-qa config key `kinds`: the kinds {:?} give no {split} question from \
                     the corpus {}; add kinds or use another corpus",
                    config.kinds, corpus.source
                )));
            }
            if let Some(n) = limit {
                if n > list.len() as u64 {
                    return Err(PluginError::config(format!(
                        "search-qa config key `{key}`: is {n}, but the kinds give {} {split} \
                         questions; lower it or leave it out for all",
                        list.len()
                    )));
                }
                list.truncate(n as usize);
            }
        }
        Ok(SearchQa {
            shared: Arc::new(Shared {
                config,
                corpus,
                index,
            }),
            train,
            test,
        })
    }

    pub fn config(&self) -> &SearchQaConfig {
        &self.shared.config
    }

    pub fn corpus(&self) -> &Corpus {
        &self.shared.corpus
    }

    pub fn index(&self) -> &Index {
        &self.shared.index
    }

    /// The tasks of a split, in task order.
    pub fn questions(&self, split: Split) -> &[Question] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// The question of a task. Errors: the index is out of range.
    pub fn question(&self, task: TaskRef) -> Result<&Question> {
        let list = self.questions(task.split);
        list.get(task.index as usize).ok_or_else(|| {
            PluginError::input(format!(
                "search-qa has {} {} tasks, no task {}",
                list.len(),
                task.split.as_str(),
                task.index
            ))
        })
    }

    /// Starts an episode, as the concrete type (`tools`: the slot's tools are on).
    pub fn episode(&self, task: TaskRef, tools: bool) -> Result<SearchQaEpisode> {
        Ok(SearchQaEpisode {
            shared: Arc::clone(&self.shared),
            question: self.question(task)?.clone(),
            tools,
            turns: Vec::new(),
            seen: BTreeSet::new(),
            searched: BTreeSet::new(),
            done: false,
        })
    }
}

impl Environment for SearchQa {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: self.train.len() as u64,
            test_tasks: self.test.len() as u64,
            max_turns: self.shared.config.max_turns,
            anchor_keys: true,
            step_rewards: true,
            feedback: true,
            tools: true,
            task_kinds: self.shared.config.kinds.clone(),
        }
    }

    fn task(&self, task: TaskRef) -> Result<TaskInfo> {
        let q = self.question(task)?;
        Ok(TaskInfo {
            id: q.id.clone(),
            kind: q.kind.name().to_string(),
            goal: q.text.clone(),
        })
    }

    /// The episode is fixed by the task (the seed changes nothing); the variant's
    /// `tools_enabled` decides whether the `search` tool is offered and run.
    fn start(
        &self,
        task: TaskRef,
        _seed: u64,
        variant: &ContextVariant,
    ) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.episode(task, variant.tools_enabled)?))
    }
}

/// What one earlier turn did, as the history shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Turn {
    Search { query: String, hits: Vec<Hit> },
    Refused,
    Invalid { reason: String },
}

/// A running episode.
#[derive(Debug)]
pub struct SearchQaEpisode {
    shared: Arc<Shared>,
    question: Question,
    /// The slot's tools are on (from the variant at `start`).
    tools: bool,
    /// Every turn so far (an answer ends the episode and is not kept).
    turns: Vec<Turn>,
    /// Entries shown so far (indices into the corpus).
    seen: BTreeSet<usize>,
    /// Searches run so far, as their normalised terms.
    searched: BTreeSet<String>,
    done: bool,
}

const REFUSED: &str = "tools are not available here; reply with answer[text].";

/// A rendered observation: its text and how many history turns the budget left out.
struct Rendered {
    text: String,
    dropped: usize,
}

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

impl SearchQaEpisode {
    pub fn question(&self) -> &Question {
        &self.question
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Turns taken so far.
    pub fn turn(&self) -> u32 {
        self.turns.len() as u32
    }

    fn config(&self) -> &SearchQaConfig {
        &self.shared.config
    }

    fn intro(&self) -> String {
        let how = if self.tools {
            "Reply with search[query] to search an encyclopedia of the elements, or \
             answer[text] to give your final answer."
        } else {
            "Reply with answer[text]."
        };
        format!("Answer the question about the chemical elements. {how}")
    }

    /// The index in `turns` of the latest search, shown as the latest results.
    fn latest_search(&self) -> Option<usize> {
        self.turns
            .iter()
            .rposition(|t| matches!(t, Turn::Search { .. }))
    }

    fn turn_lines(&self, number: usize, turn: &Turn, latest: bool) -> Vec<String> {
        match turn {
            Turn::Search { query, hits } => {
                let mut lines = vec![if latest {
                    format!("Latest results, turn {number}: search[{query}]")
                } else {
                    format!("Turn {number}: search[{query}]")
                }];
                if hits.is_empty() {
                    lines.push("no results".into());
                }
                for (i, h) in hits.iter().enumerate() {
                    lines.push(format!("{}. {}", i + 1, h.passage));
                }
                lines
            }
            Turn::Refused => vec![format!("Turn {number}: refused: {REFUSED}")],
            Turn::Invalid { reason } => {
                let reason = if self.tools {
                    reason.as_str()
                } else {
                    "no answer found; reply with answer[text]"
                };
                vec![format!("Turn {number}: invalid: {reason}")]
            }
        }
    }

    fn render(&self) -> Rendered {
        let intro = self.intro();
        let left = self.config().max_turns.saturating_sub(self.turn());
        // The question comes last, right before the policy answers (a small policy copies a
        // name or a number more easily from nearby text).
        let footer = format!("Question: {}\nTurns left: {left}.", self.question.text);
        // Without history only the last turn is shown, whatever it was: the observation still
        // reports what the last action produced.
        let latest = if self.config().history {
            self.latest_search()
        } else {
            self.turns.len().checked_sub(1)
        };
        let history: Vec<Vec<String>> = self
            .turns
            .iter()
            .enumerate()
            .filter(|(i, _)| self.config().history && Some(*i) != latest)
            .map(|(i, t)| self.turn_lines(i + 1, t, false))
            .collect();
        let mut latest_lines = latest
            .map(|i| self.turn_lines(i + 1, &self.turns[i], true))
            .unwrap_or_default();
        let budget = self.config().context_budget as usize;
        let mut dropped = 0;
        if budget > 0 {
            let block = |lines: &[String]| lines.iter().map(|l| words(l)).sum::<usize>();
            let history_words: Vec<usize> = history.iter().map(|h| block(h)).collect();
            let fixed = words(&intro) + words(&footer);
            let note = |n: usize| format!("({n} earlier turns not shown)");
            let total = |dropped: usize, latest: &[String]| {
                fixed
                    + history_words[dropped..].iter().sum::<usize>()
                    + block(latest)
                    + if dropped > 0 {
                        words(&note(dropped))
                    } else {
                        0
                    }
            };
            while dropped < history.len() && total(dropped, &latest_lines) > budget {
                dropped += 1;
            }
            // Then the latest results, from their end: whole passages, then words.
            while latest_lines.len() > 1 && total(dropped, &latest_lines) > budget {
                latest_lines.pop();
            }
            let over = total(dropped, &latest_lines).saturating_sub(budget);
            if over > 0 && latest_lines.len() > 1 {
                let last = latest_lines.last_mut().expect("a passage line");
                let keep = words(last).saturating_sub(over + 1);
                let cut: Vec<&str> = last.split_whitespace().take(keep).collect();
                *last = format!("{} ...", cut.join(" "));
            }
        }
        let mut lines = vec![intro];
        if dropped > 0 {
            lines.push(format!("({dropped} earlier turns not shown)"));
        }
        for h in &history[dropped..] {
            lines.extend(h.iter().cloned());
        }
        lines.extend(latest_lines);
        lines.push(footer);
        Rendered {
            text: lines.join("\n"),
            dropped,
        }
    }

    fn anchor(&self) -> String {
        match self.latest_search() {
            Some(i) => match &self.turns[i] {
                Turn::Search { query, .. } => format!(
                    "{} | last search: {}",
                    self.question.text,
                    search::query_terms(query).join(" ")
                ),
                _ => unreachable!("latest_search points at a search"),
            },
            None => format!("{} | no search yet", self.question.text),
        }
    }

    /// How many history turns the current observation leaves out under the budget.
    pub fn history_dropped(&self) -> usize {
        self.render().dropped
    }
}

impl Episode for SearchQaEpisode {
    fn observation(&self) -> Observation {
        Observation {
            text: self.render().text,
            anchor: Some(self.anchor()),
            admissible_actions: Vec::new(),
            tools: if self.tools {
                vec![search_schema()]
            } else {
                Vec::new()
            },
        }
    }

    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        if self.done {
            return Err(PluginError::input(format!(
                "task {}: step after the episode ended; start a new one",
                self.question.id
            )));
        }
        let number = self.turn() + 1;
        let mut outcome = StepOutcome::default();
        let mut info = serde_json::Map::new();
        info.insert("turn".into(), json!(number));
        let parsed = actions::parse(action);
        let refused = !self.tools
            && matches!(
                parsed,
                Action::Search { .. } | Action::Invalid { tool: true, .. }
            );
        if refused {
            // Tools are off for this slot: refuse, never run.
            self.turns.push(Turn::Refused);
            outcome.feedback = -1;
            info.insert("action".into(), json!("refused"));
            info.insert("refused_tool_call".into(), json!(true));
            info.insert("message".into(), json!(format!("refused: {REFUSED}")));
        } else {
            match parsed {
                Action::Search { query, tool_call } => {
                    let config = self.config();
                    let hits = self
                        .shared
                        .index
                        .search(&query, config.top_k as usize, config.passage_words)
                        .map_err(|e| {
                            PluginError::internal(format!(
                                "task {}: search failed: {e}",
                                self.question.id
                            ))
                        })?;
                    let new = hits
                        .iter()
                        .filter(|h| !self.seen.contains(&h.entry))
                        .count();
                    self.seen.extend(hits.iter().map(|h| h.entry));
                    self.searched.insert(search::query_terms(&query).join(" "));
                    outcome.tool_calls = 1;
                    outcome.feedback = i8::from(new > 0);
                    info.insert("action".into(), json!("search"));
                    info.insert("query".into(), json!(query));
                    info.insert("tool_call".into(), json!(tool_call));
                    info.insert(
                        "results".into(),
                        json!(hits.iter().map(|h| &h.name).collect::<Vec<_>>()),
                    );
                    info.insert(
                        "passages".into(),
                        json!(hits.iter().map(|h| &h.passage).collect::<Vec<_>>()),
                    );
                    info.insert("new_results".into(), json!(new));
                    self.turns.push(Turn::Search { query, hits });
                }
                Action::Answer(text) => {
                    let em = reward::exact_match(&text, &self.question.answer);
                    let f1 = reward::f1(&text, &self.question.answer);
                    self.done = true;
                    outcome.done = true;
                    outcome.success = em == 1.0;
                    outcome.reward = match self.config().reward {
                        RewardKind::ExactMatch => em,
                        RewardKind::F1 => f1,
                    };
                    outcome.feedback = if outcome.success {
                        1
                    } else if f1 == 0.0 {
                        -1
                    } else {
                        0
                    };
                    info.insert("action".into(), json!("answer"));
                    info.insert("answer".into(), json!(text));
                    info.insert("exact_match".into(), json!(em));
                    info.insert("f1".into(), json!(f1));
                }
                Action::Invalid { reason, .. } => {
                    outcome.feedback = -1;
                    info.insert("action".into(), json!("invalid"));
                    let turn = Turn::Invalid { reason };
                    let shown = self.turn_lines(number as usize, &turn, false).join("\n");
                    let message = shown.split_once(": ").map_or(shown.as_str(), |(_, m)| m);
                    info.insert("message".into(), json!(message));
                    self.turns.push(turn);
                }
            }
        }
        let turn_limit = !self.done && number >= self.config().max_turns;
        if turn_limit {
            self.done = true;
            outcome.done = true;
        }
        info.insert("turn_limit".into(), json!(turn_limit));
        if self.done {
            info.insert("gold".into(), json!(self.question.answer));
        }
        outcome.observation = self.observation();
        info.insert("history_dropped".into(), json!(self.history_dropped()));
        outcome.info_json = Json::Object(info).to_string();
        Ok(outcome)
    }

    fn expert_action(&self) -> Option<String> {
        if self.done {
            return None;
        }
        if self.tools {
            for q in &self.question.queries {
                if !self.searched.contains(&search::query_terms(q).join(" ")) {
                    return Some(format!("search[{q}]"));
                }
            }
        }
        Some(format!("answer[{}]", self.question.answer))
    }
}

cairn_plugin_sdk::export_environment! {
    name: "search-qa",
    description: "question answering with a BM25 search tool over the public-domain chemical-elements corpus: single- and two-hop questions, exact-match or token-F1 reward, a context budget",
    create: SearchQa::from_config_json,
}
