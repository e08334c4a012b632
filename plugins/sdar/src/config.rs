//! `algorithm.stack[i].config` of `sdar`: every key, its default and its checks.
//! `docs/algorithms/sdar.md` has the same table.

use cairn_opsd::SkillConfig;
use cairn_plugin_sdk::{PluginError, Result, TeacherForm};
use serde::Deserialize;

/// The per-token distillation term `d_l` the gate multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// The public reimplementation's (github TU2021/UCOB, `sdar_utils.py`):
    /// `d_l = sg(ℓ^T_l) − ℓ^S_l`, gradient `−λ g_l ∇ℓ^S_l`: the gate-weighted likelihood of
    /// the sampled token. An aux (C-type) term with coefficients `c_l = −g_l`.
    #[default]
    Ucob,
    /// The score-function reverse KL on sampled tokens (EDGE's form), gradient
    /// `−λ g_l Δ_l ∇ℓ^S_l` (`Δ` live in the update): a teacher term
    /// (`sampled_reverse_kl`) with weights `g_l` and the fixed teacher log-probs `ℓ^T`.
    ReverseKl,
    /// `g_l · KL(p^T ‖ p^S)` on the teacher's top-`top_k` ids, both renormalised (the
    /// reimplementation's top-k variant): a `top_k_forward_kl` teacher term.
    TopKForwardKl,
    /// `g_l · KL(p^S ‖ p^T)` on the teacher's top-`top_k` ids: a `top_k_reverse_kl` term.
    TopKReverseKl,
}

impl Form {
    pub fn is_top_k(self) -> bool {
        matches!(self, Form::TopKForwardKl | Form::TopKReverseKl)
    }
}

/// The plugin's config. Defaults are the public reimplementation's where it has one.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SdarConfig {
    /// λ: coefficient of the `sdar-distill` term (the reimplementation's `sdar_coef`).
    pub coef: f32,
    /// β: sharpness of the gate `σ(β Δ)` (the reimplementation's `gate_beta`). Read only with
    /// `gate = true`.
    pub beta: f64,
    /// The sigmoid gate. Off: `g = 1` on every token, naive (ungated) OPSD.
    pub gate: bool,
    /// The distillation term the gate multiplies.
    pub form: Form,
    /// `k` of the top-k forms (read only by them; ours, as EDGE's top-k default).
    pub top_k: u32,
    /// The teacher's skills (retrieval and creation).
    pub skills: SkillConfig,
}

impl Default for SdarConfig {
    fn default() -> Self {
        SdarConfig {
            coef: 0.1,
            beta: 5.0,
            gate: true,
            form: Form::Ucob,
            top_k: 20,
            skills: SkillConfig::default(),
        }
    }
}

impl SdarConfig {
    /// Parses and checks a JSON config; errors name the key (`skills.<key>` inside the
    /// `skills` table) and the accepted range.
    pub fn from_json(json: &str) -> Result<Self> {
        let (mut config, skills) = cairn_opsd::config::parse_with_skills::<SdarConfig>(json)?;
        config.skills = skills;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        PluginError::check_config(
            self.coef.is_finite() && self.coef >= 0.0,
            format!(
                "`coef` = {}: λ must be a finite number ≥ 0 (default 0.1)",
                self.coef
            ),
        )?;
        PluginError::check_config(
            !self.gate || (self.beta.is_finite() && self.beta > 0.0),
            format!(
                "`beta` = {}: the gate σ(β·Δ) needs a finite β > 0 (default 5.0); for ungated \
                 OPSD set `gate = false`",
                self.beta
            ),
        )?;
        PluginError::check_config(
            !self.form.is_top_k() || self.top_k >= 1,
            "`top_k` = 0: the top-k forms need k ≥ 1 (default 20)",
        )?;
        self.skills.validate()
    }

    /// The `k` to ask the scorer for: `top_k` for the top-k forms, else 0.
    pub fn scored_top_k(&self) -> u32 {
        if self.form.is_top_k() {
            self.top_k
        } else {
            0
        }
    }

    /// The teacher form of the `sdar-distill` term (`None`: the aux form).
    pub fn teacher_form(&self) -> Option<TeacherForm> {
        match self.form {
            Form::Ucob => None,
            Form::ReverseKl => Some(TeacherForm::SampledReverseKl),
            Form::TopKForwardKl => Some(TeacherForm::TopKForwardKl { k: self.top_k }),
            Form::TopKReverseKl => Some(TeacherForm::TopKReverseKl { k: self.top_k }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_opsd::Scope;

    #[test]
    fn defaults_are_the_reimplementations_and_every_key_parses() {
        let c = SdarConfig::from_json("").unwrap();
        assert_eq!(c, SdarConfig::default());
        assert_eq!(
            (c.coef, c.beta, c.gate, c.form),
            (0.1, 5.0, true, Form::Ucob)
        );
        assert_eq!(c.skills.k, 3);
        assert_eq!((c.scored_top_k(), c.teacher_form()), (0, None));
        let c = SdarConfig::from_json(
            r#"{"coef": 0.5, "beta": 2.0, "gate": false, "form": "top_k_forward_kl",
                "top_k": 4, "skills": {"k": 1, "scope": "general"}}"#,
        )
        .unwrap();
        assert_eq!((c.coef, c.beta, c.gate), (0.5, 2.0, false));
        assert_eq!(c.form, Form::TopKForwardKl);
        assert_eq!(c.scored_top_k(), 4);
        assert_eq!(c.teacher_form(), Some(TeacherForm::TopKForwardKl { k: 4 }));
        assert_eq!((c.skills.k, c.skills.scope), (1, Scope::General));
        for (form, want) in [
            ("reverse_kl", TeacherForm::SampledReverseKl),
            ("top_k_reverse_kl", TeacherForm::TopKReverseKl { k: 20 }),
        ] {
            let c = SdarConfig::from_json(&format!(r#"{{"form": "{form}"}}"#)).unwrap();
            assert_eq!(c.teacher_form(), Some(want));
        }
    }

    #[test]
    fn bad_values_name_the_key() {
        let check = |json: &str, want: &str| {
            let e = SdarConfig::from_json(json).unwrap_err();
            assert!(e.message.starts_with(want), "{json}: {e}");
        };
        check(r#"{"coef": -0.1}"#, "`coef` = -0.1");
        check(r#"{"beta": 0}"#, "`beta` = 0");
        check(r#"{"beta": -5}"#, "`beta` = -5");
        check(r#"{"form": "top_k_reverse_kl", "top_k": 0}"#, "`top_k` = 0");
        check(r#"{"form": "kl"}"#, "`form`");
        check(r#"{"gate": "yes"}"#, "`gate`");
        check(r#"{"skills": {"k": 0}}"#, "`skills.k` = 0");
        check(r#"{"skills": {"k": "3"}}"#, "`skills.k`: invalid type");
        check(
            r#"{"skills": {"scope": "x"}}"#,
            "`skills.scope`: unknown variant `x`",
        );
        check(
            r#"{"skills": {"kk": 1}}"#,
            "`skills.kk`: unknown field `kk`",
        );
        check(
            r#"{"coef": 0.5, "skills": {"max_per_task": 0}}"#,
            "`skills.max_per_task` = 0",
        );
        let e = SdarConfig::from_json(r#"{"lambda": 0.1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `lambda`"), "{e}");
        // β is not read without the gate, and `top_k` not without a top-k form.
        SdarConfig::from_json(r#"{"gate": false, "beta": 0}"#).unwrap();
        SdarConfig::from_json(r#"{"top_k": 0}"#).unwrap();
    }
}
