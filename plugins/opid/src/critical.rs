//! The statistical critical-turn selector (arXiv 2606.26790; github jinyangwu/OPID,
//! `opid/analysis.py`, `select_critical_steps_by_stats`).
//!
//! Over the rows of one step:
//! 1. anchor-state groups: rows of the same task group with the same anchor key (exact match,
//!    [`stats::anchor_groups`]);
//! 2. each row's discounted turn return `G_{i,t}` (γ from the config,
//!    [`stats::turn_returns`]);
//! 3. per group the mean and the **population** variance of `G`; groups with at least
//!    `min_group_size` rows are *eligible*, and the cutoff is the `var_quantile` quantile of
//!    their variances (linear interpolation, numpy's default);
//! 4. a row is a candidate when its group is eligible, its variance is ≥ the cutoff and > 0,
//!    and its return is below the group mean; its score is `var × (mean − G + 1e-6)`;
//! 5. per trajectory the `top_k` candidates with the highest score are critical (ties: the later
//!    turn first, as OPID sorts `(score, step)` descending).
//!
//! OPID computes in float32; this is float64.

use cairn_plugin_sdk::stats::{self, AnchorMatching};
use cairn_plugin_sdk::{Batch, Result};

/// What the selector picked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// One flag per batch row: the row is a critical turn.
    pub critical: Vec<bool>,
    /// Anchor groups in the batch.
    pub groups: usize,
    /// Groups that passed the size, cutoff and variance tests.
    pub eligible: usize,
    /// The variance cutoff; `None` without any group of `min_group_size` rows.
    pub cutoff: Option<f64>,
    /// Each row's turn return `G`.
    pub returns: Vec<f64>,
}

/// The `q` quantile of `values` (not empty) with linear interpolation between order
/// statistics (numpy's default method).
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let h = (v.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

/// Runs the selector (module docs) on `batch`, whose rows must all carry anchor keys.
pub fn select(
    batch: &Batch,
    gamma: f64,
    min_group_size: usize,
    var_quantile: f64,
    top_k: usize,
) -> Result<Selection> {
    let n = batch.rows.len();
    let trajectories = stats::trajectories(batch)?;
    let returns = stats::turn_returns(batch, &trajectories, gamma)?;
    let groups = stats::anchor_groups(batch, AnchorMatching::Exact)?;
    // (mean, population variance, size) per group, and each row's group.
    let mut of_row = vec![0usize; n];
    let mut moments = Vec::with_capacity(groups.len());
    for (g, rows) in groups.iter().enumerate() {
        let values: Vec<f64> = rows.iter().map(|&i| returns[i]).collect();
        let mean = stats::mean(&values);
        let var = values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / values.len() as f64;
        moments.push((mean, var, rows.len()));
        for &i in rows {
            of_row[i] = g;
        }
    }
    let sized: Vec<f64> = moments
        .iter()
        .filter(|(_, _, size)| *size >= min_group_size)
        .map(|(_, var, _)| *var)
        .collect();
    let cutoff = (!sized.is_empty()).then(|| quantile(&sized, var_quantile));
    let passes = |&(_, var, size): &(f64, f64, usize)| {
        size >= min_group_size && cutoff.is_some_and(|c| var >= c) && var > 0.0
    };
    let eligible = moments.iter().filter(|m| passes(m)).count();
    let mut critical = vec![false; n];
    for traj in &trajectories {
        let mut candidates: Vec<(f64, u32, usize)> = traj
            .rows
            .iter()
            .filter_map(|&i| {
                let m = moments[of_row[i]];
                let deviation = m.0 - returns[i];
                (passes(&m) && deviation > 0.0)
                    .then(|| (m.1 * (deviation + 1e-6), batch.rows[i].turn, i))
            })
            .collect();
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        for &(_, _, i) in candidates.iter().take(top_k) {
            critical[i] = true;
        }
    }
    Ok(Selection {
        critical,
        groups: groups.len(),
        eligible,
        cutoff,
        returns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_plugin_sdk::TurnRow;

    fn row(group: u64, traj: u64, turn: u32, anchor: &str, reward: f32) -> TurnRow {
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            turn,
            anchor: Some(anchor.into()),
            turn_reward: reward,
            response_ids: vec![1],
            response_logprobs: vec![0.0],
            response_mask: vec![1],
            ..TurnRow::default()
        }
    }

    /// Group 1: A s0 → s1 (rewards 0, 1), B s0 → s2 (0, 0), C s0 → s2 → s1 (0, 0, 1).
    /// Group 2: D at s0 alone (a singleton group, never eligible).
    /// γ = 0.95: returns A [0.95, 1], B [0, 0], C [0.9025, 0.95, 1], D [1].
    /// Groups: s0 {0.95, 0, 0.9025} mean 0.6175, var 0.19102917; s1 {1, 1} var 0;
    /// s2 {0, 0.95} mean 0.475, var 0.225625; D's s0 {1} var 0 (size 1).
    fn batch() -> Batch {
        Batch {
            step: 0,
            rows: vec![
                row(1, 10, 0, "s0", 0.0),
                row(1, 10, 1, "s1", 1.0),
                row(1, 11, 0, "s0", 0.0),
                row(1, 11, 1, "s2", 0.0),
                row(1, 12, 0, "s0", 0.0),
                row(1, 12, 1, "s2", 0.0),
                row(1, 12, 2, "s1", 1.0),
                row(2, 20, 0, "s0", 1.0),
            ],
        }
    }

    fn picked(s: &Selection) -> Vec<usize> {
        (0..s.critical.len()).filter(|&i| s.critical[i]).collect()
    }

    #[test]
    fn quantiles_interpolate_linearly() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert!((quantile(&[0.0, 1.0, 3.0], 0.75) - 2.0).abs() < 1e-12);
        assert_eq!(quantile(&[5.0], 0.75), 5.0);
        assert_eq!(quantile(&[1.0, 2.0], 0.0), 1.0);
        assert_eq!(quantile(&[1.0, 2.0], 1.0), 2.0);
    }

    #[test]
    fn the_75th_percentile_admits_only_the_widest_group() {
        let s = select(&batch(), 0.95, 2, 0.75, 1).unwrap();
        // Eligible variances [0.19102917, 0, 0.225625]: the 75th percentile is
        // 0.19102917 + 0.5 · (0.225625 − 0.19102917) = 0.20832708.
        assert!(
            (s.cutoff.unwrap() - 0.208327083).abs() < 1e-8,
            "{:?}",
            s.cutoff
        );
        assert_eq!((s.groups, s.eligible), (4, 1));
        // Only s2 passes; below its mean 0.475 is B's turn 1 (return 0).
        assert_eq!(picked(&s), [3]);
        assert!((s.returns[4] - 0.9025).abs() < 1e-12);
    }

    #[test]
    fn the_median_admits_two_groups_and_the_higher_score_wins_per_trajectory() {
        let s = select(&batch(), 0.95, 2, 0.5, 1).unwrap();
        assert!((s.cutoff.unwrap() - 0.191029167).abs() < 1e-8);
        assert_eq!(s.eligible, 2);
        // B is below the mean in s0 (score 0.19102917 × 0.6175 = 0.11796) and in s2
        // (0.225625 × 0.475 = 0.10717): top-1 keeps turn 0. A and C are above the means.
        assert_eq!(picked(&s), [2]);
        let both = select(&batch(), 0.95, 2, 0.5, 2).unwrap();
        assert_eq!(picked(&both), [2, 3]);
        // With groups of 3 or more only s0 counts: its variance is the cutoff itself.
        let big = select(&batch(), 0.95, 3, 0.75, 1).unwrap();
        assert!((big.cutoff.unwrap() - 0.191029167).abs() < 1e-8);
        assert_eq!(picked(&big), [2]);
        // Nothing of size 4: no cutoff, nothing critical.
        let none = select(&batch(), 0.95, 4, 0.75, 1).unwrap();
        assert_eq!((none.cutoff, picked(&none)), (None, vec![]));
    }

    #[test]
    fn a_row_without_an_anchor_is_an_error_naming_it() {
        let mut b = batch();
        b.rows[5].anchor = None;
        let e = select(&b, 0.95, 2, 0.75, 1).unwrap_err();
        assert!(e.message.contains("row 5"), "{e}");
    }
}
