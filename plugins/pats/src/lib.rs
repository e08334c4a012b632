//! `pats`: policy-centric training scaffolds, a stackable [`Role::Planner`] over an advantage
//! estimator (`grpo`, `gigpo`); see `docs/algorithms/pats.md`.
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"
//! [[algorithm.stack]]
//! plugin = "pats"
//! config = { scaffolded_slots = 4, delta = 0.05, tau_solve = 0.8, window = 3 }
//! ```
//!
//! **Provenance.** No paper or code for Pats is public: this is a proposal. From the brief:
//! scaffolds help a weak policy explore while it trains, they are temporary, their benefit is
//! distilled into the weights and the final policy runs without them; evidence cards from each
//! rollout group; a task-specific evaluation that keeps a scaffold, revises it through the
//! skill creator, or removes it once it has graduated or has no effect; scaffolds are never
//! injected at evaluation or export. **Every constant and rule below is ours.**
//!
//! The hooks:
//! 1. [`Algorithm::plan_group`]: the task's active scaffold (an `EntryKind::Scaffold` bank
//!    entry for the task, the newest; else `config.scaffold`; else none) goes to the first
//!    `G_s` slots ([`arms::scaffolded_variant`]); the others play plain
//!    ([`arms::plain_variant`]). A task without a scaffold, or whose scaffold was removed,
//!    plays every slot plain. Only training groups are planned: the kernel plays evaluations
//!    with the plain context and never asks a plugin, so nothing here has to refuse them.
//! 2. [`Algorithm::signals`] (pure): per-arm success rates, and with `coef > 0` the
//!    `pats-distill` teacher term: in an A/B group whose scaffolded arm had the higher mean
//!    episode reward, each plain row is distilled toward the same policy *with* the scaffold
//!    (a live teacher on the row's own tokens, as the `hint` plugin does).
//! 3. [`Algorithm::observe`] (once per step, in this order): failed reflections are counted;
//!    an evidence card per (task, scaffold) of the step goes into the bank ([`card`]); each
//!    card's window is judged ([`evaluate`]): keep, remove (graduated or no effect: the
//!    scaffold is retired) or revise (a revision request to the skill creator); tasks without
//!    a scaffold where one trajectory succeeded and one failed get a creation request
//!    ([`reflect`]); answers that arrived are checked and made active, a revision retiring the
//!    scaffold it replaces.
//! 4. `save_state` / `load_state`: the per-task windows, removals, pending requests and
//!    counters ([`state`]).
//!
//! Config keys ([`PatsConfig`], unknown keys refused), proposed defaults in parentheses:
//! `scaffolded_slots` (half the group), `delta` (0.05), `tau_solve` (0.8), `window` (3),
//! `scaffold` (empty), `max_new_scaffolds` (4), `max_scaffold_chars` (600), `coef` (0: off).
//!
//! Metrics: from `observe` (per step) `pats/cards`, `pats/kept`, `pats/removed_graduated`,
//! `pats/removed_no_effect`, `pats/revised`, `pats/undecided`, `pats/new_requested`,
//! `pats/accepted`, `pats/too_long`, `pats/reflections_failed`; from `signals`
//! `pats/scaffolds_active`, `pats/success_with`, `pats/success_without`,
//! `pats/rows_distilled`.

pub mod arms;
pub mod card;
pub mod config;
pub mod evaluate;
mod lifecycle;
pub mod reflect;
pub mod state;

use std::collections::BTreeSet;

use cairn_plugin_sdk::{
    Algorithm, BankQuery, Batch, ContextVariant, EntryKind, EntryStatus, GroupRequest, Host,
    RenderRequest, Requirements, Result, Role, Signals, StepReport, TeacherForm, TeacherSource,
    TeacherTarget, TeacherTerm,
};

use crate::arms::{plain_variant, scaffolded_variant, GroupArms, Played, ScaffoldRef};
pub use crate::config::PatsConfig;
use crate::state::PatsState;

/// The name of the distillation teacher term.
pub const DISTILL_TERM: &str = "pats-distill";

/// Bank entries a plan query looks at (the newest active scaffolds of the task).
const PLAN_QUERY_K: usize = 8;

/// The Pats planner.
pub struct Pats {
    config: PatsConfig,
    state: PatsState,
    /// Set by `load_state` when the restored state has pending reflections: a resumed run's
    /// skill creator starts with an empty queue, so the first `observe` settles them.
    resumed: bool,
}

impl Pats {
    /// Builds the plugin from its JSON config (the export macro's constructor).
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Pats {
            config: PatsConfig::from_json(json)?,
            state: PatsState::default(),
            resumed: false,
        })
    }

    pub fn config(&self) -> &PatsConfig {
        &self.config
    }

    pub fn state(&self) -> &PatsState {
        &self.state
    }

    /// The scaffold `task` plays with now: its newest active bank scaffold that may be
    /// injected, else the config's general one; none once the task's scaffold was removed.
    pub fn active_scaffold(
        &self,
        task: &str,
        host: &dyn Host,
    ) -> Result<Option<(ScaffoldRef, String)>> {
        if self.state.is_removed(task) {
            return Ok(None);
        }
        let found = host.bank_query(&BankQuery {
            kinds: vec![EntryKind::Scaffold],
            task_id: Some(task.to_string()),
            include_general: false,
            statuses: vec![EntryStatus::Active],
            k: PLAN_QUERY_K,
            ..BankQuery::default()
        })?;
        let newest = found
            .into_iter()
            .map(|r| r.entry)
            .filter(|e| {
                e.kind == EntryKind::Scaffold
                    && e.status == EntryStatus::Active
                    && e.task_id.as_deref() == Some(task)
                    && self.config.fits(&e.text)
            })
            .max_by_key(|e| e.id);
        Ok(match newest {
            Some(e) => Some((ScaffoldRef::Bank(e.id), e.text)),
            None if !self.config.scaffold.is_empty() => {
                Some((ScaffoldRef::Config, self.config.scaffold.clone()))
            }
            None => None,
        })
    }
}

fn success_rate(arm: &[&Played]) -> f64 {
    arm.iter().filter(|t| t.success).count() as f64 / arm.len() as f64
}

fn mean_reward(arm: &[Played]) -> f64 {
    arm.iter().map(|t| t.reward).sum::<f64>() / arm.len() as f64
}

impl Algorithm for Pats {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Planner,
            bank: vec![EntryKind::Scaffold, EntryKind::EvidenceCard],
            reflection: true,
            // Both arms in every group; the kernel refuses smaller groups at load.
            min_group_size: self
                .config
                .scaffolded_slots
                .map_or(2, |s| s.saturating_add(1)),
            ..Requirements::default()
        }
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let g = request.group_size;
        let g_s = self.config.scaffolded_slots(g)?;
        let Some((scaffold, text)) = self.active_scaffold(&request.task_id, host)? else {
            return Ok(vec![plain_variant(); g as usize]);
        };
        let scaffolded = scaffolded_variant(scaffold, &text);
        Ok((0..g)
            .map(|k| {
                if k < g_s {
                    scaffolded.clone()
                } else {
                    plain_variant()
                }
            })
            .collect())
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        let groups = arms::groups(batch)?;
        let contrasts: Vec<&GroupArms> = groups.iter().filter(|g| g.is_contrast()).collect();
        let in_play: BTreeSet<(&str, ScaffoldRef)> = contrasts
            .iter()
            .filter_map(|g| Some((g.task_id.as_str(), g.scaffold?)))
            .collect();
        let mut metrics = vec![("pats/scaffolds_active".to_string(), in_play.len() as f64)];
        if !contrasts.is_empty() {
            let with: Vec<&Played> = contrasts.iter().flat_map(|g| &g.with).collect();
            let without: Vec<&Played> = contrasts.iter().flat_map(|g| &g.without).collect();
            metrics.push(("pats/success_with".into(), success_rate(&with)));
            metrics.push(("pats/success_without".into(), success_rate(&without)));
        }
        let mut teacher = Vec::new();
        if self.config.coef > 0.0 {
            let mut targets = Vec::new();
            for g in &contrasts {
                let Some(variant) = &g.scaffold_variant else {
                    continue;
                };
                if mean_reward(&g.with) <= mean_reward(&g.without) {
                    continue;
                }
                for &i in g.without.iter().flat_map(|t| &t.rows) {
                    let row = &batch.rows[i];
                    let context_ids =
                        host.render_prompt(&RenderRequest::for_row(variant.clone(), row))?;
                    targets.push(TeacherTarget {
                        row: i,
                        weights: row.mask_weights(1.0),
                        source: TeacherSource::Context { context_ids },
                    });
                }
            }
            targets.sort_by_key(|t| t.row);
            metrics.push(("pats/rows_distilled".into(), targets.len() as f64));
            teacher.push(TeacherTerm {
                name: DISTILL_TERM.into(),
                coef: self.config.coef,
                form: TeacherForm::SampledReverseKl,
                targets,
            });
        }
        Ok(Signals {
            teacher,
            metrics,
            ..Signals::default()
        })
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        self.observe_step(report, host)
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("pats", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        if let Some(state) = cairn_plugin_sdk::state::load_state("pats", state)? {
            self.state = state;
            self.resumed = !self.state.pending.is_empty();
        }
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "pats",
    description: "proposal: training scaffolds per task on part of each group, evidence cards per rollout group, keep / revise / remove by task-specific evaluation",
    create: Pats::from_config_json,
}
