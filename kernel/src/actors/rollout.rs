//! The rollout actor: samples tasks, asks the algorithm to plan each group's context variants,
//! and plays B × G episodes against the environment plugin with batched generation through the
//! policy actor. Also plays held-out evaluations and collects expert demonstrations.
//!
//! In an RL run one rollout actor is the **producer**: for each [`Produce`] the trainer sends
//! it plays that step's groups and forwards them to the reward actor ([`Played`]; the step's
//! path is in [`super::flow`]). A second rollout actor serves evaluations, demonstrations and
//! the optimizer's resample rounds meanwhile.
//!
//! **Threads.** Each rollout actor is an async actor on an arbiter of its own ([`super::start`]).
//! Its requests are actor futures that hold the mailbox until they finish (`ctx.wait`,
//! [`AtomicResponse`]), so it plays one request at a time, in arrival order, and the
//! producer's steps stay in order. Each turn's generation (to the policy actor, or the engine
//! actor) and the policy-version reads are awaited. The environment's calls and the
//! algorithm's `plan_group` and `next_context` are synchronous: they block the actor's own
//! thread only, under deadlines ([`crate::deadline`]): an episode whose environment errs,
//! panics or hangs fails alone and its group follows [`RolloutSettings::on_failure`]; a hung
//! algorithm call stops the run (docs/faults.md). A plugin's host calls in those hooks block
//! their thread ([`super::host`]), never an arbiter the answering actor needs.
//!
//! The actor owns no libtorch state (the backend is the policy actor's, reached by
//! messages), so the host need not wait for its thread before exiting, and it is not counted
//! in [`super::threads::SyncThreads`]; its arbiter stops with the actor ([`RolloutActor::arbiter`])
//! or with the actix system.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use cairn_plugin_sdk::{Algorithm, Environment, GroupRequest, Split, TaskRef};
use futures::future::{FutureExt, LocalBoxFuture};
use parking_lot::Mutex;
use rand::{seq::index::sample, SeedableRng};

use crate::actors::flow::{Played, Produce};
use crate::actors::hooks::Hooks;
use crate::actors::host::HostLinks;
use crate::actors::policy::{Generate, PolicyVersion};
use crate::backend::SamplingParams;
use crate::deadline::{plugin_call, Site};
use crate::error::{Error, Result};
use crate::rollout::prompt::PromptBuilder;
use crate::rollout::{
    apply_failure_rule, demonstrations, mix, play_async, Demonstration, EpisodeSpec, FailedEpisode,
    FailureRule, GenerateAnswer, PlayParams, Rollouts,
};

/// Settings the rollout actor needs from the pipeline config (built by
/// `RolloutSettings::from_config` in `config.rs`, so this module does not import the config).
#[derive(Clone, Debug)]
pub struct RolloutSettings {
    pub seed: u64,
    pub tasks_per_step: usize,
    pub group_size: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub max_new_tokens: u32,
    pub max_turns: u32,
    /// The model's context window in tokens (the host reads it from the model); prompts that
    /// do not fit with `max_new_tokens` are refused. `None`: not checked.
    pub context_window: Option<usize>,
    /// Deadline of each environment call of an episode (`rollout.env_timeout_s`; `None`: 0,
    /// no deadline): a miss fails the episode.
    pub env_timeout: Option<std::time::Duration>,
    /// Deadline of each algorithm call and of the environment's `task` (`run.plugin_timeout_s`;
    /// `None`: 0, no deadline): a miss stops the run with [`Error::PluginHang`].
    pub plugin_timeout: Option<std::time::Duration>,
    /// The environment plugin's name (`environment.plugin`), for failure reasons.
    pub env_name: String,
    /// What becomes of a group with a failed episode (`rollout.on_episode_failure`).
    pub on_failure: FailureRule,
}

/// Cheap to clone (shared plugins, recipients, settings): each request's future owns a clone.
#[derive(Clone)]
pub struct RolloutActor {
    pub env: Arc<dyn Environment>,
    pub builder: Arc<dyn PromptBuilder>,
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub policy: Recipient<Generate>,
    /// The services plugins reach from `plan_group` and `next_context`.
    pub links: HostLinks,
    /// Whether the algorithm asked for the per-turn context hook.
    pub turn_context: bool,
    /// Where the producer's steps go next: the reward actor (`None` for the rollout actor
    /// that serves evaluations, demonstrations and resample rounds).
    pub forward: Option<Recipient<Played>>,
    pub settings: RolloutSettings,
    /// Task counts and turn limit reported by the environment.
    pub train_tasks: u64,
    pub test_tasks: u64,
    pub env_max_turns: u32,
    /// The arbiter the actor runs on alone, stopped when the actor stops (its addresses are
    /// all dropped); `None` where it shares one.
    pub arbiter: Option<ArbiterHandle>,
}

impl Actor for RolloutActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(arbiter) = self.arbiter.take() {
            arbiter.stop();
        }
    }
}

impl RolloutActor {
    fn max_turns(&self) -> u32 {
        if self.env_max_turns == 0 {
            self.settings.max_turns
        } else {
            self.settings.max_turns.min(self.env_max_turns)
        }
    }

    /// Plays `specs`. With a `step` (training), the algorithm's per-turn context hook runs
    /// when it asked for it, with the host's policy version `version`: the policy does not
    /// change while a step plays (the optimizer updates only once the step has arrived,
    /// [`super::flow`]). Evaluations (no step) play the plain policy.
    async fn play_specs(
        &self,
        specs: &[EpisodeSpec],
        temperature: f32,
        seed: u64,
        step: Option<(u64, u64)>,
    ) -> Result<Rollouts> {
        let params = PlayParams {
            sampling: SamplingParams {
                temperature,
                top_p: self.settings.top_p,
                max_new_tokens: self.settings.max_new_tokens,
                stop_ids: self.builder.stop_ids().to_vec(),
                seed,
            },
            max_turns: self.max_turns(),
            step: step.map_or(0, |(step, _)| step),
            context_window: self.settings.context_window,
            env_timeout: self.settings.env_timeout,
            env_name: self.settings.env_name.clone(),
        };
        let policy = self.policy.clone();
        let mut generate =
            |prompts: &[Vec<u32>], p: &SamplingParams| -> LocalBoxFuture<'static, GenerateAnswer> {
                let answer = policy.send(Generate {
                    prompts: prompts.to_vec(),
                    params: p.clone(),
                });
                async move {
                    let out = answer.await??;
                    Ok((out.generations, out.policy_version))
                }
                .boxed_local()
            };
        let version = step.map_or(0, |(_, version)| version);
        let hooks = self.hooks();
        let hook_metrics = std::cell::RefCell::new(Vec::new());
        let mut hook = |request: &cairn_plugin_sdk::TurnContextRequest| {
            let owned = request.clone();
            let (answer, metrics) = hooks.call_plain(
                "next_context",
                request.step,
                version,
                || {
                    format!(
                        "step {}, task {}, trajectory {}, turn {}",
                        request.step, request.task_id, request.trajectory_id, request.turn
                    )
                },
                move |algorithm, host| algorithm.next_context(&owned, host),
            )?;
            hook_metrics.borrow_mut().extend(metrics);
            Ok(answer?)
        };
        let hook: Option<&mut crate::rollout::TurnHook<'_>> = match step {
            Some(_) if self.turn_context => Some(&mut hook),
            _ => None,
        };
        let mut out = play_async(
            &self.env,
            self.builder.as_ref(),
            specs,
            &params,
            &mut generate,
            hook,
        )
        .await?;
        out.metrics.extend(hook_metrics.into_inner());
        Ok(out)
    }

    /// The algorithm's hooks on this actor's side (`plan_group`, `next_context`).
    fn hooks(&self) -> Hooks {
        Hooks {
            algorithm: self.algorithm.clone(),
            links: self.links.clone(),
            timeout: self.settings.plugin_timeout,
            actor: "rollout",
        }
    }

    /// The environment's `task`, under the plugin deadline.
    fn task_info(&self, task: TaskRef) -> Result<cairn_plugin_sdk::TaskInfo> {
        let plugin = format!("environment `{}`", self.settings.env_name);
        let site = Site {
            actor: "rollout",
            plugin: &plugin,
            call: "task",
            key: "run.plugin_timeout_s",
        };
        let env = self.env.clone();
        let info = plugin_call(
            self.settings.plugin_timeout,
            &site,
            || format!("task {} {}", task.split.as_str(), task.index),
            move || env.task(task),
        )?;
        Ok(info?)
    }

    /// Plays `groups` task groups of a step (see [`CollectGroups`]).
    async fn collect(&self, msg: &CollectGroups) -> Result<Rollouts> {
        let s = &self.settings;
        let step_seed = mix(mix(s.seed, msg.step), u64::from(msg.round));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(step_seed);
        let n = self.train_tasks as usize;
        if n == 0 {
            return Err(Error::Other(
                "the environment reports no training tasks".into(),
            ));
        }
        let picks: Vec<usize> = if msg.groups <= n {
            sample(&mut rng, n, msg.groups).into_vec()
        } else {
            (0..msg.groups).map(|i| i % n).collect()
        };
        // Bank entries a plugin writes while planning carry the version about to sample.
        let version = self.links.version.send(PolicyVersion).await?;
        let mut specs = Vec::with_capacity(msg.groups * s.group_size);
        let mut plan_metrics = Vec::new();
        for (g, index) in picks.into_iter().enumerate() {
            let task = TaskRef {
                split: Split::Train,
                index: index as u64,
            };
            let info = self.task_info(task)?;
            let group_id = msg.first_group_id + g as u64;
            let request = GroupRequest {
                step: msg.step,
                group_id,
                task_id: info.id.clone(),
                task_kind: info.kind,
                task_description: info.goal,
                group_size: s.group_size as u32,
                seed: mix(step_seed, 0x9A7 + g as u64),
            };
            let owned = request.clone();
            let (variants, metrics) = self.hooks().call_plain(
                "plan_group",
                msg.step,
                version,
                || format!("step {}, group {group_id}, task {}", msg.step, info.id),
                move |algorithm, host| algorithm.plan_group(&owned, host),
            )?;
            let variants = variants?;
            plan_metrics.extend(metrics);
            if variants.len() != s.group_size {
                return Err(Error::Other(format!(
                    "the algorithm planned {} slots for group {group_id} of size {}",
                    variants.len(),
                    s.group_size
                )));
            }
            for (slot, variant) in variants.into_iter().enumerate() {
                specs.push(EpisodeSpec {
                    group_id,
                    trajectory_id: group_id * s.group_size as u64 + slot as u64,
                    task,
                    task_id: info.id.clone(),
                    seed: mix(step_seed, (g * s.group_size + slot) as u64),
                    variant,
                });
            }
        }
        let mut out = self
            .play_specs(&specs, s.temperature, step_seed, Some((msg.step, version)))
            .await?;
        out.seeds = specs.iter().map(|e| (e.trajectory_id, e.seed)).collect();
        let dropped = apply_failure_rule(&mut out, s.on_failure);
        out.metrics.splice(0..0, plan_metrics);
        out.metrics
            .push(("episodes/failed_groups_dropped".into(), dropped as f64));
        Ok(out)
    }
}

/// Collect `groups` task groups of G rollouts for an RL step.
#[derive(Message)]
#[rtype(result = "Result<Rollouts>")]
pub struct CollectGroups {
    pub step: u64,
    /// Resample round within the step (0 first); varies the tasks drawn.
    pub round: u32,
    pub groups: usize,
    /// First group id to assign; ids are unique across the run.
    pub first_group_id: u64,
}

impl Handler<CollectGroups> for RolloutActor {
    type Result = AtomicResponse<Self, Result<Rollouts>>;
    fn handle(&mut self, msg: CollectGroups, _: &mut Self::Context) -> Self::Result {
        let this = self.clone();
        AtomicResponse::new(Box::pin(
            async move { this.collect(&msg).await }.into_actor(self),
        ))
    }
}

impl Handler<Produce> for RolloutActor {
    type Result = ();
    fn handle(&mut self, msg: Produce, ctx: &mut Self::Context) {
        let this = self.clone();
        let play = async move {
            let groups = this.settings.tasks_per_step;
            let first_group_id = msg.next_group_id.fetch_add(groups as u64, Ordering::SeqCst);
            let started = Instant::now();
            let rollouts = this
                .collect(&CollectGroups {
                    step: msg.step,
                    round: 0,
                    groups,
                    first_group_id,
                })
                .await;
            let played = Played {
                step: msg.step,
                rollouts,
                rollout_secs: started.elapsed().as_secs_f64(),
            };
            match &this.forward {
                Some(next) => next.do_send(played),
                None => tracing::error!(
                    step = msg.step,
                    "a rollout actor without a next stage was asked to produce a step"
                ),
            }
        };
        // The next request waits until this step is played and forwarded.
        ctx.wait(play.into_actor(self));
    }
}

/// Play the first `tasks` held-out tasks once each.
#[derive(Message)]
#[rtype(result = "Result<EvalReport>")]
pub struct Evaluate {
    pub tasks: usize,
    pub temperature: f32,
    pub seed: u64,
    /// Return the played rows in [`EvalReport::rows`] (with their seeds and failed episodes).
    pub record: bool,
}

/// Held-out success, overall and per task kind.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalReport {
    pub tasks: usize,
    pub successes: usize,
    pub success_rate: f64,
    pub mean_turns: f64,
    /// Episodes cut by an environment fault (counted as failures in `successes`).
    #[serde(default)]
    pub failed: usize,
    /// (task kind, successes, tasks).
    pub per_kind: Vec<(String, usize, usize)>,
    pub seed: u64,
    pub temperature: f32,
    pub policy_version: u64,
    /// The played rows, when the request asked for them.
    #[serde(skip)]
    pub rows: Vec<cairn_plugin_sdk::TurnRow>,
    /// The episodes cut by a fault, when the request asked for the rows.
    #[serde(skip)]
    pub failed_episodes: Vec<FailedEpisode>,
    /// `(trajectory_id, seed)` of every episode played, when the request asked for the rows.
    #[serde(skip)]
    pub seeds: Vec<(u64, u64)>,
}

impl EvalReport {
    /// The report in one line, as `cairn train` and `cairn eval` print it: successes over
    /// tasks, then the episodes an environment fault cut (counted as failures), when any were.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "held-out success {}/{} = {:.1}% (policy version {}, seed {}, temperature {})",
            self.successes,
            self.tasks,
            self.success_rate * 100.0,
            self.policy_version,
            self.seed,
            self.temperature
        );
        if self.failed > 0 {
            line.push_str(&format!(
                "; {} of {} episodes cut by an environment fault, counted as failures (their \
                 reasons are in the data pool: `cairn pool`)",
                self.failed, self.tasks
            ));
        }
        line
    }
}

impl Handler<Evaluate> for RolloutActor {
    type Result = AtomicResponse<Self, Result<EvalReport>>;
    fn handle(&mut self, msg: Evaluate, _: &mut Self::Context) -> Self::Result {
        let this = self.clone();
        AtomicResponse::new(Box::pin(
            async move { this.evaluate(msg).await }.into_actor(self),
        ))
    }
}

impl RolloutActor {
    /// Plays an [`Evaluate`] request.
    async fn evaluate(&self, msg: Evaluate) -> Result<EvalReport> {
        if msg.tasks == 0 || msg.tasks as u64 > self.test_tasks {
            return Err(Error::Other(format!(
                "evaluation of {} held-out tasks asked; the environment has {} (ask for 1 to {})",
                msg.tasks, self.test_tasks, self.test_tasks
            )));
        }
        let n = msg.tasks;
        let mut specs = Vec::with_capacity(n);
        let mut kinds = Vec::with_capacity(n);
        for i in 0..n {
            let task = TaskRef {
                split: Split::Test,
                index: i as u64,
            };
            let info = self.task_info(task)?;
            kinds.push(info.kind);
            specs.push(EpisodeSpec {
                group_id: i as u64,
                trajectory_id: i as u64,
                task,
                task_id: info.id,
                seed: mix(msg.seed, i as u64),
                variant: Default::default(),
            });
        }
        let rollouts = self
            .play_specs(&specs, msg.temperature, msg.seed, None)
            .await?;
        let mut per_kind: Vec<(String, usize, usize)> = Vec::new();
        let mut successes = 0;
        let mut turns = 0u64;
        for t in &rollouts.trajectories {
            let kind = &kinds[t.trajectory_id as usize];
            let entry = match per_kind.iter_mut().find(|(k, _, _)| k == kind) {
                Some(e) => e,
                None => {
                    per_kind.push((kind.clone(), 0, 0));
                    per_kind.last_mut().expect("just pushed")
                }
            };
            entry.2 += 1;
            if t.success {
                entry.1 += 1;
                successes += 1;
            }
            turns += u64::from(t.turns);
        }
        // Failed episodes count as failures: they were attempted.
        for f in &rollouts.failed {
            let kind = &kinds[f.trajectory_id as usize];
            if let Some(e) = per_kind.iter_mut().find(|(k, _, _)| k == kind) {
                e.2 += 1;
            } else {
                per_kind.push((kind.clone(), 0, 1));
            }
        }
        per_kind.sort();
        // The version that played: a row's, or (every episode cut by a fault) the policy's.
        let version = match rollouts.rows.first().or(rollouts.failed_rows.first()) {
            Some(r) => r.policy_version,
            None => self.links.version.send(PolicyVersion).await?,
        };
        Ok(EvalReport {
            tasks: n,
            successes,
            success_rate: if n == 0 {
                0.0
            } else {
                successes as f64 / n as f64
            },
            mean_turns: if rollouts.trajectories.is_empty() {
                0.0
            } else {
                turns as f64 / rollouts.trajectories.len() as f64
            },
            per_kind,
            failed: rollouts.failed.len(),
            seed: msg.seed,
            temperature: msg.temperature,
            policy_version: version,
            failed_episodes: if msg.record {
                rollouts.failed.clone()
            } else {
                Vec::new()
            },
            seeds: if msg.record {
                specs.iter().map(|e| (e.trajectory_id, e.seed)).collect()
            } else {
                Vec::new()
            },
            rows: if msg.record {
                rollouts.rows
            } else {
                Vec::new()
            },
        })
    }
}

/// Expert demonstrations on `episodes` distinct training tasks.
#[derive(Message)]
#[rtype(result = "Result<(Vec<Demonstration>, usize)>")]
pub struct CollectDemonstrations {
    pub episodes: usize,
    pub seed: u64,
    /// `warm_start.hinted_share`.
    pub hinted_share: f64,
    /// `warm_start.keep_unsolved`.
    pub keep_unsolved: bool,
}

/// Synchronous: the environment's expert plays, no other actor is asked. It still runs in
/// arrival order, after any request in flight (those hold the mailbox).
impl Handler<CollectDemonstrations> for RolloutActor {
    type Result = Result<(Vec<Demonstration>, usize)>;
    fn handle(&mut self, msg: CollectDemonstrations, _: &mut Self::Context) -> Self::Result {
        let n = self.train_tasks as usize;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(msg.seed);
        let picks = sample(&mut rng, n, msg.episodes.min(n)).into_vec();
        let tasks: Vec<(TaskRef, u64)> = picks
            .into_iter()
            .map(|i| {
                (
                    TaskRef {
                        split: Split::Train,
                        index: i as u64,
                    },
                    mix(msg.seed, i as u64),
                )
            })
            .collect();
        demonstrations(
            self.env.as_ref(),
            self.builder.as_ref(),
            &tasks,
            self.max_turns(),
            msg.hinted_share,
            msg.keep_unsolved,
        )
    }
}
