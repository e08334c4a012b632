//! `pats` through its hooks, as the kernel drives it: plans, rows played from those plans,
//! `observe` with an in-memory bank and skill creator ([`Lab`]), and the built `cdylib`.

mod ffi;
mod lifecycle;
mod plan;
mod signals;
mod state;

use std::sync::Mutex;

use cairn_pats::Pats;
use cairn_plugin_sdk::{
    Algorithm, BankEntry, BankQuery, Batch, ContextVariant, EntryKind, EntryStatus, GroupRequest,
    Host, NewEntry, PluginError, Provenance, ReflectionRequest, RenderRequest, Result, Retrieved,
    StatsUpdate, StepReport, TurnRow,
};

/// A host with an in-memory experience bank, a skill creator that only records requests (the
/// test writes the answers with [`Lab::answer`]), a prompt renderer and a metric log.
#[derive(Default)]
pub struct Lab {
    pub bank: Mutex<Vec<BankEntry>>,
    pub reflections: Mutex<Vec<ReflectionRequest>>,
    /// While set, `reflect` refuses every call (a full skill-creator queue).
    pub refuse_reflections: Mutex<bool>,
    pub metrics: Mutex<Vec<(String, f64)>>,
}

impl Lab {
    /// Puts a scaffold for `task` into the bank (as a user or an earlier run would); its id.
    pub fn seed(&self, task: &str, text: &str, status: EntryStatus) -> u64 {
        self.bank_put(&[NewEntry {
            kind: EntryKind::Scaffold,
            text: text.into(),
            task_id: Some(task.into()),
            status,
            ..NewEntry::default()
        }])
        .unwrap()[0]
    }

    /// The skill creator answers the request of `ticket` with `text`; the new entry's id.
    pub fn answer(&self, ticket: u64, text: &str) -> u64 {
        let request = self.reflections.lock().unwrap()[ticket as usize - 1].clone();
        let mut extra = request.extra.clone();
        extra.insert("reflection_ticket".into(), ticket.into());
        self.bank_put(&[NewEntry {
            kind: request.kind,
            text: text.into(),
            task_id: request.task_id.clone(),
            parent: request.parent,
            status: request.status,
            provenance: Provenance {
                source_trajectories: request.trajectories.clone(),
                writer: "skill-creator:template".into(),
                ..Provenance::default()
            },
            extra,
            ..NewEntry::default()
        }])
        .unwrap()[0]
    }

    pub fn entry(&self, id: u64) -> BankEntry {
        self.bank.lock().unwrap()[id as usize - 1].clone()
    }

    pub fn entries(&self, kind: EntryKind) -> Vec<BankEntry> {
        let bank = self.bank.lock().unwrap();
        bank.iter().filter(|e| e.kind == kind).cloned().collect()
    }

    pub fn requests(&self) -> Vec<ReflectionRequest> {
        self.reflections.lock().unwrap().clone()
    }

    /// The value of `name` logged last.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let metrics = self.metrics.lock().unwrap();
        metrics.iter().rev().find(|(n, _)| n == name).map(|m| m.1)
    }
}

impl Host for Lab {
    fn render_prompt(&self, r: &RenderRequest) -> Result<Vec<u32>> {
        Ok(format!("{}|{}", r.variant.inject, r.observation.text)
            .bytes()
            .map(u32::from)
            .collect())
    }

    /// Kind, task and status filters as the kernel's bank applies them; an empty query text
    /// gives the newest entries first.
    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        let bank = self.bank.lock().unwrap();
        let statuses = if q.statuses.is_empty() {
            vec![EntryStatus::Active, EntryStatus::UnderTest]
        } else {
            q.statuses.clone()
        };
        Ok(bank
            .iter()
            .rev()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
            .filter(|e| match &q.task_id {
                Some(t) => {
                    e.task_id.as_ref() == Some(t) || (q.include_general && e.task_id.is_none())
                }
                None => true,
            })
            .filter(|e| statuses.contains(&e.status))
            .take(q.k)
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 0.0,
            })
            .collect())
    }

    fn bank_put(&self, entries: &[NewEntry]) -> Result<Vec<u64>> {
        let mut bank = self.bank.lock().unwrap();
        let mut ids = Vec::new();
        for e in entries {
            let id = bank.len() as u64 + 1;
            let version = match e.parent {
                Some(p) => bank[p as usize - 1].version + 1,
                None => 1,
            };
            bank.push(BankEntry {
                id,
                kind: e.kind,
                text: e.text.clone(),
                trigger: e.trigger.clone(),
                task_id: e.task_id.clone(),
                version,
                parent: e.parent,
                status: e.status,
                provenance: e.provenance.clone(),
                extra: e.extra.clone(),
                ..BankEntry::default()
            });
            ids.push(id);
        }
        Ok(ids)
    }

    fn bank_update(&self, updates: &[StatsUpdate]) -> Result<()> {
        let mut bank = self.bank.lock().unwrap();
        for u in updates {
            let Some(e) = bank.get_mut(u.id as usize - 1) else {
                return Err(PluginError::host(format!("no entry {}", u.id)));
            };
            if let Some(s) = u.status {
                e.status = s;
            }
        }
        Ok(())
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
        if *self.refuse_reflections.lock().unwrap() {
            return Err(PluginError::host(
                "the skill creator's queue is full (`skills.queue`)",
            ));
        }
        let mut all = self.reflections.lock().unwrap();
        let first = all.len() as u64 + 1;
        all.extend_from_slice(requests);
        Ok((first..first + requests.len() as u64).collect())
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().unwrap().push((name.into(), value));
    }
}

/// `n` successes then failures: `wins(3, 5)` = `[true, true, true, false, false]`.
pub fn wins(n: usize, of: usize) -> Vec<bool> {
    (0..of).map(|i| i < n).collect()
}

/// One group to play: its id, task and per-slot success (the group size is its length).
pub struct Play<'a> {
    pub group: u64,
    pub task: &'a str,
    pub success: Vec<bool>,
}

/// Plans each group through `plan_group` and plays one turn per slot: trajectory id
/// `100 · group + slot`, reward 1 on success, action `a<trajectory>`, observation
/// `obs<trajectory>`, `slot % 3` tool calls, response `[1, 2]` with mask `[1, 0]`.
pub fn play(pats: &mut Pats, host: &dyn Host, step: u64, groups: &[Play]) -> StepReport {
    let mut rows = Vec::new();
    for g in groups {
        let plan = pats
            .plan_group(
                &GroupRequest {
                    step,
                    group_id: g.group,
                    task_id: g.task.into(),
                    group_size: g.success.len() as u32,
                    ..GroupRequest::default()
                },
                host,
            )
            .unwrap();
        for (slot, (variant, &success)) in plan.into_iter().zip(&g.success).enumerate() {
            rows.push(row(g.group, g.task, slot, variant, success));
        }
    }
    StepReport {
        step,
        batch: Batch { step, rows },
        ..StepReport::default()
    }
}

pub fn row(group: u64, task: &str, slot: usize, variant: ContextVariant, success: bool) -> TurnRow {
    let trajectory = 100 * group + slot as u64;
    let mut info = serde_json::Map::new();
    info.insert("action".into(), format!("a{trajectory}").into());
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        task_id: task.into(),
        variant,
        response_ids: vec![1, 2],
        response_logprobs: vec![-0.5, 0.0],
        response_mask: vec![1, 0],
        episode_reward: if success { 1.0 } else { 0.0 },
        success,
        last_turn: true,
        observation: format!("obs{trajectory}"),
        tool_calls: (slot % 3) as u32,
        info,
        ..TurnRow::default()
    }
}

/// The labels of a plan for `task` in a group of `size`.
pub fn labels(pats: &mut Pats, host: &dyn Host, task: &str, size: u32) -> Vec<String> {
    pats.plan_group(
        &GroupRequest {
            task_id: task.into(),
            group_size: size,
            ..GroupRequest::default()
        },
        host,
    )
    .unwrap()
    .into_iter()
    .map(|v| v.label)
    .collect()
}
