//! `algorithm.stack[i].config` of `ucob`: every key, its default and its checks.
//! `docs/algorithms/ucob.md` has the same table.
//!
//! Defaults are UCOB's (github TU2021/UCOB, `ucob_trainer.yaml` and the `cbsd` block its
//! `main_ucob.py` reads) where UCOB has the key; the field says "ours" where it does not.

use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::{PluginError, Result, TeacherForm};
use serde::{Deserialize, Serialize};

/// The two views of a group's slots (UCOB's `dynamic_memory_branch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Branch {
    /// The slot ran with the group's retrieved skills injected (UCOB's `good`).
    #[serde(rename = "good")]
    Good,
    /// The slot ran without skills (UCOB's `none`).
    #[serde(rename = "none")]
    NoSkill,
}

impl Branch {
    pub fn as_str(self) -> &'static str {
        match self {
            Branch::Good => "good",
            Branch::NoSkill => "none",
        }
    }

    /// The other view: skills removed from a `good` prompt, added to a `none` one.
    pub fn opposite(self) -> Branch {
        match self {
            Branch::Good => Branch::NoSkill,
            Branch::NoSkill => Branch::Good,
        }
    }

    /// Parses `"good"` / `"none"`.
    pub fn parse(s: &str) -> Option<Branch> {
        match s {
            "good" => Some(Branch::Good),
            "none" => Some(Branch::NoSkill),
            _ => None,
        }
    }
}

/// Which view a pair's target is trained in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetPolicy {
    /// The view opposite to the winner's branch: whichever view won at this state teaches
    /// the other (UCOB's default).
    #[default]
    Opposite,
    /// Always the no-skill view (the winner's response is trained under prompts without
    /// skills).
    None,
    /// Always the skill view.
    Good,
}

/// The distillation loss of an auxiliary row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Top-k on-policy distillation: a `TeacherForm::TopKForwardKl { k: topk_k }` teacher
    /// term with fixed teacher top-k scores (UCOB's `loss_type = topk_opd`). Falls back to
    /// `sampled` for a step whose host cannot return top-k scores.
    #[default]
    TopkOpd,
    /// The gated sampled-token form of UCOB's `compute_sdar_loss`: a C-type auxiliary term
    /// with `c_l = −w_l` (gate included), gradient `−coef · w_l · ∇ℓ^S_l`.
    Sampled,
}

/// Which response tokens are the environment action (UCOB's parsed action span).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpan {
    /// The plain action format of Cairn's environments: the whole response is the action,
    /// so every mask-1 token is an action token except the stop id that ends a response
    /// with `finish_reason = stop` (its last mask-1 token). Ours.
    #[default]
    Plain,
    /// Think/act formats: the tokens between an `action_open` and the next `action_close`
    /// id sequence (both found in the response ids as tokenised by `Host::tokenize`; an
    /// unclosed tag runs to the end of the response, stop id excluded), as UCOB's
    /// `<action>…</action>` pattern. A response without the opening tag has no action
    /// tokens (counted in `ucob/action_span_missing`).
    Tagged,
    /// No action tokens: `action_weight` never applies.
    None,
}

/// Which tokens of an auxiliary row are distilled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Every mask-1 token of the winner's response, with `action_weight` on the action
    /// tokens (UCOB's `opd_scope = response`).
    #[default]
    Response,
    /// Only the action tokens, each with weight `w`; turns without action tokens are not
    /// records (UCOB's `opd_scope = action`).
    Action,
}

/// Where the skill creator's entries are kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkillScope {
    /// Specific to the task they came from (`task_id` set).
    #[default]
    Task,
    /// General (`task_id` none): every task may retrieve them by BM25 relevance; the source
    /// task is kept in the entry's `extra.ucob_task`.
    General,
}

/// The plugin's config (see the module docs).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UcobConfig {
    /// Coefficient of the `ucob-cbsd` term (`cbsd.coef`).
    pub coef: f32,
    /// A pair is kept only when its return gap is strictly above this (`cbsd.margin`).
    pub margin: f64,
    /// Pair weight `w = min(gap / tau, weight_max)` (`cbsd.tau`), > 0.
    pub tau: f64,
    /// Cap of the pair weight (`cbsd.weight_max`).
    pub weight_max: f64,
    /// Pairs kept per same-anchor cell, the largest gaps first; 0: all
    /// (`cbsd.max_pairs_per_group`, which UCOB's code applies per cell).
    pub max_pairs_per_group: usize,
    /// Branches a cell's winner may come from (`cbsd.source_branches`), non-empty.
    pub source_branches: Vec<Branch>,
    /// The view a pair's target is trained in (`cbsd.target_policy`).
    pub target_policy: TargetPolicy,
    /// The distillation loss (`cbsd.loss_type`).
    pub loss: Loss,
    /// `k` of the top-k form (`cbsd.topk_k`), ≥ 1.
    pub topk_k: u32,
    /// Whether the sampled-token gate multiplies the weights (`cbsd.gate_enable`).
    pub gate_enable: bool,
    /// β of the gate `σ(β (ℓ^T − ℓ^S))` (`cbsd.gate_beta`), finite, ≥ 0.
    pub gate_beta: f64,
    /// Weight factor on the action tokens with `scope = response` (`cbsd.action_weight`),
    /// finite, ≥ 0.
    pub action_weight: f64,
    /// Which tokens are the action (ours; UCOB parses `<action>` tags from decoded text).
    pub action_span: ActionSpan,
    /// Opening tag of `action_span = tagged`.
    pub action_open: String,
    /// Closing tag of `action_span = tagged`.
    pub action_close: String,
    /// Which tokens are distilled (`cbsd.opd_scope`).
    pub scope: Scope,
    /// Discount of the turn returns `G_{i,t}` (`algorithm.gamma`), in [0, 1].
    pub gamma: f64,
    /// Turns whose action the environment rejected (`feedback = −1`, UCOB's
    /// `is_action_valid = false`) are not records.
    pub skip_invalid: bool,
    /// Skills injected into a `good` slot (UCOB's skill memory `task_top_k`), ≥ 1.
    pub skills_top_k: usize,
    /// A skill longer than this (Unicode scalar values) is never injected; it is skipped and
    /// counted (`ucob/skills_too_long`), never truncated. Ours.
    pub max_skill_chars: usize,
    /// The line above the injected skills (each then on its own `- ` line); empty: the
    /// skills alone, one per line. Ours.
    pub header: String,
    /// Reflections asked of the skill creator per step; 0 turns the creator off (then the
    /// bank must be written by something else). Ours (UCOB reflects with its own LLM call).
    pub max_reflections_per_step: usize,
    /// A task stops getting reflections once the bank holds this many of its skills. Ours.
    pub max_skills_per_task: usize,
    /// Steps a task waits after a reflection request before it may get another (its
    /// entry arrives at a later step). Ours.
    pub reflection_cooldown: u64,
    /// Where written skills are kept. Ours.
    pub skill_scope: SkillScope,
}

/// The default [`UcobConfig::header`].
pub const DEFAULT_HEADER: &str = "Skills for tasks like this one:";

impl Default for UcobConfig {
    fn default() -> Self {
        UcobConfig {
            coef: 0.1,
            margin: 0.05,
            tau: 0.2,
            weight_max: 2.0,
            max_pairs_per_group: 2,
            source_branches: vec![Branch::Good, Branch::NoSkill],
            target_policy: TargetPolicy::Opposite,
            loss: Loss::TopkOpd,
            topk_k: 32,
            gate_enable: true,
            gate_beta: 5.0,
            action_weight: 2.0,
            action_span: ActionSpan::Plain,
            action_open: "<action>".into(),
            action_close: "</action>".into(),
            scope: Scope::Response,
            gamma: 0.95,
            skip_invalid: true,
            skills_top_k: 3,
            max_skill_chars: 600,
            header: DEFAULT_HEADER.into(),
            max_reflections_per_step: 2,
            max_skills_per_task: 3,
            reflection_cooldown: 5,
            skill_scope: SkillScope::Task,
        }
    }
}

impl UcobConfig {
    /// Parses and checks a JSON config; errors name the key and the accepted range.
    pub fn from_json(json: &str) -> Result<Self> {
        let config: UcobConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        PluginError::check_config(
            self.coef.is_finite() && self.coef >= 0.0,
            format!(
                "`coef` = {}: must be a finite number ≥ 0 (UCOB uses 0.1)",
                self.coef
            ),
        )?;
        PluginError::check_config(
            self.margin.is_finite() && self.margin >= 0.0,
            format!(
                "`margin` = {}: a return gap, finite and ≥ 0 (UCOB uses 0.05)",
                self.margin
            ),
        )?;
        PluginError::check_config(
            self.tau.is_finite() && self.tau > 0.0,
            format!(
                "`tau` = {}: the weight scale must be finite and > 0 (UCOB uses 0.2)",
                self.tau
            ),
        )?;
        PluginError::check_config(
            self.weight_max.is_finite() && self.weight_max > 0.0,
            format!(
                "`weight_max` = {}: the weight cap must be finite and > 0 (UCOB uses 2.0)",
                self.weight_max
            ),
        )?;
        PluginError::check_config(
            !self.source_branches.is_empty(),
            "`source_branches` is empty: no record could win a cell; give `[\"good\", \"none\"]` \
             (UCOB's default) or one of them",
        )?;
        PluginError::check_config(
            self.topk_k >= 1,
            "`topk_k` = 0: the top-k form needs k ≥ 1 (UCOB uses 32)",
        )?;
        check_range(
            "gate_beta",
            self.gate_beta,
            Range::AtLeast(0.0),
            "",
            "UCOB uses 5.0",
        )?;
        PluginError::check_config(
            self.action_weight.is_finite() && self.action_weight >= 0.0,
            format!(
                "`action_weight` = {}: must be finite and ≥ 0 (UCOB uses 2.0; 1 weighs action \
                 tokens like the rest)",
                self.action_weight
            ),
        )?;
        if self.action_span == ActionSpan::Tagged {
            for (key, tag) in [
                ("action_open", &self.action_open),
                ("action_close", &self.action_close),
            ] {
                PluginError::check_config(
                    !tag.is_empty(),
                    format!(
                        "`{key}` is empty: `action_span = \"tagged\"` finds the action between \
                         two tags; give both (default \"<action>\" and \"</action>\")"
                    ),
                )?;
            }
        }
        check_range(
            "gamma",
            self.gamma,
            Range::Closed(0.0, 1.0),
            "the discount",
            "UCOB uses 0.95",
        )?;
        PluginError::check_config(
            self.skills_top_k >= 1,
            "`skills_top_k` = 0: skill slots would get no skill; give ≥ 1 (UCOB uses 3)",
        )?;
        PluginError::check_config(
            self.max_skill_chars >= 1,
            "`max_skill_chars` = 0: give the longest skill to inject, in characters (default \
             600)",
        )?;
        PluginError::check_config(
            self.max_reflections_per_step == 0 || self.max_skills_per_task >= 1,
            "`max_skills_per_task` = 0 with reflections on: no task could get a skill; give ≥ 1 \
             (default 3) or set `max_reflections_per_step = 0`",
        )?;
        Ok(())
    }

    /// The form of the `ucob-cbsd` teacher term in the top-k mode.
    pub fn topk_form(&self) -> TeacherForm {
        TeacherForm::TopKForwardKl { k: self.topk_k }
    }

    /// Whether the skill creator is asked for skills.
    pub fn reflects(&self) -> bool {
        self.max_reflections_per_step > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ucobs_and_every_key_parses() {
        let c = UcobConfig::from_json("").unwrap();
        assert_eq!(c, UcobConfig::default());
        assert_eq!(
            (c.coef, c.margin, c.tau, c.weight_max, c.max_pairs_per_group),
            (0.1, 0.05, 0.2, 2.0, 2)
        );
        assert_eq!(c.source_branches, [Branch::Good, Branch::NoSkill]);
        assert_eq!(c.target_policy, TargetPolicy::Opposite);
        assert_eq!(c.topk_form(), TeacherForm::TopKForwardKl { k: 32 });
        assert_eq!((c.gate_beta, c.action_weight, c.gamma), (5.0, 2.0, 0.95));
        let c = UcobConfig::from_json(
            r#"{"coef": 0.5, "margin": 0.1, "tau": 0.5, "weight_max": 3.0,
                "max_pairs_per_group": 0, "source_branches": ["good"], "target_policy": "none",
                "loss": "sampled", "topk_k": 4, "gate_enable": false, "gate_beta": 2.0,
                "action_weight": 1.0, "action_span": "tagged", "action_open": "[",
                "action_close": "]", "scope": "action", "gamma": 0.9, "skip_invalid": false,
                "skills_top_k": 2, "max_skill_chars": 50, "header": "",
                "max_reflections_per_step": 0, "max_skills_per_task": 0,
                "reflection_cooldown": 1, "skill_scope": "general"}"#,
        )
        .unwrap();
        assert_eq!(
            c,
            UcobConfig {
                coef: 0.5,
                margin: 0.1,
                tau: 0.5,
                weight_max: 3.0,
                max_pairs_per_group: 0,
                source_branches: vec![Branch::Good],
                target_policy: TargetPolicy::None,
                loss: Loss::Sampled,
                topk_k: 4,
                gate_enable: false,
                gate_beta: 2.0,
                action_weight: 1.0,
                action_span: ActionSpan::Tagged,
                action_open: "[".into(),
                action_close: "]".into(),
                scope: Scope::Action,
                gamma: 0.9,
                skip_invalid: false,
                skills_top_k: 2,
                max_skill_chars: 50,
                header: String::new(),
                max_reflections_per_step: 0,
                max_skills_per_task: 0,
                reflection_cooldown: 1,
                skill_scope: SkillScope::General,
            }
        );
        assert!(!c.reflects());
    }

    #[test]
    fn branches_are_opposite_and_parse() {
        assert_eq!(Branch::Good.opposite(), Branch::NoSkill);
        assert_eq!(Branch::NoSkill.opposite(), Branch::Good);
        for b in [Branch::Good, Branch::NoSkill] {
            assert_eq!(Branch::parse(b.as_str()), Some(b));
        }
        assert_eq!(Branch::parse("bad"), None);
    }

    #[test]
    fn bad_values_name_the_key() {
        let check = |json: &str, want: &str| {
            let e = UcobConfig::from_json(json).unwrap_err();
            assert!(e.message.starts_with(want), "{json}: {e}");
        };
        check(r#"{"coef": -1}"#, "`coef` = -1");
        check(r#"{"margin": -0.1}"#, "`margin` = -0.1");
        check(r#"{"tau": 0}"#, "`tau` = 0");
        check(r#"{"weight_max": 0}"#, "`weight_max` = 0");
        check(r#"{"source_branches": []}"#, "`source_branches` is empty");
        check(r#"{"source_branches": ["bad"]}"#, "`source_branches`");
        check(r#"{"target_policy": "all"}"#, "`target_policy`");
        check(r#"{"loss": "nll"}"#, "`loss`");
        check(r#"{"topk_k": 0}"#, "`topk_k` = 0");
        check(r#"{"gate_beta": -1}"#, "`gate_beta` = -1");
        check(r#"{"action_weight": -2}"#, "`action_weight` = -2");
        check(r#"{"action_span": "words"}"#, "`action_span`");
        check(
            r#"{"action_span": "tagged", "action_close": ""}"#,
            "`action_close` is empty",
        );
        check(r#"{"scope": "all"}"#, "`scope`");
        check(r#"{"gamma": 1.5}"#, "`gamma` = 1.5");
        check(r#"{"skills_top_k": 0}"#, "`skills_top_k` = 0");
        check(r#"{"max_skill_chars": 0}"#, "`max_skill_chars` = 0");
        check(r#"{"max_skills_per_task": 0}"#, "`max_skills_per_task` = 0");
        check(r#"{"skill_scope": "global"}"#, "`skill_scope`");
        check(r#"{"topk_k": "many"}"#, "`topk_k`");
        let e = UcobConfig::from_json(r#"{"topk": 3}"#).unwrap_err();
        assert!(e.message.contains("unknown field `topk`"), "{e}");
    }
}
