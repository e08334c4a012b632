//! Test fixtures: the SDK's mock host with a deterministic scorer with top-k, and row
//! builders.

use cairn_plugin_sdk::{
    BankEntry, Batch, ContextVariant, EntryKind, FinishReason, GroupRequest, PluginError,
    ScoreRequest, Scored, TurnRow,
};

use crate::plan::{good_variant, none_variant};

pub use cairn_plugin_sdk::testing::{render_bytes as render, MockHost};

/// The SDK's mock host (an in-memory bank ranked by insertion order, prompts rendered as the
/// bytes of `inject + "|" + observation`, text tokenized as its bytes, every call recorded)
/// scoring with [`score`] (top-k: [`top`]).
pub fn mock_host() -> MockHost {
    MockHost::default().with_scorer(|r| Ok(scored(r)))
}

/// [`mock_host`] on a backend without top-k: a score request with `top_k > 0` fails.
pub fn host_without_topk() -> MockHost {
    MockHost::default().with_scorer(|r| {
        if r.top_k > 0 {
            return Err(PluginError::host("this backend cannot return top-k scores"));
        }
        Ok(scored(r))
    })
}

fn scored(r: &ScoreRequest) -> Scored {
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
