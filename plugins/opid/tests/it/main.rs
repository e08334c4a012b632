//! Integration tests of `opid` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo` (`cairn_plugin_sdk::Stack`), with the final advantages after the
//! stack's credit composition checked against the worked example; and the built `cdylib`
//! through the loader.

mod ffi;
mod stack;

pub use cairn_plugin_sdk::testing::render_bytes as render;
use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{BankEntry, EntryKind, Scored, TurnRow};
use serde_json::{json, Value};

/// `ℓ_old`, `ℓ^ep`, `ℓ^st` of the worked example.
pub const OLD: [f32; 3] = [-0.7, -1.5, -0.2];
pub const EP: [f32; 3] = [-0.5, -1.6, -0.2];
pub const ST: [f32; 3] = [-0.3, -0.9, -0.1];

/// The SDK's mock host, rendering `inject|observation` as bytes ([`render`]), scoring a
/// context with opid's step header as [`ST`], with its episode header as [`EP`], anything
/// else as [`OLD`], and ranking the bank newest id first; the test answers reflections with
/// [`answer`].
pub fn test_host() -> MockHost {
    MockHost::default()
        .with_scorer(|r| {
            let context: String = r.context_ids.iter().map(|&b| b as u8 as char).collect();
            let lp = if context.contains("Step skill") {
                ST
            } else if context.contains("Episode skill") {
                EP
            } else {
                OLD
            };
            Ok(Scored {
                logprobs: lp.to_vec(),
                ..Scored::default()
            })
        })
        .with_ranking(|_, entries| entries.sort_by_key(|e| std::cmp::Reverse(e.id)))
}

/// Answers ticket `ticket` as the skill creator does for a JSON reply format: a Skill entry
/// with the request's extra plus `reflection_ticket` and `reply`. Returns its id.
pub fn answer(host: &MockHost, ticket: u64, reply: Value) -> u64 {
    let request = host.reflections.lock().unwrap()[ticket as usize - 1].clone();
    let mut extra = request.extra;
    extra.insert("reflection_ticket".into(), json!(ticket));
    extra.insert("reply".into(), reply.clone());
    let id = 100 + host.entries.lock().unwrap().len() as u64;
    host.put(BankEntry {
        id,
        kind: EntryKind::Skill,
        text: reply["episode_skill"].as_str().unwrap_or("").into(),
        task_id: request.task_id,
        extra,
        ..BankEntry::default()
    });
    id
}

/// One turn of task `clean-mug` with the worked example's tokens and `ℓ_old`; its prompt is
/// exactly what the host renders for it.
pub fn row(group: u64, traj: u64, turn: u32, anchor: &str, success: bool) -> TurnRow {
    let observation = format!("you are at {anchor}");
    TurnRow {
        group_id: group,
        trajectory_id: traj,
        turn,
        task_id: "clean-mug".into(),
        policy_version: 2,
        prompt_ids: render("", &observation),
        response_ids: vec![5, 6, 7],
        response_logprobs: OLD.to_vec(),
        response_mask: vec![1, 1, 1],
        old_logprobs: OLD.to_vec(),
        episode_reward: f32::from(u8::from(success)),
        success,
        anchor: Some(anchor.into()),
        observation,
        ..TurnRow::default()
    }
}
