//! The reward actor, the stage between the producer and the optimizer ([`super::flow`]): turns
//! what the environment reported into final rewards.
//!
//! - `episode_reward` = Σ turn rewards (after shaping), written on every row of the trajectory;
//! - an invalid action (feedback −1) costs `invalid_action_penalty` (GiGPO's ALFWorld setting
//!   is 0.1; off by default), except in a failed episode's rows (`extra.failed`), whose
//!   reward stays 0 (docs/faults.md);
//! - a trajectory with no policy token at all has nowhere to carry an outcome reward
//!   (verl #6310): its reward is set to 0 and counted in `reward/unplaceable`.

use actix::prelude::*;
use cairn_plugin_sdk::{Batch, TurnRow};

use crate::actors::flow::{Arrived, Collected, Played};
use crate::rollout::tokens::reward_index;
use crate::rollout::Rollouts;

/// Reward shaping settings.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// Subtracted from the reward of a turn whose action the environment rejected.
    pub invalid_action_penalty: f32,
}

/// The reward stage: finalises each step the producer forwards and forwards it to the
/// optimizer.
pub struct RewardActor {
    pub config: RewardConfig,
    pub forward: Recipient<Arrived>,
}

impl Actor for RewardActor {
    type Context = Context<Self>;
}

impl Handler<Played> for RewardActor {
    type Result = ();
    fn handle(&mut self, msg: Played, _: &mut Self::Context) {
        let collected = msg
            .rollouts
            .map(|r| reward_rollouts(&self.config, msg.step, r, msg.rollout_secs));
        self.forward.do_send(Arrived {
            step: msg.step,
            collected,
        });
    }
}

/// Rows with final rewards, and what the reward rules did.
#[derive(Debug, Default)]
pub struct Finalised {
    pub batch: Batch,
    /// Trajectories whose reward could not be placed on any policy token.
    pub unplaceable: usize,
}

/// A step's [`Collected`]: the rollouts with their rewards finalised ([`finalise`]).
pub fn reward_rollouts(
    config: &RewardConfig,
    step: u64,
    rollouts: Rollouts,
    rollout_secs: f64,
) -> Collected {
    let finalised = finalise(config, step, rollouts.rows);
    Collected {
        step,
        batch: finalised.batch,
        seeds: rollouts.seeds,
        failed: rollouts.failed,
        failure_dropped: rollouts.dropped_rows,
        unplaceable: finalised.unplaceable,
        sampled_tokens: rollouts.sampled_tokens,
        rollout_secs,
        metrics: rollouts.metrics,
    }
}

/// The reward rules, as a plain function (see the module docs).
pub fn finalise(config: &RewardConfig, step: u64, mut rows: Vec<TurnRow>) -> Finalised {
    for row in &mut rows {
        // A failed episode's rows (`rollout.on_episode_failure = "zero_reward"`) keep reward 0.
        if row.feedback < 0 && !row.extra.contains_key("failed") {
            row.turn_reward -= config.invalid_action_penalty;
        }
    }
    let groups = cairn_plugin_sdk::stats::group_indices(
        &rows.iter().map(|r| r.trajectory_id).collect::<Vec<_>>(),
    );
    let mut unplaceable = 0;
    for trajectory in groups {
        let placeable = trajectory
            .iter()
            .any(|&i| reward_index(&rows[i].response_mask).is_some());
        let total: f32 = if placeable {
            trajectory.iter().map(|&i| rows[i].turn_reward).sum()
        } else {
            0.0
        };
        if !placeable {
            unplaceable += 1;
        }
        for &i in &trajectory {
            rows[i].episode_reward = total;
        }
    }
    Finalised {
        batch: Batch { step, rows },
        unplaceable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(traj: u64, turn: u32, mask: Vec<u8>, reward: f32, feedback: i8) -> TurnRow {
        TurnRow {
            trajectory_id: traj,
            turn,
            response_ids: vec![5; mask.len()],
            response_logprobs: vec![-1.0; mask.len()],
            response_mask: mask,
            turn_reward: reward,
            feedback,
            ..Default::default()
        }
    }

    #[test]
    fn episode_reward_sums_turns_and_empty_trajectories_get_nothing() {
        let rows = vec![
            row(0, 0, vec![1, 1], 0.0, -1),
            row(0, 1, vec![1], 1.0, 1),
            row(1, 0, vec![], 10.0, 0),
        ];
        let out = finalise(
            &RewardConfig {
                invalid_action_penalty: 0.1,
            },
            3,
            rows,
        );
        let r: Vec<f32> = out.batch.rows.iter().map(|r| r.episode_reward).collect();
        assert_eq!(r, vec![0.9, 0.9, 0.0]);
        assert_eq!(out.unplaceable, 1);
        assert_eq!(out.batch.step, 3);
    }
}
