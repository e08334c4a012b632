//! The `skills` table of the `sdar` and `icsd` configs: where the teacher's skills come from
//! and how they are written.
//!
//! ```toml
//! [[algorithm.stack]]
//! plugin = "sdar"
//! config = { coef = 0.1, skills = { k = 3, reflect = true, max_per_task = 1 } }
//! ```

use cairn_plugin_sdk::{PluginError, Result};
use serde::{Deserialize, Serialize};

/// Where a new skill is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Specific to the task whose trajectory it came from (`task_id` set): retrieved for that
    /// task's rows only.
    #[default]
    Task,
    /// General (`task_id` none): retrieved for any task whose observation it matches (BM25).
    /// The source task is kept in the entry's `extra.skill_task`.
    General,
}

/// The teacher's skills: retrieval (`k`, `header`, `max_chars`) and creation (`reflect`,
/// `max_reflections_per_step`, `max_per_task`, `scope`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SkillConfig {
    /// Skills injected into a row's teacher context: the top `k` BM25 matches of the row's
    /// observation among the active skills of its task and the general ones (SDAR's
    /// reimplementation retrieves 3).
    pub k: usize,
    /// The line above the injected skills (each then on its own `- ` line). Empty: the skill
    /// texts alone, one per line.
    pub header: String,
    /// A skill longer than this (Unicode scalar values) is never injected: skipped and
    /// counted, never truncated.
    pub max_chars: usize,
    /// Ask the skill creator for skills from successful trajectories (in `observe`). Off: the
    /// bank's skills come from elsewhere (another plugin, `cairn bank`).
    pub reflect: bool,
    /// Reflections asked per step at most.
    pub max_reflections_per_step: usize,
    /// A task gets no new reflection once it has this many skills (or one is pending).
    pub max_per_task: usize,
    /// Where new skills are kept.
    pub scope: Scope,
}

/// The default [`SkillConfig::header`].
pub const DEFAULT_HEADER: &str = "Skills from earlier successful attempts:";

impl Default for SkillConfig {
    fn default() -> Self {
        SkillConfig {
            k: 3,
            header: DEFAULT_HEADER.into(),
            max_chars: 600,
            reflect: true,
            max_reflections_per_step: 2,
            max_per_task: 1,
            scope: Scope::Task,
        }
    }
}

impl SkillConfig {
    /// Checks every value; errors name the key as `skills.<key>`.
    pub fn validate(&self) -> Result<()> {
        PluginError::check_config(
            self.k >= 1,
            "`skills.k` = 0: give the number of skills to inject into the teacher's context, \
             ≥ 1 (default 3)",
        )?;
        PluginError::check_config(
            self.max_chars >= 1,
            "`skills.max_chars` = 0: give the longest skill to inject, in characters (default \
             600)",
        )?;
        PluginError::check_config(
            !self.reflect || self.max_reflections_per_step >= 1,
            "`skills.max_reflections_per_step` = 0 with `skills.reflect = true`: allow at least \
             one reflection per step (default 2), or set `skills.reflect = false`",
        )?;
        PluginError::check_config(
            !self.reflect || self.max_per_task >= 1,
            "`skills.max_per_task` = 0 with `skills.reflect = true`: allow at least one skill per \
             task (default 1), or set `skills.reflect = false`",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default)]
        skills: SkillConfig,
    }

    #[test]
    fn defaults_and_every_key_parse() {
        let o: Outer = cairn_plugin_sdk::config::parse_config("").unwrap();
        assert_eq!(o.skills, SkillConfig::default());
        o.skills.validate().unwrap();
        let o: Outer = cairn_plugin_sdk::config::parse_config(
            r#"{"skills": {"k": 2, "header": "", "max_chars": 9, "reflect": false,
                "max_reflections_per_step": 0, "max_per_task": 0, "scope": "general"}}"#,
        )
        .unwrap();
        o.skills.validate().unwrap();
        assert_eq!(
            o.skills,
            SkillConfig {
                k: 2,
                header: String::new(),
                max_chars: 9,
                reflect: false,
                max_reflections_per_step: 0,
                max_per_task: 0,
                scope: Scope::General,
            }
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let check = |json: &str, want: &str| {
            let o: Outer = cairn_plugin_sdk::config::parse_config(json).unwrap();
            let e = o.skills.validate().unwrap_err();
            assert!(e.message.starts_with(want), "{json}: {e}");
        };
        check(r#"{"skills": {"k": 0}}"#, "`skills.k` = 0");
        check(r#"{"skills": {"max_chars": 0}}"#, "`skills.max_chars` = 0");
        check(
            r#"{"skills": {"max_reflections_per_step": 0}}"#,
            "`skills.max_reflections_per_step` = 0",
        );
        check(
            r#"{"skills": {"max_per_task": 0}}"#,
            "`skills.max_per_task` = 0",
        );
        let e = cairn_plugin_sdk::config::parse_config::<Outer>(r#"{"skills": {"kk": 1}}"#)
            .unwrap_err();
        assert!(e.message.contains("unknown field `kk`"), "{e}");
        let e = cairn_plugin_sdk::config::parse_config::<Outer>(r#"{"skills": {"scope": "all"}}"#)
            .unwrap_err();
        assert!(e.message.starts_with("`skills`"), "{e}");
    }
}
