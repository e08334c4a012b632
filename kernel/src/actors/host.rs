//! The kernel's [`Host`]: the services a plugin reaches during a call (scoring, generation,
//! prompt rendering, the experience bank, the skill creator, metrics), as messages to the
//! actors that own them.
//!
//! [`HostLinks`] is the set of recipients, built once by [`super::start`] and shared by the
//! rollout and optimizer actors; [`KernelHost`] borrows it for one plugin call, with the step
//! context (step, policy version, the rows a reflection may refer to).
//!
//! The plugin ABI is synchronous, so each service that another actor answers blocks the
//! plugin's thread until the answer comes: the kernel's one blocking wait on an actor
//! ([`ask`]). It is safe because a hook never runs on an arbiter that the answering actor
//! needs (see [`ask`]).

use std::sync::Arc;

use actix::prelude::*;
use cairn_plugin_sdk::{
    BankQuery, GenerateRequest, Generation, Host, NewEntry, PluginError, ReflectionRequest,
    RenderRequest, Retrieved, ScoreRequest, ScoreWeights, Scored, StatsUpdate, TurnRow,
};
use parking_lot::Mutex;

use crate::actors::bank::{PutEntries, QueryBank, UpdateEntries};
use crate::actors::policy::{Generate, PolicyVersion, Score, ScoreTopK};
use crate::actors::skills::Reflect;
use crate::backend::{SamplingParams, Sequence, Weights};
use crate::error::Error;
use crate::rollout::prompt::{PromptBuilder, TextCodec};

/// Recipients of every service a plugin may call.
#[derive(Clone)]
pub struct HostLinks {
    pub score: Recipient<Score>,
    pub score_top_k: Recipient<ScoreTopK>,
    pub generate: Recipient<Generate>,
    pub version: Recipient<PolicyVersion>,
    pub bank_query: Recipient<QueryBank>,
    pub bank_put: Recipient<PutEntries>,
    pub bank_update: Recipient<UpdateEntries>,
    pub reflect: Recipient<Reflect>,
    pub codec: Arc<dyn TextCodec>,
    pub builder: Arc<dyn PromptBuilder>,
    /// The rollout temperature, the default of score requests.
    pub temperature: f32,
    /// Written as the `writer` of bank entries and reflections (the algorithm stack's names).
    pub writer: String,
}

/// The host of one plugin call.
pub struct KernelHost<'a> {
    links: &'a HostLinks,
    step: u64,
    policy_version: u64,
    /// Rows a reflection request may name by trajectory id (the batch of the call).
    rows: &'a [TurnRow],
    metrics: Mutex<Vec<(String, f64)>>,
}

fn host_error(e: Error) -> PluginError {
    PluginError::host(e.to_string())
}

/// Sends `msg` and blocks this thread until the answer comes: the answer of a plugin's
/// synchronous [`Host`] call (the plugin ABI has no futures). This is the kernel's one
/// blocking wait on another actor, and it cannot deadlock: a hook runs on a plugin-call
/// worker thread ([`crate::deadline`]) or, with no deadline, on its calling actor's own
/// arbiter (the rollout and optimizer actors each have one), never on a thread the answering
/// actor needs (the policy and bank actors have `SyncArbiter` threads, the skill creator the
/// system arbiter).
fn ask<M, T>(recipient: &Recipient<M>, msg: M) -> cairn_plugin_sdk::Result<T>
where
    M: Message<Result = crate::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    futures::executor::block_on(recipient.send(msg))
        .map_err(Error::from)
        .and_then(|answer| answer)
        .map_err(host_error)
}

impl<'a> KernelHost<'a> {
    pub fn new(links: &'a HostLinks, step: u64, policy_version: u64, rows: &'a [TurnRow]) -> Self {
        KernelHost {
            links,
            step,
            policy_version,
            rows,
            metrics: Mutex::new(Vec::new()),
        }
    }

    /// The metrics plugins logged through this host.
    pub fn into_metrics(self) -> Vec<(String, f64)> {
        self.metrics.into_inner()
    }
}

impl Host for KernelHost<'_> {
    fn score(&self, requests: &[ScoreRequest]) -> cairn_plugin_sdk::Result<Vec<Scored>> {
        // One backend call per (weights, temperature, top-k) class, results put back in
        // request order.
        let mut out: Vec<Option<Scored>> = vec![None; requests.len()];
        let mut done = vec![false; requests.len()];
        for i in 0..requests.len() {
            if done[i] {
                continue;
            }
            let key = (
                requests[i].weights,
                requests[i].temperature.map(f32::to_bits),
                requests[i].top_k,
            );
            let members: Vec<usize> = (i..requests.len())
                .filter(|&j| {
                    !done[j]
                        && (
                            requests[j].weights,
                            requests[j].temperature.map(f32::to_bits),
                            requests[j].top_k,
                        ) == key
                })
                .collect();
            let sequences: Vec<Sequence> = members
                .iter()
                .map(|&j| Sequence {
                    prompt_ids: requests[j].context_ids.clone(),
                    response_ids: requests[j].response_ids.clone(),
                })
                .collect();
            let weights = match requests[i].weights {
                ScoreWeights::Current => Weights::Current,
                ScoreWeights::Version(v) => Weights::Version(v),
                ScoreWeights::Reference => Weights::Reference,
            };
            let temperature = requests[i].temperature.unwrap_or(self.links.temperature);
            if !(temperature > 0.0 && temperature.is_finite()) {
                return Err(PluginError::input(format!(
                    "score request {i}: temperature {temperature} is not a finite number > 0"
                )));
            }
            let scored: Vec<Scored> = if requests[i].top_k == 0 {
                ask(
                    &self.links.score,
                    Score {
                        sequences,
                        temperature,
                        weights,
                    },
                )?
                .into_iter()
                .map(|logprobs| Scored {
                    logprobs,
                    ..Default::default()
                })
                .collect()
            } else {
                ask(
                    &self.links.score_top_k,
                    ScoreTopK {
                        sequences,
                        temperature,
                        weights,
                        top_k: requests[i].top_k,
                    },
                )?
            };
            if scored.len() != members.len() {
                return Err(PluginError::host(format!(
                    "the backend scored {} of {} sequences",
                    scored.len(),
                    members.len()
                )));
            }
            for (j, s) in members.into_iter().zip(scored) {
                done[j] = true;
                out[j] = Some(s);
            }
        }
        Ok(out
            .into_iter()
            .map(|s| s.expect("every request belongs to one class"))
            .collect())
    }

    fn generate(&self, requests: &[GenerateRequest]) -> cairn_plugin_sdk::Result<Vec<Generation>> {
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let params = SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                max_new_tokens: r.max_new_tokens,
                stop_ids: self.links.builder.stop_ids().to_vec(),
                seed: r.seed,
            };
            let g = ask(
                &self.links.generate,
                Generate {
                    prompts: vec![r.prompt_ids.clone()],
                    params,
                },
            )?;
            out.extend(g.generations.into_iter().map(|g| Generation {
                ids: g.ids,
                logprobs: g.logprobs,
                finish_reason: g.finish_reason,
            }));
        }
        Ok(out)
    }

    fn tokenize(&self, text: &str) -> cairn_plugin_sdk::Result<Vec<u32>> {
        self.links.codec.encode(text).map_err(host_error)
    }

    fn render_prompt(&self, request: &RenderRequest) -> cairn_plugin_sdk::Result<Vec<u32>> {
        self.links
            .builder
            .render(&request.variant, &request.observation, &request.history)
            .map_err(host_error)
    }

    fn bank_query(&self, query: &BankQuery) -> cairn_plugin_sdk::Result<Vec<Retrieved>> {
        ask(&self.links.bank_query, QueryBank(query.clone()))
    }

    fn bank_put(&self, entries: &[NewEntry]) -> cairn_plugin_sdk::Result<Vec<u64>> {
        ask(
            &self.links.bank_put,
            PutEntries {
                entries: entries.to_vec(),
                step: self.step,
                policy_version: self.policy_version,
                writer: self.links.writer.clone(),
            },
        )
    }

    fn bank_update(&self, updates: &[StatsUpdate]) -> cairn_plugin_sdk::Result<()> {
        ask(&self.links.bank_update, UpdateEntries(updates.to_vec()))
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> cairn_plugin_sdk::Result<Vec<u64>> {
        let wanted: std::collections::HashSet<u64> = requests
            .iter()
            .flat_map(|r| r.trajectories.iter().copied())
            .collect();
        let rows: Vec<TurnRow> = self
            .rows
            .iter()
            .filter(|r| wanted.contains(&r.trajectory_id))
            .cloned()
            .collect();
        ask(
            &self.links.reflect,
            Reflect {
                requests: requests.to_vec(),
                rows,
                step: self.step,
                policy_version: self.policy_version,
                writer: self.links.writer.clone(),
            },
        )
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().push((name.to_string(), value));
    }
}
