//! The `skills` table of the `sdar` and `icsd` configs: where the teacher's skills come from
//! and how they are written.
//!
//! ```toml
//! [[algorithm.stack]]
//! plugin = "sdar"
//! config = { coef = 0.1, skills = { k = 3, reflect = true, max_per_task = 1 } }
//! ```

use cairn_plugin_sdk::{PluginError, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// Parses a plugin's JSON config whose `skills` key is a [`SkillConfig`] (the `sdar` and
/// `icsd` configs), as [`cairn_plugin_sdk::config::parse_config`] does, but with the errors of
/// the `skills` table naming the full key: `` `skills.scope`: unknown variant … ``,
/// `` `skills.kk`: unknown field `kk` … `` (the SDK's parser names only the top-level key,
/// `skills`, or none for an unknown field). Returns the config without its `skills` (`T`'s
/// default there) and the parsed table; checks neither ([`SkillConfig::validate`] does).
pub fn parse_with_skills<T: DeserializeOwned>(json: &str) -> Result<(T, SkillConfig)> {
    let text = json.trim();
    let mut map = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => map,
        // Empty, `null`, not JSON or not an object: the SDK's parser accepts or words it.
        _ => {
            return cairn_plugin_sdk::config::parse_config::<T>(json)
                .map(|config| (config, SkillConfig::default()))
        }
    };
    let skills = map.remove("skills");
    let config = cairn_plugin_sdk::config::parse_config::<T>(&Value::Object(map).to_string())?;
    let skills = match skills {
        None => SkillConfig::default(),
        Some(value) => parse_skills(&value)?,
    };
    Ok((config, skills))
}

/// Parses the `skills` table; errors name the key as `skills.<key>`.
fn parse_skills(value: &Value) -> Result<SkillConfig> {
    if !value.is_object() {
        return Err(PluginError::config(format!(
            "`skills` = {value}: must be a table of the teacher's skill settings, e.g. \
             `skills = {{ k = 3, reflect = true }}`"
        )));
    }
    cairn_plugin_sdk::config::parse_config::<SkillConfig>(&value.to_string()).map_err(|e| {
        let message = if let Some(rest) = e.message.strip_prefix('`') {
            // `` `k`: invalid type … `` → `` `skills.k`: invalid type … ``
            format!("`skills.{rest}")
        } else if let Some(rest) = e.message.strip_prefix("unknown field `") {
            let key = rest.split('`').next().unwrap_or_default();
            format!("`skills.{key}`: {}", e.message)
        } else {
            format!("`skills`: {}", e.message)
        };
        PluginError::new(e.kind, message)
    })
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

    /// A plugin config with a `skills` table: the skills the way `sdar` and `icsd` read them.
    fn parse(json: &str) -> Result<SkillConfig> {
        let (outer, skills) = parse_with_skills::<Outer>(json)?;
        assert_eq!(outer.skills, SkillConfig::default());
        Ok(skills)
    }

    #[test]
    fn bad_values_name_the_key() {
        let check = |json: &str, want: &str| {
            let e = parse(json).unwrap().validate().unwrap_err();
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
    }

    #[test]
    fn errors_inside_the_skills_table_name_the_full_key() {
        let check = |json: &str, want: &[&str]| {
            let e = parse(json).unwrap_err();
            assert_eq!(e.kind, cairn_plugin_sdk::ErrorKind::Config);
            for w in want {
                assert!(e.message.contains(w), "{json}: {e}");
            }
        };
        check(
            r#"{"skills": {"kk": 1}}"#,
            &["`skills.kk`: unknown field `kk`", "expected one of `k`"],
        );
        check(
            r#"{"skills": {"scope": "all"}}"#,
            &[
                "`skills.scope`: unknown variant `all`",
                "`task`",
                "`general`",
            ],
        );
        check(
            r#"{"skills": {"k": "three"}}"#,
            &["`skills.k`: invalid type"],
        );
        check(r#"{"skills": {"k": -1}}"#, &["`skills.k`: invalid value"]);
        check(
            r#"{"skills": {"reflect": "yes", "k": 2}}"#,
            &["`skills.reflect`: invalid type"],
        );
        check(r#"{"skills": 3}"#, &["`skills` = 3: must be a table"]);
        // Outside the table the SDK's errors are unchanged.
        let e = parse_with_skills::<Outer>(r#"{"skils": {}}"#).unwrap_err();
        assert!(e.message.contains("unknown field `skils`"), "{e}");
        let e = parse_with_skills::<Outer>("[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{e}");
        assert_eq!(parse("").unwrap(), SkillConfig::default());
        assert_eq!(parse("null").unwrap(), SkillConfig::default());
        assert_eq!(parse(r#"{"skills": {"k": 5}}"#).unwrap().k, 5);
    }
}
