//! Integration tests of `edge` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, and the distillation term through the kernel's objective.

mod objective;
mod stack;

use cairn_edge::Edge;
pub use cairn_plugin_sdk::testing::render_bytes as render;
use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{Algorithm, BankEntry, ContextVariant, GroupRequest, TurnRow};

/// The SDK's mock host with a fixed bank (in id order): a general experience and one of
/// task `clean-mug`; prompts render as the bytes of `inject + "|" + observation` ([`render`]).
pub fn test_host() -> MockHost {
    let host = MockHost::default();
    host.put(BankEntry {
        id: 1,
        text: "open the drawer before searching it".into(),
        ..BankEntry::default()
    });
    host.put(BankEntry {
        id: 2,
        text: "mugs are usually in the cabinet".into(),
        task_id: Some("clean-mug".into()),
        ..BankEntry::default()
    });
    host
}

/// The slots `edge` plans for group `group` (4 slots, task `clean-mug`) at step 0.
pub fn plan(edge: &mut Edge, host: &MockHost, group: u64) -> Vec<ContextVariant> {
    edge.plan_group(
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

/// One turn: trajectory `trajectory` of `group`, played with `variant`, at `anchor`, with a
/// turn reward, the trajectory's episode reward and success, three trainable tokens with
/// `ℓ_old = [−0.5, −2.0, −0.1]`.
pub fn row(
    group: u64,
    trajectory: u64,
    turn: u32,
    variant: &ContextVariant,
    anchor: &str,
    turn_reward: f32,
    episode_reward: f32,
) -> TurnRow {
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        turn,
        task_id: "clean-mug".into(),
        variant: variant.clone(),
        prompt_ids: vec![1, 2],
        response_ids: vec![5, 6, 7],
        response_logprobs: vec![-0.5, -2.0, -0.1],
        response_mask: vec![1, 1, 1],
        old_logprobs: vec![-0.5, -2.0, -0.1],
        turn_reward,
        episode_reward,
        success: episode_reward > 0.0,
        last_turn: false,
        anchor: Some(anchor.into()),
        observation: format!("you are at {anchor}"),
        ..TurnRow::default()
    }
}
