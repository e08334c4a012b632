//! The rollout actor: samples tasks, asks the algorithm to plan each group's context variants,
//! and plays B × G episodes against the environment plugin with batched generation through the
//! policy actor. Also plays held-out evaluations and collects expert demonstrations.
//!
//! It runs on a `SyncArbiter` thread: each turn it blocks on the policy actor's answer, and
//! environment plugin calls are synchronous anyway.

use std::sync::Arc;

use actix::prelude::*;
use cairn_plugin_sdk::{Algorithm, Environment, GroupRequest, Split, TaskRef};
use parking_lot::Mutex;
use rand::{seq::index::sample, SeedableRng};

use crate::actors::policy::{call, Generate};
use crate::backend::SamplingParams;
use crate::error::{Error, Result};
use crate::rollout::prompt::PromptBuilder;
use crate::rollout::{demonstrations, mix, play, Demonstration, EpisodeSpec, PlayParams, Rollouts};

/// Settings the rollout actor needs from the pipeline config.
#[derive(Clone, Debug)]
pub struct RolloutSettings {
    pub seed: u64,
    pub tasks_per_step: usize,
    pub group_size: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub max_new_tokens: u32,
    pub max_turns: u32,
}

impl RolloutSettings {
    /// The settings of a pipeline config's `[run]` and `[rollout]`.
    pub fn from_config(config: &crate::config::PipelineConfig) -> Self {
        let r = &config.rollout;
        RolloutSettings {
            seed: config.run.seed,
            tasks_per_step: r.tasks_per_step,
            group_size: r.group_size,
            temperature: r.temperature,
            top_p: r.top_p,
            max_new_tokens: r.max_new_tokens,
            max_turns: r.max_turns,
        }
    }
}

pub struct RolloutActor {
    pub env: Arc<dyn Environment>,
    pub builder: Arc<dyn PromptBuilder>,
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub policy: Recipient<Generate>,
    pub settings: RolloutSettings,
    /// Task counts and turn limit reported by the environment.
    pub train_tasks: u64,
    pub test_tasks: u64,
    pub env_max_turns: u32,
}

impl Actor for RolloutActor {
    type Context = SyncContext<Self>;
}

impl RolloutActor {
    fn max_turns(&self) -> u32 {
        if self.env_max_turns == 0 {
            self.settings.max_turns
        } else {
            self.settings.max_turns.min(self.env_max_turns)
        }
    }

    fn play_specs(&self, specs: &[EpisodeSpec], temperature: f32, seed: u64) -> Result<Rollouts> {
        let params = PlayParams {
            sampling: SamplingParams {
                temperature,
                top_p: self.settings.top_p,
                max_new_tokens: self.settings.max_new_tokens,
                stop_ids: self.builder.stop_ids().to_vec(),
                seed,
            },
            max_turns: self.max_turns(),
            policy_version: 0,
        };
        let mut version = None;
        let policy = self.policy.clone();
        let mut generate = |prompts: &[Vec<u32>], p: &SamplingParams| {
            let out = call(
                &policy,
                Generate {
                    prompts: prompts.to_vec(),
                    params: p.clone(),
                },
            )??;
            version.get_or_insert(out.policy_version);
            Ok(out.generations)
        };
        let mut rollouts = play(
            self.env.as_ref(),
            self.builder.as_ref(),
            specs,
            &params,
            &mut generate,
        )?;
        let v = version.unwrap_or(0);
        for row in &mut rollouts.rows {
            row.policy_version = v;
        }
        Ok(rollouts)
    }

    fn task_id(&self, task: TaskRef) -> Result<String> {
        Ok(self.env.task(task)?.id)
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
    type Result = Result<Rollouts>;
    fn handle(&mut self, msg: CollectGroups, _: &mut Self::Context) -> Self::Result {
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
        let mut specs = Vec::with_capacity(msg.groups * s.group_size);
        for (g, index) in picks.into_iter().enumerate() {
            let task = TaskRef {
                split: Split::Train,
                index: index as u64,
            };
            let task_id = self.task_id(task)?;
            let group_id = msg.first_group_id + g as u64;
            let variants = self.algorithm.lock().plan_group(&GroupRequest {
                step: msg.step,
                group_id,
                task_id: task_id.clone(),
                group_size: s.group_size as u32,
            })?;
            for (slot, variant) in variants.into_iter().enumerate() {
                specs.push(EpisodeSpec {
                    group_id,
                    trajectory_id: group_id * s.group_size as u64 + slot as u64,
                    task,
                    task_id: task_id.clone(),
                    seed: mix(step_seed, (g * s.group_size + slot) as u64),
                    variant,
                });
            }
        }
        self.play_specs(&specs, s.temperature, step_seed)
    }
}

/// Play the first `tasks` held-out tasks once each.
#[derive(Message)]
#[rtype(result = "Result<EvalReport>")]
pub struct Evaluate {
    pub tasks: usize,
    pub temperature: f32,
    pub seed: u64,
    /// Return the played rows in [`EvalReport::rows`].
    pub record: bool,
}

/// Held-out success, overall and per task kind.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalReport {
    pub tasks: usize,
    pub successes: usize,
    pub success_rate: f64,
    pub mean_turns: f64,
    /// (task kind, successes, tasks).
    pub per_kind: Vec<(String, usize, usize)>,
    pub seed: u64,
    pub temperature: f32,
    pub policy_version: u64,
    /// The played rows, when the request asked for them.
    #[serde(skip)]
    pub rows: Vec<cairn_plugin_sdk::TurnRow>,
}

impl Handler<Evaluate> for RolloutActor {
    type Result = Result<EvalReport>;
    fn handle(&mut self, msg: Evaluate, _: &mut Self::Context) -> Self::Result {
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
            let info = self.env.task(task)?;
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
        let rollouts = self.play_specs(&specs, msg.temperature, msg.seed)?;
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
        // Aborted episodes count as failures: they were attempted.
        for (id, _, _) in &rollouts.aborted {
            let kind = &kinds[*id as usize];
            if let Some(e) = per_kind.iter_mut().find(|(k, _, _)| k == kind) {
                e.2 += 1;
            } else {
                per_kind.push((kind.clone(), 0, 1));
            }
        }
        per_kind.sort();
        let version = rollouts.rows.first().map(|r| r.policy_version).unwrap_or(0);
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
            seed: msg.seed,
            temperature: msg.temperature,
            policy_version: version,
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
}

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
        )
    }
}
