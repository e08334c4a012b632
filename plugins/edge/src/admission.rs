//! Which rows EDGE distills, and how strongly: the marginal gain of the injected experiences,
//! measured between the two arms of a group (xvolcano02/EDGE `ray_trainer.py`, same-anchor
//! weights; `core_algos.py`, trajectory-level weights).
//!
//! Every row has a score `s` ([`Score`]): its trajectory's success as 1 / 0, or its episode
//! reward. Rows are split by arm ([`Arm`], from `variant.extra.edge_arm`); rows of neither arm
//! (not planned by `edge`) take no part.
//!
//! * **Anchor level.** A cell is `(group_id, anchor)`; a row without an anchor joins the cell
//!   `(group_id, turn)` of the anchor-less rows of its group at the same turn (ours: EDGE always
//!   has anchors; at turn 0 the rows of a group start from the same task). In a cell with rows
//!   of both arms, with `max_E`, `max_N` the best scores of each arm:
//!   `w = 1` if `max_E > 0` and `max_N ≤ 0`, else 0 (`require_positive_gain = true`), or
//!   `w = max(0, max_E − max_N)`. A cell with `w > 0` is admitted; its targets are its N rows
//!   with `s ≤ 0` (`target = "w_o_experience_only"`) or all its rows (`"all"`).
//! * **Trajectory level.** Per group with both arms, `w = max(0, mean_E s − mean_N s)`, the
//!   means over trajectories; the targets are every N row of the group (or every row, with
//!   `"all"`).

use std::collections::HashMap;

use cairn_plugin_sdk::stats::{group_indices, trajectories};
use cairn_plugin_sdk::{Batch, ContextVariant, PluginError, Result, TurnRow};

use crate::config::{EdgeConfig, Level, Score, Target};

/// The `variant.extra` key naming a slot's arm.
pub const ARM_KEY: &str = "edge_arm";

/// The arm of a rollout slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// Experience-conditioned: retrieved experiences in the prompt.
    E,
    /// Experience-free.
    N,
}

impl Arm {
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::E => "E",
            Arm::N => "N",
        }
    }
}

/// The arm recorded on a variant: `None` without `extra.edge_arm`; an error naming `row` for
/// any other value than `"E"` or `"N"`.
pub fn arm_of(variant: &ContextVariant, row: usize) -> Result<Option<Arm>> {
    match variant.extra.get(ARM_KEY) {
        None => Ok(None),
        Some(v) => match v.as_str() {
            Some("E") => Ok(Some(Arm::E)),
            Some("N") => Ok(Some(Arm::N)),
            _ => Err(PluginError::input(format!(
                "row {row}: variant.extra.{ARM_KEY} is {v}; edge plans \"E\" or \"N\" (was the \
                 batch planned by another plugin?)"
            ))),
        },
    }
}

/// The score of a row: success as 1 / 0, or the episode reward.
pub fn row_score(row: &TurnRow, score: Score) -> f64 {
    match score {
        Score::Success => f64::from(u8::from(row.success)),
        Score::Reward => f64::from(row.episode_reward),
    }
}

/// The result of admission on a batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Admission {
    /// `w` per batch row, `[rows]` (0: not a target).
    pub weights: Vec<f64>,
    /// Cells (anchor level) or groups (trajectory level) with `w > 0`.
    pub admitted: usize,
}

/// The arm of every row (checked).
pub fn arms(batch: &Batch) -> Result<Vec<Option<Arm>>> {
    batch
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| arm_of(&r.variant, i))
        .collect()
}

/// Computes the distillation weight of every row (see the module docs).
pub fn admission(batch: &Batch, config: &EdgeConfig) -> Result<Admission> {
    let arms = arms(batch)?;
    let scores: Vec<f64> = batch
        .rows
        .iter()
        .map(|r| row_score(r, config.score))
        .collect();
    match config.level {
        Level::Anchor => Ok(anchor_level(batch, config, &arms, &scores)),
        Level::Trajectory => trajectory_level(batch, config, &arms, &scores),
    }
}

/// Cell key: the group and either the anchor or, for rows without one, the turn.
type Cell<'a> = (u64, Option<&'a str>, Option<u32>);

fn anchor_level(batch: &Batch, config: &EdgeConfig, arms: &[Option<Arm>], s: &[f64]) -> Admission {
    let keys: Vec<Cell<'_>> = batch
        .rows
        .iter()
        .map(|r| match &r.anchor {
            Some(a) => (r.group_id, Some(a.as_str()), None),
            None => (r.group_id, None, Some(r.turn)),
        })
        .collect();
    let mut out = Admission {
        weights: vec![0.0; batch.rows.len()],
        admitted: 0,
    };
    for cell in group_indices(&keys) {
        let best = |arm: Arm| {
            cell.iter()
                .filter(|&&i| arms[i] == Some(arm))
                .map(|&i| s[i])
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        };
        let (Some(max_e), Some(max_n)) = (best(Arm::E), best(Arm::N)) else {
            continue;
        };
        let w = if config.require_positive_gain {
            if max_e > 0.0 && max_n <= 0.0 {
                1.0
            } else {
                0.0
            }
        } else {
            (max_e - max_n).max(0.0)
        };
        if w <= 0.0 {
            continue;
        }
        out.admitted += 1;
        for &i in &cell {
            let target = match config.target {
                Target::WithoutExperienceOnly => arms[i] == Some(Arm::N) && s[i] <= 0.0,
                Target::All => arms[i].is_some(),
            };
            if target {
                out.weights[i] = w;
            }
        }
    }
    out
}

fn trajectory_level(
    batch: &Batch,
    config: &EdgeConfig,
    arms: &[Option<Arm>],
    s: &[f64],
) -> Result<Admission> {
    let trajs = trajectories(batch)?;
    let mut out = Admission {
        weights: vec![0.0; batch.rows.len()],
        admitted: 0,
    };
    let by_group = group_indices(&trajs.iter().map(|t| t.group_id).collect::<Vec<_>>());
    for group in by_group {
        let mut sums: HashMap<&'static str, (f64, usize)> = HashMap::new();
        for &t in &group {
            let head = trajs[t].rows[0];
            if let Some(arm) = arms[head] {
                let e = sums.entry(arm.as_str()).or_default();
                e.0 += s[head];
                e.1 += 1;
            }
        }
        let mean = |arm: Arm| sums.get(arm.as_str()).map(|&(sum, n)| sum / n as f64);
        let (Some(mean_e), Some(mean_n)) = (mean(Arm::E), mean(Arm::N)) else {
            continue;
        };
        let w = (mean_e - mean_n).max(0.0);
        if w <= 0.0 {
            continue;
        }
        out.admitted += 1;
        for &t in &group {
            for &i in &trajs[t].rows {
                let target = match config.target {
                    Target::WithoutExperienceOnly => arms[i] == Some(Arm::N),
                    Target::All => arms[i].is_some(),
                };
                if target {
                    out.weights[i] = w;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{arm_row, batch};

    fn weights(config: &str, rows: Vec<TurnRow>) -> (Vec<f64>, usize) {
        let config = EdgeConfig::from_json(config).unwrap();
        let a = admission(&batch(0, rows), &config).unwrap();
        (a.weights, a.admitted)
    }

    /// §3e: E1 succeeds, E2, N1, N2 fail, all at anchor `s0` → w = 1 on N1 and N2 only.
    #[test]
    fn the_worked_example_admits_the_failed_n_rows() {
        let rows = vec![
            arm_row(1, 10, 0, Arm::E, 1.0, Some("s0")),
            arm_row(1, 11, 0, Arm::E, 0.0, Some("s0")),
            arm_row(1, 12, 0, Arm::N, 0.0, Some("s0")),
            arm_row(1, 13, 0, Arm::N, 0.0, Some("s0")),
        ];
        assert_eq!(weights("", rows), (vec![0.0, 0.0, 1.0, 1.0], 1));
    }

    #[test]
    fn cells_are_per_group_and_anchor_and_need_both_arms() {
        let rows = vec![
            // Group 1, s0: E succeeded, N failed → admitted. s1: only E rows → no contrast.
            arm_row(1, 10, 0, Arm::E, 1.0, Some("s0")),
            arm_row(1, 10, 1, Arm::E, 1.0, Some("s1")),
            arm_row(1, 11, 0, Arm::N, 0.0, Some("s0")),
            // Group 2 shares the anchor string but is another cell; N succeeded there too.
            arm_row(2, 20, 0, Arm::E, 1.0, Some("s0")),
            arm_row(2, 21, 0, Arm::N, 1.0, Some("s0")),
            // Anchor-less rows of group 3 meet by turn: turn 0 admitted, turn 1 has no N row.
            arm_row(3, 30, 0, Arm::E, 1.0, None),
            arm_row(3, 30, 1, Arm::E, 1.0, None),
            arm_row(3, 31, 0, Arm::N, 0.0, None),
        ];
        let (w, admitted) = weights("", rows);
        assert_eq!(w, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(admitted, 2);
    }

    #[test]
    fn the_alternative_gain_rule_gives_the_gap_of_the_best_scores() {
        // Rewards: E best 0.8, N best 0.3 → w = 0.5, on the N rows with s ≤ 0 only.
        let rows = || {
            vec![
                arm_row(1, 10, 0, Arm::E, 0.8, Some("s0")),
                arm_row(1, 11, 0, Arm::E, 0.1, Some("s0")),
                arm_row(1, 12, 0, Arm::N, 0.3, Some("s0")),
                arm_row(1, 13, 0, Arm::N, 0.0, Some("s0")),
            ]
        };
        let (w, admitted) = weights(
            r#"{"score": "reward", "require_positive_gain": false}"#,
            rows(),
        );
        assert_eq!(admitted, 1);
        assert!((w[3] - 0.5).abs() < 1e-6, "{w:?}");
        assert_eq!([w[0], w[1], w[2]], [0.0; 3]);
        // The default rule refuses the cell: the N arm also scored above 0.
        assert_eq!(weights(r#"{"score": "reward"}"#, rows()), (vec![0.0; 4], 0));
        // With the success score the same rows are all failures (success = false).
        assert_eq!(
            weights(r#"{"require_positive_gain": false}"#, rows()),
            (vec![0.0; 4], 0)
        );
    }

    #[test]
    fn target_all_distills_every_row_of_the_cell() {
        let rows = vec![
            arm_row(1, 10, 0, Arm::E, 1.0, Some("s0")),
            arm_row(1, 11, 0, Arm::E, 0.0, Some("s0")),
            arm_row(1, 12, 0, Arm::N, 0.0, Some("s0")),
            arm_row(1, 13, 0, Arm::N, 0.0, Some("s1")),
        ];
        let (w, admitted) = weights(r#"{"target": "all"}"#, rows);
        assert_eq!(w, [1.0, 1.0, 1.0, 0.0]);
        assert_eq!(admitted, 1);
    }

    #[test]
    fn the_trajectory_level_gives_the_gap_of_the_arm_means_to_every_n_row() {
        // Rewards: E trajectories 1.0 and 0.5 (mean 0.75), N 0.25 and 0 (mean 0.125):
        // w = 0.625 on every row of the N trajectories, two turns each, whatever their score.
        let rows = vec![
            arm_row(1, 10, 0, Arm::E, 1.0, Some("s0")),
            arm_row(1, 11, 0, Arm::E, 0.5, Some("s0")),
            arm_row(1, 12, 0, Arm::N, 0.25, Some("s0")),
            arm_row(1, 12, 1, Arm::N, 0.25, Some("s2")),
            arm_row(1, 13, 0, Arm::N, 0.0, Some("s0")),
            arm_row(1, 13, 1, Arm::N, 0.0, Some("s3")),
            // Group 2: the N arm did better, w = 0.
            arm_row(2, 20, 0, Arm::E, 0.0, None),
            arm_row(2, 21, 0, Arm::N, 1.0, None),
        ];
        let (w, admitted) = weights(
            r#"{"level": "trajectory", "score": "reward"}"#,
            rows.clone(),
        );
        assert_eq!(admitted, 1);
        for (i, want) in [0.0, 0.0, 0.625, 0.625, 0.625, 0.625, 0.0, 0.0]
            .iter()
            .enumerate()
        {
            assert!((w[i] - want).abs() < 1e-6, "row {i}: {w:?}");
        }
        let (w, _) = weights(
            r#"{"level": "trajectory", "score": "reward", "target": "all"}"#,
            rows,
        );
        assert!((w[0] - 0.625).abs() < 1e-6 && (w[1] - 0.625).abs() < 1e-6);
        assert_eq!([w[6], w[7]], [0.0, 0.0]);
    }

    #[test]
    fn rows_of_no_arm_take_no_part_and_a_bad_arm_is_an_error() {
        let mut plain = arm_row(1, 12, 0, Arm::N, 0.0, Some("s0"));
        plain.variant = ContextVariant::default();
        let rows = vec![arm_row(1, 10, 0, Arm::E, 1.0, Some("s0")), plain.clone()];
        assert_eq!(weights("", rows), (vec![0.0, 0.0], 0));
        plain.variant.extra.insert(ARM_KEY.into(), "X".into());
        let e = admission(&batch(0, vec![plain]), &EdgeConfig::default()).unwrap_err();
        assert!(
            e.message
                .starts_with("row 0: variant.extra.edge_arm is \"X\""),
            "{e}"
        );
    }
}
