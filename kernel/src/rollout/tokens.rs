//! Token-level bookkeeping rules of the rollout and the reward actor, and the tests that pin
//! them on the functions the pipeline runs. Each rule fixes a class of bug seen in other
//! frameworks (the cases, their sources and exact values are in docs/bug-cases.md):
//!
//! - a row's loss mask comes from what was sampled (1 on every sampled id, stop id included),
//!   never from comparing ids with a pad id: rows hold no padding at all (trl #4970), and every
//!   configured stop id ends sampling (trl #7039; `ChatFormat::stop_ids`);
//! - rewards are row scalars (`turn_reward`, `episode_reward`) whose advantages plugins broadcast
//!   to mask-1 tokens, so a reward can never land on a pad (trl #3750) or on a tool-output id
//!   (verl #6392); a trajectory without any policy token carries no reward at all, so it cannot
//!   feed a phantom value into its group's baseline (verl #6310; [`reward_index`], used by the
//!   reward actor);
//! - a truncated response stays exactly as sampled, ids and log-probs, with finish reason
//!   `length` (OpenRLHF #238).

/// Where an outcome reward belongs: the last token with loss mask 1 (a policy token). `None`
/// when the response has no policy token; then the reward has nowhere to go, and the reward
/// actor zeroes the trajectory's reward instead of placing it.
pub fn reward_index(response_mask: &[u8]) -> Option<usize> {
    response_mask.iter().rposition(|&m| m == 1)
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::stats::{normalise_groups, Normalise, StdKind};
    use cairn_plugin_sdk::{
        ContextVariant, Environment, EnvironmentInfo, Episode, FinishReason, Observation, Split,
        StepOutcome, TaskInfo, TaskRef, TurnRow,
    };

    use super::*;
    use crate::actors::reward::{finalise, RewardConfig};
    use crate::backend::{Generation, SamplingParams};
    use crate::rollout::prompt::{tests::WordCodec, PlainPrompt};
    use crate::rollout::{play, EpisodeSpec, PlayParams};

    const IM_END: u32 = 151645;
    const ENDOFTEXT: u32 = 151643;

    /// One-turn episodes: any action ends them with reward 1.
    struct OneTurn;

    struct OneTurnEpisode;

    impl Environment for OneTurn {
        fn info(&self) -> EnvironmentInfo {
            EnvironmentInfo {
                train_tasks: 1,
                test_tasks: 1,
                max_turns: 1,
                ..Default::default()
            }
        }
        fn task(&self, _: TaskRef) -> cairn_plugin_sdk::Result<TaskInfo> {
            Ok(TaskInfo::default())
        }
        fn start(
            &self,
            _: TaskRef,
            _: u64,
            _: &ContextVariant,
        ) -> cairn_plugin_sdk::Result<Box<dyn Episode>> {
            Ok(Box::new(OneTurnEpisode))
        }
    }

    impl Episode for OneTurnEpisode {
        fn observation(&self) -> Observation {
            Observation {
                text: "say something".into(),
                ..Default::default()
            }
        }
        fn step(&mut self, _: &str) -> cairn_plugin_sdk::Result<StepOutcome> {
            Ok(StepOutcome {
                reward: 1.0,
                done: true,
                success: true,
                info_json: "{}".into(),
                ..Default::default()
            })
        }
        fn expert_action(&self) -> Option<String> {
            None
        }
    }

    /// The row [`play`] records when the policy samples `generation` (stop ids: Qwen's two).
    fn played_row(generation: Generation) -> TurnRow {
        let builder = PlainPrompt {
            codec: WordCodec::default(),
            separator: vec![1],
            stop_ids: vec![IM_END, ENDOFTEXT],
        };
        let spec = EpisodeSpec {
            group_id: 0,
            trajectory_id: 0,
            task: TaskRef {
                split: Split::Train,
                index: 0,
            },
            task_id: "t".into(),
            seed: 0,
            variant: ContextVariant::default(),
        };
        let params = PlayParams {
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                max_new_tokens: 4,
                stop_ids: vec![IM_END, ENDOFTEXT],
                seed: 0,
            },
            max_turns: 1,
            step: 0,
            context_window: None,
            env_timeout: None,
            env_name: "one-turn".into(),
        };
        let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
            Ok((vec![generation.clone(); prompts.len()], 3))
        };
        let env: std::sync::Arc<dyn cairn_plugin_sdk::Environment> = std::sync::Arc::new(OneTurn);
        let mut out = play(&env, &builder, &[spec], &params, &mut generate, None).unwrap();
        assert_eq!(out.rows.len(), 1);
        out.rows.remove(0)
    }

    #[test]
    fn trl_4970_mask_comes_from_what_was_sampled_not_the_pad_id() {
        // Qwen pads with <|endoftext|>, which is also a stop id: the genuine stop stays in.
        let row = played_row(Generation {
            ids: vec![9707, 1879, ENDOFTEXT],
            logprobs: vec![-0.1, -0.2, -0.3],
            finish_reason: FinishReason::Stop,
        });
        assert_eq!(row.response_ids, vec![9707, 1879, ENDOFTEXT]);
        assert_eq!(row.response_mask, vec![1, 1, 1]);
        assert_eq!(row.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn openrlhf_238_truncated_response_is_kept_as_sampled() {
        let row = played_row(Generation {
            ids: vec![9707, 1879, 11, 1879],
            logprobs: vec![-0.1, -0.2, -0.3, -0.4],
            finish_reason: FinishReason::Length,
        });
        assert_eq!(row.response_ids, vec![9707, 1879, 11, 1879]);
        assert_eq!(row.response_logprobs, vec![-0.1, -0.2, -0.3, -0.4]);
        assert_eq!(row.finish_reason, FinishReason::Length);
        assert_eq!(row.response_mask, vec![1, 1, 1, 1]);
        assert_eq!(row.policy_version, 3);
    }

    #[test]
    fn trl_3750_the_reward_token_is_the_stop_not_a_pad() {
        // A row ends at its sampled stop id; with no stop (truncated) at its last sampled id.
        let stopped = played_row(Generation {
            ids: vec![9707, 1879, IM_END],
            logprobs: vec![-0.5; 3],
            finish_reason: FinishReason::Stop,
        });
        assert_eq!(reward_index(&stopped.response_mask), Some(2));
        let truncated = played_row(Generation {
            ids: vec![9707, 1879, 11, 1879],
            logprobs: vec![-0.5; 4],
            finish_reason: FinishReason::Length,
        });
        assert_eq!(reward_index(&truncated.response_mask), Some(3));
        assert_eq!(reward_index(&[1, 1, 1, 1, 1]), Some(4));
    }

    fn reward_row(trajectory: u64, mask: Vec<u8>, reward: f32) -> TurnRow {
        TurnRow {
            trajectory_id: trajectory,
            response_ids: vec![7; mask.len()],
            response_logprobs: vec![-1.0; mask.len()],
            response_mask: mask,
            turn_reward: reward,
            ..Default::default()
        }
    }

    #[test]
    fn verl_6392_the_reward_goes_to_the_last_policy_token_not_tool_output() {
        // "assistant", "final" sampled; "TOOL_LEAK" is a tool-output id (mask 0); then a pad.
        assert_eq!(reward_index(&[1, 1, 0, 0]), Some(1));
        let out = finalise(
            &RewardConfig::default(),
            0,
            vec![reward_row(0, vec![1, 1, 0, 0], 1.0)],
        );
        assert_eq!(out.batch.rows[0].episode_reward, 1.0);
        assert_eq!(out.unplaceable, 0);
    }

    #[test]
    fn verl_6310_empty_response_gets_no_phantom_reward() {
        let out = finalise(
            &RewardConfig::default(),
            0,
            vec![
                reward_row(0, vec![1, 1, 0], 1.0),
                reward_row(1, vec![0, 0, 0], 10.0),
            ],
        );
        let outcome: Vec<f64> = out
            .batch
            .rows
            .iter()
            .map(|r| f64::from(r.episode_reward))
            .collect();
        assert_eq!(outcome, vec![1.0, 0.0]);
        assert_eq!(out.unplaceable, 1);
        let adv = normalise_groups(
            &outcome,
            &[vec![0, 1]],
            Normalise::MeanStd {
                eps: 1e-6,
                std: StdKind::Unbiased,
            },
        );
        // The case's ±0.707106 is 1/√2 truncated; under the bug the signs flip.
        let half = std::f64::consts::FRAC_1_SQRT_2;
        assert!(
            (adv[0] - half).abs() < 1e-6 && (adv[1] + half).abs() < 1e-6,
            "{adv:?}"
        );
    }
}
