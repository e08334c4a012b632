//! `pats` through its hooks, as the kernel drives it: plans, rows played from those plans,
//! `observe` with the SDK's mock host ([`lab_host`]), and the built `cdylib`.

mod ffi;
mod lifecycle;
mod plan;
mod signals;
mod state;

use cairn_pats::Pats;
use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{
    Algorithm, BankEntry, Batch, ContextVariant, EntryKind, EntryStatus, GroupRequest, Host,
    NewEntry, Provenance, ReflectionRequest, StepReport, TurnRow,
};

/// The SDK's mock host as `pats` meets the kernel: bank queries newest first (an empty query
/// text ranks by recency), prompts as the bytes of `inject|observation`, and a skill creator
/// that leaves each reflection pending until the test answers it ([`Lab::answer`]).
pub fn lab_host() -> MockHost {
    MockHost::default().with_ranking(|_, matches| matches.reverse())
}

/// The test's moves on the [`lab_host`] host.
pub trait Lab {
    /// Puts a scaffold for `task` into the bank (as a user or an earlier run would); its id.
    fn seed(&self, task: &str, text: &str, status: EntryStatus) -> u64;
    /// The skill creator answers the request of `ticket` with `text`; the new entry's id.
    fn answer(&self, ticket: u64, text: &str) -> u64;
    /// The bank's entries of `kind`, by id.
    fn entries(&self, kind: EntryKind) -> Vec<BankEntry>;
    /// Every reflection asked, in ticket order.
    fn requests(&self) -> Vec<ReflectionRequest>;
}

impl Lab for MockHost {
    fn seed(&self, task: &str, text: &str, status: EntryStatus) -> u64 {
        self.bank_put(&[NewEntry {
            kind: EntryKind::Scaffold,
            text: text.into(),
            task_id: Some(task.into()),
            status,
            ..NewEntry::default()
        }])
        .unwrap()[0]
    }

    fn answer(&self, ticket: u64, text: &str) -> u64 {
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

    fn entries(&self, kind: EntryKind) -> Vec<BankEntry> {
        let bank = self.entries.lock().unwrap();
        bank.iter().filter(|e| e.kind == kind).cloned().collect()
    }

    fn requests(&self) -> Vec<ReflectionRequest> {
        self.reflections.lock().unwrap().clone()
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
