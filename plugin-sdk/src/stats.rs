//! Group statistics shared by advantage estimators (docs/algorithms/kernel-contract.md, P8):
//! grouping by id, mean and standard deviation, group normalisation, discounted returns, masked whitening, and
//! the batch views built on them: [`trajectories`] (rows of one rollout in turn order),
//! [`outcome_advantages`] (GRPO-style episode-level normalisation, over rows or trajectories),
//! [`anchor_groups`] (GiGPO step groups, exact or fuzzy with [`similarity_ratio`]),
//! [`turn_returns`] and [`broadcast_rows`].
//!
//! All arithmetic is in `f64`; callers convert to `f32` at the end. Groups are always formed
//! from ids, never from a fixed stride, so groups may have different sizes. Functions that read
//! a [`Batch`] validate what they read and return an input error naming the row.

use std::collections::HashMap;
use std::hash::Hash;

use crate::batch::Batch;
use crate::error::{PluginError, Result};

/// Indices of equal keys, groups in order of first appearance.
pub fn group_indices<K: Hash + Eq + Clone>(keys: &[K]) -> Vec<Vec<usize>> {
    let mut slot: HashMap<K, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let g = *slot.entry(k.clone()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// Arithmetic mean; 0 for an empty slice.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Which standard deviation to divide by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdKind {
    /// N−1 denominator (verl's `torch.std`; docs/algorithms/grpo.md).
    Unbiased,
    /// N denominator.
    Population,
}

/// Standard deviation; 0 when undefined (empty, or a single value for `Unbiased`).
pub fn std(values: &[f64], kind: StdKind) -> f64 {
    let n = values.len();
    let denom = match kind {
        StdKind::Unbiased if n < 2 => return 0.0,
        StdKind::Unbiased => (n - 1) as f64,
        StdKind::Population if n == 0 => return 0.0,
        StdKind::Population => n as f64,
    };
    let m = mean(values);
    (values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / denom).sqrt()
}

/// True when every value equals the first up to float error: the group carries no signal.
///
/// "Zero up to float error" is decided on the spread (max − min), relative to the magnitude of
/// the values, so a group like `[0.1, 0.1, 0.1]` whose computed std is `1e-17` counts as zero.
pub fn is_constant(values: &[f64]) -> bool {
    let (lo, hi) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if values.is_empty() {
        return true;
    }
    let scale = lo.abs().max(hi.abs()).max(1.0);
    hi - lo <= 1e-9 * scale
}

/// How group normalisation divides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Normalise {
    /// `(x − μ) / (s + ε)` with the given std.
    MeanStd { eps: f64, std: StdKind },
    /// `x − μ` (Dr.GRPO, GiGPO `mean_norm`).
    Mean,
}

/// Normalises `values` within each group (lists of indices into `values`).
///
/// Rules (verl `compute_grpo_outcome_advantage`): a group of one sample uses μ = 0, s = 1, so
/// its value passes through; a constant group ([`is_constant`]) gives exactly 0 for every
/// member, whatever the mode.
pub fn normalise_groups(values: &[f64], groups: &[Vec<usize>], mode: Normalise) -> Vec<f64> {
    let mut out = vec![0.0; values.len()];
    for group in groups {
        let xs: Vec<f64> = group.iter().map(|&i| values[i]).collect();
        if xs.len() == 1 {
            let (mu, s) = (0.0, 1.0);
            out[group[0]] = match mode {
                Normalise::MeanStd { eps, .. } => (xs[0] - mu) / (s + eps),
                Normalise::Mean => xs[0] - mu,
            };
            continue;
        }
        if is_constant(&xs) {
            continue; // exactly zero
        }
        let mu = mean(&xs);
        for (&i, &x) in group.iter().zip(&xs) {
            out[i] = match mode {
                Normalise::MeanStd { eps, std: kind } => (x - mu) / (std(&xs, kind) + eps),
                Normalise::Mean => x - mu,
            };
        }
    }
    out
}

/// Discounted returns `G_t = Σ_{k≥t} γ^{k−t} r_k`.
pub fn discounted_returns(rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut out = vec![0.0; rewards.len()];
    let mut acc = 0.0;
    for t in (0..rewards.len()).rev() {
        acc = rewards[t] + gamma * acc;
        out[t] = acc;
    }
    out
}

/// Masked whitening of per-token values (verl `masked_whiten`, ReSkill's batch-level second
/// normalisation, REINFORCE++): `(x − μ) / sqrt(s² + eps)` over the tokens whose mask is 1,
/// with `μ` and `s` the mean and standard deviation of exactly those values.
///
/// Select-then-reduce: masked slots (mask 0) never enter a sum, so a NaN or infinity there is
/// harmless (AReaL #1347); they come out as 0. The standard deviation convention is
/// the caller's choice; Cairn's plugins use [`StdKind::Unbiased`] like verl's `masked_var`
/// (Bessel-corrected), which maps `[1, 3, 5]` to `[−1, 0, 1]` (population would give ±1.2247).
/// Fewer than two selected values (or a constant selection) give all zeros. `values` and
/// `masks` must have the same shape; the output has it too.
pub fn masked_whiten(
    values: &[Vec<f64>],
    masks: &[Vec<u8>],
    kind: StdKind,
    eps: f64,
) -> Vec<Vec<f64>> {
    let selected: Vec<f64> = values
        .iter()
        .zip(masks)
        .flat_map(|(v, m)| v.iter().zip(m).filter(|(_, &m)| m == 1).map(|(&x, _)| x))
        .collect();
    let constant = is_constant(&selected);
    let mu = mean(&selected);
    let s = std(&selected, kind);
    let scale = 1.0 / (s * s + eps).sqrt();
    values
        .iter()
        .zip(masks)
        .map(|(v, m)| {
            v.iter()
                .zip(m)
                .map(|(&x, &m)| {
                    if m == 1 && !constant {
                        (x - mu) * scale
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect()
}

/// The rows of one trajectory (rollout) of a batch, in turn order.
#[derive(Clone, Debug, PartialEq)]
pub struct Trajectory {
    /// `TurnRow::trajectory_id`.
    pub id: u64,
    /// `TurnRow::group_id`, the same on every row of the trajectory.
    pub group_id: u64,
    /// Indices into `batch.rows`, ordered by `turn`.
    pub rows: Vec<usize>,
    /// The episode (outcome) reward `R_i`, the same on every row.
    pub episode_reward: f64,
    /// Whether the trajectory solved its task, the same on every row.
    pub success: bool,
}

/// Splits a batch into trajectories (by `trajectory_id`, in order of first appearance), each
/// with its rows sorted by turn.
///
/// Checks the invariants every outcome-based estimator relies on: all rows of a trajectory share
/// `group_id`, `episode_reward` and `success`; turn indices are distinct; the episode reward is
/// finite. The error names the rows involved.
pub fn trajectories(batch: &Batch) -> Result<Vec<Trajectory>> {
    let ids: Vec<u64> = batch.rows.iter().map(|r| r.trajectory_id).collect();
    let mut out = Vec::new();
    for mut rows in group_indices(&ids) {
        rows.sort_by_key(|&i| batch.rows[i].turn);
        let first = rows[0];
        let head = &batch.rows[first];
        if !head.episode_reward.is_finite() {
            return Err(PluginError::input(format!(
                "row {first}: episode_reward is {}; rewards must be finite",
                head.episode_reward
            )));
        }
        for pair in rows.windows(2) {
            let (a, b) = (&batch.rows[pair[0]], &batch.rows[pair[1]]);
            let same = |what: &str, ok: bool| {
                if ok {
                    Ok(())
                } else {
                    Err(PluginError::input(format!(
                        "rows {} and {} belong to trajectory {} but differ in {what}; every row \
                         of a trajectory carries the same {what}",
                        pair[0], pair[1], head.trajectory_id
                    )))
                }
            };
            same("group_id", a.group_id == b.group_id)?;
            same("episode_reward", a.episode_reward == b.episode_reward)?;
            same("success", a.success == b.success)?;
            if a.turn == b.turn {
                return Err(PluginError::input(format!(
                    "rows {} and {} are both turn {} of trajectory {}; turn indices must be \
                     distinct",
                    pair[0], pair[1], a.turn, head.trajectory_id
                )));
            }
        }
        out.push(Trajectory {
            id: head.trajectory_id,
            group_id: head.group_id,
            episode_reward: f64::from(head.episode_reward),
            success: head.success,
            rows,
        });
    }
    Ok(out)
}

/// Which samples the episode-level statistics of a group are taken over (verl-agent
/// `compute_mean_std_cross_steps`; the two differ, docs/algorithms/gigpo.md: 6.25 vs 6.667).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeSamples {
    /// One sample per row: a trajectory with T turns contributes its reward T times
    /// (`compute_mean_std_cross_steps = true`, the verl-agent default).
    Rows,
    /// One sample per trajectory (`compute_mean_std_cross_steps = false`).
    Trajectories,
}

/// Episode-level group-relative advantage of each trajectory (GRPO, GiGPO's episode term).
///
/// `rewards[i]` is the (possibly shaped) outcome reward of `trajs[i]`; groups are formed from
/// `group_id`. Each group's samples are its trajectories' rewards, once per row or once per
/// trajectory (`samples`), normalised with [`normalise_groups`]' rules: one sample → `μ = 0,
/// s = 1`; constant (up to float error) → exactly 0. Returns one advantage per trajectory.
pub fn outcome_advantages(
    trajs: &[Trajectory],
    rewards: &[f64],
    mode: Normalise,
    samples: OutcomeSamples,
) -> Vec<f64> {
    let group_ids: Vec<u64> = trajs.iter().map(|t| t.group_id).collect();
    let mut out = vec![0.0; trajs.len()];
    for group in group_indices(&group_ids) {
        let xs: Vec<f64> = group
            .iter()
            .flat_map(|&i| {
                let copies = match samples {
                    OutcomeSamples::Rows => trajs[i].rows.len(),
                    OutcomeSamples::Trajectories => 1,
                };
                std::iter::repeat_n(rewards[i], copies)
            })
            .collect();
        let (mu, s) = if xs.len() == 1 {
            (0.0, 1.0)
        } else if is_constant(&xs) {
            continue; // exactly zero
        } else {
            let s = match mode {
                Normalise::MeanStd { std: kind, .. } => std(&xs, kind),
                Normalise::Mean => 1.0,
            };
            (mean(&xs), s)
        };
        let divisor = match mode {
            Normalise::MeanStd { eps, .. } => s + eps,
            Normalise::Mean => 1.0,
        };
        for &i in &group {
            out[i] = (rewards[i] - mu) / divisor;
        }
    }
    out
}

/// How anchor-state keys are matched into step groups (GiGPO `enable_similarity`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AnchorMatching {
    /// Rows whose anchor strings are equal.
    Exact,
    /// Greedy clustering: in row order, a row joins the first cluster of its task group whose
    /// representative (first member) has [`similarity_ratio`]`(anchor, representative) ≥
    /// threshold`, else starts a new cluster. verl-agent's default threshold is 0.95.
    Similar { threshold: f64 },
}

/// GiGPO step groups (arXiv 2505.10978 §3; docs/algorithms/gigpo.md): rows of the same task group (`group_id`) whose anchor
/// keys match. Returns lists of indices into `batch.rows`, in order of first appearance; every
/// row is in exactly one group. A row without an anchor key is an input error naming it.
pub fn anchor_groups(batch: &Batch, matching: AnchorMatching) -> Result<Vec<Vec<usize>>> {
    let mut anchors = Vec::with_capacity(batch.rows.len());
    for (i, row) in batch.rows.iter().enumerate() {
        match &row.anchor {
            Some(a) => anchors.push(a.as_str()),
            None => {
                return Err(PluginError::input(format!(
                    "row {i} (trajectory {}, turn {}) has no anchor key; the environment must \
                     report the anchor state of every turn",
                    row.trajectory_id, row.turn
                )))
            }
        }
    }
    match matching {
        AnchorMatching::Exact => {
            let keys: Vec<(u64, &str)> = batch
                .rows
                .iter()
                .zip(&anchors)
                .map(|(r, &a)| (r.group_id, a))
                .collect();
            Ok(group_indices(&keys))
        }
        AnchorMatching::Similar { threshold } => {
            let group_ids: Vec<u64> = batch.rows.iter().map(|r| r.group_id).collect();
            // Clusters of all task groups, in order of creation.
            let mut clusters: Vec<Vec<usize>> = Vec::new();
            for group in group_indices(&group_ids) {
                let first_cluster = clusters.len();
                for i in group {
                    let found = clusters[first_cluster..]
                        .iter()
                        .position(|c| similarity_ratio(anchors[i], anchors[c[0]]) >= threshold);
                    match found {
                        Some(k) => clusters[first_cluster + k].push(i),
                        None => clusters.push(vec![i]),
                    }
                }
            }
            Ok(clusters)
        }
    }
}

/// The similarity ratio of Python's `difflib.SequenceMatcher(None, a, b).ratio()`, over Unicode
/// scalar values: `2·M / (|a| + |b|)`, where `M` is the number of characters in the matching
/// blocks (1.0 when both strings are empty).
///
/// The matching blocks are found exactly as difflib does (Ratcliff–Obershelp): take the longest
/// common block of `a[alo..ahi]` and `b[blo..bhi]` (ties: the earliest in `a`, then in `b`),
/// then recurse on the pieces left and right of it. Like difflib's default `autojunk = true`,
/// when `|b| ≥ 200` any character occurring more than `|b|/100 + 1` times in `b` is "popular":
/// it cannot start a block, though blocks may still extend over it. The ratio is therefore not
/// symmetric for long strings; GiGPO calls it as `ratio(new observation, representative)`.
pub fn similarity_ratio(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    2.0 * BlockMatcher::new(&a, &b).matched_chars() as f64 / total as f64
}

/// difflib's `SequenceMatcher` with no junk function, for [`similarity_ratio`].
struct BlockMatcher<'a> {
    a: &'a [char],
    b: &'a [char],
    /// Positions of each non-popular character of `b`, ascending.
    b2j: HashMap<char, Vec<usize>>,
}

impl<'a> BlockMatcher<'a> {
    fn new(a: &'a [char], b: &'a [char]) -> Self {
        let mut b2j: HashMap<char, Vec<usize>> = HashMap::new();
        for (j, &c) in b.iter().enumerate() {
            b2j.entry(c).or_default().push(j);
        }
        if b.len() >= 200 {
            let popular = b.len() / 100 + 1;
            b2j.retain(|_, js| js.len() <= popular);
        }
        BlockMatcher { a, b, b2j }
    }

    /// difflib `find_longest_match(alo, ahi, blo, bhi)`: `(i, j, size)`.
    fn longest_match(
        &self,
        alo: usize,
        ahi: usize,
        blo: usize,
        bhi: usize,
    ) -> (usize, usize, usize) {
        let (a, b) = (self.a, self.b);
        let (mut besti, mut bestj, mut best) = (alo, blo, 0);
        // j2len[j]: length of the longest block ending at a[i−1], b[j].
        let mut j2len: HashMap<usize, usize> = HashMap::new();
        for (i, c) in a.iter().enumerate().take(ahi).skip(alo) {
            let mut next: HashMap<usize, usize> = HashMap::new();
            for &j in self.b2j.get(c).map_or(&[][..], Vec::as_slice) {
                if j < blo {
                    continue;
                }
                if j >= bhi {
                    break;
                }
                let k = if j == 0 {
                    0
                } else {
                    j2len.get(&(j - 1)).copied().unwrap_or(0)
                } + 1;
                next.insert(j, k);
                if k > best {
                    (besti, bestj, best) = (i + 1 - k, j + 1 - k, k);
                }
            }
            j2len = next;
        }
        // Extend over equal (possibly popular) characters on both ends.
        while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
            (besti, bestj, best) = (besti - 1, bestj - 1, best + 1);
        }
        while besti + best < ahi && bestj + best < bhi && a[besti + best] == b[bestj + best] {
            best += 1;
        }
        (besti, bestj, best)
    }

    /// Σ sizes of difflib's `get_matching_blocks()`.
    fn matched_chars(&self) -> usize {
        let mut total = 0;
        let mut queue = vec![(0, self.a.len(), 0, self.b.len())];
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.longest_match(alo, ahi, blo, bhi);
            if k == 0 {
                continue;
            }
            total += k;
            if alo < i && blo < j {
                queue.push((alo, i, blo, j));
            }
            if i + k < ahi && j + k < bhi {
                queue.push((i + k, ahi, j + k, bhi));
            }
        }
        total
    }
}

/// Discounted turn returns `G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k}` of every row, from the rows'
/// `turn_reward` in turn order within each trajectory. Returns one value per batch row.
pub fn turn_returns(batch: &Batch, trajs: &[Trajectory], gamma: f64) -> Result<Vec<f64>> {
    let mut out = vec![0.0; batch.rows.len()];
    for traj in trajs {
        let mut rewards = Vec::with_capacity(traj.rows.len());
        for &i in &traj.rows {
            let r = batch.rows[i].turn_reward;
            if !r.is_finite() {
                return Err(PluginError::input(format!(
                    "row {i}: turn_reward is {r}; rewards must be finite"
                )));
            }
            rewards.push(f64::from(r));
        }
        for (&i, g) in traj.rows.iter().zip(discounted_returns(&rewards, gamma)) {
            out[i] = g;
        }
    }
    Ok(out)
}

/// Broadcasts one value per row to that row's trainable tokens: `[rows][L_r]`, `value` where
/// the response mask is 1 and exactly 0 elsewhere.
pub fn broadcast_rows(batch: &Batch, per_row: &[f64]) -> Vec<Vec<f32>> {
    batch
        .rows
        .iter()
        .zip(per_row)
        .map(|(row, &v)| {
            row.response_mask
                .iter()
                .map(|&m| if m == 1 { v as f32 } else { 0.0 })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::TurnRow;

    fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn groups_follow_ids_not_stride() {
        assert_eq!(
            group_indices(&[7u64, 3, 7, 9, 3]),
            vec![vec![0, 2], vec![1, 4], vec![3]]
        );
    }

    #[test]
    fn grpo_worked_example_section_1e() {
        let r = [1.0, 0.0, 0.5, 0.0];
        let g = vec![vec![0, 1, 2, 3]];
        let unbiased = Normalise::MeanStd {
            eps: 1e-6,
            std: StdKind::Unbiased,
        };
        close(
            &normalise_groups(&r, &g, unbiased),
            &[1.3056, -0.7833, 0.2611, -0.7833],
            1e-4,
        );
        let population = Normalise::MeanStd {
            eps: 1e-6,
            std: StdKind::Population,
        };
        close(
            &normalise_groups(&r, &g, population),
            &[1.5076, -0.9045, 0.3015, -0.9045],
            1e-4,
        );
        close(
            &normalise_groups(&r, &g, Normalise::Mean),
            &[0.625, -0.375, 0.125, -0.375],
            1e-12,
        );
        assert_eq!(normalise_groups(&[1.0; 4], &g, unbiased), vec![0.0; 4]);
    }

    #[test]
    fn constant_up_to_float_error_is_zero() {
        let r = [0.1 + 0.2, 0.3, 0.30000000000000004];
        let g = vec![vec![0, 1, 2]];
        let out = normalise_groups(
            &r,
            &g,
            Normalise::MeanStd {
                eps: 1e-6,
                std: StdKind::Unbiased,
            },
        );
        assert_eq!(out, vec![0.0; 3]);
        assert!(!is_constant(&[0.0, 1e-3]));
    }

    #[test]
    fn singleton_group_passes_through() {
        let out = normalise_groups(&[0.7], &[vec![0]], Normalise::Mean);
        assert_eq!(out, vec![0.7]);
    }

    /// One row of a test batch: group, trajectory, turn, episode reward, mask.
    fn row(group: u64, traj: u64, turn: u32, reward: f32, mask: &[u8]) -> TurnRow {
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            turn,
            episode_reward: reward,
            response_ids: vec![1; mask.len()],
            response_logprobs: vec![0.0; mask.len()],
            response_mask: mask.to_vec(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn masked_whiten_ignores_nan_in_masked_slots_areal_1347() {
        // Case areal-1347-masked-nan-normalisation: values [[1, NaN], [3, 5]], mask [[1,0],[1,1]].
        let values = vec![vec![1.0, f64::NAN], vec![3.0, 5.0]];
        let masks = vec![vec![1, 0], vec![1, 1]];
        // Cairn's convention: unbiased (sample) std, as verl's masked_var.
        let out = masked_whiten(&values, &masks, StdKind::Unbiased, 1e-8);
        close(&out.concat(), &[-1.0, 0.0, 0.0, 1.0], 1e-6);
        // The case's other convention, for the record: population std.
        let out = masked_whiten(&values, &masks, StdKind::Population, 1e-8);
        close(&out.concat(), &[-1.224745, 0.0, 0.0, 1.224745], 1e-6);
        assert_eq!(
            masked_whiten(&[vec![2.0, 2.0]], &[vec![1, 1]], StdKind::Unbiased, 1e-8),
            vec![vec![0.0, 0.0]]
        );
    }

    #[test]
    fn trajectories_sort_turns_and_check_invariants() {
        let batch = Batch {
            step: 0,
            rows: vec![
                row(1, 10, 1, 1.0, &[1]),
                row(1, 11, 0, 0.0, &[1]),
                row(1, 10, 0, 1.0, &[1]),
            ],
        };
        let t = trajectories(&batch).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].id, t[0].rows.clone(), t[0].episode_reward),
            (10, vec![2, 0], 1.0)
        );
        assert_eq!(t[1].rows, vec![1]);

        let mut bad = batch.clone();
        bad.rows[2].episode_reward = 0.5;
        let e = trajectories(&bad).unwrap_err();
        assert!(
            e.message.contains("rows 2 and 0") && e.message.contains("episode_reward"),
            "{e}"
        );
        let mut bad = batch.clone();
        bad.rows[0].turn = 0;
        assert!(trajectories(&bad)
            .unwrap_err()
            .message
            .contains("both turn 0"));
        let mut bad = batch;
        bad.rows[1].episode_reward = f32::NAN;
        assert!(trajectories(&bad)
            .unwrap_err()
            .message
            .contains("row 1: episode_reward is NaN"));
    }

    /// docs/algorithms/gigpo.md, worked example: rows of A (2 turns, R = 10), B (3 turns, 10), C (3 turns, 0).
    fn gigpo_example() -> Batch {
        let anchors = [
            ("s0", 0, 0),
            ("s1", 0, 1),
            ("s0", 1, 0),
            ("s2", 1, 1),
            ("s1", 1, 2),
            ("s0", 2, 0),
            ("s2", 2, 1),
            ("s2", 2, 2),
        ];
        let rows = anchors
            .iter()
            .map(|&(a, traj, turn)| {
                let reward = if traj == 2 { 0.0 } else { 10.0 };
                let last = (traj == 0 && turn == 1) || (traj != 0 && turn == 2);
                TurnRow {
                    anchor: Some(a.to_string()),
                    turn_reward: if last { reward } else { 0.0 },
                    ..row(7, traj, turn, reward, &[1, 1])
                }
            })
            .collect();
        Batch { step: 0, rows }
    }

    #[test]
    fn outcome_advantages_over_rows_or_trajectories() {
        let batch = gigpo_example();
        let t = trajectories(&batch).unwrap();
        let r: Vec<f64> = t.iter().map(|t| t.episode_reward).collect();
        // Mean over rows 6.25, over trajectories 6.6667 (docs/algorithms/gigpo.md).
        close(
            &outcome_advantages(&t, &r, Normalise::Mean, OutcomeSamples::Rows),
            &[3.75, 3.75, -6.25],
            1e-12,
        );
        let third = 10.0 / 3.0;
        close(
            &outcome_advantages(&t, &r, Normalise::Mean, OutcomeSamples::Trajectories),
            &[third, third, -2.0 * third],
            1e-12,
        );
        let std = Normalise::MeanStd {
            eps: 1e-6,
            std: StdKind::Unbiased,
        };
        close(
            &outcome_advantages(&t, &r, std, OutcomeSamples::Rows),
            &[0.7246, 0.7246, -1.2076],
            1e-4,
        );
        // A lone one-row trajectory passes through (μ = 0, s = 1), a lone multi-row one is
        // constant over its rows and gets 0 — verl-agent's rules.
        let lone = Batch {
            step: 0,
            rows: vec![
                row(1, 1, 0, 0.5, &[1]),
                row(2, 2, 0, 0.5, &[1]),
                row(2, 2, 1, 0.5, &[1]),
            ],
        };
        let t = trajectories(&lone).unwrap();
        close(
            &outcome_advantages(&t, &[0.5, 0.5], std, OutcomeSamples::Rows),
            &[0.5 / (1.0 + 1e-6), 0.0],
            1e-15,
        );
    }

    #[test]
    fn anchor_groups_and_turn_returns_match_gigpo_example() {
        let batch = gigpo_example();
        let groups = anchor_groups(&batch, AnchorMatching::Exact).unwrap();
        assert_eq!(groups, vec![vec![0, 2, 5], vec![1, 4], vec![3, 6, 7]]);
        let t = trajectories(&batch).unwrap();
        let g = turn_returns(&batch, &t, 0.95).unwrap();
        close(&g, &[9.5, 10.0, 9.025, 9.5, 10.0, 0.0, 0.0, 0.0], 1e-12);

        // Different task groups never share a step group.
        let mut two = batch.clone();
        two.rows[5].group_id = 8;
        assert_eq!(
            anchor_groups(&two, AnchorMatching::Exact).unwrap()[0],
            vec![0, 2]
        );

        let mut missing = batch;
        missing.rows[3].anchor = None;
        let e = anchor_groups(&missing, AnchorMatching::Exact).unwrap_err();
        assert!(
            e.message
                .contains("row 3 (trajectory 1, turn 1) has no anchor key"),
            "{e}"
        );
    }

    #[test]
    fn fuzzy_anchor_groups_cluster_greedily() {
        let obs = [
            "kitchen: fridge 1, table 2",
            "kitchen: fridge 1, table 3",
            "hallway",
            "kitchen: fridge 1, table 2!",
        ];
        let rows = obs
            .iter()
            .enumerate()
            .map(|(i, o)| TurnRow {
                anchor: Some(o.to_string()),
                ..row(1, i as u64, 0, 0.0, &[1])
            })
            .collect();
        let batch = Batch { step: 0, rows };
        // ratio(row 1, row 0) = 0.9615 ≥ 0.95; ratio(row 3, row 0) = 52/53 = 0.981.
        let groups = anchor_groups(&batch, AnchorMatching::Similar { threshold: 0.95 }).unwrap();
        assert_eq!(groups, vec![vec![0, 1, 3], vec![2]]);
        let groups = anchor_groups(&batch, AnchorMatching::Similar { threshold: 0.97 }).unwrap();
        assert_eq!(groups, vec![vec![0, 3], vec![1], vec![2]]);
    }

    #[test]
    fn similarity_ratio_matches_python_difflib() {
        // Reference values from CPython 3 `difflib.SequenceMatcher(None, a, b).ratio()`.
        let room = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, a knife 3, and a spatula 1. ".repeat(3);
        let room2 = "You arrive at countertop 1. On the countertop 1, you see a apple 2, a bread 2, a knife 1, and a spatula 1. ".repeat(3);
        let xs = format!("{}abc{}", "x".repeat(150), "y".repeat(100));
        let ys = format!("{}abc{}", "y".repeat(100), "x".repeat(150));
        let cases: [(&str, &str, f64); 10] = [
            ("", "", 1.0),
            ("abc", "", 0.0),
            ("abcd", "bcde", 0.75),
            (
                "You are in the middle of a room.",
                "You are in the middle of a room!",
                0.96875,
            ),
            (
                "kitchen: fridge 1, table 2",
                "kitchen: fridge 1, table 3",
                0.9615384615384616,
            ),
            (
                "the cat sat on the mat",
                "the mat sat on the cat",
                0.9090909090909091,
            ),
            ("héllo wörld", "hello world", 0.8181818181818182),
            // |b| ≥ 200: autojunk makes the ratio asymmetric.
            (&room, &room2, 0.9221183800623053),
            (&room2, &room, 0.5669781931464174),
            (&xs, &ys, 0.011857707509881422),
        ];
        for (a, b, want) in cases {
            let got = similarity_ratio(a, b);
            assert!(
                (got - want).abs() < 1e-15,
                "ratio({a:?}, {b:?}) = {got}, difflib gives {want}"
            );
        }
    }

    #[test]
    fn broadcast_writes_only_trainable_tokens() {
        let batch = Batch {
            step: 0,
            rows: vec![row(1, 1, 0, 0.0, &[0, 1, 1, 0]), row(1, 2, 0, 0.0, &[])],
        };
        assert_eq!(
            broadcast_rows(&batch, &[0.5, 2.0]),
            vec![vec![0.0, 0.5, 0.5, 0.0], vec![]]
        );
    }

    #[test]
    fn discounted_returns_match_gigpo_example() {
        close(
            &discounted_returns(&[0.0, 0.0, 10.0], 0.95),
            &[9.025, 9.5, 10.0],
            1e-12,
        );
    }
}
