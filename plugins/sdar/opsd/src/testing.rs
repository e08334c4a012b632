//! A mock host for the plugins' tests (feature `testing`): an in-memory bank, a prompt
//! renderer, a scorer with fixed answers, a skill creator that records its requests, and a
//! metric log.

use std::collections::HashMap;
use std::sync::Mutex;

use cairn_plugin_sdk::{
    BankEntry, BankQuery, EntryKind, EntryStatus, Host, PluginError, ReflectionRequest,
    RenderRequest, Result, Retrieved, ScoreRequest, Scored, TurnRow,
};

/// The bank is a list ranked by id (the mock ignores the query text, except that an empty
/// text asks for the newest entries first); a prompt renders as the bytes of
/// `inject + "|" + observation`; scoring (within `window`, when set) answers
/// `teacher[response_ids]` (every position at `default_logprob` when absent), with `top_k` ids
/// `0..k` at log-probs `−1, −2, …`.
pub struct MockHost {
    pub entries: Mutex<Vec<BankEntry>>,
    pub queries: Mutex<Vec<BankQuery>>,
    pub renders: Mutex<Vec<RenderRequest>>,
    pub scored: Mutex<Vec<ScoreRequest>>,
    pub reflections: Mutex<Vec<ReflectionRequest>>,
    pub metrics: Mutex<Vec<(String, f64)>>,
    /// Teacher log-probs by response ids.
    pub teacher: HashMap<Vec<u32>, Vec<f32>>,
    pub default_logprob: f32,
    /// `reflect` fails (a full queue).
    pub refuse_reflections: bool,
    /// `score` fails for a call with a request whose context and response are longer than
    /// this (a context window).
    pub window: Option<usize>,
    /// Tickets handed out so far.
    pub tickets: Mutex<u64>,
}

impl Default for MockHost {
    fn default() -> Self {
        MockHost {
            entries: Mutex::default(),
            queries: Mutex::default(),
            renders: Mutex::default(),
            scored: Mutex::default(),
            reflections: Mutex::default(),
            metrics: Mutex::default(),
            teacher: HashMap::new(),
            default_logprob: -1.0,
            refuse_reflections: false,
            window: None,
            tickets: Mutex::new(0),
        }
    }
}

/// What [`MockHost::render_prompt`] returns.
pub fn render(inject: &str, observation: &str) -> Vec<u32> {
    format!("{inject}|{observation}")
        .bytes()
        .map(u32::from)
        .collect()
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

impl MockHost {
    pub fn put(&self, e: BankEntry) {
        self.entries.lock().unwrap().push(e);
    }

    /// The last value logged under `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let metrics = self.metrics.lock().unwrap();
        metrics.iter().rev().find(|(n, _)| n == name).map(|m| m.1)
    }
}

impl Host for MockHost {
    fn render_prompt(&self, r: &RenderRequest) -> Result<Vec<u32>> {
        self.renders.lock().unwrap().push(r.clone());
        Ok(render(&r.variant.inject, &r.observation.text))
    }

    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        self.queries.lock().unwrap().push(q.clone());
        let entries = self.entries.lock().unwrap();
        let statuses = if q.statuses.is_empty() {
            vec![EntryStatus::Active, EntryStatus::UnderTest]
        } else {
            q.statuses.clone()
        };
        let mut list: Vec<&BankEntry> = entries
            .iter()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
            .filter(|e| statuses.contains(&e.status))
            .filter(|e| match &q.task_id {
                None => true,
                Some(t) => {
                    e.task_id.as_ref() == Some(t) || (q.include_general && e.task_id.is_none())
                }
            })
            .collect();
        if q.text.is_empty() {
            list.reverse();
        }
        Ok(list
            .into_iter()
            .take(q.k)
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 1.0,
            })
            .collect())
    }

    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        if let Some(w) = self.window {
            if let Some(r) = requests
                .iter()
                .find(|r| r.context_ids.len() + r.response_ids.len() > w)
            {
                return Err(PluginError::host(format!(
                    "{} tokens do not fit the context window of {w}",
                    r.context_ids.len() + r.response_ids.len()
                )));
            }
        }
        self.scored.lock().unwrap().extend_from_slice(requests);
        Ok(requests
            .iter()
            .map(|r| {
                let l = r.response_ids.len();
                let k = r.top_k as usize;
                let logprobs = self
                    .teacher
                    .get(&r.response_ids)
                    .cloned()
                    .unwrap_or_else(|| vec![self.default_logprob; l]);
                Scored {
                    logprobs,
                    top_ids: (0..l).flat_map(|_| 0..k as u32).collect(),
                    top_logprobs: (0..l).flat_map(|_| (1..=k).map(|j| -(j as f32))).collect(),
                }
            })
            .collect())
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
        if self.refuse_reflections {
            return Err(PluginError::host(
                "the skill creator's queue is full (skills.queue)",
            ));
        }
        self.reflections.lock().unwrap().extend_from_slice(requests);
        let mut t = self.tickets.lock().unwrap();
        let first = *t + 1;
        *t += requests.len() as u64;
        Ok((first..=*t).collect())
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().unwrap().push((name.into(), value));
    }
}
