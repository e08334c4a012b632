//! The plugin's JSON config: parsing with named-key errors, defaults and validation.

use serde::Deserialize;

use cairn_plugin_sdk::{PluginError, Result};

use crate::catalog::TaskKind;
use crate::world::Knobs;

/// Receptacle kinds the smallest room pool holds: the upper bound for `max_receptacles`.
const MAX_RECEPTACLES: u32 = 16;
const MAX_DISTRACTORS: u32 = 16;
/// The expert needs up to about 10 steps for the simplest two-object tasks; a smaller cap
/// would make generation reject almost every draw.
const MIN_EXPERT_STEPS: u32 = 10;
/// Upper bound of `max_expert_steps` in the knowledge regime, where it may exceed `max_turns`:
/// the blind expert searches every listed place within about 30 steps, so a larger cap filters
/// nothing and would only lengthen the check of a draw.
const MAX_EXPERT_STEPS_KNOWLEDGE: u32 = 60;

/// The household's configuration. Every key is optional; unknown keys are an error.
///
/// ```json
/// {"max_turns": 20, "train_tasks": 10000, "test_tasks": 500,
///  "task_kinds": ["pick_and_place", "pick_heat_then_place"],
///  "min_receptacles": 6, "max_receptacles": 9, "min_distractors": 2, "max_distractors": 5,
///  "max_expert_steps": 14, "invalid_penalty": 0.0, "knowledge": false}
/// ```
///
/// The knowledge regime (see the crate docs, "Knowledge regime"), with the turn limit below
/// what blind search needs:
///
/// ```json
/// {"knowledge": true, "max_turns": 8, "max_expert_steps": 20,
///  "min_receptacles": 12, "max_receptacles": 14,
///  "task_kinds": ["pick_and_place", "look_at_obj_in_light", "pick_clean_then_place",
///                 "pick_heat_then_place", "pick_cool_then_place"]}
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HouseholdConfig {
    /// Turn limit of an episode: at this turn an unsolved episode ends with `success = false`.
    pub max_turns: u32,
    /// Generated tasks whose expert solution is longer than this are redrawn, so the expert
    /// solves every task within `max_turns`. At least 10 and at most `max_turns`; with
    /// `knowledge` at most 60 and free to exceed `max_turns` (the expert searches blindly, so
    /// a turn limit below its solution length is what makes knowledge of the homes pay).
    pub max_expert_steps: u32,
    /// Number of training tasks (indices `0..train_tasks`).
    pub train_tasks: u64,
    /// Number of held-out tasks (indices `0..test_tasks`).
    pub test_tasks: u64,
    /// The task kinds to generate (names from [`TaskKind::name`]); task `i` has kind
    /// `task_kinds[i % len]`.
    pub task_kinds: Vec<String>,
    /// Fewest receptacles in a room (a task's required receptacles may add more).
    pub min_receptacles: u32,
    /// Most receptacles drawn for a room, at most 16.
    pub max_receptacles: u32,
    /// Fewest distractor objects (kinds other than the target).
    pub min_distractors: u32,
    /// Most distractor objects, at most 16.
    pub max_distractors: u32,
    /// Subtracted from the reward of a step whose action was invalid (`nothing happens .`).
    pub invalid_penalty: f32,
    /// The knowledge regime: every target starts in its room's fixed home receptacle kind for
    /// that object ([`crate::home_of`]), the room holds every kind plausible for the target, and
    /// `unsearched :` lists places in a per-task shuffled order. `false` (the default) leaves
    /// every task, observation and expert action exactly as without the key.
    pub knowledge: bool,
}

impl Default for HouseholdConfig {
    fn default() -> Self {
        HouseholdConfig {
            max_turns: 20,
            max_expert_steps: 14,
            train_tasks: 10_000,
            test_tasks: 500,
            task_kinds: TaskKind::ALL.iter().map(|k| k.name().to_string()).collect(),
            min_receptacles: 6,
            max_receptacles: 9,
            min_distractors: 2,
            max_distractors: 5,
            invalid_penalty: 0.0,
            knowledge: false,
        }
    }
}

impl HouseholdConfig {
    /// Parses a config from JSON text. Empty text or `null` gives the defaults. An error names
    /// the offending key (and, for an unknown key, the allowed ones).
    pub fn from_json(text: &str) -> Result<HouseholdConfig> {
        let value: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(text).map_err(|e| {
                PluginError::config(format!("household config is not valid JSON: {e}"))
            })?
        };
        let map = match value {
            serde_json::Value::Null => return Ok(HouseholdConfig::default()),
            serde_json::Value::Object(map) => map,
            other => {
                return Err(PluginError::config(format!(
                    "household config must be a JSON object, got `{other}`"
                )))
            }
        };
        // Deserialise key by key first, so a type error names its key (serde_json's own
        // message only gives a line and column). Unknown keys fail here too, with serde's
        // "unknown field `x`, expected one of ..." message.
        for (key, item) in &map {
            let single =
                serde_json::Value::Object([(key.clone(), item.clone())].into_iter().collect());
            if let Err(e) = serde_json::from_value::<HouseholdConfig>(single) {
                return Err(PluginError::config(format!(
                    "household config key `{key}`: {e}"
                )));
            }
        }
        let config: HouseholdConfig = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(|e| PluginError::config(format!("household config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the values against each other and against the generator's limits.
    pub fn validate(&self) -> Result<()> {
        let fail = |key: &str, why: String| {
            Err(PluginError::config(format!(
                "household config key `{key}`: {why}"
            )))
        };
        if self.max_turns == 0 {
            return fail("max_turns", "must be at least 1".into());
        }
        if self.knowledge {
            if !(MIN_EXPERT_STEPS..=MAX_EXPERT_STEPS_KNOWLEDGE).contains(&self.max_expert_steps) {
                return fail(
                    "max_expert_steps",
                    format!(
                        "is {}, must be between {MIN_EXPERT_STEPS} and \
                         {MAX_EXPERT_STEPS_KNOWLEDGE} with knowledge = true",
                        self.max_expert_steps
                    ),
                );
            }
        } else if self.max_expert_steps < MIN_EXPERT_STEPS || self.max_expert_steps > self.max_turns
        {
            return fail(
                "max_expert_steps",
                format!(
                    "is {}, must be between {MIN_EXPERT_STEPS} and max_turns ({}); only \
                     knowledge = true allows a cap above max_turns",
                    self.max_expert_steps, self.max_turns
                ),
            );
        }
        if self.task_kinds.is_empty() {
            return fail("task_kinds", "must name at least one task kind".into());
        }
        for (i, name) in self.task_kinds.iter().enumerate() {
            if TaskKind::from_name(name).is_none() {
                let allowed: Vec<&str> = TaskKind::ALL.iter().map(|k| k.name()).collect();
                return fail(
                    "task_kinds",
                    format!(
                        "unknown kind `{name}`, expected one of {}",
                        allowed.join(", ")
                    ),
                );
            }
            if self.task_kinds[..i].contains(name) {
                return fail("task_kinds", format!("`{name}` is listed twice"));
            }
        }
        if self.min_receptacles > self.max_receptacles || self.max_receptacles > MAX_RECEPTACLES {
            return fail(
                "max_receptacles",
                format!(
                    "need min_receptacles ({}) <= max_receptacles ({}) <= {MAX_RECEPTACLES}",
                    self.min_receptacles, self.max_receptacles
                ),
            );
        }
        if self.min_distractors > self.max_distractors || self.max_distractors > MAX_DISTRACTORS {
            return fail(
                "max_distractors",
                format!(
                    "need min_distractors ({}) <= max_distractors ({}) <= {MAX_DISTRACTORS}",
                    self.min_distractors, self.max_distractors
                ),
            );
        }
        if !(self.invalid_penalty.is_finite() && self.invalid_penalty >= 0.0) {
            return fail(
                "invalid_penalty",
                format!("is {}, must be a finite number >= 0", self.invalid_penalty),
            );
        }
        Ok(())
    }

    /// The configured task kinds, parsed (call after [`Self::validate`]).
    pub(crate) fn kinds(&self) -> Vec<TaskKind> {
        self.task_kinds
            .iter()
            .filter_map(|n| TaskKind::from_name(n))
            .collect()
    }

    pub(crate) fn knobs(&self) -> Knobs {
        Knobs {
            receptacles: (self.min_receptacles, self.max_receptacles),
            distractors: (self.min_distractors, self.max_distractors),
            knowledge: self.knowledge,
        }
    }
}
