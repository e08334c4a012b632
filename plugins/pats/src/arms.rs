//! The two arms of a Pats group: how a slot's [`ContextVariant`] records its arm and scaffold,
//! and how a batch splits back into groups of scaffolded and plain trajectories.
//!
//! A scaffolded slot carries `extra = {"pats_arm": "S", "scaffold_id": <id>}` (`<id>` is the
//! bank entry id, or `"config"` for the general scaffold of the config); a plain slot carries
//! `{"pats_arm": "0"}`. Every row of the slot records its variant, so [`groups`] needs nothing
//! but the batch.

use std::fmt;

use cairn_plugin_sdk::stats::{group_indices, trajectories};
use cairn_plugin_sdk::{Batch, ContextVariant, PluginError, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `ContextVariant::extra` key of the arm: [`SCAFFOLDED`] or [`PLAIN`].
pub const ARM_KEY: &str = "pats_arm";
/// `ContextVariant::extra` key of the injected scaffold (scaffolded slots only).
pub const SCAFFOLD_KEY: &str = "scaffold_id";
/// The scaffolded arm.
pub const SCAFFOLDED: &str = "S";
/// The plain arm.
pub const PLAIN: &str = "0";

/// Which scaffold a slot got: a bank entry, or the general scaffold of the config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaffoldRef {
    /// `config.scaffold`.
    Config,
    /// The bank entry with this id (`EntryKind::Scaffold`).
    Bank(u64),
}

impl ScaffoldRef {
    /// The value of `extra.scaffold_id`: the entry id, or `"config"`.
    pub fn to_json(self) -> Value {
        match self {
            ScaffoldRef::Config => Value::from("config"),
            ScaffoldRef::Bank(id) => Value::from(id),
        }
    }

    /// Reads `extra.scaffold_id`; `None` for anything else.
    pub fn from_json(value: &Value) -> Option<Self> {
        match value {
            Value::String(s) if s == "config" => Some(ScaffoldRef::Config),
            other => other.as_u64().map(ScaffoldRef::Bank),
        }
    }
}

impl fmt::Display for ScaffoldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaffoldRef::Config => f.write_str("config"),
            ScaffoldRef::Bank(id) => write!(f, "{id}"),
        }
    }
}

/// The variant of a scaffolded slot: label `scaffold:<id>`, the text injected.
pub fn scaffolded_variant(scaffold: ScaffoldRef, text: &str) -> ContextVariant {
    let mut extra = serde_json::Map::new();
    extra.insert(ARM_KEY.into(), Value::from(SCAFFOLDED));
    extra.insert(SCAFFOLD_KEY.into(), scaffold.to_json());
    ContextVariant {
        label: format!("scaffold:{scaffold}"),
        inject: text.to_string(),
        extra,
        ..ContextVariant::default()
    }
}

/// The variant of a plain slot: the default context, tagged with its arm.
pub fn plain_variant() -> ContextVariant {
    let mut variant = ContextVariant::default();
    variant.extra.insert(ARM_KEY.into(), Value::from(PLAIN));
    variant
}

/// The scaffold of a variant planned as scaffolded; `None` for a plain (or untagged) one.
pub fn scaffold_of(variant: &ContextVariant) -> Option<ScaffoldRef> {
    if variant.extra.get(ARM_KEY).and_then(Value::as_str) != Some(SCAFFOLDED) {
        return None;
    }
    variant
        .extra
        .get(SCAFFOLD_KEY)
        .and_then(ScaffoldRef::from_json)
}

/// One played trajectory, as the cards see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Played {
    pub trajectory_id: u64,
    pub success: bool,
    /// Episode reward `R_i`.
    pub reward: f64,
    /// Tool calls over all its turns.
    pub tool_calls: u64,
    /// The decoded action of each turn, by turn (`info["action"]`; `None` where a row has
    /// none).
    pub actions: Vec<Option<String>>,
    /// Indices of its rows in the batch, by turn.
    pub rows: Vec<usize>,
}

/// One task group split by arm.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupArms {
    pub group_id: u64,
    pub task_id: String,
    /// The scaffold the group's scaffolded slots got; `None`: the group played plain.
    pub scaffold: Option<ScaffoldRef>,
    /// The variant of its first scaffolded trajectory's first turn (the exact context the
    /// scaffolded arm saw), for the distillation teacher.
    pub scaffold_variant: Option<ContextVariant>,
    /// Scaffolded trajectories, in order of first appearance (slot order).
    pub with: Vec<Played>,
    /// Plain trajectories (untagged ones included), in order of first appearance.
    pub without: Vec<Played>,
}

impl GroupArms {
    /// Both arms played: the group is an A/B comparison.
    pub fn is_contrast(&self) -> bool {
        self.scaffold.is_some() && !self.with.is_empty() && !self.without.is_empty()
    }
}

/// Splits a batch into its groups (in order of first appearance), each split by the arm of
/// its trajectories' first turn. The trajectory checks of `stats::trajectories` apply; a
/// group whose scaffolded slots name two different scaffolds is an input error.
pub fn groups(batch: &Batch) -> Result<Vec<GroupArms>> {
    let trajs = trajectories(batch)?;
    let by_group = group_indices(&trajs.iter().map(|t| t.group_id).collect::<Vec<_>>());
    let mut out = Vec::with_capacity(by_group.len());
    for members in by_group {
        let head = &batch.rows[trajs[members[0]].rows[0]];
        let mut group = GroupArms {
            group_id: head.group_id,
            task_id: head.task_id.clone(),
            scaffold: None,
            scaffold_variant: None,
            with: Vec::new(),
            without: Vec::new(),
        };
        for &m in &members {
            let t = &trajs[m];
            let first = &batch.rows[t.rows[0]];
            let played = Played {
                trajectory_id: t.id,
                success: t.success,
                reward: t.episode_reward,
                tool_calls: t
                    .rows
                    .iter()
                    .map(|&i| u64::from(batch.rows[i].tool_calls))
                    .sum(),
                actions: t
                    .rows
                    .iter()
                    .map(|&i| {
                        batch.rows[i]
                            .info
                            .get("action")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect(),
                rows: t.rows.clone(),
            };
            match scaffold_of(&first.variant) {
                Some(s) => {
                    match group.scaffold {
                        None => {
                            group.scaffold = Some(s);
                            group.scaffold_variant = Some(first.variant.clone());
                        }
                        Some(other) if other != s => {
                            return Err(PluginError::input(format!(
                                "group {} has scaffolded slots with scaffold {other} and with \
                                 scaffold {s}; pats plans one scaffold per group, so these \
                                 rows were not planned by it",
                                group.group_id
                            )))
                        }
                        Some(_) => {}
                    }
                    group.with.push(played);
                }
                None => group.without.push(played),
            }
        }
        out.push(group);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_plugin_sdk::TurnRow;

    fn row(group: u64, traj: u64, turn: u32, variant: &ContextVariant) -> TurnRow {
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            turn,
            task_id: "t".into(),
            variant: variant.clone(),
            tool_calls: turn + 1,
            ..Default::default()
        }
    }

    #[test]
    fn variants_carry_the_arm_and_the_scaffold() {
        let v = scaffolded_variant(ScaffoldRef::Bank(7), "look first");
        assert_eq!(v.label, "scaffold:7");
        assert_eq!(v.inject, "look first");
        assert!(v.tools_enabled);
        assert_eq!(
            serde_json::Value::Object(v.extra.clone()),
            serde_json::json!({"pats_arm": "S", "scaffold_id": 7})
        );
        assert_eq!(scaffold_of(&v), Some(ScaffoldRef::Bank(7)));
        let c = scaffolded_variant(ScaffoldRef::Config, "x");
        assert_eq!(c.label, "scaffold:config");
        assert_eq!(c.extra[SCAFFOLD_KEY], "config");
        assert_eq!(scaffold_of(&c), Some(ScaffoldRef::Config));
        let p = plain_variant();
        assert_eq!((p.label.as_str(), p.inject.as_str()), ("plain", ""));
        assert_eq!(
            serde_json::Value::Object(p.extra.clone()),
            serde_json::json!({"pats_arm": "0"})
        );
        assert_eq!(scaffold_of(&p), None);
        assert_eq!(scaffold_of(&ContextVariant::default()), None);
    }

    #[test]
    fn a_batch_splits_into_groups_by_the_arm_of_the_first_turn() {
        let s = scaffolded_variant(ScaffoldRef::Bank(3), "x");
        let p = plain_variant();
        let mut rows = vec![
            row(1, 11, 1, &p), // a later turn whose variant changed: the first turn decides
            row(1, 10, 0, &s),
            row(1, 11, 0, &s),
            row(1, 12, 0, &p),
            row(2, 20, 0, &ContextVariant::default()),
        ];
        rows[1].info.insert("action".into(), "go north".into());
        let g = groups(&Batch { step: 0, rows }).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].scaffold, Some(ScaffoldRef::Bank(3)));
        assert!(g[0].is_contrast());
        let with: Vec<u64> = g[0].with.iter().map(|t| t.trajectory_id).collect();
        let without: Vec<u64> = g[0].without.iter().map(|t| t.trajectory_id).collect();
        assert_eq!((with, without), (vec![11, 10], vec![12]));
        // Trajectory 11: turns 0 and 1, tool calls 1 + 2; rows by turn.
        assert_eq!(g[0].with[0].tool_calls, 3);
        assert_eq!(g[0].with[0].rows, [2, 0]);
        assert_eq!(g[0].with[1].actions, [Some("go north".to_string())]);
        assert_eq!(g[0].with[0].actions, [None, None]);
        assert_eq!(g[1].scaffold, None);
        assert!(!g[1].is_contrast());
        assert_eq!(g[1].without.len(), 1);
    }

    #[test]
    fn two_scaffolds_in_one_group_are_refused() {
        let rows = vec![
            row(4, 1, 0, &scaffolded_variant(ScaffoldRef::Bank(3), "x")),
            row(4, 2, 0, &scaffolded_variant(ScaffoldRef::Config, "y")),
        ];
        let e = groups(&Batch { step: 0, rows }).unwrap_err();
        assert!(
            e.message.starts_with(
                "group 4 has scaffolded slots with scaffold 3 and with scaffold config"
            ),
            "{e}"
        );
    }
}
