//! Playing episodes: many environment episodes advanced turn by turn, with one batched
//! generation call per turn across every live episode.
//!
//! [`play`] is the synchronous core the rollout actor runs on its own thread; it is also used
//! for held-out evaluation and, with [`demonstrations`], for expert warm-start data. Each turn
//! becomes one [`TurnRow`] with the exact prompt ids, sampled ids and sampled log-probs.
//!
//! An environment that fails mid-episode (an error or a caught panic in the plugin) aborts
//! that episode only: it is reported in [`Rollouts::aborted`] with the task and the error, its
//! rows are not trained on, and the other episodes go on.

pub mod prompt;
pub mod tokens;

use cairn_plugin_sdk::{
    ContextVariant, Environment, Episode, Observation, TaskRef, TurnContext, TurnContextRequest,
    TurnRow, TurnSummary,
};

use crate::backend::{Generation, SamplingParams};
use crate::error::Result;
use prompt::PromptBuilder;

/// One rollout slot to play.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeSpec {
    pub group_id: u64,
    pub trajectory_id: u64,
    pub task: TaskRef,
    pub task_id: String,
    /// Seed handed to the environment's `start`.
    pub seed: u64,
    pub variant: ContextVariant,
}

/// How to play.
#[derive(Clone, Debug, PartialEq)]
pub struct PlayParams {
    /// Sampling for every turn; `seed` is mixed with the turn index per call.
    pub sampling: SamplingParams,
    pub max_turns: u32,
    /// The training step (handed to the per-turn context hook).
    pub step: u64,
    /// The model's context window in tokens; a prompt that leaves no room for
    /// `sampling.max_new_tokens` in it is an error naming the trajectory, the task, the
    /// variant and the lengths. `None`: not checked.
    pub context_window: Option<usize>,
}

/// The outcome of one trajectory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrajectoryOutcome {
    pub trajectory_id: u64,
    pub group_id: u64,
    pub task_id: String,
    pub turns: u32,
    pub success: bool,
    /// Sum of the environment's step rewards.
    pub reward: f32,
}

/// What [`play`] returns.
#[derive(Clone, Debug, Default)]
pub struct Rollouts {
    /// One row per turn of every trajectory that was not aborted, in trajectory then turn
    /// order. `episode_reward`, `success` and `last_turn` are already filled in.
    pub rows: Vec<TurnRow>,
    pub trajectories: Vec<TrajectoryOutcome>,
    /// Trajectories cut by an environment error: (trajectory id, task id, error).
    pub aborted: Vec<(u64, String, String)>,
    /// Response tokens sampled.
    pub sampled_tokens: usize,
    /// Metrics the algorithm logged (`Host::log_metric`) while planning the groups and in the
    /// per-turn context hook; they go into the step's metrics.
    pub metrics: Vec<(String, f64)>,
}

/// The batched generation call: one response per prompt, and the policy version that sampled
/// them (recorded on each row, so a row's version is the version of its own turn).
pub type GenerateFn<'a> =
    dyn FnMut(&[Vec<u32>], &SamplingParams) -> Result<(Vec<Generation>, u64)> + 'a;

/// The per-turn context hook ([`cairn_plugin_sdk::Algorithm::next_context`]), called before
/// every turn after the first when the algorithm asks for it.
pub type TurnHook<'a> = dyn FnMut(&TurnContextRequest) -> Result<TurnContext> + 'a;

struct Live {
    spec: EpisodeSpec,
    episode: Box<dyn Episode>,
    observation: Observation,
    rows: Vec<TurnRow>,
    reward: f32,
    /// What the hook sees of the finished turns.
    summaries: Vec<TurnSummary>,
}

/// Plays every episode of `specs` to the end (done, or `max_turns`). With a `hook`, the
/// context of each turn after the first is asked of it: it may keep the slot's context, switch
/// it for this and later turns, or give the whole prompt of this turn (the row then records
/// that prompt, and its `extra.prompt_override = true`).
pub fn play(
    env: &dyn Environment,
    builder: &dyn PromptBuilder,
    specs: &[EpisodeSpec],
    params: &PlayParams,
    generate: &mut GenerateFn<'_>,
    mut hook: Option<&mut TurnHook<'_>>,
) -> Result<Rollouts> {
    let mut out = Rollouts::default();
    let mut live: Vec<Live> = Vec::with_capacity(specs.len());
    for spec in specs {
        match env.start(spec.task, spec.seed, &spec.variant) {
            Ok(episode) => {
                let observation = episode.observation();
                live.push(Live {
                    spec: spec.clone(),
                    episode,
                    observation,
                    rows: Vec::new(),
                    reward: 0.0,
                    summaries: Vec::new(),
                });
            }
            Err(e) => {
                tracing::warn!(task = %spec.task_id, error = %e, "environment failed to start an episode");
                out.aborted
                    .push((spec.trajectory_id, spec.task_id.clone(), e.to_string()));
            }
        }
    }
    let mut turn = 0u32;
    while !live.is_empty() {
        let mut overridden = vec![false; live.len()];
        let mut prompts = Vec::with_capacity(live.len());
        for (i, l) in live.iter_mut().enumerate() {
            if let (Some(hook), true) = (hook.as_deref_mut(), turn > 0) {
                let request = TurnContextRequest {
                    step: params.step,
                    group_id: l.spec.group_id,
                    trajectory_id: l.spec.trajectory_id,
                    task_id: l.spec.task_id.clone(),
                    turn,
                    variant: l.spec.variant.clone(),
                    turns: l.summaries.clone(),
                    observation: l.observation.clone(),
                };
                match hook(&request)? {
                    TurnContext::Keep => {}
                    TurnContext::Variant { variant } => l.spec.variant = variant,
                    TurnContext::Prompt { prompt_ids } => {
                        overridden[i] = true;
                        prompts.push(prompt_ids);
                        continue;
                    }
                }
            }
            prompts.push(builder.prompt(&l.spec.variant, &l.observation)?);
        }
        if let Some(window) = params.context_window {
            let room = params.sampling.max_new_tokens as usize;
            for (l, prompt) in live.iter().zip(&prompts) {
                if prompt.len() + room > window {
                    return Err(crate::Error::Other(format!(
                        "trajectory {} (task {}, turn {turn}, variant `{}`): the prompt is {} \
                         tokens, and with max_new_tokens = {room} it does not fit the model's \
                         context window of {window} tokens; shorten what the variant injects \
                         ({} characters; see the plugin's length limit) or the observation",
                        l.spec.trajectory_id,
                        l.spec.task_id,
                        l.spec.variant.label,
                        prompt.len(),
                        l.spec.variant.inject.chars().count()
                    )));
                }
            }
        }
        let mut sampling = params.sampling.clone();
        sampling.seed = mix(params.sampling.seed, u64::from(turn));
        let (generations, version) = generate(&prompts, &sampling)?;
        if generations.len() != prompts.len() {
            return Err(crate::Error::Model(format!(
                "generate returned {} responses for {} prompts",
                generations.len(),
                prompts.len()
            )));
        }
        let mut still_live = Vec::with_capacity(live.len());
        for (((mut l, prompt_ids), generation), overridden) in live
            .into_iter()
            .zip(prompts)
            .zip(generations)
            .zip(overridden)
        {
            out.sampled_tokens += generation.ids.len();
            let action = builder.action(&generation.ids)?;
            let outcome = match l.episode.step(&action) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(task = %l.spec.task_id, turn, error = %e, "environment step failed; episode aborted");
                    out.aborted
                        .push((l.spec.trajectory_id, l.spec.task_id.clone(), e.to_string()));
                    continue;
                }
            };
            let mut info: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&outcome.info_json).unwrap_or_default();
            l.summaries.push(TurnSummary {
                observation: l.observation.text.clone(),
                action: action.clone(),
                reward: outcome.reward,
                feedback: outcome.feedback,
                tool_calls: outcome.tool_calls,
            });
            info.insert("action".into(), serde_json::Value::String(action));
            let mut extra = serde_json::Map::new();
            if overridden {
                extra.insert("prompt_override".into(), serde_json::Value::Bool(true));
            }
            l.reward += outcome.reward;
            l.rows.push(TurnRow {
                group_id: l.spec.group_id,
                trajectory_id: l.spec.trajectory_id,
                turn,
                task_id: l.spec.task_id.clone(),
                policy_version: version,
                variant: l.spec.variant.clone(),
                prompt_ids,
                response_mask: vec![1; generation.ids.len()],
                response_ids: generation.ids,
                response_logprobs: generation.logprobs,
                finish_reason: generation.finish_reason,
                turn_reward: outcome.reward,
                episode_reward: 0.0,
                success: outcome.success,
                last_turn: false,
                anchor: l.observation.anchor.take(),
                observation: std::mem::take(&mut l.observation.text),
                feedback: outcome.feedback,
                tool_calls: outcome.tool_calls,
                info,
                extra,
                ..TurnRow::default()
            });
            l.observation = outcome.observation;
            if outcome.done || turn + 1 >= params.max_turns {
                finish(&mut out, l, outcome.success);
            } else {
                still_live.push(l);
            }
        }
        live = still_live;
        turn += 1;
    }
    Ok(out)
}

fn finish(out: &mut Rollouts, mut l: Live, success: bool) {
    let turns = l.rows.len() as u32;
    for (i, row) in l.rows.iter_mut().enumerate() {
        row.episode_reward = l.reward;
        row.success = success;
        row.last_turn = i + 1 == turns as usize;
    }
    out.trajectories.push(TrajectoryOutcome {
        trajectory_id: l.spec.trajectory_id,
        group_id: l.spec.group_id,
        task_id: l.spec.task_id.clone(),
        turns,
        success,
        reward: l.reward,
    });
    out.rows.append(&mut l.rows);
}

/// A supervised example: prompt ids and the response ids to imitate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demonstration {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

/// Plays the environment's expert on `tasks` and returns one example per expert turn, framed
/// exactly as the policy will see it. Episodes whose expert fails within `max_turns` are
/// counted in the second return value, and skipped unless `keep_unsolved`.
///
/// A `hinted_share` of the solved episodes (spread evenly: episode `k` is hinted when
/// `⌊(k+1)·share⌋ > ⌊k·share⌋`) is framed with a context variant (label `demo-hint`) whose
/// injected text is that episode's own solution in the skill creator's template form
/// ([`crate::skills::template::solved_text`]): the demonstration then teaches how an injected
/// experience reads, and never the answer of another task.
pub fn demonstrations(
    env: &dyn Environment,
    builder: &dyn PromptBuilder,
    tasks: &[(TaskRef, u64)],
    max_turns: u32,
    hinted_share: f64,
    keep_unsolved: bool,
) -> Result<(Vec<Demonstration>, usize)> {
    let mut demos = Vec::new();
    let mut failed = 0;
    let plain = ContextVariant::default();
    for (k, &(task, seed)) in tasks.iter().enumerate() {
        let mut episode = env.start(task, seed, &plain)?;
        let mut turns = Vec::new();
        let mut solved = false;
        for _ in 0..max_turns {
            let observation = episode.observation();
            let Some(action) = episode.expert_action() else {
                break;
            };
            let outcome = episode.step(&action)?;
            turns.push((observation, action));
            if outcome.done {
                solved = outcome.success;
                break;
            }
        }
        if !solved {
            failed += 1;
            if !keep_unsolved {
                continue;
            }
        }
        let hinted = ((k + 1) as f64 * hinted_share).floor() > (k as f64 * hinted_share).floor();
        // An unsolved episode's actions are no solution: it is never shown as one.
        let variant = if hinted && solved {
            let actions: Vec<&str> = turns.iter().map(|(_, a)| a.as_str()).collect();
            ContextVariant {
                label: "demo-hint".into(),
                inject: crate::skills::template::solved_text(&actions),
                ..ContextVariant::default()
            }
        } else {
            plain.clone()
        };
        for (observation, action) in &turns {
            demos.push(Demonstration {
                prompt_ids: builder.prompt(&variant, observation)?,
                response_ids: builder.demonstration(action)?,
            });
        }
    }
    Ok((demos, failed))
}

/// Text for training a tokenizer on an environment: goals, observations, admissible actions and
/// expert actions of `episodes` expert episodes on training tasks (never held-out tasks).
pub fn corpus(env: &dyn Environment, episodes: usize, max_turns: u32) -> Result<Vec<String>> {
    let info = env.info();
    let plain = ContextVariant::default();
    let mut lines = Vec::new();
    for i in 0..(episodes as u64).min(info.train_tasks) {
        let task = TaskRef {
            split: cairn_plugin_sdk::Split::Train,
            index: i,
        };
        lines.push(env.task(task)?.goal);
        let mut episode = env.start(task, i, &plain)?;
        for _ in 0..max_turns {
            let observation = episode.observation();
            lines.push(observation.text);
            lines.extend(observation.admissible_actions);
            let Some(action) = episode.expert_action() else {
                break;
            };
            let outcome = episode.step(&action)?;
            lines.push(action);
            if outcome.done {
                lines.push(outcome.observation.text);
                break;
            }
        }
    }
    Ok(lines)
}

/// SplitMix64 finaliser: derives independent seeds from (seed, index).
pub fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod demonstration_tests {
    use cairn_plugin_sdk::{
        ContextVariant, Environment, EnvironmentInfo, Episode, Observation, Split, StepOutcome,
        TaskInfo, TaskRef,
    };

    use super::demonstrations;
    use crate::rollout::prompt::{tests::WordCodec, PlainPrompt, TextCodec};

    /// Two-turn episodes whose expert says `go k` then `take k` (k = task index).
    struct TwoTurns;
    struct TwoTurnsEpisode {
        task: u64,
        turn: u32,
    }

    impl Environment for TwoTurns {
        fn info(&self) -> EnvironmentInfo {
            EnvironmentInfo {
                train_tasks: 8,
                test_tasks: 1,
                max_turns: 2,
                ..Default::default()
            }
        }
        fn task(&self, _: TaskRef) -> cairn_plugin_sdk::Result<TaskInfo> {
            Ok(TaskInfo::default())
        }
        fn start(
            &self,
            task: TaskRef,
            _: u64,
            _: &ContextVariant,
        ) -> cairn_plugin_sdk::Result<Box<dyn Episode>> {
            Ok(Box::new(TwoTurnsEpisode {
                task: task.index,
                turn: 0,
            }))
        }
    }

    impl Episode for TwoTurnsEpisode {
        fn observation(&self) -> Observation {
            Observation {
                text: format!("room {} turn {}", self.task, self.turn),
                ..Default::default()
            }
        }
        fn step(&mut self, _: &str) -> cairn_plugin_sdk::Result<StepOutcome> {
            self.turn += 1;
            Ok(StepOutcome {
                done: self.turn == 2,
                success: self.turn == 2,
                info_json: "{}".into(),
                ..Default::default()
            })
        }
        fn expert_action(&self) -> Option<String> {
            Some(match self.turn {
                0 => format!("go {}", self.task),
                _ => format!("take {}", self.task),
            })
        }
    }

    #[test]
    fn a_hinted_share_of_demonstrations_carries_its_own_solution_in_the_template_form() {
        let builder = PlainPrompt {
            codec: WordCodec::default(),
            separator: vec![1],
            stop_ids: vec![2],
        };
        let tasks: Vec<(TaskRef, u64)> = (0..4)
            .map(|i| {
                (
                    TaskRef {
                        split: Split::Train,
                        index: i,
                    },
                    i,
                )
            })
            .collect();
        let (plain, failed) = demonstrations(&TwoTurns, &builder, &tasks, 2, 0.0, false).unwrap();
        assert_eq!((plain.len(), failed), (8, 0));
        // With one turn the expert finishes nothing: skipped, or kept (and never hinted).
        let (none, failed) = demonstrations(&TwoTurns, &builder, &tasks, 1, 1.0, false).unwrap();
        assert_eq!((none.len(), failed), (0, 4));
        let (kept, failed) = demonstrations(&TwoTurns, &builder, &tasks, 1, 1.0, true).unwrap();
        assert_eq!((kept.len(), failed), (4, 4));
        let first = builder.codec.decode(&kept[0].prompt_ids).unwrap();
        assert_eq!(first, "room 0 turn 0");
        let (hinted, _) = demonstrations(&TwoTurns, &builder, &tasks, 2, 0.5, false).unwrap();
        assert_eq!(hinted.len(), 8);
        // Share 0.5 over 4 episodes: episodes 1 and 3 are hinted, each turn of them.
        for (k, pair) in hinted.chunks(2).enumerate() {
            for (t, demo) in pair.iter().enumerate() {
                let text = builder.codec.decode(&demo.prompt_ids).unwrap();
                let observation = format!("room {k} turn {t}");
                let expected = if k % 2 == 1 {
                    format!("solved in 2 turns: go {k}; take {k} {observation}")
                } else {
                    observation
                };
                assert_eq!(text, expected, "episode {k} turn {t}");
                assert_eq!(demo.response_ids, plain[2 * k + t].response_ids);
            }
        }
        let (all, _) = demonstrations(&TwoTurns, &builder, &tasks, 2, 1.0, false).unwrap();
        let first = builder.codec.decode(&all[0].prompt_ids).unwrap();
        assert!(
            first.starts_with("solved in 2 turns: go 0; take 0"),
            "{first}"
        );
    }
}
