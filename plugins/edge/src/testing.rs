//! Test fixtures: the SDK's mock host, and row builders.

use cairn_plugin_sdk::{BankEntry, Batch, ContextVariant, GroupRequest, Provenance, TurnRow};

use crate::admission::Arm;
use crate::plan::{e_variant, n_variant};

/// The SDK's mock host: an in-memory bank ranked by insertion order (the query text is
/// ignored), prompts rendered as the bytes of `inject + "|" + observation` ([`render`]), and
/// every call recorded.
pub use cairn_plugin_sdk::testing::{render_bytes as render, MockHost};

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
