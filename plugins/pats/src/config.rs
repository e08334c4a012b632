//! `algorithm.stack[i].config` of `pats`: the keys, their proposed defaults and the checks
//! that turn a bad value into a config error naming the key.
//!
//! Every constant here is ours (Pats is a proposal; see `docs/algorithms/pats.md`).

use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::{PluginError, Result};
use serde::Deserialize;

/// The plugin's config. Unknown keys are refused.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PatsConfig {
    /// `G_s`: slots of each group that get the task's scaffold; the rest play plain. `None`:
    /// half the group, rounded down. Must leave at least one plain slot.
    pub scaffolded_slots: Option<u32>,
    /// `δ`: the gain band. `Δ > δ` keeps a scaffold, `Δ < −δ` revises it, `|Δ| ≤ δ` over a full
    /// window removes it ("no effect"). In `[0, 1)`.
    pub delta: f64,
    /// `τ_solve`: a plain success rate `p_0 ≥ τ_solve` removes the scaffold ("graduated").
    /// In `(0, 1]`.
    pub tau_solve: f64,
    /// `K`: evidence cards of a (task, scaffold) the evaluation pools, newest last. ≥ 1.
    pub window: u32,
    /// A general scaffold for tasks without one of their own in the bank (empty: none).
    pub scaffold: String,
    /// Creation requests to the skill creator per step, at most (0: never create).
    pub max_new_scaffolds: u32,
    /// Longest scaffold text injected, in characters (Unicode scalar values). A longer one
    /// arriving from the skill creator is retired and never injected.
    pub max_scaffold_chars: u32,
    /// Coefficient of the `pats-distill` teacher term (scaffolded → plain); 0 turns it off.
    pub coef: f32,
}

impl Default for PatsConfig {
    fn default() -> Self {
        PatsConfig {
            scaffolded_slots: None,
            delta: 0.05,
            tau_solve: 0.8,
            window: 3,
            scaffold: String::new(),
            max_new_scaffolds: 4,
            max_scaffold_chars: 600,
            coef: 0.0,
        }
    }
}

impl PatsConfig {
    /// Parses and checks a JSON config object (empty or `null`: the defaults).
    pub fn from_json(json: &str) -> Result<Self> {
        let config: PatsConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(config)
    }

    /// Rejects invalid values, naming the key and the accepted range.
    pub fn validate(&self) -> Result<()> {
        fn check(ok: bool, message: impl Into<String>) -> Result<()> {
            PluginError::check_config(ok, message)
        }
        check(
            self.scaffolded_slots != Some(0),
            "`scaffolded_slots` = 0: no slot would see the scaffold; give at least 1, or leave \
             the key out for half the group",
        )?;
        check_range(
            "delta",
            self.delta,
            Range::ClosedOpen(0.0, 1.0),
            "the gain band",
            "proposed 0.05",
        )?;
        check_range(
            "tau_solve",
            self.tau_solve,
            Range::OpenClosed(0.0, 1.0),
            "a success rate threshold",
            "proposed 0.8",
        )?;
        check(
            self.window >= 1,
            "`window` = 0: the evaluation needs at least one evidence card (proposed 3)",
        )?;
        check(
            self.max_scaffold_chars >= 1,
            "`max_scaffold_chars` = 0: no scaffold could be injected; give a positive length \
             (proposed 600)",
        )?;
        let chars = self.scaffold.chars().count();
        check(
            self.scaffold.is_empty() || !self.scaffold.trim().is_empty(),
            "`scaffold` is blank: give the text of the general scaffold, or leave the key out",
        )?;
        check(
            chars <= self.max_scaffold_chars as usize,
            format!(
                "`scaffold` has {chars} characters, more than `max_scaffold_chars` = {}; \
                 shorten it or raise the limit",
                self.max_scaffold_chars
            ),
        )?;
        check(
            self.coef.is_finite() && self.coef >= 0.0,
            format!(
                "`coef` = {}: must be a finite number ≥ 0 (0 turns distillation off)",
                self.coef
            ),
        )
    }

    /// `G_s` for a group of `group_size`: the configured value or half the group. An error
    /// when the group would have no scaffolded or no plain slot.
    pub fn scaffolded_slots(&self, group_size: u32) -> Result<u32> {
        let g_s = self.scaffolded_slots.unwrap_or(group_size / 2);
        match self.scaffolded_slots {
            Some(_) if g_s >= group_size => Err(PluginError::config(format!(
                "`scaffolded_slots` = {g_s} leaves no plain slot in a group of {group_size}; \
                 set it below `rollout.group_size`, or leave it out for half the group"
            ))),
            None if g_s == 0 => Err(PluginError::config(format!(
                "pats splits each group into a scaffolded and a plain arm, but the groups have \
                 {group_size} slot; set `rollout.group_size` to at least 2"
            ))),
            _ => Ok(g_s),
        }
    }

    /// Whether `text` may be injected: not blank and at most `max_scaffold_chars` long.
    pub fn fits(&self, text: &str) -> bool {
        !text.trim().is_empty() && text.chars().count() <= self.max_scaffold_chars as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `json` and returns the error message (or "ok").
    fn check(json: &str, expected_start: &str) {
        let got = match PatsConfig::from_json(json) {
            Ok(_) => "ok".to_string(),
            Err(e) => e.message,
        };
        assert!(got.starts_with(expected_start), "{json}: {got}");
    }

    #[test]
    fn defaults_are_the_proposal() {
        let c = PatsConfig::from_json("").unwrap();
        assert_eq!(c, PatsConfig::default());
        assert_eq!(
            (c.delta, c.tau_solve, c.window, c.max_new_scaffolds),
            (0.05, 0.8, 3, 4)
        );
        assert_eq!((c.max_scaffold_chars, c.coef), (600, 0.0));
        assert_eq!(c.scaffolded_slots(8).unwrap(), 4);
        assert_eq!(c.scaffolded_slots(7).unwrap(), 3);
        let c = PatsConfig::from_json(r#"{"scaffolded_slots": 6}"#).unwrap();
        assert_eq!(c.scaffolded_slots(8).unwrap(), 6);
    }

    #[test]
    fn bad_values_name_the_key() {
        check(r#"{"scaffolded_slots": 0}"#, "`scaffolded_slots` = 0");
        check(r#"{"scaffolded_slots": -1}"#, "`scaffolded_slots`");
        check(r#"{"delta": -0.1}"#, "`delta` = -0.1");
        check(r#"{"delta": 1.0}"#, "`delta` = 1");
        check(r#"{"tau_solve": 0}"#, "`tau_solve` = 0");
        check(r#"{"tau_solve": 1.5}"#, "`tau_solve` = 1.5");
        check(r#"{"window": 0}"#, "`window` = 0");
        check(r#"{"max_scaffold_chars": 0}"#, "`max_scaffold_chars` = 0");
        check(r#"{"scaffold": "  "}"#, "`scaffold` is blank");
        check(
            r#"{"scaffold": "abcdef", "max_scaffold_chars": 5}"#,
            "`scaffold` has 6 characters",
        );
        check(r#"{"coef": -1}"#, "`coef` = -1");
        check(r#"{"max_new_scaffolds": "many"}"#, "`max_new_scaffolds`");
        check(r#"{"windw": 3}"#, "unknown field `windw`");
        check(r#"{"tau_solve": 1.0, "delta": 0.0, "coef": 0.5}"#, "ok");
    }

    #[test]
    fn every_group_keeps_both_arms() {
        let c = PatsConfig::from_json(r#"{"scaffolded_slots": 4}"#).unwrap();
        let e = c.scaffolded_slots(4).unwrap_err();
        assert!(
            e.message
                .starts_with("`scaffolded_slots` = 4 leaves no plain slot in a group of 4"),
            "{e}"
        );
        let e = PatsConfig::default().scaffolded_slots(1).unwrap_err();
        assert!(e.message.contains("at least 2"), "{e}");
    }

    #[test]
    fn fits_counts_characters_not_bytes() {
        let c = PatsConfig::from_json(r#"{"max_scaffold_chars": 3}"#).unwrap();
        assert!(c.fits("äöü"));
        assert!(!c.fits("abcd"));
        assert!(!c.fits(" \n"));
    }
}
