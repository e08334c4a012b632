//! `algorithm.stack[i].config` of `icsd`: every key, its default and its checks.
//! `docs/algorithms/icsd.md` has the same table. Every default is ours (ICSD is a proposal).

use cairn_opsd::SkillConfig;
use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::{PluginError, Result};
use serde::Deserialize;

/// The per-token influence `I_l`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Influence {
    /// `|Δ_l|`: the teacher–student disagreement on the sampled token.
    #[default]
    Gap,
    /// `|Δ_l| · |Â_i|`, with `Â_i` the GRPO outcome advantage of the row's trajectory
    /// (recomputed here from the episode rewards: a stacked plugin does not see the
    /// estimator's advantages).
    GapTimesAdvantage,
}

/// The base OPSD term the weights multiply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Base {
    /// Ungated sampled-token reverse KL, coefficient `Δ_l` on `−ℓ^S` (gradient
    /// `−λ w_l Δ_l ∇ℓ^S_l`): a teacher term with weights `w_l`.
    #[default]
    ReverseKl,
    /// SDAR's gated reverse KL, coefficient `g_l Δ_l`: weights `w_l g_l`.
    GatedReverseKl,
    /// SDAR's gated likelihood form (the UCOB reimplementation's), coefficient `g_l`
    /// (gradient `−λ w_l g_l ∇ℓ^S_l`): an aux term with coefficients `−w_l g_l`.
    GatedUcob,
}

impl Base {
    pub fn gated(self) -> bool {
        !matches!(self, Base::ReverseKl)
    }
}

/// The plugin's config.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IcsdConfig {
    /// λ: coefficient of the `icsd-distill` term.
    pub coef: f32,
    /// Lower clip of the calibrated weight `z = I / mean(I)`.
    pub w_min: f64,
    /// Upper clip.
    pub w_max: f64,
    /// Clip-and-rescale rounds: 1 keeps the weights the per-turn rescale gives, even where it
    /// moves them outside `[w_min, w_max]`; each further round clips and rescales again.
    pub rescale_rounds: u32,
    /// What a token's influence is.
    pub influence: Influence,
    /// The base term.
    pub base: Base,
    /// β of the gate `σ(β Δ)`, read only by the gated bases.
    pub beta: f64,
    /// The teacher's skills (retrieval and creation).
    pub skills: SkillConfig,
}

impl Default for IcsdConfig {
    fn default() -> Self {
        IcsdConfig {
            coef: 0.1,
            w_min: 0.25,
            w_max: 2.0,
            rescale_rounds: 1,
            influence: Influence::Gap,
            base: Base::ReverseKl,
            beta: 5.0,
            skills: SkillConfig::default(),
        }
    }
}

impl IcsdConfig {
    /// Parses and checks a JSON config; errors name the key (`skills.<key>` inside the
    /// `skills` table) and the accepted range.
    pub fn from_json(json: &str) -> Result<Self> {
        let (mut config, skills) = cairn_opsd::config::parse_with_skills::<IcsdConfig>(json)?;
        config.skills = skills;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        check_range("coef", self.coef, Range::AtLeast(0.0), "λ", "default 0.1")?;
        PluginError::check_config(
            self.w_min.is_finite() && self.w_min > 0.0,
            format!(
                "`w_min` = {}: the lower weight clip must be a finite number > 0 (default 0.25), \
                 so every turn's weights have a positive sum",
                self.w_min
            ),
        )?;
        PluginError::check_config(
            self.w_max.is_finite() && self.w_max >= self.w_min,
            format!(
                "`w_max` = {}: the upper weight clip must be finite and ≥ `w_min` = {} \
                 (defaults 2.0 and 0.25)",
                self.w_max, self.w_min
            ),
        )?;
        PluginError::check_config(
            (1..=100).contains(&self.rescale_rounds),
            format!(
                "`rescale_rounds` = {}: give 1 to 100 clip-and-rescale rounds (default 1)",
                self.rescale_rounds
            ),
        )?;
        PluginError::check_config(
            !self.base.gated() || (self.beta.is_finite() && self.beta > 0.0),
            format!(
                "`beta` = {}: the gated bases need a finite β > 0 (default 5.0)",
                self.beta
            ),
        )?;
        self.skills.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_every_key_parse() {
        let c = IcsdConfig::from_json("").unwrap();
        assert_eq!(c, IcsdConfig::default());
        assert_eq!((c.coef, c.w_min, c.w_max), (0.1, 0.25, 2.0));
        assert_eq!((c.influence, c.base), (Influence::Gap, Base::ReverseKl));
        let c = IcsdConfig::from_json(
            r#"{"coef": 0.2, "w_min": 0.5, "w_max": 0.5, "influence": "gap_times_advantage",
                "base": "gated_ucob", "beta": 2.0, "rescale_rounds": 3, "skills": {"k": 1}}"#,
        )
        .unwrap();
        assert_eq!(c.rescale_rounds, 3);
        assert_eq!((c.coef, c.w_min, c.w_max, c.beta), (0.2, 0.5, 0.5, 2.0));
        assert_eq!(
            (c.influence, c.base),
            (Influence::GapTimesAdvantage, Base::GatedUcob)
        );
        assert_eq!(c.skills.k, 1);
        let c = IcsdConfig::from_json(r#"{"base": "gated_reverse_kl"}"#).unwrap();
        assert!(c.base.gated());
    }

    #[test]
    fn bad_values_name_the_key() {
        let check = |json: &str, want: &str| {
            let e = IcsdConfig::from_json(json).unwrap_err();
            assert!(e.message.starts_with(want), "{json}: {e}");
        };
        check(r#"{"coef": -1}"#, "`coef` = -1");
        check(r#"{"w_min": 0}"#, "`w_min` = 0");
        check(r#"{"w_min": -0.5}"#, "`w_min` = -0.5");
        check(r#"{"w_min": 3, "w_max": 2}"#, "`w_max` = 2");
        check(r#"{"w_max": 0.1}"#, "`w_max` = 0.1");
        check(r#"{"base": "gated_ucob", "beta": 0}"#, "`beta` = 0");
        check(r#"{"rescale_rounds": 0}"#, "`rescale_rounds` = 0");
        check(r#"{"rescale_rounds": 101}"#, "`rescale_rounds` = 101");
        check(r#"{"influence": "advantage"}"#, "`influence`");
        check(r#"{"base": "kl"}"#, "`base`");
        check(r#"{"skills": {"max_chars": 0}}"#, "`skills.max_chars` = 0");
        check(r#"{"skills": {"k": 0}}"#, "`skills.k` = 0");
        check(r#"{"skills": {"k": -2}}"#, "`skills.k`: invalid value");
        check(
            r#"{"skills": {"scope": "x"}}"#,
            "`skills.scope`: unknown variant `x`",
        );
        check(
            r#"{"skills": {"kk": 1}}"#,
            "`skills.kk`: unknown field `kk`",
        );
        let e = IcsdConfig::from_json(r#"{"wmin": 1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `wmin`"), "{e}");
        // β is not read by the ungated base.
        IcsdConfig::from_json(r#"{"beta": 0}"#).unwrap();
    }
}
