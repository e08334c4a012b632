//! Group statistics shared by advantage estimators (algorithms.md §14, P8): grouping by id,
//! mean and standard deviation, group normalisation, discounted returns.
//!
//! All arithmetic is in `f64`; callers convert to `f32` at the end. Groups are always formed
//! from ids, never from a fixed stride, so groups may have different sizes.

use std::collections::HashMap;
use std::hash::Hash;

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
    /// N−1 denominator (verl's `torch.std`, algorithms.md §1).
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
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn groups_follow_ids_not_stride() {
        assert_eq!(group_indices(&[7u64, 3, 7, 9, 3]), vec![vec![0, 2], vec![1, 4], vec![3]]);
    }

    #[test]
    fn grpo_worked_example_section_1e() {
        let r = [1.0, 0.0, 0.5, 0.0];
        let g = vec![vec![0, 1, 2, 3]];
        let unbiased = Normalise::MeanStd { eps: 1e-6, std: StdKind::Unbiased };
        close(&normalise_groups(&r, &g, unbiased), &[1.3056, -0.7833, 0.2611, -0.7833], 1e-4);
        let population = Normalise::MeanStd { eps: 1e-6, std: StdKind::Population };
        close(&normalise_groups(&r, &g, population), &[1.5076, -0.9045, 0.3015, -0.9045], 1e-4);
        close(&normalise_groups(&r, &g, Normalise::Mean), &[0.625, -0.375, 0.125, -0.375], 1e-12);
        assert_eq!(normalise_groups(&[1.0; 4], &g, unbiased), vec![0.0; 4]);
    }

    #[test]
    fn constant_up_to_float_error_is_zero() {
        let r = [0.1 + 0.2, 0.3, 0.30000000000000004];
        let g = vec![vec![0, 1, 2]];
        let out = normalise_groups(&r, &g, Normalise::MeanStd { eps: 1e-6, std: StdKind::Unbiased });
        assert_eq!(out, vec![0.0; 3]);
        assert!(!is_constant(&[0.0, 1e-3]));
    }

    #[test]
    fn singleton_group_passes_through() {
        let out = normalise_groups(&[0.7], &[vec![0]], Normalise::Mean);
        assert_eq!(out, vec![0.7]);
    }

    #[test]
    fn discounted_returns_match_gigpo_example() {
        close(&discounted_returns(&[0.0, 0.0, 10.0], 0.95), &[9.025, 9.5, 10.0], 1e-12);
    }
}
