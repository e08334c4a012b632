//! Credit-aware bidirectional self-distillation (CBSD) pairs at turn granularity (github
//! TU2021/UCOB, `main_ucob.py`, `_build_cbsd_auxiliary_batch`):
//!
//! 1. every valid turn is a *record* with its branch and its discounted turn return
//!    `G_{i,t}` (γ = `gamma`);
//! 2. records of the same task group and the same anchor state form a *cell*;
//! 3. the cell's *winner* is the record with the highest return among `source_branches`
//!    (the first such record in batch order on a tie); the *target view* is the opposite of
//!    the winner's branch (or the fixed view `target_policy` names);
//! 4. every other record of the cell with a prompt in the target view is a candidate target:
//!    `gap = G_winner − G_target`, kept only if `gap > margin`, pair weight
//!    `w = min(gap / tau, weight_max)`. When no other record has such a prompt, the winner
//!    itself is the target, trained under its own opposite-view prompt, with the cell's mean
//!    return as the baseline. The `max_pairs_per_group` largest gaps are kept (ties in record
//!    order).
//!
//! [`cell_pairs`] is that rule on one cell, pure; the plugin renders the prompts and builds the
//! auxiliary rows.

use crate::config::{Branch, TargetPolicy, UcobConfig};

/// One record of a cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    /// Index into `batch.rows`.
    pub row: usize,
    pub branch: Branch,
    /// The discounted turn return `G_{i,t}`.
    pub ret: f64,
}

/// A kept pair: train the winner's response under the target's prompt in `target_view`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    /// The winner (teacher): its response and its own prompt.
    pub winner: Record,
    /// The target record; equal to `winner` for the fallback pair.
    pub target: Record,
    pub target_view: Branch,
    /// `G_winner − G_target` (`G_winner` − the cell's mean return for the fallback).
    pub gap: f64,
    /// `min(gap / tau, weight_max)`.
    pub weight: f64,
    /// The winner is its own target (no other record had a target-view prompt).
    pub fallback: bool,
}

/// What one cell gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CellPairs {
    /// Kept pairs, largest gap first.
    pub pairs: Vec<Pair>,
    /// Candidate pairs examined (UCOB's `raw_pair_count`).
    pub raw: usize,
    /// Candidates with `gap ≤ margin` (UCOB's `margin_filtered_count`).
    pub margin_filtered: usize,
    /// Kept fallback pairs dropped because the winner had no opposite-view prompt either
    /// (UCOB's `append_failed_count`).
    pub missing_prompt: usize,
    /// The target view of the cell's winner; None when the cell had no record of a source
    /// branch.
    pub view: Option<Branch>,
}

/// The target view of a winner from `branch`.
pub fn target_view(policy: TargetPolicy, branch: Branch) -> Branch {
    match policy {
        TargetPolicy::Opposite => branch.opposite(),
        TargetPolicy::None => Branch::NoSkill,
        TargetPolicy::Good => Branch::Good,
    }
}

/// `min(max(gap / tau, 0), weight_max)`.
pub fn pair_weight(config: &UcobConfig, gap: f64) -> f64 {
    (gap / config.tau).max(0.0).min(config.weight_max)
}

/// The pairs of one cell (see the module docs). `has_prompt(record, view)` says whether the
/// record's turn has a prompt in `view` (its own prompt in its own view; a rendered one in
/// the other view).
pub fn cell_pairs(
    cell: &[Record],
    config: &UcobConfig,
    has_prompt: &mut dyn FnMut(&Record, Branch) -> bool,
) -> CellPairs {
    let mut out = CellPairs::default();
    let mut winner: Option<(usize, &Record)> = None;
    for (k, r) in cell.iter().enumerate() {
        if !config.source_branches.contains(&r.branch) {
            continue;
        }
        // Strictly greater: the first maximum wins, as Python's `max`.
        if winner.is_none_or(|(_, w)| r.ret > w.ret) {
            winner = Some((k, r));
        }
    }
    let Some((wk, &w)) = winner else {
        return out;
    };
    let view = target_view(config.target_policy, w.branch);
    out.view = Some(view);
    let mut targets: Vec<(Record, bool)> = cell
        .iter()
        .enumerate()
        .filter(|&(k, r)| k != wk && has_prompt(r, view))
        .map(|(_, r)| (*r, false))
        .collect();
    let mean = cell.iter().map(|r| r.ret).sum::<f64>() / cell.len() as f64;
    if targets.is_empty() {
        targets.push((w, true));
    }
    let mut scored: Vec<Pair> = Vec::new();
    for (t, fallback) in targets {
        out.raw += 1;
        let baseline = if fallback { mean } else { t.ret };
        let gap = w.ret - baseline;
        if gap <= config.margin {
            out.margin_filtered += 1;
            continue;
        }
        scored.push(Pair {
            winner: w,
            target: t,
            target_view: view,
            gap,
            weight: pair_weight(config, gap),
            fallback,
        });
    }
    // Stable: equal gaps keep record order.
    scored.sort_by(|a, b| b.gap.total_cmp(&a.gap));
    if config.max_pairs_per_group > 0 {
        scored.truncate(config.max_pairs_per_group);
    }
    for p in scored {
        if p.fallback && !has_prompt(&p.target, view) {
            out.missing_prompt += 1;
        } else {
            out.pairs.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(row: usize, branch: Branch, ret: f64) -> Record {
        Record { row, branch, ret }
    }

    /// The worked example: cell returns (none, 0.9025), (good, 0.95), (none, 0), (good, 0).
    fn example() -> Vec<Record> {
        vec![
            rec(0, Branch::NoSkill, 0.9025),
            rec(1, Branch::Good, 0.95),
            rec(2, Branch::NoSkill, 0.0),
            rec(3, Branch::Good, 0.0),
        ]
    }

    #[test]
    fn the_worked_example_keeps_two_pairs_at_the_weight_cap() {
        let config = UcobConfig::default();
        let mut asked = Vec::new();
        let out = cell_pairs(&example(), &config, &mut |r, v| {
            asked.push((r.row, v));
            true
        });
        // Winner (good, 0.95): the target view is `none`, asked of every other record.
        assert_eq!(
            asked,
            [
                (0, Branch::NoSkill),
                (2, Branch::NoSkill),
                (3, Branch::NoSkill)
            ]
        );
        assert_eq!(
            (out.raw, out.margin_filtered, out.missing_prompt),
            (3, 1, 0)
        );
        let got: Vec<(usize, usize, Branch, f64, f64, bool)> = out
            .pairs
            .iter()
            .map(|p| {
                (
                    p.winner.row,
                    p.target.row,
                    p.target_view,
                    p.gap,
                    p.weight,
                    p.fallback,
                )
            })
            .collect();
        // vs (none, 0.9025): gap 0.0475 ≤ 0.05, dropped; vs (none, 0) and (good, 0): gap 0.95,
        // w = min(4.75, 2) = 2.0; the (good, 0) target is trained under its no-skill prompt.
        assert_eq!(
            got,
            [
                (1, 2, Branch::NoSkill, 0.95, 2.0, false),
                (1, 3, Branch::NoSkill, 0.95, 2.0, false)
            ]
        );
        let dropped: f64 = 0.95 - 0.9025;
        assert!((dropped - 0.0475).abs() < 1e-12 && dropped <= config.margin);
        assert!((pair_weight(&config, 0.95) - 2.0).abs() < 1e-12);
        assert!((0.95f64 / 0.2 - 4.75).abs() < 1e-12);
    }

    #[test]
    fn pair_weights_scale_with_the_gap_below_the_cap() {
        let config = UcobConfig::default();
        assert!((pair_weight(&config, 0.1) - 0.5).abs() < 1e-12);
        assert!((pair_weight(&config, 0.3) - 1.5).abs() < 1e-12);
        assert_eq!(pair_weight(&config, 5.0), 2.0);
        assert_eq!(pair_weight(&config, -1.0), 0.0);
    }

    #[test]
    fn the_largest_gaps_are_kept_and_ties_keep_record_order() {
        let cell = vec![
            rec(0, Branch::NoSkill, 1.0),
            rec(1, Branch::Good, 0.5),
            rec(2, Branch::Good, 0.2),
            rec(3, Branch::Good, 0.5),
            rec(4, Branch::Good, 0.0),
        ];
        let out = cell_pairs(&cell, &UcobConfig::default(), &mut |_, _| true);
        let targets: Vec<usize> = out.pairs.iter().map(|p| p.target.row).collect();
        assert_eq!(targets, [4, 2]);
        assert!(out.pairs.iter().all(|p| p.target_view == Branch::Good));
        let config = UcobConfig {
            max_pairs_per_group: 0,
            ..UcobConfig::default()
        };
        let out = cell_pairs(&cell, &config, &mut |_, _| true);
        let targets: Vec<usize> = out.pairs.iter().map(|p| p.target.row).collect();
        assert_eq!(targets, [4, 2, 1, 3]);
    }

    #[test]
    fn the_first_maximum_wins_and_only_source_branches_compete() {
        let cell = vec![
            rec(0, Branch::Good, 1.0),
            rec(1, Branch::NoSkill, 1.0),
            rec(2, Branch::NoSkill, 0.0),
        ];
        let out = cell_pairs(&cell, &UcobConfig::default(), &mut |_, _| true);
        assert_eq!(out.pairs[0].winner.row, 0);
        let config = UcobConfig {
            source_branches: vec![Branch::NoSkill],
            ..UcobConfig::default()
        };
        let out = cell_pairs(&cell, &config, &mut |_, _| true);
        assert_eq!(out.pairs[0].winner.row, 1);
        assert!(out.pairs.iter().all(|p| p.target_view == Branch::Good));
        let targets: Vec<usize> = out.pairs.iter().map(|p| p.target.row).collect();
        // vs the good record: gap 0, dropped.
        assert_eq!((targets, out.margin_filtered), (vec![2], 1));
        let only_none = vec![rec(0, Branch::NoSkill, 1.0)];
        let config = UcobConfig {
            source_branches: vec![Branch::Good],
            ..UcobConfig::default()
        };
        let out = cell_pairs(&only_none, &config, &mut |_, _| true);
        assert!(out.view.is_none() && out.pairs.is_empty() && out.raw == 0);
    }

    #[test]
    fn a_fixed_target_policy_sets_the_view() {
        let cell = example();
        let config = UcobConfig {
            target_policy: TargetPolicy::Good,
            ..UcobConfig::default()
        };
        let out = cell_pairs(&cell, &config, &mut |_, _| true);
        assert!(out.pairs.iter().all(|p| p.target_view == Branch::Good));
        assert_eq!(
            target_view(TargetPolicy::None, Branch::NoSkill),
            Branch::NoSkill
        );
    }

    #[test]
    fn without_other_prompts_the_winner_is_its_own_target_against_the_cell_mean() {
        // Returns 1.0 (good, winner), 0.2, 0.0: mean 0.4, gap 0.6, w = 2.0 (capped from 3).
        let cell = vec![
            rec(0, Branch::Good, 1.0),
            rec(1, Branch::Good, 0.2),
            rec(2, Branch::NoSkill, 0.0),
        ];
        let out = cell_pairs(&cell, &UcobConfig::default(), &mut |r, _| r.row == 0);
        assert_eq!(out.raw, 1);
        let p = out.pairs[0];
        assert!(p.fallback && p.winner == p.target && p.target.row == 0);
        assert!((p.gap - 0.6).abs() < 1e-12, "{}", p.gap);
        assert_eq!(p.weight, 2.0);
        // Neither has a prompt: the pair is counted as missing, not kept.
        let out = cell_pairs(&cell, &UcobConfig::default(), &mut |_, _| false);
        assert_eq!((out.pairs.len(), out.raw, out.missing_prompt), (0, 1, 1));
        // A singleton cell: the gap against its own mean is 0, filtered by the margin.
        let out = cell_pairs(&cell[..1], &UcobConfig::default(), &mut |_, _| true);
        assert_eq!((out.pairs.len(), out.raw, out.margin_filtered), (0, 1, 1));
    }
}
