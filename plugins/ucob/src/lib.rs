//! `ucob`: UCOB, credit-aware on-policy bidirectional self-distillation (following the code
//! of github TU2021/UCOB: `main_ucob.py`, `sdar_utils.py`, `dp_actor.py`,
//! `ucob_trainer.yaml`; `docs/algorithms/ucob.md`). A [`Role::Planner`] stacked on an
//! advantage estimator (UCOB trains over GiGPO), which keeps computing every advantage:
//!
//! ```toml
//! [algorithm]
//! plugin = "gigpo"                # or "grpo"
//! config = { gamma = 0.95 }
//! [[algorithm.stack]]
//! plugin = "ucob"
//! config = { coef = 0.1 }
//! ```
//!
//! Each hook does one part of the method:
//! 1. **Two-view mixed rollouts** ([`Algorithm::plan_group`], [`plan`]): in a group of n the
//!    first ⌊n/2⌋ slots run without skills (branch `none`), the rest with the top
//!    `skills_top_k` `Skill` entries the bank retrieves for the task (branch `good`, label
//!    `skill:<count>`). The branch and the skill ids are in `variant.extra` (`ucob_branch`,
//!    `skill_ids`). With no skill found every slot is `none`.
//! 2. **CBSD pairs** ([`Algorithm::signals`], [`pairs`], [`cbsd`]): per same-anchor cell the
//!    highest-return record wins; the other records (or, failing them, the winner itself)
//!    are its targets in the opposite view, kept above a return margin with weight
//!    `min(gap/τ, w_max)`.
//! 3. **Auxiliary rows**: per pair one extra row, the winner's sampled response verbatim
//!    trained under the target's prompt in the target view.
//! 4. **Gated top-k OPD**: one term, `ucob-cbsd`: a `TopKForwardKl { k }` teacher term with
//!    the winner's own prompt as the (fixed, re-scored) teacher, per-token weights
//!    `w · action factor · σ(β(ℓ^T − ℓ^S))` ([`tokens`]); the sampled-token form where the
//!    host cannot return top-k scores, or with `loss = "sampled"`.
//! 5. **Skills** ([`Algorithm::observe`], [`creator`]): reflections through the skill
//!    creator, so a run from an empty bank builds one; exposures and successes of the shown
//!    skills.
//!
//! Metrics (in the signals): `ucob/success_good`, `ucob/success_none`, `ucob/records`,
//! `ucob/cells`, `ucob/raw_pairs`, `ucob/margin_filtered`, `ucob/missing_prompt`,
//! `ucob/pairs`, `ucob/pairs_good_to_none`, `ucob/pairs_none_to_good`,
//! `ucob/fallback_pairs`, `ucob/cells_without_skills`, `ucob/render_mismatch`,
//! `ucob/action_span_missing`, `ucob/aux_tokens`, `ucob/gap_mean`, `ucob/weight_mean`,
//! `ucob/gate_mean`, `ucob/topk_unavailable`; from planning (summed over the step's groups):
//! `ucob/groups_without_skills`, `ucob/skills_too_long`; from `observe`:
//! `ucob/reflections_requested`, `ucob/reflections_refused`, `ucob/reflections_failed`,
//! `ucob/skills_written`, `ucob/exposure_updates_failed`.

use std::collections::BTreeMap;

use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, EntryKind, GroupRequest, Host, PluginError, Requirements,
    Result, Role, Signals, StepReport,
};
use serde::{Deserialize, Serialize};

pub mod cbsd;
pub mod config;
pub mod creator;
pub mod pairs;
pub mod plan;
#[cfg(test)]
mod testing;
pub mod tokens;

pub use cbsd::{aux_info, AUX_KEY, TERM};
pub use config::{ActionSpan, Branch, Loss, Scope, SkillScope, TargetPolicy, UcobConfig};
pub use pairs::{cell_pairs, CellPairs, Pair, Record};

/// What the plugin keeps across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UcobState {
    /// Steps observed.
    pub steps: u64,
    /// The step of each task's last reflection request.
    pub last_request: BTreeMap<String, u64>,
}

pub struct Ucob {
    config: UcobConfig,
    state: UcobState,
}

impl Ucob {
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Ucob {
            config: UcobConfig::from_json(json)?,
            state: UcobState::default(),
        })
    }

    pub fn config(&self) -> &UcobConfig {
        &self.config
    }

    pub fn state(&self) -> &UcobState {
        &self.state
    }
}

impl Algorithm for Ucob {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Planner,
            anchor_keys: true,
            step_rewards: true,
            teacher_scores: true,
            teacher_topk: self.config.loss == Loss::TopkOpd,
            bank: vec![EntryKind::Skill],
            reflection: self.config.reflects(),
            min_group_size: 2,
            ..Requirements::default()
        }
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let n = request.group_size;
        if n < 2 {
            return Err(PluginError::input(format!(
                "group {} has {n} slot(s); ucob splits every group into a no-skill and a skill \
                 half, so set rollout.group_size ≥ 2",
                request.group_id
            )));
        }
        let none = plan::none_variant(request);
        let found = plan::retrieve(&self.config, request, host)?;
        host.log_metric("ucob/skills_too_long", found.too_long as f64);
        if found.entries.is_empty() {
            host.log_metric("ucob/groups_without_skills", 1.0);
            return Ok(plan::slots(n, &none, None));
        }
        let good = plan::good_variant(&self.config.header, request, &found.entries);
        Ok(plan::slots(n, &none, Some(&good)))
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        cbsd::signals(&self.config, batch, host)
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        self.state.steps += 1;
        host.log_metric(
            "ucob/reflections_failed",
            report.failed_reflections.len() as f64,
        );
        host.log_metric("ucob/skills_written", report.new_entries.len() as f64);
        let updates = creator::exposure_updates(&report.batch)?;
        if !updates.is_empty() {
            // A skill retired meanwhile, or a bank error: counted, training goes on.
            let failed = host.bank_update(&updates).is_err();
            host.log_metric("ucob/exposure_updates_failed", f64::from(u8::from(failed)));
        }
        if self.config.reflects() {
            let created = creator::reflect(
                &self.config,
                report.step,
                &self.state.last_request,
                &report.batch,
                host,
            )?;
            for task in created.tasks {
                self.state.last_request.insert(task, report.step);
            }
            host.log_metric("ucob/reflections_requested", created.requested as f64);
            host.log_metric("ucob/reflections_refused", created.refused as f64);
        }
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("ucob", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        if let Some(state) = cairn_plugin_sdk::state::load_state("ucob", state)? {
            self.state = state;
        }
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "ucob",
    description: "UCOB: two-view mixed rollouts (with / without retrieved skills), same-anchor winner and target pairs, auxiliary rows of the winner's response under the target's other-view prompt, gated top-k on-policy distillation, skills written by the skill creator",
    create: Ucob::from_config_json,
}

#[cfg(test)]
mod tests;
