//! `edge`: EDGE, experience distillation for guided exploration (arXiv 2608.21946; following
//! the code of github xvolcano02/EDGE; `docs/algorithms/edge.md`). A [`Role::Planner`] stacked
//! on an advantage estimator, which keeps computing every advantage:
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"                 # or "gigpo"
//! [[algorithm.stack]]
//! plugin = "edge"
//! config = { coef = 1.0, warmup_steps = 100 }
//! ```
//!
//! Each hook does one part of the method:
//! 1. **Partition** ([`Algorithm::plan_group`], [`plan`]): during the warm-up (`step <
//!    warmup_steps`, steps from 0) the first half of each group's slots are
//!    experience-conditioned (arm E: the group's retrieved experiences injected, label
//!    `experience:<count>`), the rest experience-free (arm N: the plain context). The arm, the
//!    injected ids and the task kind are recorded in `variant.extra` (`edge_arm`,
//!    `experience_ids`, `task_kind`). After the warm-up, and for a group whose retrieval finds
//!    nothing, every slot is N.
//! 2. **Admission** ([`Algorithm::signals`], [`admission`]): the marginal gain of the
//!    experiences, per same-anchor cell or per group, decides which rows are distilled and
//!    with which weight `w`.
//! 3. **Distillation**: one teacher term, `edge-distill`: per target row a live teacher (the
//!    policy at the update's weights) on the row's own tokens, under the prompt the E arm of
//!    its group saw for the row's observation ([`Host::render_prompt`]); per-token weights
//!    `w · mask`; sampled-token reverse KL `w · sg(ℓ^S − ℓ^T) · ℓ^S`, or its top-k form.
//!    The kernel's objective computes the loss (`kernel/src/objective/teacher.rs`).
//! 4. **Co-evolving bank** ([`Algorithm::observe`], [`management`]): credits, utility EMA,
//!    negative streaks, hard pruning, capacity trimming and synthesis of new experiences
//!    through the skill creator ([`Host::reflect`]), once per management window.
//! 5. **State** (`save_state` / `load_state`): the step counters and the window's buffered
//!    credits, so a resumed run closes its window with the same numbers.
//!
//! Metrics: `edge/success_e`, `edge/success_n`, `edge/rows_distilled`, `edge/cells_admitted`
//! (in the signals); `edge/reflections_failed`, `edge/entries_too_long` (every step), and
//! `edge/bank_size`, `edge/bank_utility_mean`, `edge/credited`, `edge/retired`,
//! `edge/evicted`, `edge/reflections_requested`, `edge/reflections_refused` (when a window
//! closes), through [`Host::log_metric`] in `observe`.

use std::collections::HashMap;

use cairn_plugin_sdk::stats::trajectories;
use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, EntryKind, GroupRequest, Host, PluginError, RenderRequest,
    Requirements, Result, Role, Signals, StepReport, TeacherSource, TeacherTarget, TeacherTerm,
};
use serde::{Deserialize, Serialize};

pub mod admission;
pub mod config;
pub mod management;
pub mod plan;
#[cfg(test)]
mod testing;

pub use admission::{admission, Admission, Arm, ARM_KEY};
pub use config::{EdgeConfig, Level, Score, Target, TokenSelection};
pub use management::{manage, step_outcomes, Managed, Window};

/// The name of the distillation term.
pub const TERM: &str = "edge-distill";

/// What the plugin keeps across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EdgeState {
    /// Steps observed.
    pub steps: u64,
    /// Management windows closed.
    pub windows: u64,
    /// The open window's buffer.
    pub window: Window,
    /// Entries `plan_group` skipped as too long since the last `observe` (planning has no
    /// metrics channel of its own, so `observe` reports them).
    pub entries_too_long: u64,
}

pub struct Edge {
    config: EdgeConfig,
    state: EdgeState,
}

impl Edge {
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Edge {
            config: EdgeConfig::from_json(json)?,
            state: EdgeState::default(),
        })
    }

    pub fn config(&self) -> &EdgeConfig {
        &self.config
    }

    pub fn state(&self) -> &EdgeState {
        &self.state
    }
}

/// Mean success of the trajectories of one arm; `None` when the arm played none.
fn arm_success(batch: &Batch, arms: &[Option<Arm>], arm: Arm) -> Result<Option<f64>> {
    let outcomes: Vec<f64> = trajectories(batch)?
        .iter()
        .filter(|t| arms[t.rows[0]] == Some(arm))
        .map(|t| f64::from(u8::from(t.success)))
        .collect();
    Ok((!outcomes.is_empty()).then(|| outcomes.iter().sum::<f64>() / outcomes.len() as f64))
}

impl Algorithm for Edge {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Planner,
            even_group_size: true,
            min_group_size: 2,
            bank: vec![EntryKind::Experience],
            reflection: true,
            teacher_topk: self.config.token_selection == TokenSelection::TeacherTopk,
            ..Requirements::default()
        }
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let n = request.group_size;
        if n < 2 || !n.is_multiple_of(2) {
            return Err(PluginError::input(format!(
                "group {} has {n} slots; edge splits every group into two equal halves, so set \
                 rollout.group_size to an even number ≥ 2",
                request.group_id
            )));
        }
        let plain = plan::n_variant(request);
        if !self.config.in_warmup(request.step) {
            return Ok(vec![plain; n as usize]);
        }
        let found = plan::retrieve(&self.config, request, host)?;
        self.state.entries_too_long += found.too_long;
        if found.entries.is_empty() {
            return Ok(vec![plain; n as usize]);
        }
        let e = plan::e_variant(&self.config.header, request, &found.entries);
        Ok((0..n)
            .map(|k| if k < n / 2 { e.clone() } else { plain.clone() })
            .collect())
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let arms = admission::arms(batch)?;
        let mut metrics = Vec::new();
        for (name, arm) in [("edge/success_e", Arm::E), ("edge/success_n", Arm::N)] {
            if let Some(rate) = arm_success(batch, &arms, arm)? {
                metrics.push((name.to_string(), rate));
            }
        }
        let mut targets = Vec::new();
        let mut admitted = 0;
        if self.config.in_warmup(batch.step) {
            let a = admission(batch, &self.config)?;
            admitted = a.admitted;
            // Every E slot of a group has the same variant: the group's retrieval.
            let mut e_variants: HashMap<u64, &ContextVariant> = HashMap::new();
            for (row, arm) in batch.rows.iter().zip(&arms) {
                if *arm == Some(Arm::E) {
                    e_variants.entry(row.group_id).or_insert(&row.variant);
                }
            }
            let mut rendered: HashMap<(u64, &str, Option<&str>), Vec<u32>> = HashMap::new();
            for (i, row) in batch.rows.iter().enumerate() {
                let w = a.weights[i];
                if w <= 0.0 || row.trainable_tokens() == 0 {
                    continue;
                }
                let Some(variant) = e_variants.get(&row.group_id) else {
                    return Err(PluginError::internal(format!(
                        "row {i} was admitted but group {} has no E row",
                        row.group_id
                    )));
                };
                let key = (
                    row.group_id,
                    row.observation.as_str(),
                    row.anchor.as_deref(),
                );
                let context_ids = match rendered.get(&key) {
                    Some(ids) => ids.clone(),
                    None => {
                        let ids =
                            host.render_prompt(&RenderRequest::for_row((*variant).clone(), row))?;
                        rendered.insert(key, ids.clone());
                        ids
                    }
                };
                targets.push(TeacherTarget {
                    row: i,
                    weights: row.mask_weights(w as f32),
                    source: TeacherSource::Context { context_ids },
                });
            }
        }
        metrics.push(("edge/rows_distilled".into(), targets.len() as f64));
        metrics.push(("edge/cells_admitted".into(), admitted as f64));
        Ok(Signals {
            teacher: vec![TeacherTerm {
                name: TERM.into(),
                coef: self.config.coef,
                form: self.config.form(),
                targets,
            }],
            metrics,
            ..Signals::default()
        })
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let outcomes = step_outcomes(&report.batch, &self.config)?;
        self.state.window.record(&outcomes);
        self.state.steps += 1;
        host.log_metric(
            "edge/reflections_failed",
            report.failed_reflections.len() as f64,
        );
        host.log_metric(
            "edge/entries_too_long",
            std::mem::take(&mut self.state.entries_too_long) as f64,
        );
        if !self.config.closes_window(report.step) {
            return Ok(());
        }
        let m = manage(
            &self.config,
            &self.state.window,
            report.step,
            &outcomes,
            host,
        )?;
        self.state.window = Window::default();
        self.state.windows += 1;
        for (name, value) in [
            ("edge/bank_size", m.bank_size as f64),
            ("edge/bank_utility_mean", m.utility_mean),
            ("edge/credited", m.credited as f64),
            ("edge/retired", m.retired.len() as f64),
            ("edge/evicted", m.evicted.len() as f64),
            ("edge/reflections_requested", m.requested as f64),
            ("edge/reflections_refused", m.refused as f64),
        ] {
            host.log_metric(name, value);
        }
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("edge", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        if let Some(state) = cairn_plugin_sdk::state::load_state("edge", state)? {
            self.state = state;
        }
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "edge",
    description: "EDGE: half-group experience injection, same-anchor gain admission, reverse-KL distillation toward the experience-conditioned policy, and a co-evolving experience bank",
    create: Edge::from_config_json,
}

#[cfg(test)]
mod tests;
