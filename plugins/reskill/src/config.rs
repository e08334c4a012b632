//! `algorithm.stack[i].config` of `reskill`: every key, its default and its check.

use serde::Deserialize;

use cairn_plugin_sdk::{PluginError, Result};

use crate::ab::WeightingStrategy;

/// The plugin's config. Defaults are ReSkill's (`configs/base.yaml` and
/// `skill_ab_tracker.py` of amazon-science/reskill) except `create_every`, which is ours.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReskillConfig {
    /// Flushed steps an A/B test runs at least (`ab_test_steps`).
    pub test_steps: u32,
    /// Episodes (both versions) an A/B test collects at least.
    pub min_episodes: u64,
    /// Clamp of the new version's assignment probability `p_new`.
    pub p_new_min: f64,
    pub p_new_max: f64,
    /// How earlier steps are discounted: `"dynamic"`, `"none"` or `"last_step"`.
    pub weighting_strategy: WeightingStrategy,
    /// The horizon grid of the `dynamic` fit is `M = 1..=m_grid_max`.
    pub m_grid_max: u32,
    /// Steps between two skill requests (the creator runs only when no test runs and no
    /// request is pending).
    pub create_every: u32,
    /// Episodes the reservoir must hold before the creator runs (`min_reservoir_size`).
    pub min_reservoir: u32,
    /// Episodes the reservoir keeps, the most recent ones (`reservoir_max_size`).
    pub reservoir_size: u32,
    /// Longest skill text accepted, in characters (`max_skill_content_chars`).
    pub max_skill_chars: u32,
    /// Share of its target episodes a new skill's trigger must fire on.
    pub min_trigger_rate: f64,
    /// Most skills injected into one turn's context.
    pub max_active_skills: u32,
}

impl Default for ReskillConfig {
    fn default() -> Self {
        ReskillConfig {
            test_steps: 5,
            min_episodes: 50,
            p_new_min: 0.15,
            p_new_max: 0.85,
            weighting_strategy: WeightingStrategy::Dynamic,
            m_grid_max: 2000,
            create_every: 1,
            min_reservoir: 100,
            reservoir_size: 200,
            max_skill_chars: 500,
            min_trigger_rate: 0.5,
            max_active_skills: 8,
        }
    }
}

impl ReskillConfig {
    /// Parses and checks a JSON config; every error names its key.
    pub fn from_json(json: &str) -> Result<ReskillConfig> {
        let config: ReskillConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<()> {
        PluginError::check_config(
            self.test_steps >= 1,
            format!("`test_steps` = {} must be at least 1", self.test_steps),
        )?;
        for (key, v) in [("p_new_min", self.p_new_min), ("p_new_max", self.p_new_max)] {
            PluginError::check_config(
                (0.0..=1.0).contains(&v),
                format!("`{key}` = {v} must be a probability in [0, 1]"),
            )?;
        }
        PluginError::check_config(
            self.p_new_min <= self.p_new_max,
            format!(
                "`p_new_min` = {} must not exceed `p_new_max` = {}",
                self.p_new_min, self.p_new_max
            ),
        )?;
        PluginError::check_config(
            self.m_grid_max >= 1,
            "`m_grid_max` = 0 leaves the horizon grid empty; give at least 1 (ReSkill: 2000)",
        )?;
        PluginError::check_config(
            self.create_every >= 1,
            "`create_every` = 0: give the steps between two skill requests, at least 1",
        )?;
        PluginError::check_config(
            self.reservoir_size >= 2,
            format!(
                "`reservoir_size` = {} must be at least 2 (a success and a failure)",
                self.reservoir_size
            ),
        )?;
        PluginError::check_config(
            self.min_reservoir <= self.reservoir_size,
            format!(
                "`min_reservoir` = {} exceeds `reservoir_size` = {}, so the creator would never \
                 run; lower it or raise `reservoir_size`",
                self.min_reservoir, self.reservoir_size
            ),
        )?;
        PluginError::check_config(
            self.max_skill_chars >= 1,
            "`max_skill_chars` = 0 rejects every skill; give at least 1 (ReSkill: 500)",
        )?;
        PluginError::check_config(
            (0.0..=1.0).contains(&self.min_trigger_rate),
            format!(
                "`min_trigger_rate` = {} must be a share in [0, 1]",
                self.min_trigger_rate
            ),
        )?;
        PluginError::check_config(
            self.max_active_skills >= 1,
            "`max_active_skills` = 0 would never inject a skill; give at least 1 (ReSkill: 8)",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(json: &str) -> String {
        ReskillConfig::from_json(json).unwrap_err().message
    }

    #[test]
    fn defaults_are_reskills() {
        let c = ReskillConfig::from_json("").unwrap();
        assert_eq!(c, ReskillConfig::default());
        assert_eq!((c.test_steps, c.min_episodes), (5, 50));
        assert_eq!((c.p_new_min, c.p_new_max), (0.15, 0.85));
        assert_eq!(c.weighting_strategy, WeightingStrategy::Dynamic);
        assert_eq!(
            (c.m_grid_max, c.reservoir_size, c.min_reservoir),
            (2000, 200, 100)
        );
        assert_eq!((c.max_skill_chars, c.max_active_skills), (500, 8));
        assert_eq!((c.min_trigger_rate, c.create_every), (0.5, 1));
        let c = ReskillConfig::from_json(
            r#"{"weighting_strategy": "last_step", "test_steps": 3, "min_episodes": 8}"#,
        )
        .unwrap();
        assert_eq!(c.weighting_strategy, WeightingStrategy::LastStep);
        assert_eq!((c.test_steps, c.min_episodes), (3, 8));
    }

    #[test]
    fn every_bad_value_names_its_key() {
        for (json, start) in [
            (r#"{"test_steps": 0}"#, "`test_steps` = 0"),
            (r#"{"min_episodes": -1}"#, "`min_episodes`"),
            (r#"{"p_new_min": -0.1}"#, "`p_new_min` = -0.1"),
            (r#"{"p_new_max": 1.5}"#, "`p_new_max` = 1.5"),
            (
                r#"{"p_new_min": 0.9}"#,
                "`p_new_min` = 0.9 must not exceed `p_new_max`",
            ),
            (
                r#"{"weighting_strategy": "sometimes"}"#,
                "`weighting_strategy`",
            ),
            (r#"{"m_grid_max": 0}"#, "`m_grid_max` = 0"),
            (r#"{"create_every": 0}"#, "`create_every` = 0"),
            (
                r#"{"reservoir_size": 1, "min_reservoir": 1}"#,
                "`reservoir_size` = 1",
            ),
            (r#"{"min_reservoir": 300}"#, "`min_reservoir` = 300"),
            (r#"{"max_skill_chars": 0}"#, "`max_skill_chars` = 0"),
            (r#"{"min_trigger_rate": 2}"#, "`min_trigger_rate` = 2"),
            (r#"{"max_active_skills": 0}"#, "`max_active_skills` = 0"),
        ] {
            let e = error(json);
            assert!(e.starts_with(start), "{json}: {e}");
        }
        assert!(error(r#"{"test_step": 5}"#).contains("unknown field `test_step`"));
        assert!(error(r#"{"weighting_strategy": "sometimes"}"#).contains("dynamic"));
    }
}
