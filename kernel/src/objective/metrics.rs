//! Batch-level training metrics: what the rewards, groups and responses of a step looked like.
//! They explain a step whose loss is 0 (every group uniform, trl #3857) and show truncation.

use cairn_plugin_sdk::stats::{group_indices, is_constant, mean, std, StdKind};
use cairn_plugin_sdk::{Batch, FinishReason, Signals};

/// Metrics of a batch and the signals computed for it, as `(name, value)`:
///
/// | name | meaning |
/// |------|---------|
/// | `reward/episode_mean` | mean episode reward over trajectories (one value per trajectory) |
/// | `reward/episode_std` | unbiased (N−1) std of the episode reward over trajectories (0 for one) |
/// | `success_rate` | fraction of trajectories with `success` |
/// | `groups/count` | task groups in the batch |
/// | `groups/zero_advantage_fraction` | fraction of groups whose advantages are exactly 0 on every mask-1 token of every row |
/// | `groups/zero_reward_std_fraction` | fraction of groups whose trajectories' episode rewards are all equal (up to float error) |
/// | `groups/dropped_fraction` | fraction of groups the algorithm dropped (dynamic sampling) |
/// | `trajectories/count`, `rows/count` | sizes |
/// | `turns_per_trajectory/mean` | rows per trajectory, mean over trajectories |
/// | `response_length/mean`, `response_length/max` | mask-1 tokens per row, over rows |
/// | `truncation_rate` | fraction of rows with `finish_reason = length` |
///
/// All groups of the batch count, dropped or not. Trajectories are formed from
/// `trajectory_id`; a trajectory's reward, success and group are read from its first row (the
/// algorithm plugins check that all its rows agree). Signals are expected to be validated
/// against the batch (`Signals::validate_against`); a row without advantages counts as all
/// zero.
pub fn batch_metrics(batch: &Batch, signals: &Signals) -> Vec<(String, f64)> {
    let rows = &batch.rows;
    let trajs = group_indices(&rows.iter().map(|r| r.trajectory_id).collect::<Vec<_>>());
    let rewards: Vec<f64> = trajs
        .iter()
        .map(|t| f64::from(rows[t[0]].episode_reward))
        .collect();
    let successes = trajs.iter().filter(|t| rows[t[0]].success).count();
    let frac = |count: usize, of: usize| {
        if of == 0 {
            0.0
        } else {
            count as f64 / of as f64
        }
    };

    // Groups of trajectories (by the group of each trajectory's first row).
    let groups = group_indices(
        &trajs
            .iter()
            .map(|t| rows[t[0]].group_id)
            .collect::<Vec<_>>(),
    );
    let zero_std = groups
        .iter()
        .filter(|g| is_constant(&g.iter().map(|&i| rewards[i]).collect::<Vec<_>>()))
        .count();
    let zero_advantage = |r: usize| {
        let adv = signals.advantages.get(r).map_or(&[][..], Vec::as_slice);
        rows[r]
            .response_mask
            .iter()
            .zip(adv)
            .all(|(&m, &a)| m != 1 || a == 0.0)
    };
    let zero_adv = groups
        .iter()
        .filter(|g| {
            g.iter()
                .flat_map(|&i| &trajs[i])
                .all(|&r| zero_advantage(r))
        })
        .count();
    let dropped = groups
        .iter()
        .filter(|g| {
            signals
                .dropped_groups
                .contains(&rows[trajs[g[0]][0]].group_id)
        })
        .count();
    let lengths: Vec<f64> = rows.iter().map(|r| r.trainable_tokens() as f64).collect();
    let truncated = rows
        .iter()
        .filter(|r| r.finish_reason == FinishReason::Length)
        .count();
    let turns: Vec<f64> = trajs.iter().map(|t| t.len() as f64).collect();

    vec![
        ("reward/episode_mean".into(), mean(&rewards)),
        (
            "reward/episode_std".into(),
            std(&rewards, StdKind::Unbiased),
        ),
        ("success_rate".into(), frac(successes, trajs.len())),
        ("groups/count".into(), groups.len() as f64),
        (
            "groups/zero_advantage_fraction".into(),
            frac(zero_adv, groups.len()),
        ),
        (
            "groups/zero_reward_std_fraction".into(),
            frac(zero_std, groups.len()),
        ),
        (
            "groups/dropped_fraction".into(),
            frac(dropped, groups.len()),
        ),
        ("trajectories/count".into(), trajs.len() as f64),
        ("rows/count".into(), rows.len() as f64),
        ("turns_per_trajectory/mean".into(), mean(&turns)),
        ("response_length/mean".into(), mean(&lengths)),
        (
            "response_length/max".into(),
            lengths.iter().copied().fold(0.0, f64::max),
        ),
        ("truncation_rate".into(), frac(truncated, rows.len())),
    ]
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::stats::{normalise_groups, Normalise};
    use cairn_plugin_sdk::TurnRow;

    use super::*;

    fn row(group: u64, traj: u64, turn: u32, reward: f32, mask: &[u8]) -> TurnRow {
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            turn,
            episode_reward: reward,
            success: reward > 0.5,
            response_ids: vec![0; mask.len()],
            response_logprobs: vec![0.0; mask.len()],
            response_mask: mask.to_vec(),
            ..TurnRow::default()
        }
    }

    /// `check(batch, signals, expected (name, value) pairs)`.
    fn check(batch: &Batch, signals: &Signals, expected: &[(&str, f64)]) {
        let got = batch_metrics(batch, signals);
        for (name, want) in expected {
            let value = got.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
            assert!(
                value.is_some_and(|v| (v - want).abs() < 1e-6),
                "{name}: got {value:?}, want {want}"
            );
        }
    }

    #[test]
    fn uniform_groups_are_exposed_trl_3857() {
        // Case trl-3857-zero-std-groups: rewards [1,1,1,1, 0,0,0,0], groups of 4, eps 1e-4.
        let rewards = [1.0f32, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let rows: Vec<TurnRow> = rewards
            .iter()
            .enumerate()
            .map(|(i, &r)| row(i as u64 / 4, i as u64, 0, r, &[1, 1]))
            .collect();
        let batch = Batch { step: 0, rows };
        let groups = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
        let r64: Vec<f64> = rewards.iter().map(|&r| f64::from(r)).collect();
        let adv = normalise_groups(
            &r64,
            &groups,
            Normalise::MeanStd {
                eps: 1e-4,
                std: StdKind::Unbiased,
            },
        );
        let signals = Signals {
            advantages: adv.iter().map(|&a| vec![a as f32; 2]).collect(),
            ..Default::default()
        };
        check(
            &batch,
            &signals,
            &[
                ("groups/zero_reward_std_fraction", 1.0),
                ("groups/zero_advantage_fraction", 1.0),
                ("reward/episode_std", 0.534522),
                ("reward/episode_mean", 0.5),
                ("success_rate", 0.5),
            ],
        );
    }

    #[test]
    fn lengths_turns_truncation_and_dropped_groups() {
        let mut rows = vec![
            row(1, 10, 0, 1.0, &[1, 1, 0]),
            row(1, 10, 1, 1.0, &[1, 1, 1, 1]),
            row(1, 11, 0, 0.0, &[1, 0]),
            row(2, 20, 0, 0.0, &[0, 0]),
        ];
        rows[1].finish_reason = FinishReason::Length;
        let batch = Batch { step: 0, rows };
        // Group 1 has a non-zero advantage on a trainable token; group 2 only on a masked one.
        let signals = Signals {
            advantages: vec![
                vec![0.5, 0.5, 0.0],
                vec![0.5; 4],
                vec![-1.0, 0.0],
                vec![3.0, 3.0],
            ],
            dropped_groups: vec![2],
            ..Default::default()
        };
        check(
            &batch,
            &signals,
            &[
                ("groups/count", 2.0),
                ("groups/zero_advantage_fraction", 0.5),
                ("groups/zero_reward_std_fraction", 0.5),
                ("groups/dropped_fraction", 0.5),
                ("trajectories/count", 3.0),
                ("rows/count", 4.0),
                ("turns_per_trajectory/mean", 4.0 / 3.0),
                ("response_length/mean", (2.0 + 4.0 + 1.0 + 0.0) / 4.0),
                ("response_length/max", 4.0),
                ("truncation_rate", 0.25),
                ("reward/episode_mean", 1.0 / 3.0),
                ("success_rate", 1.0 / 3.0),
            ],
        );
        let bad = Signals {
            advantages: vec![vec![0.0; 3]],
            ..Default::default()
        };
        // Rows without advantages count as all zero (no panic on unvalidated signals).
        check(
            &batch,
            &bad,
            &[
                ("groups/zero_advantage_fraction", 1.0),
                ("groups/dropped_fraction", 0.0),
            ],
        );
    }
}
