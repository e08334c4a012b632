//! Evidence cards: what one step showed about one scaffold on one task.
//!
//! A card pools every A/B group (both arms played) of a (task, scaffold) in a step: usually one
//! group, more when the kernel drew the task twice. It records per arm the trajectories and
//! successes, the mean episode reward and the mean tool calls per trajectory, and one failing
//! and one succeeding excerpt (the first in slot order, so the scaffolded arm's come first).
//! [`EvidenceCard::to_entry`] makes it an `EntryKind::EvidenceCard` bank entry; its
//! [`CardCounts`] go into the evaluation window (`crate::evaluate`).

use cairn_plugin_sdk::{EntryKind, NewEntry, Provenance};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::arms::{GroupArms, Played, ScaffoldRef, PLAIN, SCAFFOLDED};

/// Longest excerpt kept on a card, in characters (then cut, with `…` appended).
pub const EXCERPT_CHARS: usize = 300;

/// The counts of one card: all the evaluation needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardCounts {
    /// The step the card was written at.
    pub step: u64,
    /// Scaffolded trajectories, and how many of them succeeded.
    pub n_with: u32,
    pub succ_with: u32,
    /// Plain trajectories, and how many of them succeeded.
    pub n_without: u32,
    pub succ_without: u32,
}

/// The actions of one trajectory, for a card.
#[derive(Clone, Debug, PartialEq)]
pub struct Excerpt {
    pub trajectory_id: u64,
    /// The trajectory's arm: [`SCAFFOLDED`] or [`PLAIN`].
    pub arm: &'static str,
    /// Its actions joined by `"; "`, at most [`EXCERPT_CHARS`] characters (plus `…`).
    pub text: String,
}

/// One evidence card.
#[derive(Clone, Debug, PartialEq)]
pub struct EvidenceCard {
    pub task_id: String,
    pub scaffold: ScaffoldRef,
    /// The scaffold's text, as injected.
    pub scaffold_text: String,
    /// The groups pooled into the card.
    pub group_ids: Vec<u64>,
    pub counts: CardCounts,
    /// Mean episode reward per arm.
    pub reward_with: f64,
    pub reward_without: f64,
    /// Mean tool calls per trajectory (all turns) per arm.
    pub tool_calls_with: f64,
    pub tool_calls_without: f64,
    pub success: Option<Excerpt>,
    pub failure: Option<Excerpt>,
    /// Every trajectory of the pooled groups (the entry's provenance).
    pub trajectories: Vec<u64>,
}

/// Joins actions with `"; "` (a turn without one shows as `?`) and cuts the result at
/// [`EXCERPT_CHARS`] characters.
pub fn excerpt(actions: &[Option<String>]) -> String {
    let joined = actions
        .iter()
        .map(|a| a.as_deref().unwrap_or("?"))
        .collect::<Vec<_>>()
        .join("; ");
    if joined.chars().count() <= EXCERPT_CHARS {
        return joined;
    }
    let mut cut: String = joined.chars().take(EXCERPT_CHARS).collect();
    cut.push('…');
    cut
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// The cards of a step: one per (task, scaffold) with at least one A/B group, in order of
/// the groups' first appearance.
pub fn cards(step: u64, groups: &[GroupArms]) -> Vec<EvidenceCard> {
    let mut keys: Vec<(&str, ScaffoldRef)> = Vec::new();
    for g in groups.iter().filter(|g| g.is_contrast()) {
        if let Some(s) = g.scaffold {
            if !keys.contains(&(g.task_id.as_str(), s)) {
                keys.push((g.task_id.as_str(), s));
            }
        }
    }
    keys.into_iter()
        .map(|(task, scaffold)| {
            let pooled: Vec<&GroupArms> = groups
                .iter()
                .filter(|g| g.is_contrast() && g.task_id == task && g.scaffold == Some(scaffold))
                .collect();
            card(step, task, scaffold, &pooled)
        })
        .collect()
}

fn card(step: u64, task: &str, scaffold: ScaffoldRef, pooled: &[&GroupArms]) -> EvidenceCard {
    let with: Vec<&Played> = pooled.iter().flat_map(|g| &g.with).collect();
    let without: Vec<&Played> = pooled.iter().flat_map(|g| &g.without).collect();
    let count = |arm: &[&Played]| arm.iter().filter(|t| t.success).count() as u32;
    // Slot order within each group: the scaffolded slots come first.
    let in_slot_order: Vec<(&'static str, &Played)> = pooled
        .iter()
        .flat_map(|g| {
            g.with
                .iter()
                .map(|t| (SCAFFOLDED, t))
                .chain(g.without.iter().map(|t| (PLAIN, t)))
        })
        .collect();
    let find = |success: bool| {
        in_slot_order
            .iter()
            .find(|(_, t)| t.success == success)
            .map(|&(arm, t)| Excerpt {
                trajectory_id: t.trajectory_id,
                arm,
                text: excerpt(&t.actions),
            })
    };
    EvidenceCard {
        task_id: task.to_string(),
        scaffold,
        scaffold_text: pooled
            .first()
            .and_then(|g| g.scaffold_variant.as_ref())
            .map(|v| v.inject.clone())
            .unwrap_or_default(),
        group_ids: pooled.iter().map(|g| g.group_id).collect(),
        counts: CardCounts {
            step,
            n_with: with.len() as u32,
            succ_with: count(&with),
            n_without: without.len() as u32,
            succ_without: count(&without),
        },
        reward_with: mean(with.iter().map(|t| t.reward)),
        reward_without: mean(without.iter().map(|t| t.reward)),
        tool_calls_with: mean(with.iter().map(|t| t.tool_calls as f64)),
        tool_calls_without: mean(without.iter().map(|t| t.tool_calls as f64)),
        success: find(true),
        failure: find(false),
        trajectories: in_slot_order.iter().map(|(_, t)| t.trajectory_id).collect(),
    }
}

impl EvidenceCard {
    /// The one-line text of the bank entry.
    pub fn text(&self) -> String {
        let c = &self.counts;
        format!(
            "task {}, scaffold {}, step {}: with the scaffold {}/{} solved (mean reward {:.2}, \
             {:.2} tool calls), without {}/{} ({:.2}, {:.2} tool calls)",
            self.task_id,
            self.scaffold,
            c.step,
            c.succ_with,
            c.n_with,
            self.reward_with,
            self.tool_calls_with,
            c.succ_without,
            c.n_without,
            self.reward_without,
            self.tool_calls_without
        )
    }

    /// The bank entry: kind `EvidenceCard`, the card's task, its numbers in `extra`, its
    /// trajectories as provenance (step, version and writer are filled in by the kernel).
    pub fn to_entry(&self) -> NewEntry {
        let c = &self.counts;
        let excerpt = |e: &Option<Excerpt>| match e {
            Some(e) => json!({"trajectory_id": e.trajectory_id, "arm": e.arm, "text": e.text}),
            None => Value::Null,
        };
        let extra: serde_json::Map<String, Value> = [
            ("scaffold_id", self.scaffold.to_json()),
            ("step", json!(c.step)),
            ("group_ids", json!(self.group_ids)),
            ("n_with", json!(c.n_with)),
            ("succ_with", json!(c.succ_with)),
            ("n_without", json!(c.n_without)),
            ("succ_without", json!(c.succ_without)),
            ("reward_with", json!(self.reward_with)),
            ("reward_without", json!(self.reward_without)),
            ("tool_calls_with", json!(self.tool_calls_with)),
            ("tool_calls_without", json!(self.tool_calls_without)),
            ("success_excerpt", excerpt(&self.success)),
            ("failure_excerpt", excerpt(&self.failure)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        NewEntry {
            kind: EntryKind::EvidenceCard,
            text: self.text(),
            task_id: Some(self.task_id.clone()),
            provenance: Provenance {
                source_trajectories: self.trajectories.clone(),
                ..Provenance::default()
            },
            extra,
            ..NewEntry::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arms::{groups, plain_variant, scaffolded_variant};
    use cairn_plugin_sdk::{Batch, TurnRow};

    /// One single-turn trajectory row.
    fn row(group: u64, traj: u64, task: &str, scaffolded: bool, success: bool) -> TurnRow {
        let variant = if scaffolded {
            scaffolded_variant(ScaffoldRef::Bank(5), "use the map")
        } else {
            plain_variant()
        };
        let mut info = serde_json::Map::new();
        info.insert("action".into(), format!("act{traj}").into());
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            task_id: task.into(),
            variant,
            success,
            episode_reward: if success { 1.0 } else { 0.0 },
            tool_calls: (traj % 4) as u32,
            info,
            ..Default::default()
        }
    }

    #[test]
    fn a_card_pools_the_groups_of_a_task_and_counts_each_arm() {
        // Task a, two groups: (S ok, S fail | 0 fail, 0 ok) and (S ok, S ok | 0 fail, 0 fail).
        // A second turn on trajectory 1 adds tool calls and an action. Task b played plain.
        let mut rows = vec![
            row(1, 1, "a", true, true),
            row(1, 2, "a", true, false),
            row(1, 3, "a", false, false),
            row(1, 4, "a", false, true),
            row(2, 5, "a", true, true),
            row(2, 6, "a", true, true),
            row(2, 7, "a", false, false),
            row(2, 8, "a", false, false),
            row(3, 9, "b", false, true),
        ];
        let mut second = rows[0].clone();
        second.turn = 1;
        second.tool_calls = 4;
        second.info.insert("action".into(), "finish".into());
        rows.push(second);
        let g = groups(&Batch { step: 0, rows }).unwrap();
        let cards = cards(12, &g);
        assert_eq!(cards.len(), 1, "task b has no scaffold: no card");
        let c = &cards[0];
        assert_eq!(
            c.counts,
            CardCounts {
                step: 12,
                n_with: 4,
                succ_with: 3,
                n_without: 4,
                succ_without: 1
            }
        );
        assert_eq!((c.reward_with, c.reward_without), (0.75, 0.25));
        // Tool calls: with 1+4, 2, 1, 2 → 10/4; without 3, 0, 3, 0 → 6/4.
        assert_eq!((c.tool_calls_with, c.tool_calls_without), (2.5, 1.5));
        assert_eq!(c.group_ids, [1, 2]);
        assert_eq!(c.trajectories, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(c.scaffold_text, "use the map");
        let ok = c.success.as_ref().unwrap();
        assert_eq!(
            (ok.trajectory_id, ok.arm, ok.text.as_str()),
            (1, "S", "act1; finish")
        );
        let bad = c.failure.as_ref().unwrap();
        assert_eq!(
            (bad.trajectory_id, bad.arm, bad.text.as_str()),
            (2, "S", "act2")
        );

        let e = c.to_entry();
        assert_eq!(e.kind, EntryKind::EvidenceCard);
        assert_eq!(e.task_id.as_deref(), Some("a"));
        assert_eq!(e.provenance.source_trajectories, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            e.text,
            "task a, scaffold 5, step 12: with the scaffold 3/4 solved (mean reward 0.75, 2.50 \
             tool calls), without 1/4 (0.25, 1.50 tool calls)"
        );
        assert_eq!(
            Value::Object(e.extra),
            json!({
                "scaffold_id": 5, "step": 12, "group_ids": [1, 2],
                "n_with": 4, "succ_with": 3, "n_without": 4, "succ_without": 1,
                "reward_with": 0.75, "reward_without": 0.25,
                "tool_calls_with": 2.5, "tool_calls_without": 1.5,
                "success_excerpt": {"trajectory_id": 1, "arm": "S", "text": "act1; finish"},
                "failure_excerpt": {"trajectory_id": 2, "arm": "S", "text": "act2"},
            })
        );
    }

    #[test]
    fn a_card_without_a_failure_says_so() {
        let rows = vec![row(1, 1, "a", true, true), row(1, 2, "a", false, true)];
        let c = &cards(0, &groups(&Batch { step: 0, rows }).unwrap())[0];
        assert_eq!(c.failure, None);
        assert_eq!(c.to_entry().extra["failure_excerpt"], Value::Null);
        assert_eq!(c.success.as_ref().unwrap().trajectory_id, 1);
    }

    #[test]
    fn excerpts_are_bounded() {
        assert_eq!(
            excerpt(&[Some("a".into()), None, Some("b".into())]),
            "a; ?; b"
        );
        let long = vec![Some("é".repeat(200)), Some("x".repeat(200))];
        let e = excerpt(&long);
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
        assert!(e.starts_with(&"é".repeat(200)) && e.ends_with("x…"), "{e}");
    }
}
