//! Test fixtures: a mock host (an in-memory bank, a byte-level prompt builder and tokenizer,
//! a deterministic scorer with top-k) and row builders.

use std::sync::Mutex;

use cairn_plugin_sdk::{
    BankEntry, BankQuery, Batch, ContextVariant, EntryKind, EntryStatus, FinishReason,
    GroupRequest, Host, PluginError, ReflectionRequest, RenderRequest, Result, Retrieved,
    ScoreRequest, Scored, StatsUpdate, TurnRow,
};

use crate::plan::{good_variant, none_variant};

/// A host whose bank is a list ranked by id (the mock ignores the query text), whose prompts
/// render as the bytes of `inject + "|" + observation`, whose tokenizer gives the bytes of a
/// text, whose scores are [`score`] (top-k: [`top`]), and which records every call.
#[derive(Default)]
pub struct MockHost {
    pub entries: Mutex<Vec<BankEntry>>,
    pub queries: Mutex<Vec<BankQuery>>,
    pub updates: Mutex<Vec<StatsUpdate>>,
    pub reflections: Mutex<Vec<ReflectionRequest>>,
    pub scores: Mutex<Vec<ScoreRequest>>,
    pub renders: Mutex<Vec<RenderRequest>>,
    pub metrics: Mutex<Vec<(String, f64)>>,
    /// `score` with `top_k > 0` fails (a backend without top-k).
    pub no_topk: bool,
    /// `reflect` fails (a full queue).
    pub refuse_reflections: bool,
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

/// What [`MockHost::render_prompt`] returns.
pub fn render(inject: &str, observation: &str) -> Vec<u32> {
    format!("{inject}|{observation}")
        .bytes()
        .map(u32::from)
        .collect()
}

/// The mock's log-prob of response token `l` (id `id`) after `context`.
pub fn score(context: &[u32], id: u32, l: usize) -> f32 {
    let c: u64 = context.iter().map(|&x| u64::from(x)).sum();
    -0.1 - 0.02 * ((c + 3 * u64::from(id) + l as u64) % 50) as f32
}

/// The mock's top-k at a position: ids `0..k`, log-probs `−0.5 (j + 1)`.
pub fn top(k: usize) -> (Vec<u32>, Vec<f32>) {
    (
        (0..k as u32).collect(),
        (0..k).map(|j| -0.5 * (j + 1) as f32).collect(),
    )
}

impl Host for MockHost {
    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        self.scores.lock().unwrap().extend_from_slice(requests);
        if self.no_topk && requests.iter().any(|r| r.top_k > 0) {
            return Err(PluginError::host("this backend cannot return top-k scores"));
        }
        Ok(requests
            .iter()
            .map(|r| {
                let logprobs = r
                    .response_ids
                    .iter()
                    .enumerate()
                    .map(|(l, &id)| score(&r.context_ids, id, l))
                    .collect();
                let k = r.top_k as usize;
                let (ids, lps) = top(k);
                let n = r.response_ids.len();
                Scored {
                    logprobs,
                    top_ids: ids.iter().copied().cycle().take(n * k).collect(),
                    top_logprobs: lps.iter().copied().cycle().take(n * k).collect(),
                }
            })
            .collect())
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }

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
        Ok(entries
            .iter()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
            .filter(|e| statuses.contains(&e.status))
            .filter(|e| match &q.task_id {
                None => true,
                Some(t) => {
                    e.task_id.as_ref() == Some(t) || (q.include_general && e.task_id.is_none())
                }
            })
            .take(q.k)
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 1.0,
            })
            .collect())
    }

    fn bank_update(&self, updates: &[StatsUpdate]) -> Result<()> {
        let entries = self.entries.lock().unwrap();
        for u in updates {
            if !entries.iter().any(|e| e.id == u.id) {
                return Err(PluginError::host(format!("no entry {}", u.id)));
            }
        }
        self.updates.lock().unwrap().extend_from_slice(updates);
        Ok(())
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
        if self.refuse_reflections {
            return Err(PluginError::host(
                "the skill creator's queue is full (skills.queue)",
            ));
        }
        let mut r = self.reflections.lock().unwrap();
        let first = r.len() as u64 + 1;
        r.extend_from_slice(requests);
        Ok((first..first + requests.len() as u64).collect())
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().unwrap().push((name.into(), value));
    }
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

/// The request of group `group` (task `t{group}`, kind `clean`, 4 slots).
pub fn group_request(group: u64) -> GroupRequest {
    GroupRequest {
        group_id: group,
        task_id: format!("t{group}"),
        task_kind: "clean".into(),
        task_description: "clean the mug".into(),
        group_size: 4,
        ..GroupRequest::default()
    }
}

/// The variant of a slot of group `group`; `good` slots saw skill 7.
pub fn variant(group: u64, good: bool) -> ContextVariant {
    if good {
        good_variant(
            crate::config::DEFAULT_HEADER,
            &group_request(group),
            &[skill(7, None, "look first")],
        )
    } else {
        none_variant(&group_request(group))
    }
}

/// One turn of trajectory `traj` in group `group`: observation `at {anchor} (trajectory
/// {traj})` (the same anchor, a different history), the prompt the mock renders for it, the response `[40 + traj, 41 + turn, 2]` (stop id 2, all sampled)
/// with sampled log-probs `[−0.5, −1.0, −0.1]`.
pub fn row(
    group: u64,
    traj: u64,
    turn: u32,
    good: bool,
    anchor: &str,
    turn_reward: f32,
    episode_reward: f32,
) -> TurnRow {
    let variant = variant(group, good);
    let observation = format!("at {anchor} (trajectory {traj})");
    let mut info = serde_json::Map::new();
    info.insert("action".into(), format!("act {traj}-{turn}").into());
    TurnRow {
        group_id: group,
        trajectory_id: traj,
        turn,
        task_id: format!("t{group}"),
        prompt_ids: render(&variant.inject, &observation),
        variant,
        response_ids: vec![40 + traj as u32, 41 + turn, 2],
        response_logprobs: vec![-0.5, -1.0, -0.1],
        response_mask: vec![1, 1, 1],
        finish_reason: FinishReason::Stop,
        old_logprobs: vec![-0.5, -1.0, -0.1],
        turn_reward,
        episode_reward,
        success: episode_reward >= 1.0,
        anchor: Some(anchor.into()),
        observation,
        info,
        ..TurnRow::default()
    }
}

/// A trajectory through `anchors` with reward `reward` on its last turn (0 elsewhere).
pub fn trajectory(
    group: u64,
    traj: u64,
    good: bool,
    anchors: &[&str],
    reward: f32,
) -> Vec<TurnRow> {
    let n = anchors.len();
    anchors
        .iter()
        .enumerate()
        .map(|(t, a)| {
            let r = if t + 1 == n { reward } else { 0.0 };
            let mut row = row(group, traj, t as u32, good, a, r, reward);
            row.last_turn = t + 1 == n;
            row
        })
        .collect()
}

pub fn batch(step: u64, rows: Vec<TurnRow>) -> Batch {
    Batch { step, rows }
}
