//! `algorithm.stack[i].config` of `opid`: every key, its default (the OPID ALFWorld script's,
//! github jinyangwu/OPID `examples/opid_trainer/run_alfworld_opid_guide.sh`, where it has one)
//! and its checks. `docs/algorithms/opid.md` has the same table.
//!
//! The estimator's own weights are not here: `A^ep + w_step · A^S` is `grpo`'s or `gigpo`'s
//! advantage (`gigpo`'s `omega` is OPID's `w_step`; the OPID script uses 0).

use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::{PluginError, Result};
use serde::Deserialize;

/// Which skill contexts a turn is scored under (github jinyangwu/OPID, `opid/prompting.py`,
/// `select_skill_teacher_sources`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Critical-first: a turn with a step skill (and `w_st > 0`) is scored under the
    /// step-skill context only; every other turn with an episode skill under the episode-skill
    /// context.
    #[default]
    StepPriority,
    /// Both contexts wherever each skill exists; both teacher advantages are added.
    Additive,
}

/// Who picks the critical turns a trajectory's step skills may be written for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Critical {
    /// The analyzer, among all the trajectory's turns (at most `max_step_skills`).
    #[default]
    Analyzer,
    /// The statistical selector over the step's anchor-state groups
    /// ([`crate::critical::select`]); the analyzer writes step skills for those turns only.
    /// Needs anchor keys.
    Statistical,
}

/// Normalisation of each teacher advantage over its active tokens in the batch
/// (`normalize_teacher_adv`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalise {
    /// None (the OPID script's `normalize_teacher_adv = False`).
    #[default]
    None,
    /// Subtract the mean.
    MeanNorm,
    /// Subtract the mean, divide by the population std plus ε when the std is > ε (else only
    /// subtract the mean), as OPID's `compute_teacher_token_advantage` does.
    MeanStdNorm,
}

/// What a teacher log-prob is compared with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// `ℓ_old`, the kernel's log-probs of the row under its training prompt (the paper's
    /// `ℓ^T − ℓ_old`). Used only when the kernel's prompt builder reproduces that prompt from
    /// the row; otherwise the row's plain context is re-scored (counted).
    #[default]
    Old,
    /// Always re-score the row's plain context with the same weights as the teacher (ours:
    /// exact at any `rollout.max_staleness`, one more scoring per routed row).
    Rescored,
}

/// Which earlier trajectories' skills a row may use (ours; see `docs/algorithms/opid.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Skills of earlier trajectories of the same task (`task_id`).
    #[default]
    Task,
    /// Skills of any earlier trajectory: one episode skill per outcome and step skills keyed
    /// by anchor (or turn) alone.
    General,
}

/// The plugin's config.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpidConfig {
    /// `w_ep`, weight of the episode-skill teacher advantage
    /// (`episode_skill_teacher_advantage_w`).
    pub w_ep: f32,
    /// `w_st`, weight of the step-skill teacher advantage (`step_skill_teacher_advantage_w`).
    pub w_st: f32,
    /// Critical-first or additive routing.
    pub routing: Routing,
    /// Who picks critical turns.
    pub critical: Critical,
    /// `K`: step skills kept per analysed trajectory, the first `K` valid ones in reply order
    /// (`analysis_max_step_skills_per_traj`).
    pub max_step_skills: u32,
    /// Analyse only failed trajectories (`failed_only`).
    pub failed_only: bool,
    /// Re-asks of the analyzer after a reply that is not the JSON object
    /// (`OPID_ANALYSIS_PARSE_RETRIES`, which counts attempts: its 2 attempts are 1 re-ask;
    /// ours counts re-asks, default 2). At most 10.
    pub retries: u32,
    /// Normalisation of each teacher advantage.
    pub normalise: Normalise,
    /// Clip each teacher advantage to `[−clip, clip]` after normalisation (`clip_teacher_adv`;
    /// none by default).
    pub clip: Option<f32>,
    /// `ε` of the normalisation.
    pub eps: f64,
    /// What teacher log-probs are compared with.
    pub reference: Reference,
    /// Which earlier trajectories' skills a row may use.
    pub scope: Scope,
    /// Discount `γ` of the turn returns the statistical selector ranks.
    pub gamma: f64,
    /// The statistical selector's variance cut: an anchor group is eligible when its return
    /// variance is at least this quantile of the variances of the groups with at least
    /// `min_group_size` rows (`stats_var_quantile`).
    pub var_quantile: f64,
    /// Smallest anchor group the statistical selector considers (`stats_min_group_size`).
    pub min_group_size: u32,
    /// Critical turns the statistical selector keeps per trajectory (`stats_topk_per_traj`).
    pub critical_per_trajectory: u32,
    /// A skill longer than this (Unicode scalar values) is not kept (counted as
    /// `opid/skills_too_long`), never truncated. Ours: OPID has no such limit; it bounds the
    /// re-scored contexts.
    pub max_skill_chars: usize,
    /// The line above an episode skill in its context (ours; OPID's `**Episode-Level Skill**`
    /// section title).
    pub episode_header: String,
    /// The line above a step skill in its context (ours; OPID's `**Critical-Step Skill**`).
    pub step_header: String,
}

/// The default [`OpidConfig::episode_header`].
pub const EPISODE_HEADER: &str =
    "Episode skill, from earlier attempts at this task; refer to it when deciding what to do:";
/// The default [`OpidConfig::step_header`].
pub const STEP_HEADER: &str = "Step skill for this decision only:";

impl Default for OpidConfig {
    fn default() -> Self {
        OpidConfig {
            w_ep: 0.001,
            w_st: 0.001,
            routing: Routing::StepPriority,
            critical: Critical::Analyzer,
            max_step_skills: 5,
            failed_only: false,
            retries: 2,
            normalise: Normalise::None,
            clip: None,
            eps: 1e-6,
            reference: Reference::Old,
            scope: Scope::Task,
            gamma: 0.95,
            var_quantile: 0.75,
            min_group_size: 2,
            critical_per_trajectory: 1,
            max_skill_chars: 1000,
            episode_header: EPISODE_HEADER.into(),
            step_header: STEP_HEADER.into(),
        }
    }
}

impl OpidConfig {
    /// Parses and checks a JSON config; errors name the key and the accepted range.
    pub fn from_json(json: &str) -> Result<Self> {
        let config: OpidConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        for (key, value) in [("w_ep", self.w_ep), ("w_st", self.w_st)] {
            PluginError::check_config(
                value.is_finite() && value >= 0.0,
                format!("`{key}` = {value}: must be a finite number ≥ 0 (OPID uses 0.001)"),
            )?;
        }
        PluginError::check_config(
            self.w_ep > 0.0 || self.w_st > 0.0,
            "`w_ep` and `w_st` are both 0: opid would add nothing; give at least one a \
             weight > 0 (OPID uses 0.001 for both), or remove opid from the stack",
        )?;
        PluginError::check_config(
            self.max_step_skills >= 1 || self.w_st == 0.0,
            format!(
                "`max_step_skills` = 0 with `w_st` = {}: no step skill would ever be kept, so \
                 the step-skill term would never apply; give `max_step_skills` ≥ 1 (OPID uses \
                 5), or set `w_st = 0` to train with episode skills only",
                self.w_st
            ),
        )?;
        PluginError::check_config(
            self.retries <= 10,
            format!(
                "`retries` = {}: re-asks of the analyzer, at most 10 (default 2)",
                self.retries
            ),
        )?;
        if let Some(c) = self.clip {
            PluginError::check_config(
                c.is_finite() && c > 0.0,
                format!("`clip` = {c}: must be a finite number > 0, or left out for no clip"),
            )?;
        }
        PluginError::check_config(
            self.eps.is_finite() && self.eps > 0.0,
            format!(
                "`eps` = {}: must be a finite number > 0 (default 1e-6)",
                self.eps
            ),
        )?;
        check_range(
            "gamma",
            self.gamma,
            Range::Closed(0.0, 1.0),
            "the discount",
            "OPID uses 0.95",
        )?;
        PluginError::check_config(
            self.var_quantile.is_finite() && (0.0..=1.0).contains(&self.var_quantile),
            format!(
                "`var_quantile` = {}: a quantile, in [0, 1] (OPID uses 0.75)",
                self.var_quantile
            ),
        )?;
        PluginError::check_config(
            self.min_group_size >= 2,
            format!(
                "`min_group_size` = {}: a group needs at least 2 rows to have a variance \
                 (OPID uses 2)",
                self.min_group_size
            ),
        )?;
        PluginError::check_config(
            self.critical_per_trajectory >= 1,
            "`critical_per_trajectory` = 0: the statistical selector would pick nothing; \
             give at least 1 (OPID uses 1)",
        )?;
        PluginError::check_config(
            self.max_skill_chars >= 1,
            "`max_skill_chars` = 0: give the longest skill to keep, in characters (default \
             1000)",
        )?;
        Ok(())
    }
}
