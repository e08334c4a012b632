//! `opid`: OPID, on-policy hindsight skill distillation (arXiv 2606.26790; following the code
//! of github jinyangwu/OPID; it also covers SEED, whose repository was not available:
//! `docs/algorithms/opid.md`). A [`Role::Auxiliary`] plugin stacked on an advantage estimator,
//! which keeps computing `A^ep + w_step · A^S`; `opid` adds token-level teacher advantages
//! through [`Signals::advantage_add`]:
//!
//! ```toml
//! [algorithm]
//! plugin = "gigpo"                 # or "grpo"
//! config = { omega = 0.0 }         # OPID's w_step = 0
//! [[algorithm.stack]]
//! plugin = "opid"
//! config = { w_ep = 0.001, w_st = 0.001 }
//! ```
//!
//! Each hook does one part of the method:
//! 1. **Hindsight analysis** ([`Algorithm::observe`], [`analysis`]): every completed trajectory
//!    of the step (only the failed ones with `failed_only`) is sent to the skill creator
//!    ([`Host::reflect`]) with OPID's analysis prompt and a JSON reply format
//!    (`{"episode_skill", "step_skills"}`, re-asked up to `retries` times when invalid). Under
//!    `critical = "statistical"` the step skills may only be written for the turns the
//!    statistical selector picked ([`critical`]).
//! 2. **Skills** ([`Algorithm::observe`]): an answered analysis arrives at a later step as a
//!    bank entry (`StepReport::new_entries`; the parsed JSON in `extra.reply`); its episode
//!    skill and its first `K` step skills are filed in the plugin state by task, outcome and
//!    turn key (anchor, or turn index). A failed analysis is counted and gives no skill.
//! 3. **Re-scoring** ([`Algorithm::signals`]): each row whose task has skills is routed
//!    ([`teacher::route`], critical-first or additive) and its sampled response is scored by
//!    the weights that sampled it (`ScoreWeights::Version(row.policy_version)`) under the
//!    row's own context with the skill injected ([`Host::render_prompt`]).
//! 4. **Teacher advantages** ([`teacher`]): `D = (ℓ^skill − ℓ_old) · m`, optionally
//!    normalised and clipped; `advantage_add = w_ep · D^ep + w_st · D^st`.
//! 5. **State** (`save_state` / `load_state`): the skill table and the counters; reflections
//!    pending at a checkpoint are dropped on resume (the kernel does not checkpoint its queue).
//!
//! **The one-step lag (ours).** OPID's trainer waits for the analysis of a batch before its
//! update and scores each trajectory under its *own* hindsight skills. Cairn's skill creator
//! never blocks a step, and `signals` sees only the current batch, so here a row is scored
//! under the skills of *earlier* trajectories of its task (the newest analysis of a trajectory
//! with the same outcome, else the other outcome; step skills of the same anchor state or turn).
//! Rows of a task without an answered analysis get no teacher term.
//!
//! Metrics (in the signals): `opid/rows_episode`, `opid/rows_step`, `opid/rows_rescored_base`,
//! `opid/teacher_token_share`, `opid/d_ep_mean`, `opid/d_st_mean`, `opid/add_abs_mean`; (in
//! `observe`) `opid/reflections_requested`, `opid/reflections_refused`,
//! `opid/reflections_failed`, `opid/analyses_received`, `opid/step_skills_kept`,
//! `opid/step_skills_dropped`, `opid/skills_too_long`, `opid/pending`, `opid/pending_expired`,
//! `opid/skill_scopes`, and `opid/critical_turns` under the statistical selector.

use std::collections::BTreeMap;

use cairn_plugin_sdk::stats::trajectories;
use cairn_plugin_sdk::{
    Algorithm, BankQuery, Batch, ContextVariant, EntryKind, FinishReason, Host, PluginError,
    RenderRequest, Requirements, Result, Role, ScoreRequest, ScoreWeights, Signals, StepReport,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod analysis;
pub mod config;
pub mod critical;
pub mod teacher;

pub use analysis::{Analysis, Skills};
pub use config::{Critical, Normalise, OpidConfig, Reference, Routing, Scope};
pub use teacher::Route;

/// A pending reflection unanswered after this many steps is dropped (counted as
/// `opid/pending_expired`).
pub const MAX_PENDING_STEPS: u64 = 64;
/// Bank entries looked at beyond the step's new ones when collecting answers (other writers'
/// entries may be newer).
const QUERY_SLACK: usize = 64;

/// Cumulative counters, checkpointed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub requested: u64,
    pub refused: u64,
    pub failed: u64,
    pub received: u64,
    pub step_skills_kept: u64,
    pub step_skills_dropped: u64,
    pub too_long: u64,
    pub expired: u64,
}

/// What the plugin keeps across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpidState {
    /// Steps observed.
    pub steps: u64,
    /// Reflection tickets not answered yet, with the step they were asked at.
    pub pending: BTreeMap<u64, u64>,
    /// The skills rows are scored with.
    pub skills: Skills,
    pub counters: Counters,
}

pub struct Opid {
    config: OpidConfig,
    state: OpidState,
}

impl Opid {
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Opid {
            config: OpidConfig::from_json(json)?,
            state: OpidState::default(),
        })
    }

    pub fn config(&self) -> &OpidConfig {
        &self.config
    }

    pub fn state(&self) -> &OpidState {
        &self.state
    }

    /// The context of `variant` with a skill block injected after what it already injects.
    fn with_skill(&self, variant: &ContextVariant, header: &str, skill: &str) -> ContextVariant {
        let block = if header.is_empty() {
            skill.to_string()
        } else {
            format!("{header}\n{skill}")
        };
        let inject = if variant.inject.is_empty() {
            block
        } else {
            format!("{}\n\n{block}", variant.inject)
        };
        ContextVariant {
            inject,
            ..variant.clone()
        }
    }

    /// Answers and failures of earlier requests (observe, step 1): `(failed, received, step
    /// skills kept, step skills dropped)` this step.
    fn collect(&mut self, report: &StepReport, host: &dyn Host) -> Result<(u64, u64, u64, u64)> {
        let mut failed = 0;
        for (ticket, _) in &report.failed_reflections {
            if self.state.pending.remove(ticket).is_some() {
                failed += 1;
            }
        }
        let (mut received, mut kept, mut dropped, mut too_long) = (0u64, 0u64, 0u64, 0u64);
        if !report.new_entries.is_empty() && !self.state.pending.is_empty() {
            let found = host.bank_query(&BankQuery {
                text: String::new(),
                k: report.new_entries.len() + QUERY_SLACK,
                kinds: vec![EntryKind::Skill],
                task_id: None,
                include_general: true,
                ..BankQuery::default()
            })?;
            let mut ours: Vec<_> = found
                .into_iter()
                .map(|r| r.entry)
                .filter(|e| report.new_entries.contains(&e.id))
                .filter_map(|e| {
                    let ticket = e.extra.get("reflection_ticket").and_then(Value::as_u64)?;
                    self.state
                        .pending
                        .contains_key(&ticket)
                        .then_some((ticket, e))
                })
                .collect();
            // Write order, so the newest answer of a slot wins.
            ours.sort_by_key(|(_, e)| e.id);
            for (ticket, entry) in ours {
                let Some(a) = analysis::read(&entry, &self.config) else {
                    continue;
                };
                self.state.pending.remove(&ticket);
                received += 1;
                kept += a.steps.len() as u64;
                dropped += a.dropped as u64;
                too_long += a.too_long as u64;
                self.state.skills.insert(&a, self.config.scope);
            }
        }
        let c = &mut self.state.counters;
        c.failed += failed;
        c.received += received;
        c.step_skills_kept += kept;
        c.step_skills_dropped += dropped;
        c.too_long += too_long;
        host.log_metric("opid/skills_too_long", too_long as f64);
        Ok((failed, received, kept, dropped))
    }

    /// Asks for the analysis of every completed trajectory of the step (observe, step 3).
    fn ask(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let batch = &report.batch;
        let trajs = trajectories(batch)?;
        let critical = match self.config.critical {
            Critical::Analyzer => None,
            Critical::Statistical => {
                let s = critical::select(
                    batch,
                    self.config.gamma,
                    self.config.min_group_size as usize,
                    self.config.var_quantile,
                    self.config.critical_per_trajectory as usize,
                )?;
                host.log_metric(
                    "opid/critical_turns",
                    s.critical.iter().filter(|&&c| c).count() as f64,
                );
                Some(s.critical)
            }
        };
        let (mut requested, mut refused) = (0u64, 0u64);
        let mut full = false;
        for t in &trajs {
            let complete = t.rows.last().is_some_and(|&i| batch.rows[i].last_turn)
                && t.rows
                    .iter()
                    .all(|&i| batch.rows[i].finish_reason != FinishReason::Aborted);
            if !complete || (self.config.failed_only && t.success) {
                continue;
            }
            if full {
                refused += 1;
                continue;
            }
            let candidates: Vec<u32> = t
                .rows
                .iter()
                .filter(|&&i| critical.as_ref().is_none_or(|c| c[i]))
                .map(|&i| batch.rows[i].turn)
                .collect();
            let request = analysis::request(batch, t, &candidates, &self.config, report.step);
            // One request per call: a full queue refuses only what does not fit.
            match host.reflect(std::slice::from_ref(&request)) {
                Ok(tickets) => {
                    requested += 1;
                    for ticket in tickets {
                        self.state.pending.insert(ticket, report.step);
                    }
                }
                Err(_) => {
                    full = true;
                    refused += 1;
                }
            }
        }
        self.state.counters.requested += requested;
        self.state.counters.refused += refused;
        host.log_metric("opid/reflections_requested", requested as f64);
        host.log_metric("opid/reflections_refused", refused as f64);
        Ok(())
    }
}

/// The context ids and teacher log-probs of one scoring of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scoring {
    Base,
    Episode,
    Step,
}

impl Algorithm for Opid {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Auxiliary,
            teacher_scores: true,
            bank: vec![EntryKind::Skill],
            reflection: true,
            anchor_keys: self.config.critical == Critical::Statistical,
            ..Requirements::default()
        }
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let config = &self.config;
        let n = batch.rows.len();
        let mut routes = vec![Route::default(); n];
        let mut requests: Vec<ScoreRequest> = Vec::new();
        let mut scorings: Vec<(usize, Scoring)> = Vec::new();
        let mut rescored_base = 0usize;
        for (i, row) in batch.rows.iter().enumerate() {
            if row.trainable_tokens() == 0 {
                continue;
            }
            let (episode, step) = self.state.skills.lookup(row, config.scope);
            let route = teacher::route(episode, step, config.w_ep, config.w_st, config.routing);
            if !route.any() {
                continue;
            }
            routes[i] = route;
            let l = row.response_ids.len();
            let render =
                |variant: ContextVariant| host.render_prompt(&RenderRequest::for_row(variant, row));
            let plain = render(row.variant.clone())?;
            let exact = plain.as_slice() == row.train_prompt();
            let mut score = |context_ids: Vec<u32>, what: Scoring| {
                requests.push(ScoreRequest {
                    context_ids,
                    response_ids: row.response_ids.clone(),
                    weights: ScoreWeights::Version(row.policy_version),
                    temperature: None,
                    top_k: 0,
                });
                scorings.push((i, what));
            };
            if config.reference == Reference::Rescored || !exact {
                rescored_base += 1;
                score(plain, Scoring::Base);
            } else if row.old_logprobs.len() != l {
                return Err(PluginError::input(format!(
                    "row {i} has {} old_logprobs for {l} response tokens; opid compares the \
                     teacher log-probs with ℓ_old, which the kernel fills in before signals",
                    row.old_logprobs.len()
                )));
            }
            if route.episode {
                let v =
                    self.with_skill(&row.variant, &config.episode_header, episode.unwrap_or(""));
                score(render(v)?, Scoring::Episode);
            }
            if route.step {
                let v = self.with_skill(&row.variant, &config.step_header, step.unwrap_or(""));
                score(render(v)?, Scoring::Step);
            }
        }
        let mut metrics = vec![
            (
                "opid/rows_episode".to_string(),
                routes.iter().filter(|r| r.episode).count() as f64,
            ),
            (
                "opid/rows_step".to_string(),
                routes.iter().filter(|r| r.step).count() as f64,
            ),
            ("opid/rows_rescored_base".to_string(), rescored_base as f64),
        ];
        if requests.is_empty() {
            return Ok(Signals {
                metrics,
                ..Signals::default()
            });
        }
        let scored = host.score(&requests)?;
        if scored.len() != requests.len() {
            return Err(PluginError::host(format!(
                "scoring returned {} results for {} requests",
                scored.len(),
                requests.len()
            )));
        }
        // Per row: the reference, the episode and the step log-probs.
        let mut base: Vec<Option<Vec<f32>>> = vec![None; n];
        let mut ep: Vec<Option<Vec<f32>>> = vec![None; n];
        let mut st: Vec<Option<Vec<f32>>> = vec![None; n];
        for (&(i, what), s) in scorings.iter().zip(scored) {
            let row = &batch.rows[i];
            let l = row.response_ids.len();
            if s.logprobs.len() != l {
                return Err(PluginError::host(format!(
                    "scoring row {i} returned {} log-probs for {l} response tokens",
                    s.logprobs.len()
                )));
            }
            if let Some(l) = row
                .response_mask
                .iter()
                .zip(&s.logprobs)
                .position(|(&m, x)| m == 1 && !x.is_finite())
            {
                return Err(PluginError::host(format!(
                    "scoring row {i} under its skill context gave a non-finite log-prob at \
                     token {l}"
                )));
            }
            let slot = match what {
                Scoring::Base => &mut base[i],
                Scoring::Episode => &mut ep[i],
                Scoring::Step => &mut st[i],
            };
            *slot = Some(s.logprobs);
        }
        let masks: Vec<&[u8]> = batch.rows.iter().map(|r| &r.response_mask[..]).collect();
        let gains = |teacher: &[Option<Vec<f32>>]| -> Vec<Vec<f64>> {
            batch
                .rows
                .iter()
                .enumerate()
                .map(|(i, row)| match &teacher[i] {
                    Some(t) => {
                        let reference = base[i].as_deref().unwrap_or(&row.old_logprobs);
                        teacher::gain(t, reference, &row.response_mask)
                    }
                    None => vec![0.0; row.response_ids.len()],
                })
                .collect()
        };
        let mut d_ep = gains(&ep);
        let mut d_st = gains(&st);
        let active_ep: Vec<bool> = routes.iter().map(|r| r.episode).collect();
        let active_st: Vec<bool> = routes.iter().map(|r| r.step).collect();
        let mean_active = |d: &[Vec<f64>], active: &[bool]| {
            let (sum, count) = d
                .iter()
                .zip(active)
                .zip(&masks)
                .filter(|((_, &a), _)| a)
                .flat_map(|((v, _), m)| v.iter().zip(m.iter()).filter(|(_, &m)| m == 1))
                .fold((0.0, 0usize), |(s, c), (x, _)| (s + x, c + 1));
            if count == 0 {
                0.0
            } else {
                sum / count as f64
            }
        };
        metrics.push(("opid/d_ep_mean".into(), mean_active(&d_ep, &active_ep)));
        metrics.push(("opid/d_st_mean".into(), mean_active(&d_st, &active_st)));
        for (d, active) in [(&mut d_ep, &active_ep), (&mut d_st, &active_st)] {
            teacher::normalise(d, active, &masks, config.normalise, config.eps);
            teacher::clip(d, config.clip);
        }
        let add: Vec<Vec<f32>> = batch
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let r = routes[i];
                teacher::fuse(
                    r.episode.then_some(&d_ep[i][..]),
                    r.step.then_some(&d_st[i][..]),
                    config.w_ep,
                    config.w_st,
                    row.response_ids.len(),
                )
            })
            .collect();
        let trainable: usize = batch.rows.iter().map(|r| r.trainable_tokens()).sum();
        let teacher_tokens: usize = batch
            .rows
            .iter()
            .zip(&routes)
            .filter(|(_, r)| r.any())
            .map(|(row, _)| row.trainable_tokens())
            .sum();
        let abs_sum: f64 = add
            .iter()
            .zip(&masks)
            .flat_map(|(a, m)| a.iter().zip(m.iter()).filter(|(_, &m)| m == 1))
            .map(|(x, _)| f64::from(x.abs()))
            .sum();
        metrics.push((
            "opid/teacher_token_share".into(),
            teacher_tokens as f64 / trainable.max(1) as f64,
        ));
        metrics.push((
            "opid/add_abs_mean".into(),
            abs_sum / trainable.max(1) as f64,
        ));
        Ok(Signals {
            advantage_add: add,
            metrics,
            ..Signals::default()
        })
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let (failed, received, kept, dropped) = self.collect(report, host)?;
        let before = self.state.pending.len();
        self.state
            .pending
            .retain(|_, asked| report.step.saturating_sub(*asked) < MAX_PENDING_STEPS);
        let expired = (before - self.state.pending.len()) as u64;
        self.state.counters.expired += expired;
        self.ask(report, host)?;
        self.state.steps += 1;
        for (name, value) in [
            ("opid/reflections_failed", failed as f64),
            ("opid/analyses_received", received as f64),
            ("opid/step_skills_kept", kept as f64),
            ("opid/step_skills_dropped", dropped as f64),
            ("opid/pending", self.state.pending.len() as f64),
            ("opid/pending_expired", expired as f64),
            ("opid/skill_scopes", self.state.skills.0.len() as f64),
        ] {
            host.log_metric(name, value);
        }
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("opid", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        let Some(mut state) = cairn_plugin_sdk::state::load_state::<OpidState>("opid", state)?
        else {
            return Ok(());
        };
        // The kernel does not checkpoint queued reflections and counts tickets from 1 again
        // after a resume: a pending ticket would never be answered, or be mistaken for a new one.
        state.pending.clear();
        self.state = state;
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "opid",
    description: "OPID/SEED: hindsight skills from the skill creator (JSON with re-asks), critical-first routing, re-scoring with the rollout-time weights, token-level teacher advantages added to grpo's or gigpo's",
    create: Opid::from_config_json,
}

#[cfg(test)]
mod tests;
