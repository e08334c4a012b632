//! Test fixtures: a mock host with an in-memory bank, and row builders.

use std::sync::Mutex;

use cairn_plugin_sdk::{
    BankEntry, BankQuery, Batch, ContextVariant, EntryStatus, GroupRequest, Host, PluginError,
    Provenance, ReflectionRequest, RenderRequest, Result, Retrieved, StatsUpdate, TurnRow,
};

use crate::admission::Arm;
use crate::plan::{e_variant, n_variant};

/// A host whose bank is a list ranked by id (the mock ignores the query text), whose prompts
/// render as the bytes of `inject + "|" + observation`, and which records every call.
#[derive(Default)]
pub struct MockHost {
    pub entries: Mutex<Vec<BankEntry>>,
    pub queries: Mutex<Vec<BankQuery>>,
    pub updates: Mutex<Vec<StatsUpdate>>,
    pub reflections: Mutex<Vec<ReflectionRequest>>,
    pub metrics: Mutex<Vec<(String, f64)>>,
    /// `reflect` fails (a full queue).
    pub refuse_reflections: bool,
}

impl MockHost {
    pub fn put(&self, e: BankEntry) {
        self.entries.lock().unwrap().push(e);
    }

    pub fn entry(&self, id: u64) -> BankEntry {
        let entries = self.entries.lock().unwrap();
        entries.iter().find(|e| e.id == id).unwrap().clone()
    }

    /// The last value logged under `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let metrics = self.metrics.lock().unwrap();
        metrics.iter().rev().find(|(n, _)| n == name).map(|m| m.1)
    }
}

impl Host for MockHost {
    fn render_prompt(&self, r: &RenderRequest) -> Result<Vec<u32>> {
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
        let mut entries = self.entries.lock().unwrap();
        for u in updates {
            let Some(e) = entries.iter_mut().find(|e| e.id == u.id) else {
                return Err(PluginError::host(format!("no entry {}", u.id)));
            };
            if let Some(stats) = &u.set {
                e.stats = stats.clone();
            }
            if let Some(status) = u.status {
                e.status = status;
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

/// What [`MockHost::render_prompt`] returns.
pub fn render(inject: &str, observation: &str) -> Vec<u32> {
    format!("{inject}|{observation}")
        .bytes()
        .map(u32::from)
        .collect()
}

/// An active experience.
pub fn entry(id: u64, task: Option<&str>, text: &str) -> BankEntry {
    BankEntry {
        id,
        text: text.into(),
        task_id: task.map(str::to_string),
        ..BankEntry::default()
    }
}

/// An active experience written at `step`.
pub fn entry_at(id: u64, task: Option<&str>, step: u64) -> BankEntry {
    BankEntry {
        provenance: Provenance {
            step,
            ..Provenance::default()
        },
        ..entry(id, task, &format!("experience {id}"))
    }
}

/// The request of group `group` of task `t{group}`, kind `clean`.
pub fn group_request(group: u64) -> GroupRequest {
    GroupRequest {
        group_id: group,
        task_id: format!("t{group}"),
        task_kind: "clean".into(),
        group_size: 4,
        ..GroupRequest::default()
    }
}

/// The variant of an `arm` slot of group `group`; E slots saw experience 7.
pub fn variant(group: u64, arm: Arm) -> ContextVariant {
    match arm {
        Arm::E => e_variant(
            crate::config::DEFAULT_HEADER,
            &group_request(group),
            &[entry(7, None, "look first")],
        ),
        Arm::N => n_variant(&group_request(group)),
    }
}

/// One turn of trajectory `traj` in group `group`, in arm `arm`, with score `score` as its
/// episode reward (success iff the score is 1), three trainable tokens, and
/// `ℓ_old = [−0.5, −2.0, −0.1]`.
pub fn arm_row(
    group: u64,
    traj: u64,
    turn: u32,
    arm: Arm,
    score: f32,
    anchor: Option<&str>,
) -> TurnRow {
    let mut info = serde_json::Map::new();
    info.insert("action".into(), format!("act {traj}-{turn}").into());
    TurnRow {
        group_id: group,
        trajectory_id: traj,
        turn,
        task_id: format!("t{group}"),
        variant: variant(group, arm),
        prompt_ids: vec![1, 2],
        response_ids: vec![5, 6, 7],
        response_logprobs: vec![-0.5, -2.0, -0.1],
        response_mask: vec![1, 1, 1],
        old_logprobs: vec![-0.5, -2.0, -0.1],
        episode_reward: score,
        success: score >= 1.0,
        anchor: anchor.map(str::to_string),
        observation: format!("at {}", anchor.unwrap_or("?")),
        info,
        ..TurnRow::default()
    }
}

/// Single-turn trajectories of one group: `(trajectory, arm, score)`.
pub fn group_rows(group: u64, slots: &[(u64, Arm, f32)]) -> Vec<TurnRow> {
    slots
        .iter()
        .map(|&(traj, arm, score)| arm_row(group, traj, 0, arm, score, Some("s0")))
        .collect()
}

pub fn batch(step: u64, rows: Vec<TurnRow>) -> Batch {
    Batch { step, rows }
}
