//! Test fixtures for the plugins' tests (feature `testing`): the SDK's mock host with a
//! teacher scorer, and row builders.

use std::collections::HashMap;

pub use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{BankEntry, EntryKind, PluginError, Result, ScoreRequest, Scored, TurnRow};

pub use cairn_plugin_sdk::testing::render_bytes as render;

/// What [`mock_host`] scores: `logprobs[response_ids]` (every position at `default_logprob`
/// when absent), with `top_k` ids `0..k` at log-probs `−1, −2, …`; a call with a request whose
/// context and response are longer than `window` (when set) fails, as a context window does.
#[derive(Clone, Debug)]
pub struct Teacher {
    /// Teacher log-probs by response ids.
    pub logprobs: HashMap<Vec<u32>, Vec<f32>>,
    pub default_logprob: f32,
    pub window: Option<usize>,
}

impl Default for Teacher {
    fn default() -> Self {
        Teacher {
            logprobs: HashMap::new(),
            default_logprob: -1.0,
            window: None,
        }
    }
}

impl Teacher {
    fn score(&self, r: &ScoreRequest) -> Result<Scored> {
        let len = r.context_ids.len() + r.response_ids.len();
        if let Some(w) = self.window.filter(|&w| len > w) {
            return Err(PluginError::host(format!(
                "{len} tokens do not fit the context window of {w}"
            )));
        }
        let l = r.response_ids.len();
        let k = r.top_k as usize;
        Ok(Scored {
            logprobs: self
                .logprobs
                .get(&r.response_ids)
                .cloned()
                .unwrap_or_else(|| vec![self.default_logprob; l]),
            top_ids: (0..l).flat_map(|_| 0..k as u32).collect(),
            top_logprobs: (0..l).flat_map(|_| (1..=k).map(|j| -(j as f32))).collect(),
        })
    }
}

/// The SDK's mock host (an in-memory bank ranked by insertion order, prompts rendered as the
/// bytes of `inject + "|" + observation`, every call recorded) scoring with `teacher`; a bank
/// query with an empty text asks for the newest entries first.
pub fn mock_host(teacher: Teacher) -> MockHost {
    MockHost::default()
        .with_scorer(move |r| teacher.score(r))
        .with_ranking(|q, entries| {
            if q.text.is_empty() {
                entries.reverse();
            }
        })
}

/// An active skill.
pub fn skill(id: u64, task: Option<&str>, text: &str) -> BankEntry {
    BankEntry {
        id,
        kind: EntryKind::Skill,
        text: text.into(),
        task_id: task.map(str::to_string),
        ..BankEntry::default()
    }
}

/// A trainable row of `task`, trajectory `trajectory` of group
/// `group`, with `ℓ_old = old` on every token (mask 1), response ids `ids`, its prompt the
/// plain render of its observation.
pub fn row(group: u64, trajectory: u64, task: &str, ids: &[u32], old: &[f32]) -> TurnRow {
    let observation = format!("you are in room {task}");
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        task_id: task.into(),
        prompt_ids: render("", &observation),
        response_ids: ids.to_vec(),
        response_logprobs: old.to_vec(),
        response_mask: vec![1; ids.len()],
        old_logprobs: old.to_vec(),
        observation,
        ..TurnRow::default()
    }
}
