//! Playing episodes: many environment episodes advanced turn by turn, with one batched
//! generation call per turn across every live episode.
//!
//! [`play_async`] is the core the rollout actor runs on its own arbiter: it awaits each turn's
//! batched generation ([`AsyncGenerateFn`], a message to the policy actor or the engine actor),
//! while the environment's calls stay synchronous under their deadline. [`play`] is the same
//! with a synchronous generator (tests, benchmarks, tools). It is also used for held-out
//! evaluation and, with [`demonstrations`], for expert warm-start data. Each turn becomes one
//! [`TurnRow`] with the exact prompt ids, sampled ids and sampled log-probs.
//!
//! **Environment faults.** An environment call (`start` with the first observation, `step`)
//! that returns an error, panics (caught at the plugin boundary), or gives no reply within
//! [`PlayParams::env_timeout`] fails that episode only: it is reported in [`Rollouts::failed`]
//! with the kind, the call, the task, the turn and the message, the turns it played are put
//! in [`Rollouts::failed_rows`] (episode reward 0, not a success, `extra.failed` = the kind),
//! and the other episodes go on. The calls run on a worker thread, a turn's calls handed to
//! it together ([`crate::deadline::call_each`]): a hung episode is abandoned with its worker,
//! and the episodes after it step on a fresh one. What becomes of the failed episode's group is
//! [`FailureRule`]'s choice ([`apply_failure_rule`]).

pub mod prompt;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use cairn_plugin_sdk::{
    ContextVariant, Environment, Episode, ErrorKind, Observation, PluginError, StepOutcome,
    TaskRef, TurnContext, TurnContextRequest, TurnRow, TurnSummary,
};
use futures::future::{FutureExt, LocalBoxFuture};

use crate::backend::{Generation, SamplingParams};
use crate::deadline::{self, Missed};
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
    /// Deadline of each environment call (`rollout.env_timeout_s`): an episode whose `start`
    /// or `step` gives no reply within it fails (kind timeout). `None`: the calls run on the
    /// calling thread, without a deadline.
    pub env_timeout: Option<Duration>,
    /// The environment plugin's name, for failure reasons.
    pub env_name: String,
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

/// How an episode failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The environment returned an error.
    Error,
    /// The environment panicked (caught at the plugin boundary).
    Panic,
    /// The environment gave no reply within the deadline.
    Timeout,
    /// The algorithm's per-turn context hook gave a whole prompt
    /// ([`TurnContext::Prompt`]) that leaves no room for `max_new_tokens` in the model's
    /// context window: the plugin's context budget is too large for this model.
    ContextOverflow,
    /// The external rollout engine (`[rollout.engine]`) failed the turn's generation on
    /// every attempt: down, timed out, or an unusable answer. Every episode of that turn
    /// fails.
    Engine,
}

impl FailureKind {
    /// `error`, `panic`, `timeout`, `context_overflow` or `engine` (the metric suffix:
    /// `episodes/failed_<kind>`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Error => "error",
            FailureKind::Panic => "panic",
            FailureKind::Timeout => "timeout",
            FailureKind::ContextOverflow => "context_overflow",
            FailureKind::Engine => "engine",
        }
    }

    /// Every kind, in metric order.
    pub const ALL: [FailureKind; 5] = [
        FailureKind::Error,
        FailureKind::Panic,
        FailureKind::Timeout,
        FailureKind::ContextOverflow,
        FailureKind::Engine,
    ];
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An episode cut by an environment fault: which one, how, and the reason (the call, the
/// task, the turn and the plugin's message, or "no reply within N s").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailedEpisode {
    pub trajectory_id: u64,
    pub group_id: u64,
    pub task_id: String,
    pub kind: FailureKind,
    pub reason: String,
}

/// What becomes of a group with a failed episode in a training step
/// (`rollout.on_episode_failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureRule {
    /// The whole group is left out of the step (counted in `episodes/failed_groups_dropped`):
    /// an environment fault says nothing about the policy.
    #[default]
    DropGroup,
    /// The group trains with the failed episode as a member of episode reward 0 and no
    /// success: the turns it played (the one whose call failed included) train with that
    /// reward and count in the group's mean and spread. An episode that failed before its
    /// first turn has no rows and is simply absent from its group.
    ZeroReward,
}

/// What [`play`] returns.
#[derive(Clone, Debug, Default)]
pub struct Rollouts {
    /// One row per turn of every trajectory that finished, in trajectory then turn order.
    /// `episode_reward`, `success` and `last_turn` are already filled in.
    pub rows: Vec<TurnRow>,
    pub trajectories: Vec<TrajectoryOutcome>,
    /// Trajectories cut by an environment fault (an error, a caught panic, or no reply within
    /// the deadline), in the order they failed.
    pub failed: Vec<FailedEpisode>,
    /// The turns the failed trajectories played, the turn whose step failed included (with
    /// reward 0): every row has `turn_reward` and `episode_reward` 0, `success` false,
    /// `last_turn` on its trajectory's last row, and `extra.failed` = the kind. Not trained on
    /// unless [`apply_failure_rule`] with [`FailureRule::ZeroReward`] moves them into `rows`.
    pub failed_rows: Vec<TurnRow>,
    /// The rows [`apply_failure_rule`] took out of a training step with
    /// [`FailureRule::DropGroup`]: every played turn of each group with a failed episode (the
    /// failed trajectories' own turns included). Never trained on; the data pool records them
    /// as untrained, with the reason.
    pub dropped_rows: Vec<TurnRow>,
    /// Response tokens sampled.
    pub sampled_tokens: usize,
    /// `(trajectory_id, environment seed)` of the episodes played, when the player chose the
    /// seeds (the rollout actor fills it in after [`play`]; the data pool records it).
    pub seeds: Vec<(u64, u64)>,
    /// Metrics the algorithm logged (`Host::log_metric`) while planning the groups and in the
    /// per-turn context hook; they go into the step's metrics.
    pub metrics: Vec<(String, f64)>,
}

/// Applies `rule` to a training step's rollouts: [`FailureRule::DropGroup`] moves every row
/// of each group with a failed episode (and the failed trajectories' own rows) into
/// [`Rollouts::dropped_rows`] and removes the groups' outcomes; [`FailureRule::ZeroReward`] appends the
/// failed trajectories' rows ([`Rollouts::failed_rows`]) to `rows`. Either way
/// `failed_rows` is empty afterwards and `failed` is kept. Returns the number of groups
/// dropped.
pub fn apply_failure_rule(out: &mut Rollouts, rule: FailureRule) -> usize {
    let failed_rows = std::mem::take(&mut out.failed_rows);
    match rule {
        FailureRule::DropGroup => {
            let groups: std::collections::BTreeSet<u64> =
                out.failed.iter().map(|f| f.group_id).collect();
            let (dropped, kept): (Vec<TurnRow>, Vec<TurnRow>) = std::mem::take(&mut out.rows)
                .into_iter()
                .partition(|r| groups.contains(&r.group_id));
            out.rows = kept;
            out.dropped_rows.extend(dropped);
            out.dropped_rows.extend(failed_rows);
            out.trajectories.retain(|t| !groups.contains(&t.group_id));
            groups.len()
        }
        FailureRule::ZeroReward => {
            out.rows.extend(failed_rows);
            0
        }
    }
}

/// The batched generation call: one response per prompt, and the policy version that sampled
/// them (recorded on each row, so a row's version is the version of its own turn).
pub type GenerateFn<'a> =
    dyn FnMut(&[Vec<u32>], &SamplingParams) -> Result<(Vec<Generation>, u64)> + 'a;

/// [`GenerateFn`] whose answer is awaited: the call takes what it needs from the arguments
/// (the prompts go into a message) and returns the answer's future.
pub type AsyncGenerateFn<'a> =
    dyn FnMut(&[Vec<u32>], &SamplingParams) -> LocalBoxFuture<'static, GenerateAnswer> + 'a;

/// What a generation call answers: one response per prompt, and the version that sampled them.
pub type GenerateAnswer = Result<(Vec<Generation>, u64)>;

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

/// Why an environment call gave no usable answer.
#[derive(Clone)]
struct Fault {
    kind: FailureKind,
    message: String,
}

impl Fault {
    fn plugin(e: &PluginError) -> Fault {
        Fault {
            kind: if e.kind == ErrorKind::Panic {
                FailureKind::Panic
            } else {
                FailureKind::Error
            },
            message: e.to_string(),
        }
    }

    fn missed(m: Missed, env_name: &str) -> Fault {
        match m {
            Missed::TimedOut(d) => Fault {
                kind: FailureKind::Timeout,
                message: format!(
                    "environment `{env_name}` gave no reply within {} s \
                     (rollout.env_timeout_s); the call was abandoned",
                    d.as_secs_f64()
                ),
            },
            Missed::Panicked(message) => Fault {
                kind: FailureKind::Panic,
                message: format!("environment `{env_name}` {message}"),
            },
        }
    }

    /// A plugin error or panic inside `observation()`, which reports it in the text.
    fn in_observation(observation: &Observation) -> Option<Fault> {
        let prefix = cairn_plugin_sdk::host::foreign::OBSERVATION_ERROR_PREFIX;
        let message = observation.text.strip_prefix(prefix)?;
        let message = message.strip_suffix(']').unwrap_or(message);
        Some(Fault {
            kind: if message.contains("panicked") {
                FailureKind::Panic
            } else {
                FailureKind::Error
            },
            message: message.to_string(),
        })
    }
}

/// A started episode with its first observation, or why it did not start.
type Started = std::result::Result<(Box<dyn Episode>, Observation), Fault>;

/// A stepped episode with the step's outcome, or why the step failed.
type Stepped = std::result::Result<(Box<dyn Episode>, StepOutcome), Fault>;

/// Starts the episodes of `specs` and reads their first observations, in order, each call
/// under the deadline ([`deadline::call_each`]: one hand-off to the worker for them all).
fn start_episodes(
    env: &Arc<dyn Environment>,
    specs: &[EpisodeSpec],
    params: &PlayParams,
) -> Vec<Started> {
    let calls: Vec<_> = specs
        .iter()
        .map(|spec| {
            let env = env.clone();
            let (task, seed, variant) = (spec.task, spec.seed, spec.variant.clone());
            move || {
                env.start(task, seed, &variant).map(|episode| {
                    let observation = episode.observation();
                    (episode, observation)
                })
            }
        })
        .collect();
    deadline::call_each(params.env_timeout, calls)
        .into_iter()
        .map(|answer| match answer {
            Ok(Ok((episode, observation))) => match Fault::in_observation(&observation) {
                Some(fault) => Err(fault),
                None => Ok((episode, observation)),
            },
            Ok(Err(e)) => Err(Fault::plugin(&e)),
            Err(m) => Err(Fault::missed(m, &params.env_name)),
        })
        .collect()
}

/// One step of each episode with its action, in order, each call under the deadline (one
/// hand-off for them all): an episode comes back with its outcome, or is dropped (on an
/// error, on the worker) or abandoned (on a timeout).
fn step_episodes(steps: Vec<(Box<dyn Episode>, String)>, params: &PlayParams) -> Vec<Stepped> {
    let calls: Vec<_> = steps
        .into_iter()
        .map(|(mut episode, action)| {
            move || episode.step(&action).map(|outcome| (episode, outcome))
        })
        .collect();
    deadline::call_each(params.env_timeout, calls)
        .into_iter()
        .map(|answer| match answer {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(Fault::plugin(&e)),
            Err(m) => Err(Fault::missed(m, &params.env_name)),
        })
        .collect()
}

/// Plays every episode of `specs` to the end (done, or `max_turns`). With a `hook`, the
/// context of each turn after the first is asked of it: it may keep the slot's context, switch
/// it for this and later turns, or give the whole prompt of this turn (the row then records
/// that prompt, the answer's `extra` entries, and `extra.prompt_override = true`; the kernel's
/// keys win over the plugin's of the same name).
///
/// A hook's whole prompt that leaves no room for `max_new_tokens` in the context window fails
/// that episode only ([`FailureKind::ContextOverflow`], like an environment fault: the turns
/// it played go to [`Rollouts::failed_rows`]); the reason names the trajectory, the task, the
/// turn, the prompt's length and the window, and says that the plugin's context budget is too
/// large.
///
/// # Errors
/// A prompt the kernel built (the variant's injection and the observation) that does not fit
/// the context window, a failed generation or hook call, or a response the prompt builder
/// cannot decode: these stop the whole call. Environment faults do not (see the module docs),
/// nor does an external engine's [`crate::Error::Engine`]: the turn's episodes fail with kind
/// [`FailureKind::Engine`].
pub fn play(
    env: &Arc<dyn Environment>,
    builder: &dyn PromptBuilder,
    specs: &[EpisodeSpec],
    params: &PlayParams,
    generate: &mut GenerateFn<'_>,
    hook: Option<&mut TurnHook<'_>>,
) -> Result<Rollouts> {
    let mut generate = |prompts: &[Vec<u32>], sampling: &SamplingParams| {
        futures::future::ready(generate(prompts, sampling)).boxed_local()
    };
    // Every generation is ready when asked for, and nothing else in `play_async` waits: it
    // finishes in its first poll.
    play_async(env, builder, specs, params, &mut generate, hook)
        .now_or_never()
        .expect("play_async with ready generations finishes in one poll")
}

/// [`play`], awaiting each turn's generation. The environment's calls and the hook's run
/// synchronously on the calling thread (or, under a deadline, on its worker while it waits):
/// run it where blocking the thread holds up nobody else, as the rollout actor's own arbiter.
///
/// # Errors
/// As [`play`].
pub async fn play_async(
    env: &Arc<dyn Environment>,
    builder: &dyn PromptBuilder,
    specs: &[EpisodeSpec],
    params: &PlayParams,
    generate: &mut AsyncGenerateFn<'_>,
    mut hook: Option<&mut TurnHook<'_>>,
) -> Result<Rollouts> {
    let mut out = Rollouts::default();
    let mut live: Vec<Live> = Vec::with_capacity(specs.len());
    // What the hook sees of the finished turns is kept only for a hook.
    let keep_summaries = hook.is_some();
    for (spec, started) in specs.iter().zip(start_episodes(env, specs, params)) {
        match started {
            Ok((episode, observation)) => {
                live.push(Live {
                    spec: spec.clone(),
                    episode,
                    observation,
                    rows: Vec::new(),
                    reward: 0.0,
                    summaries: Vec::new(),
                });
            }
            Err(fault) => fail(&mut out, spec, Vec::new(), "start", 0, fault),
        }
    }
    let mut turn = 0u32;
    while !live.is_empty() {
        // Per live episode: the `extra` of the hook's whole prompt, when it gave one.
        let mut overridden: Vec<Option<serde_json::Map<String, serde_json::Value>>> =
            vec![None; live.len()];
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
                    TurnContext::Prompt { prompt_ids, extra } => {
                        overridden[i] = Some(extra);
                        prompts.push(prompt_ids);
                        continue;
                    }
                }
            }
            prompts.push(builder.prompt(&l.spec.variant, &l.observation)?);
        }
        if let Some(window) = params.context_window {
            let room = params.sampling.max_new_tokens as usize;
            // A hook's whole prompt that does not fit fails its episode only.
            let fits: Vec<bool> = prompts.iter().map(|p| p.len() + room <= window).collect();
            if fits
                .iter()
                .zip(&overridden)
                .any(|(&fits, o)| !fits && o.is_some())
            {
                let (mut kept_live, mut kept_prompts, mut kept_overridden) =
                    (Vec::new(), Vec::new(), Vec::new());
                for (((l, prompt), o), fits) in live
                    .into_iter()
                    .zip(std::mem::take(&mut prompts))
                    .zip(std::mem::take(&mut overridden))
                    .zip(fits)
                {
                    if fits || o.is_none() {
                        kept_live.push(l);
                        kept_prompts.push(prompt);
                        kept_overridden.push(o);
                        continue;
                    }
                    let fault = Fault {
                        kind: FailureKind::ContextOverflow,
                        message: format!(
                            "the per-turn context hook (the algorithm's next_context) gave a \
                             prompt of {} tokens, and with max_new_tokens = {room} it does not \
                             fit the model's context window of {window} tokens: the plugin's \
                             context budget is too large; keep its prompts within {} tokens",
                            prompt.len(),
                            window.saturating_sub(room)
                        ),
                    };
                    let Live { spec, rows, .. } = l;
                    fail(&mut out, &spec, rows, "next_context", turn, fault);
                }
                (live, prompts, overridden) = (kept_live, kept_prompts, kept_overridden);
                if live.is_empty() {
                    break;
                }
            }
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
        let (generations, version) = match generate(&prompts, &sampling).await {
            Ok(answer) => answer,
            // An external engine that failed on every attempt fails this turn's episodes;
            // the others of the step (and the run) go on.
            Err(crate::Error::Engine { url, message }) => {
                let fault = Fault {
                    kind: FailureKind::Engine,
                    message: format!("rollout engine {url}: {message}"),
                };
                for l in live {
                    let Live { spec, rows, .. } = l;
                    fail(&mut out, &spec, rows, "generate", turn, fault.clone());
                }
                break;
            }
            Err(e) => return Err(e),
        };
        if generations.len() != prompts.len() {
            return Err(crate::Error::Model(format!(
                "generate returned {} responses for {} prompts",
                generations.len(),
                prompts.len()
            )));
        }
        // Every episode's action first, then the environment's steps in one hand-off.
        let mut actions = Vec::with_capacity(live.len());
        for generation in &generations {
            out.sampled_tokens += generation.ids.len();
            actions.push(builder.action(&generation.ids)?);
        }
        let mut played = Vec::with_capacity(live.len());
        let mut steps = Vec::with_capacity(live.len());
        for (l, action) in live.into_iter().zip(&actions) {
            let Live {
                spec,
                episode,
                observation,
                rows,
                reward,
                summaries,
            } = l;
            steps.push((episode, action.clone()));
            played.push((spec, observation, rows, reward, summaries));
        }
        let stepped = step_episodes(steps, params);
        let mut still_live = Vec::with_capacity(played.len());
        for ((((played, stepped), action), prompt_ids), (generation, overridden)) in played
            .into_iter()
            .zip(stepped)
            .zip(actions)
            .zip(prompts)
            .zip(generations.into_iter().zip(overridden))
        {
            let (spec, mut observation, mut rows, mut reward, mut summaries) = played;
            let (episode, outcome, fault) = match stepped {
                Ok((episode, outcome)) => (Some(episode), outcome, None),
                // The turn was played by the policy: under `zero_reward` it trains too.
                Err(fault) => (None, StepOutcome::default(), Some(fault)),
            };
            let mut info: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&outcome.info_json).unwrap_or_default();
            if keep_summaries {
                summaries.push(TurnSummary {
                    observation: observation.text.clone(),
                    action: action.clone(),
                    reward: outcome.reward,
                    feedback: outcome.feedback,
                    tool_calls: outcome.tool_calls,
                });
            }
            info.insert("action".into(), serde_json::Value::String(action));
            let mut extra = serde_json::Map::new();
            if let Some(plugin_extra) = overridden {
                extra = plugin_extra;
                extra.insert("prompt_override".into(), serde_json::Value::Bool(true));
            }
            // The tool schemas the observation offered (the prompt shows them when the slot's
            // tools are on), so `RenderRequest::for_row` renders this turn's prompt exactly.
            if !observation.tools.is_empty() {
                extra.insert(
                    "tools".into(),
                    serde_json::Value::Array(std::mem::take(&mut observation.tools)),
                );
            }
            reward += outcome.reward;
            rows.push(TurnRow {
                group_id: spec.group_id,
                trajectory_id: spec.trajectory_id,
                turn,
                task_id: spec.task_id.clone(),
                policy_version: version,
                variant: spec.variant.clone(),
                prompt_ids,
                response_mask: vec![1; generation.ids.len()],
                response_ids: generation.ids,
                response_logprobs: generation.logprobs,
                finish_reason: generation.finish_reason,
                turn_reward: outcome.reward,
                episode_reward: 0.0,
                success: outcome.success,
                last_turn: false,
                anchor: observation.anchor.take(),
                observation: std::mem::take(&mut observation.text),
                feedback: outcome.feedback,
                tool_calls: outcome.tool_calls,
                info,
                extra,
                ..TurnRow::default()
            });
            let (Some(episode), None) = (episode, fault.as_ref()) else {
                let fault = fault.expect("a step without an episode has a fault");
                fail(&mut out, &spec, rows, "step", turn, fault);
                continue;
            };
            let l = Live {
                spec,
                episode,
                observation: outcome.observation,
                rows,
                reward,
                summaries,
            };
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

/// Records a failed episode: the reason names the call, the task and the turn; the played
/// `rows` go to [`Rollouts::failed_rows`] with reward 0.
fn fail(
    out: &mut Rollouts,
    spec: &EpisodeSpec,
    mut rows: Vec<TurnRow>,
    call: &str,
    turn: u32,
    fault: Fault,
) {
    let reason = format!(
        "{call} of task {} (trajectory {}, turn {turn}): {}",
        spec.task_id, spec.trajectory_id, fault.message
    );
    tracing::warn!(kind = fault.kind.as_str(), %reason, "episode failed");
    let n = rows.len();
    for (i, row) in rows.iter_mut().enumerate() {
        row.turn_reward = 0.0;
        row.episode_reward = 0.0;
        row.success = false;
        row.last_turn = i + 1 == n;
        row.extra.insert(
            "failed".into(),
            serde_json::Value::String(fault.kind.as_str().into()),
        );
    }
    out.failed_rows.append(&mut rows);
    out.failed.push(FailedEpisode {
        trajectory_id: spec.trajectory_id,
        group_id: spec.group_id,
        task_id: spec.task_id.clone(),
        kind: fault.kind,
        reason,
    });
}

/// A supervised example: prompt ids and the response ids to imitate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demonstration {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

/// The entry text for a successful trajectory with these actions, by turn:
/// `solved in {n} turns: {a_0}; {a_1}; …`. The warm start's hinted demonstrations inject it, and the `template`
/// reflector writes it, so a small policy learns the format of the entries it will be shown.
pub fn solved_text(actions: &[&str]) -> String {
    format!("solved in {} turns: {}", actions.len(), actions.join("; "))
}

/// Plays the environment's expert on `tasks` and returns one example per expert turn, framed
/// exactly as the policy will see it. Episodes whose expert fails within `max_turns` are
/// counted in the second return value, and skipped unless `keep_unsolved`.
///
/// A `hinted_share` of the solved episodes (spread evenly: episode `k` is hinted when
/// `⌊(k+1)·share⌋ > ⌊k·share⌋`) is framed with a context variant (label `demo-hint`) whose
/// injected text is that episode's own solution in the skill creator's template form
/// ([`solved_text`]): the demonstration then teaches how an injected
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
                inject: solved_text(&actions),
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

/// Text for training a tokenizer on an environment: goals, observations, their tool schemas,
/// admissible actions and expert actions of `episodes` expert episodes on training tasks (never
/// held-out tasks).
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
            // The tool schemas a tools-on prompt shows (`Tools: [...]`), so their words are
            // in the vocabulary too.
            if !observation.tools.is_empty() {
                lines.push(serde_json::Value::from(observation.tools).to_string());
            }
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

#[cfg(test)]
mod fault_tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use cairn_plugin_sdk::{
        ContextVariant, Environment, EnvironmentInfo, Episode, FinishReason, Observation,
        PluginError, Split, StepOutcome, TaskInfo, TaskRef,
    };

    use super::*;
    use crate::backend::{Generation, SamplingParams};
    use crate::rollout::prompt::{tests::WordCodec, PlainPrompt};

    #[derive(Clone, Copy, PartialEq)]
    enum Fault {
        Error,
        Panic,
        Hang,
    }

    /// Three-turn episodes (reward 1 per turn, success at the end); task `task` fails at
    /// `turn` (`None`: at start) the given way. A hang lasts until `release` is set.
    struct Faulty {
        faults: Vec<(u64, Option<u32>, Fault)>,
        release: Arc<AtomicBool>,
    }

    struct FaultyEpisode {
        task: u64,
        turn: u32,
        fault: Option<(u32, Fault)>,
        release: Arc<AtomicBool>,
    }

    fn trip(fault: Fault, release: &AtomicBool) -> cairn_plugin_sdk::Result<()> {
        match fault {
            Fault::Error => Err(PluginError::internal("injected error")),
            Fault::Panic => panic!("injected panic"),
            Fault::Hang => {
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            }
        }
    }

    impl Environment for Faulty {
        fn info(&self) -> EnvironmentInfo {
            EnvironmentInfo {
                train_tasks: 8,
                test_tasks: 1,
                max_turns: 3,
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
            let mine = self.faults.iter().find(|f| f.0 == task.index);
            if let Some(&(_, None, fault)) = mine {
                trip(fault, &self.release)?;
            }
            Ok(Box::new(FaultyEpisode {
                task: task.index,
                turn: 0,
                fault: mine.and_then(|&(_, turn, fault)| turn.map(|t| (t, fault))),
                release: self.release.clone(),
            }))
        }
    }

    impl Episode for FaultyEpisode {
        fn observation(&self) -> Observation {
            Observation {
                text: format!("room {} turn {}", self.task, self.turn),
                ..Default::default()
            }
        }
        fn step(&mut self, _: &str) -> cairn_plugin_sdk::Result<StepOutcome> {
            if let Some((turn, fault)) = self.fault {
                if turn == self.turn {
                    trip(fault, &self.release)?;
                }
            }
            self.turn += 1;
            Ok(StepOutcome {
                reward: 1.0,
                done: self.turn == 3,
                success: self.turn == 3,
                info_json: "{}".into(),
                ..Default::default()
            })
        }
        fn expert_action(&self) -> Option<String> {
            None
        }
    }

    fn spec(group: u64, slot: u64, task: u64) -> EpisodeSpec {
        EpisodeSpec {
            group_id: group,
            trajectory_id: group * 2 + slot,
            task: TaskRef {
                split: Split::Train,
                index: task,
            },
            task_id: format!("t{task}"),
            seed: slot,
            variant: ContextVariant::default(),
        }
    }

    fn builder() -> PlainPrompt<WordCodec> {
        PlainPrompt {
            codec: WordCodec::default(),
            separator: vec![1],
            stop_ids: vec![2],
        }
    }

    /// Three turns of two-token answers, step 0, no context window; `env_timeout` as given.
    fn params(env_timeout: Option<Duration>) -> PlayParams {
        PlayParams {
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                max_new_tokens: 2,
                stop_ids: vec![2],
                seed: 0,
            },
            max_turns: 3,
            step: 0,
            context_window: None,
            env_timeout,
            env_name: "faulty-test".into(),
        }
    }

    fn run(faults: Vec<(u64, Option<u32>, Fault)>, specs: &[EpisodeSpec]) -> Rollouts {
        let release = Arc::new(AtomicBool::new(false));
        let env: Arc<dyn Environment> = Arc::new(Faulty {
            faults,
            release: release.clone(),
        });
        let (builder, params) = (builder(), params(Some(Duration::from_millis(100))));
        let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
            let one = Generation {
                ids: vec![10, 2],
                logprobs: vec![-0.5, -0.1],
                finish_reason: FinishReason::Stop,
            };
            Ok((vec![one; prompts.len()], 0))
        };
        let out = play(&env, &builder, specs, &params, &mut generate, None).expect("plays");
        release.store(true, Ordering::SeqCst);
        out
    }

    /// Groups 0–3 of two slots; task 1 errors at its second step, task 2 panics at start,
    /// task 3 hangs at its first step. Group 0 is clean.
    fn faulty_run() -> Rollouts {
        let specs: Vec<EpisodeSpec> = (0..4)
            .flat_map(|g| [spec(g, 0, g), spec(g, 1, if g == 0 { 0 } else { 7 })])
            .collect();
        run(
            vec![
                (1, Some(1), Fault::Error),
                (2, None, Fault::Panic),
                (3, Some(0), Fault::Hang),
            ],
            &specs,
        )
    }

    #[test]
    fn an_environment_error_panic_or_hang_fails_that_episode_only() {
        let out = faulty_run();
        let mut failed: Vec<(u64, FailureKind)> = out
            .failed
            .iter()
            .map(|f| (f.trajectory_id, f.kind))
            .collect();
        failed.sort_by_key(|f| f.0);
        assert_eq!(
            failed,
            vec![
                (2, FailureKind::Error),
                (4, FailureKind::Panic),
                (6, FailureKind::Timeout)
            ]
        );
        let reason = |id: u64| {
            out.failed
                .iter()
                .find(|f| f.trajectory_id == id)
                .map(|f| f.reason.clone())
                .unwrap()
        };
        assert!(
            reason(2).starts_with("step of task t1 (trajectory 2, turn 1): "),
            "{}",
            reason(2)
        );
        assert!(reason(2).contains("injected error"), "{}", reason(2));
        assert!(
            reason(4).starts_with("start of task t2 (trajectory 4, turn 0)"),
            "{}",
            reason(4)
        );
        assert!(reason(4).contains("injected panic"), "{}", reason(4));
        assert!(
            reason(6).contains("environment `faulty-test` gave no reply within 0.1 s"),
            "{}",
            reason(6)
        );
        // The five clean episodes played all three turns.
        assert_eq!(out.trajectories.len(), 5);
        assert!(out.trajectories.iter().all(|t| t.turns == 3 && t.success));
        assert_eq!(out.rows.len(), 15);
        // The failed episodes' played turns, in the order they failed: one of trajectory 6
        // (its first step hung), two of trajectory 2 (the failing one included), none of 4
        // (it never started).
        let failed_rows: Vec<(u64, u32, bool)> = out
            .failed_rows
            .iter()
            .map(|r| (r.trajectory_id, r.turn, r.last_turn))
            .collect();
        assert_eq!(failed_rows, vec![(6, 0, true), (2, 0, false), (2, 1, true)]);
        for r in &out.failed_rows {
            assert_eq!(
                (r.turn_reward, r.episode_reward, r.success),
                (0.0, 0.0, false)
            );
            assert!(r.extra.contains_key("failed"));
        }
        assert_eq!(out.failed_rows[0].extra["failed"], "timeout");
        assert_eq!(out.failed_rows[2].extra["failed"], "error");
    }

    #[test]
    fn drop_group_leaves_out_each_group_with_a_failure() {
        let mut out = faulty_run();
        assert_eq!(apply_failure_rule(&mut out, FailureRule::DropGroup), 3);
        let groups: std::collections::BTreeSet<u64> = out.rows.iter().map(|r| r.group_id).collect();
        assert_eq!(groups.into_iter().collect::<Vec<_>>(), vec![0]);
        assert_eq!(out.rows.len(), 6);
        assert!(out.trajectories.iter().all(|t| t.group_id == 0));
        assert!(out.failed_rows.is_empty());
        // Every turn the dropped groups played (the failed trajectories' own included) is kept
        // aside for the data pool, untrained.
        assert_eq!(out.dropped_rows.len(), 15 - 6 + 3);
        assert!(out.dropped_rows.iter().all(|r| r.group_id != 0));
        assert_eq!(out.failed.len(), 3, "failures stay reported");
    }

    #[test]
    fn zero_reward_keeps_the_failed_members_with_reward_zero() {
        let mut out = faulty_run();
        assert_eq!(apply_failure_rule(&mut out, FailureRule::ZeroReward), 0);
        assert_eq!(out.rows.len(), 15 + 3);
        assert!(out.failed_rows.is_empty());
        assert!(out.dropped_rows.is_empty());
        // Group 1: a clean member with reward 3 and the failed one with reward 0, as GRPO sees
        // them (one episode reward per trajectory).
        let mut group1: Vec<(u64, f32, bool)> = out
            .rows
            .iter()
            .filter(|r| r.group_id == 1 && r.last_turn)
            .map(|r| (r.trajectory_id, r.episode_reward, r.success))
            .collect();
        group1.sort_by_key(|g| g.0);
        assert_eq!(group1, vec![(2, 0.0, false), (3, 3.0, true)]);
        // Group 2's failed member never started: the group has its clean member only.
        assert_eq!(out.rows.iter().filter(|r| r.group_id == 2).count(), 3);
    }

    /// `play_async` suspends at each turn's generation until its answer comes, and plays
    /// exactly what `play` plays with the same answers given at once.
    #[test]
    fn play_async_awaits_each_generation_and_plays_as_play_does() {
        let env: Arc<dyn Environment> = Arc::new(Faulty {
            faults: vec![(1, Some(1), Fault::Error)],
            release: Arc::new(AtomicBool::new(true)),
        });
        let (builder, params) = (builder(), params(None));
        let specs = [spec(0, 0, 0), spec(0, 1, 1)];
        // The answer of turn k: one id per prompt, k + 10, at version k.
        let answer = |prompts: usize, turn: u64| {
            let one = Generation {
                ids: vec![10 + turn as u32, 2],
                logprobs: vec![-0.5, -0.1],
                finish_reason: FinishReason::Stop,
            };
            Ok((vec![one; prompts], turn))
        };
        let mut turn = 0;
        let mut now = |prompts: &[Vec<u32>], _: &SamplingParams| {
            turn += 1;
            answer(prompts.len(), turn)
        };
        let played = play(&env, &builder, &specs, &params, &mut now, None).expect("plays");

        let (mut turn, waits) = (0, std::cell::Cell::new(0));
        let mut later = |prompts: &[Vec<u32>], _: &SamplingParams| {
            turn += 1;
            let (n, k, waits) = (prompts.len(), turn, &waits);
            // Pending on the first poll (waking itself), the answer on the next.
            let mut asked = false;
            let pending = futures::future::poll_fn(move |cx| {
                if std::mem::replace(&mut asked, true) {
                    std::task::Poll::Ready(())
                } else {
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
            });
            waits.set(waits.get() + 1);
            async move {
                pending.await;
                answer(n, k)
            }
            .boxed_local()
        };
        let mut run = Box::pin(play_async(
            &env, &builder, &specs, &params, &mut later, None,
        ));
        assert!(
            (&mut run).now_or_never().is_none(),
            "it waits for the first generation"
        );
        let awaited = futures::executor::block_on(run).expect("plays");
        assert_eq!(waits.get(), 3, "one generation per turn");
        assert_eq!(awaited.rows, played.rows);
        assert_eq!(awaited.failed_rows, played.failed_rows);
        assert_eq!(awaited.failed, played.failed);
        assert_eq!(
            awaited
                .rows
                .iter()
                .map(|r| r.policy_version)
                .collect::<Vec<_>>(),
            vec![1, 2, 3],
            "each row carries its own turn's version"
        );
    }

    #[test]
    fn without_a_deadline_errors_and_panics_still_fail_the_episode() {
        let release = Arc::new(AtomicBool::new(true));
        let env: Arc<dyn Environment> = Arc::new(Faulty {
            faults: vec![(1, Some(0), Fault::Panic), (2, Some(2), Fault::Error)],
            release,
        });
        let (builder, params) = (builder(), params(None));
        let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
            let one = Generation {
                ids: vec![10, 2],
                logprobs: vec![-0.5, -0.1],
                finish_reason: FinishReason::Stop,
            };
            Ok((vec![one; prompts.len()], 0))
        };
        let specs = [spec(0, 0, 0), spec(0, 1, 1), spec(1, 0, 2)];
        let out = play(&env, &builder, &specs, &params, &mut generate, None).expect("plays");
        let kinds: Vec<FailureKind> = out.failed.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![FailureKind::Panic, FailureKind::Error]);
        assert_eq!(out.trajectories.len(), 1);
    }

    #[test]
    fn an_error_inside_the_observation_fails_the_episode() {
        let observation = Observation {
            text: format!(
                "{}plugin `x`: panicked: boom]",
                cairn_plugin_sdk::host::foreign::OBSERVATION_ERROR_PREFIX
            ),
            ..Default::default()
        };
        let f = super::Fault::in_observation(&observation).expect("a fault");
        assert_eq!(f.kind, FailureKind::Panic);
        assert_eq!(f.message, "plugin `x`: panicked: boom");
        assert!(super::Fault::in_observation(&Observation::default()).is_none());
    }

    /// Plays three-turn episodes of `specs` (no environment fault) with `hook` and a context
    /// window of 40 tokens (`max_new_tokens` 2).
    fn run_with_hook(specs: &[EpisodeSpec], hook: &mut TurnHook<'_>) -> Result<Rollouts> {
        let env: Arc<dyn Environment> = Arc::new(Faulty {
            faults: vec![],
            release: Arc::new(AtomicBool::new(true)),
        });
        let builder = builder();
        let params = PlayParams {
            step: 4,
            context_window: Some(40),
            ..params(None)
        };
        let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
            let one = Generation {
                ids: vec![10, 2],
                logprobs: vec![-0.5, -0.1],
                finish_reason: FinishReason::Stop,
            };
            Ok((vec![one; prompts.len()], 0))
        };
        play(&env, &builder, specs, &params, &mut generate, Some(hook))
    }

    #[test]
    fn a_hooks_prompt_records_its_extra_on_the_turns_row() {
        let specs = [spec(0, 0, 0), spec(0, 1, 1)];
        let mut hook = |r: &TurnContextRequest| {
            Ok(if r.trajectory_id == 0 && r.turn == 1 {
                let mut extra = serde_json::Map::new();
                extra.insert("echo_records".into(), serde_json::json!([3, 1]));
                // The kernel's key wins over a plugin's of the same name.
                extra.insert("prompt_override".into(), serde_json::json!("mine"));
                TurnContext::Prompt {
                    prompt_ids: vec![7, 8, 9],
                    extra,
                }
            } else {
                TurnContext::Keep
            })
        };
        let out = run_with_hook(&specs, &mut hook).unwrap();
        assert!(out.failed.is_empty());
        assert_eq!(out.rows.len(), 6);
        let row = |traj: u64, turn: u32| {
            out.rows
                .iter()
                .find(|r| r.trajectory_id == traj && r.turn == turn)
                .unwrap()
        };
        let overridden = row(0, 1);
        assert_eq!(overridden.prompt_ids, vec![7, 8, 9]);
        assert_eq!(
            serde_json::Value::Object(overridden.extra.clone()),
            serde_json::json!({"echo_records": [3, 1], "prompt_override": true})
        );
        // Other turns record nothing.
        for (traj, turn) in [(0, 0), (0, 2), (1, 1)] {
            assert!(row(traj, turn).extra.is_empty(), "{traj} {turn}");
        }
    }

    #[test]
    fn a_hooks_prompt_beyond_the_context_window_fails_that_episode_only() {
        // Trajectory 1's hook prompt at turn 2 is 39 tokens: with max_new_tokens = 2 it needs
        // 41 of the 40-token window. Trajectory 0 plays on.
        let specs = [spec(0, 0, 0), spec(0, 1, 1)];
        let mut hook = |r: &TurnContextRequest| {
            Ok(if r.trajectory_id == 1 && r.turn == 2 {
                TurnContext::Prompt {
                    prompt_ids: vec![5; 39],
                    extra: Default::default(),
                }
            } else {
                TurnContext::Keep
            })
        };
        let out = run_with_hook(&specs, &mut hook).unwrap();
        assert_eq!(out.trajectories.len(), 1);
        assert_eq!(out.trajectories[0].trajectory_id, 0);
        assert_eq!(out.rows.len(), 3);
        assert_eq!(out.failed.len(), 1);
        let f = &out.failed[0];
        assert_eq!(
            (f.trajectory_id, f.group_id, f.kind),
            (1, 0, FailureKind::ContextOverflow)
        );
        assert_eq!(
            f.reason,
            "next_context of task t1 (trajectory 1, turn 2): the per-turn context hook (the \
             algorithm's next_context) gave a prompt of 39 tokens, and with max_new_tokens = 2 \
             it does not fit the model's context window of 40 tokens: the plugin's context \
             budget is too large; keep its prompts within 38 tokens"
        );
        // The two turns it played are kept as failed rows, marked with the kind.
        assert_eq!(out.failed_rows.len(), 2);
        assert!(out
            .failed_rows
            .iter()
            .all(|r| r.trajectory_id == 1 && r.extra["failed"] == "context_overflow"));
        assert_eq!(FailureKind::ContextOverflow.as_str(), "context_overflow");
        // A prompt of exactly window − max_new_tokens fits.
        let mut fits = |r: &TurnContextRequest| {
            Ok(if r.turn == 1 {
                TurnContext::Prompt {
                    prompt_ids: vec![5; 38],
                    extra: Default::default(),
                }
            } else {
                TurnContext::Keep
            })
        };
        let out = run_with_hook(&specs, &mut fits).unwrap();
        assert!(out.failed.is_empty());
        assert_eq!(out.rows.len(), 6);
        // Every episode failing this way ends the call normally.
        let mut all = |_: &TurnContextRequest| {
            Ok(TurnContext::Prompt {
                prompt_ids: vec![5; 40],
                extra: Default::default(),
            })
        };
        let out = run_with_hook(&specs, &mut all).unwrap();
        assert_eq!((out.failed.len(), out.failed_rows.len()), (2, 2));
        assert!(out.rows.is_empty());
    }

    #[test]
    fn a_kernel_built_prompt_beyond_the_context_window_is_still_an_error() {
        let mut long = spec(0, 0, 0);
        long.variant.inject = vec!["word"; 60].join(" ");
        let mut keep = |_: &TurnContextRequest| Ok(TurnContext::Keep);
        let e = run_with_hook(&[long], &mut keep).unwrap_err().to_string();
        assert!(
            e.contains(
                "does not fit the model's context window of 40 tokens; shorten what the \
                        variant injects"
            ),
            "{e}"
        );
    }
}
