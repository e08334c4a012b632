//! Integration tests of `ucob` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, and the `ucob-cbsd` term through the kernel's objective.

mod objective;
mod stack;

pub use cairn_plugin_sdk::testing::render_bytes as render;
use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{
    Algorithm, BankEntry, ContextVariant, EntryKind, GroupRequest, Scored, TurnRow,
};
use cairn_ucob::Ucob;

/// Fixed answers for the toy: the teacher's scores after `context`, the student's after any
/// other context.
pub struct Toy {
    pub context: Vec<u32>,
    pub teacher: Scored,
    pub student: Scored,
}

/// The SDK's mock host with a fixed bank of two skills (in id order), prompts rendered as the
/// bytes of `inject + "|" + observation` ([`render`]), and a deterministic scorer with top-k,
/// or the toy's answers when given one.
pub fn test_host(toy: Option<Toy>) -> MockHost {
    let host = MockHost::default().with_scorer(move |r| {
        if let Some(toy) = &toy {
            return Ok(if r.context_ids == toy.context {
                toy.teacher.clone()
            } else {
                toy.student.clone()
            });
        }
        let c: u32 = r.context_ids.iter().sum();
        let n = r.response_ids.len();
        let k = r.top_k as usize;
        Ok(Scored {
            logprobs: (0..n)
                .map(|l| -0.2 - 0.05 * ((c as usize + l) % 9) as f32)
                .collect(),
            top_ids: (0..n * k).map(|x| (x % k) as u32).collect(),
            top_logprobs: (0..n * k).map(|x| -0.3 * (1 + x % k) as f32).collect(),
        })
    });
    host.put(BankEntry {
        id: 1,
        kind: EntryKind::Skill,
        text: "open every closed container before searching it".into(),
        ..BankEntry::default()
    });
    host.put(BankEntry {
        id: 2,
        kind: EntryKind::Skill,
        text: "mugs are usually in the cabinet".into(),
        task_id: Some("clean-mug".into()),
        ..BankEntry::default()
    });
    host
}

/// The slots `ucob` plans for group `group` (4 slots, task `clean-mug`).
pub fn plan(ucob: &mut dyn Algorithm, host: &MockHost, group: u64) -> Vec<ContextVariant> {
    ucob.plan_group(
        &GroupRequest {
            step: 0,
            group_id: group,
            task_id: "clean-mug".into(),
            task_kind: "clean".into(),
            task_description: "clean the mug and put it in the cabinet".into(),
            group_size: 4,
            seed: 7,
        },
        host,
    )
    .expect("the test host has a bank")
}

/// One turn of trajectory `trajectory` of `group` played with `variant` at `anchor`: the
/// prompt the host renders for its observation, three sampled tokens (the last a stop id).
pub fn row(
    group: u64,
    trajectory: u64,
    turn: u32,
    variant: &ContextVariant,
    anchor: &str,
    turn_reward: f32,
    episode_reward: f32,
) -> TurnRow {
    let observation = format!("you are at {anchor}; trajectory {trajectory}");
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        turn,
        task_id: "clean-mug".into(),
        variant: variant.clone(),
        prompt_ids: render(&variant.inject, &observation),
        response_ids: vec![50 + trajectory as u32, 60 + turn, 2],
        response_logprobs: vec![-0.5, -2.0, -0.1],
        response_mask: vec![1, 1, 1],
        old_logprobs: vec![-0.5, -2.0, -0.1],
        turn_reward,
        episode_reward,
        success: episode_reward > 0.0,
        anchor: Some(anchor.into()),
        observation,
        ..TurnRow::default()
    }
}

/// A fresh `ucob` with the default config.
pub fn ucob() -> Ucob {
    Ucob::from_config_json("").unwrap()
}
