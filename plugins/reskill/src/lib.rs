//! `reskill`: ReSkill (arXiv 2606.01619; github amazon-science/reskill) as a stackable
//! [`Role::Planner`] over an advantage estimator (`grpo`, `gigpo`). It changes no loss term:
//! it keeps a library of short, trigger-fired skills in the experience bank and decides, by a
//! Thompson-sampled A/B test inside each group, whether a new skill helps.
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"
//! [[algorithm.stack]]
//! plugin = "reskill"
//! config = { test_steps = 5, min_episodes = 50 }
//! ```
//!
//! Hooks (`docs/algorithms/reskill.md` has the method, the formulas and every key):
//! - [`Algorithm::plan_group`]: while a test runs, each slot independently plays the new
//!   bundle (active skills plus the skill under test) with probability `p_new`, else the old
//!   one; the draws come from a ChaCha8 RNG seeded with [`GroupRequest::seed`]. Without a
//!   test every slot plays the active skills.
//! - [`Algorithm::next_context`]: before each later turn, the skills of the slot's bundle
//!   whose trigger matches the new observation are injected.
//! - [`Algorithm::observe`]: episodes go into the reservoir; the test's outcomes of the step
//!   are flushed into the Beta posteriors with the configured discount; a finished test is
//!   decided; an arriving skill is verified; and the creator asks the skill creator
//!   ([`Host::reflect`]) for a new skill when no test runs.
//! - [`Algorithm::signals`]: no advantages and no terms, one metric.
//!
//! Modules: [`beta`] (log-gamma, incomplete beta, `P[θ_new > θ_old]` by quadrature), [`ab`]
//! (posteriors, discounting, the `M` fit), [`assertion`] (the rule engine), [`creator`]
//! (episodes, the diagnosis, the trigger, the prompt), [`state`] (what is checkpointed),
//! [`config`]; the `observe` steps live in `lifecycle.rs`.

pub mod ab;
pub mod assertion;
pub mod beta;
pub mod config;
pub mod creator;
mod lifecycle;
pub mod state;

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use regex::Regex;
use serde_json::{json, Map, Value};

use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, EntryKind, GroupRequest, Host, PluginError, Requirements,
    Result, Role, Signals, StepReport, TurnContext, TurnContextRequest,
};

use config::ReskillConfig;
use creator::{Episode, Version};
pub use state::{
    Counters, Pending, ReskillState, Skill, TrackedAssertion, Verdict, MAX_TRACKED_ASSERTIONS,
};

/// The plugin: its config, its checkpointed state, and the compiled triggers of the skills it
/// serves.
pub struct Reskill {
    config: ReskillConfig,
    state: ReskillState,
    /// Compiled triggers of `state.skills` (`None`: fires always); rebuilt on load.
    triggers: HashMap<u64, Option<Regex>>,
}

fn ids_of(extra: &Map<String, Value>, key: &str) -> Result<Option<Vec<u64>>> {
    let Some(value) = extra.get(key) else {
        return Ok(None);
    };
    let ids = value
        .as_array()
        .and_then(|a| a.iter().map(Value::as_u64).collect());
    match ids {
        Some(ids) => Ok(Some(ids)),
        None => Err(PluginError::input(format!(
            "the slot's `extra.{key}` = {value} is not a list of skill ids; reskill plans it as \
             one, so another plugin changed it"
        ))),
    }
}

impl Reskill {
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config = ReskillConfig::from_json(json)?;
        let state = ReskillState::new(&config);
        Reskill::new(config, state)
    }

    /// A plugin with a given state (e.g. a checkpoint's): checks the state against the config
    /// and compiles the skills' triggers.
    pub fn new(config: ReskillConfig, mut state: ReskillState) -> Result<Self> {
        config.validate()?;
        if state.fit.log_likelihood.len() != config.m_grid_max as usize {
            return Err(PluginError::config(format!(
                "`m_grid_max` = {} but the saved horizon fit has {} grid points; resume with \
                 the `m_grid_max` the run started with",
                config.m_grid_max,
                state.fit.log_likelihood.len()
            )));
        }
        while state.reservoir.len() > config.reservoir_size as usize {
            state.reservoir.pop_front();
        }
        let mut triggers = HashMap::new();
        for (&id, skill) in &state.skills {
            let trigger = match &skill.trigger {
                Some(t) => Some(assertion::pattern(
                    t,
                    &format!("the trigger of skill {id}"),
                )?),
                None => None,
            };
            triggers.insert(id, trigger);
        }
        Ok(Reskill {
            config,
            state,
            triggers,
        })
    }

    pub fn config(&self) -> &ReskillConfig {
        &self.config
    }

    pub fn state(&self) -> &ReskillState {
        &self.state
    }

    /// The skills a slot of `version` plays, in injection priority: the skill under test
    /// first (so the cap never hides it), then the active skills by id, without the one the
    /// tested skill replaces.
    fn bundle(&self, version: Option<Version>) -> Vec<u64> {
        let active = self.state.active();
        match (version, &self.state.test) {
            (Some(Version::New), Some(t)) => std::iter::once(t.skill)
                .chain(active.into_iter().filter(|&id| Some(id) != t.parent))
                .collect(),
            _ => active,
        }
    }

    /// The skills of `ids` whose trigger matches `text`, at most `max_active_skills`.
    fn triggered(&self, ids: &[u64], text: &str) -> Vec<u64> {
        ids.iter()
            .copied()
            .filter(|id| match self.triggers.get(id) {
                Some(Some(re)) => re.is_match(text),
                Some(None) => true,
                None => false,
            })
            .take(self.config.max_active_skills as usize)
            .collect()
    }

    fn inject(&self, ids: &[u64]) -> String {
        ids.iter()
            .filter_map(|id| self.state.skills.get(id))
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    fn variant(&self, request: &GroupRequest, version: Option<(u64, Version)>) -> ContextVariant {
        let skills = self.bundle(version.map(|(_, v)| v));
        // The first turn's observation is not known when planning; the goal stands in.
        let triggered = self.triggered(&skills, &request.task_description);
        let mut extra = Map::new();
        extra.insert("task_kind".into(), json!(request.task_kind));
        extra.insert("skills".into(), json!(skills));
        extra.insert("triggered".into(), json!(triggered));
        let label = match version {
            Some((test, v)) => {
                extra.insert("reskill_version".into(), json!(v.as_str()));
                extra.insert("test".into(), json!(test));
                format!("skill:{}", v.as_str())
            }
            None if skills.is_empty() => "plain".into(),
            None => "skill:active".into(),
        };
        ContextVariant {
            label,
            inject: self.inject(&triggered),
            extra,
            ..ContextVariant::default()
        }
    }
}

impl Algorithm for Reskill {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Planner,
            turn_context: true,
            bank: vec![EntryKind::Skill],
            reflection: true,
            ..Requirements::default()
        }
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        _host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let Some(test) = &self.state.test else {
            return Ok(vec![
                self.variant(request, None);
                request.group_size as usize
            ]);
        };
        let (id, p_new) = (test.id, test.p_new);
        let new = self.variant(request, Some((id, Version::New)));
        let old = self.variant(request, Some((id, Version::Old)));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(request.seed);
        Ok((0..request.group_size)
            .map(|_| {
                if rng.gen::<f64>() < p_new {
                    new.clone()
                } else {
                    old.clone()
                }
            })
            .collect())
    }

    fn next_context(
        &mut self,
        request: &TurnContextRequest,
        _host: &dyn Host,
    ) -> Result<TurnContext> {
        let extra = &request.variant.extra;
        let Some(skills) = ids_of(extra, "skills")? else {
            return Ok(TurnContext::Keep);
        };
        let triggered = self.triggered(&skills, &request.observation.text);
        if ids_of(extra, "triggered")?.unwrap_or_default() == triggered {
            return Ok(TurnContext::Keep);
        }
        let mut variant = request.variant.clone();
        variant.inject = self.inject(&triggered);
        variant.extra.insert("triggered".into(), json!(triggered));
        Ok(TurnContext::Variant { variant })
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        let with_skills = batch
            .rows
            .iter()
            .filter(|r| {
                r.variant
                    .extra
                    .get("triggered")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty())
            })
            .count();
        let share = if batch.rows.is_empty() {
            0.0
        } else {
            with_skills as f64 / batch.rows.len() as f64
        };
        Ok(Signals {
            metrics: vec![("reskill/rows_with_skills".into(), share)],
            ..Signals::default()
        })
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let played = creator::episodes_of(&report.batch);
        for p in &played {
            self.state.reservoir.push_back(p.episode.clone());
        }
        while self.state.reservoir.len() > self.config.reservoir_size as usize {
            self.state.reservoir.pop_front();
        }
        if let Some(p) = self.state.pending.clone() {
            if report
                .failed_reflections
                .iter()
                .any(|(t, _)| *t == p.ticket)
            {
                self.state.counters.reflections_failed += 1;
                self.state.pending = None;
                // Not proposed after all: the assertion may be tried again.
                self.state.assertions.retain(|t| {
                    !(t.verdict == Verdict::Requested
                        && t.task_kind == p.task_kind
                        && t.assertion == p.assertion)
                });
            }
        }
        self.run_test(&played, host)?;
        self.receive(report, host)?;
        let current: Vec<Episode> = played.into_iter().map(|p| p.episode).collect();
        self.create(&current, report.step, host)?;
        self.log_state(host);
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("reskill", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        let Some(mut state) =
            cairn_plugin_sdk::state::load_state::<ReskillState>("reskill", state)?
        else {
            return Ok(());
        };
        // The kernel does not checkpoint queued reflections and counts tickets from 1 again
        // after a resume, so a pending ticket would never be answered.
        state.pending = None;
        *self = Reskill::new(self.config.clone(), state)?;
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "reskill",
    description: "ReSkill planner: assertion-diagnosed skills from the skill creator, per-turn trigger matching, within-group Thompson-sampled A/B tests with adaptive discounting",
    create: Reskill::from_config_json,
}
