//! KL estimators to the reference policy: values, exact gradients, and the reward-side penalty
//! (`kl_mode = reward`).

use cairn_plugin_sdk::stats::group_indices;
use cairn_plugin_sdk::Batch;
use serde::Serialize;

use super::config::{KlEstimator, ObjectiveConfig};
use crate::error::{Error, Result};

/// verl clamps `low_var_kl` (k3) to `[−K3_CLAMP, K3_CLAMP]`.
pub const K3_CLAMP: f64 = 10.0;

/// Value of the estimator at one token, `ℓ` = current (or sampling) log-prob, `ℓ_ref` =
/// reference log-prob (see [`KlEstimator`] for the formulas).
pub fn kl_value(estimator: KlEstimator, logp: f64, ref_logp: f64) -> f64 {
    kl_value_and_grad(estimator, logp, ref_logp).0
}

/// `(k, ∂k/∂ℓ)` at one token. k3 is evaluated as `expm1(δ) − δ` (no cancellation for small
/// `δ`); where its clamp is active the gradient is 0, as autodiff through `clamp` gives.
pub fn kl_value_and_grad(estimator: KlEstimator, logp: f64, ref_logp: f64) -> (f64, f64) {
    match estimator {
        KlEstimator::K1 => (logp - ref_logp, 1.0),
        KlEstimator::K2 => {
            let d = logp - ref_logp;
            (0.5 * d * d, d)
        }
        KlEstimator::K3 => {
            let delta = ref_logp - logp;
            let k = delta.exp_m1() - delta;
            if k > K3_CLAMP {
                (K3_CLAMP, 0.0)
            } else {
                // ∂/∂ℓ (e^δ − δ − 1) with δ = ℓ_ref − ℓ: −e^δ + 1.
                (k, -delta.exp_m1())
            }
        }
    }
}

/// What [`apply_kl_to_rewards`] did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KlPenaltyReport {
    /// `kl_coef · Σ_l k_l` over each row's mask-1 tokens, `[rows]`: subtracted from the row's
    /// `turn_reward`.
    pub row_penalty: Vec<f64>,
    /// Token mean of the estimator `k` (not scaled by `kl_coef`) over all mask-1 tokens.
    pub mean_token_kl: f64,
    /// Mask-1 tokens read.
    pub tokens: usize,
}

/// `kl_mode = reward`: puts the per-token KL penalty into the rewards, before the algorithm
/// computes advantages. Call it once per batch, after the reward actor and before
/// `Algorithm::signals`.
///
/// With `k_l` the configured estimator between `logp` (the sampling policy's log-probs: the
/// recomputed `ℓ_old`, or the rollout's `response_logprobs`) and `ref_logp`, both `[rows][L]`:
///
/// * each row's penalty is `p_row = kl_coef · Σ_{l: m=1} k_l`, and `turn_reward −= p_row` (the
///   turn that incurred the divergence pays for it, so discounted step returns see it there);
/// * each trajectory's `episode_reward −= Σ_{its rows} p_row`, on every row, so the outcome
///   reward stays the same on all rows of a trajectory. This equals verl's token-level
///   `score − β·kld` summed over the whole trajectory (verl-agent sums per row instead, which
///   would give the rows of one trajectory different outcomes);
/// * `info["kl_penalty"]` records `p_row`; a batch that already carries it is rejected, so the
///   penalty cannot be applied twice.
///
/// Masked slots are never read (they may hold NaN). The penalty is not in the loss: with
/// `kl_mode = reward` the [`super::RlLoss`] adds no KL term (it still reports the KL metric).
pub fn apply_kl_to_rewards(
    config: &ObjectiveConfig,
    batch: &mut Batch,
    logp: &[Vec<f32>],
    ref_logp: &[Vec<f32>],
) -> Result<KlPenaltyReport> {
    let n = batch.rows.len();
    if logp.len() != n || ref_logp.len() != n {
        return Err(Error::Shape {
            what: "kl penalty",
            detail: format!(
                "the batch has {n} rows but logp has {} and ref_logp {}",
                logp.len(),
                ref_logp.len()
            ),
        });
    }
    let mut report = KlPenaltyReport {
        row_penalty: Vec::with_capacity(n),
        ..Default::default()
    };
    let mut kl_sum = 0.0;
    for (r, row) in batch.rows.iter().enumerate() {
        if row.info.contains_key("kl_penalty") {
            return Err(Error::Other(format!(
                "row {r} already carries info.kl_penalty: the KL penalty was applied to this \
                 batch before; apply it once"
            )));
        }
        let l = row.response_mask.len();
        if logp[r].len() != l || ref_logp[r].len() != l {
            return Err(Error::Shape {
                what: "kl penalty",
                detail: format!(
                    "row {r}: mask has {l} tokens but logp has {} and ref_logp {}",
                    logp[r].len(),
                    ref_logp[r].len()
                ),
            });
        }
        let mut row_sum = 0.0;
        for (t, _) in row
            .response_mask
            .iter()
            .enumerate()
            .filter(|(_, &m)| m == 1)
        {
            let (a, b) = (f64::from(logp[r][t]), f64::from(ref_logp[r][t]));
            if !a.is_finite() || !b.is_finite() {
                return Err(Error::Other(format!(
                    "kl penalty: row {r}, token {t}: log-prob {a} / reference log-prob {b} is not \
                     finite on a trainable token"
                )));
            }
            let k = kl_value(config.kl_estimator, a, b);
            row_sum += k;
            report.tokens += 1;
        }
        kl_sum += row_sum;
        report.row_penalty.push(config.kl_coef * row_sum);
    }
    let ids: Vec<u64> = batch.rows.iter().map(|r| r.trajectory_id).collect();
    for traj in group_indices(&ids) {
        let total: f64 = traj.iter().map(|&r| report.row_penalty[r]).sum();
        for &r in &traj {
            let row = &mut batch.rows[r];
            let p = report.row_penalty[r];
            row.turn_reward = (f64::from(row.turn_reward) - p) as f32;
            row.episode_reward = (f64::from(row.episode_reward) - total) as f32;
            row.info.insert("kl_penalty".into(), serde_json::json!(p));
        }
    }
    report.mean_token_kl = if report.tokens == 0 {
        0.0
    } else {
        kl_sum / report.tokens as f64
    };
    Ok(report)
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::TurnRow;

    use super::*;

    fn close(got: f64, want: f64, tol: f64, what: &str) {
        assert!((got - want).abs() <= tol, "{what}: got {got}, want {want}");
    }

    /// `check(estimator, ℓ, ℓ_ref, value, gradient)`.
    fn check(est: KlEstimator, logp: f64, ref_logp: f64, value: f64, grad: f64) {
        let (k, g) = kl_value_and_grad(est, logp, ref_logp);
        close(
            k,
            value,
            1e-6,
            &format!("{est:?} value at ({logp}, {ref_logp})"),
        );
        close(
            g,
            grad,
            1e-6,
            &format!("{est:?} gradient at ({logp}, {ref_logp})"),
        );
        // The gradient is the derivative of the value (central difference).
        let h = 1e-6;
        let fd =
            (kl_value(est, logp + h, ref_logp) - kl_value(est, logp - h, ref_logp)) / (2.0 * h);
        close(
            g,
            fd,
            1e-6,
            &format!("{est:?} gradient vs finite difference"),
        );
    }

    #[test]
    fn worked_example_section_1e() {
        // ℓ_θ = −1.0, ℓ_ref = −1.2 → k1 0.2, k2 0.02, k3 0.0187.
        close(kl_value(KlEstimator::K1, -1.0, -1.2), 0.2, 1e-12, "k1");
        close(kl_value(KlEstimator::K2, -1.0, -1.2), 0.02, 1e-12, "k2");
        close(kl_value(KlEstimator::K3, -1.0, -1.2), 0.0187, 5e-5, "k3");
    }

    #[test]
    fn estimators_and_gradients_openrlhf_1309() {
        // Case openrlhf-1309-kl-estimators: logp [−1, −2, −0.5], ref [−1.5, −1, −0.5].
        let logp = [-1.0, -2.0, -0.5];
        let ref_logp = [-1.5, -1.0, -0.5];
        let k1 = [0.5, -1.0, 0.0];
        let k2 = [0.125, 0.5, 0.0];
        let k3 = [0.106531, 0.718282, 0.0];
        let dk2 = [0.5, -1.0, 0.0];
        let dk3 = [0.393469, -1.718282, 0.0];
        for i in 0..3 {
            check(KlEstimator::K1, logp[i], ref_logp[i], k1[i], 1.0);
            check(KlEstimator::K2, logp[i], ref_logp[i], k2[i], dk2[i]);
            check(KlEstimator::K3, logp[i], ref_logp[i], k3[i], dk3[i]);
            // k2's gradient is the unbiased reverse-KL gradient weight log(π/π_ref).
            close(
                kl_value_and_grad(KlEstimator::K2, logp[i], ref_logp[i]).1,
                logp[i] - ref_logp[i],
                0.0,
                "k2 weight",
            );
        }
        // k3 ≥ 0 everywhere, k1 is negative on the second token.
        assert!(kl_value(KlEstimator::K1, -2.0, -1.0) < 0.0);
    }

    #[test]
    fn k3_clamp_has_zero_gradient() {
        // δ = ℓ_ref − ℓ = 5: e^5 − 6 = 142.4 > 10.
        assert_eq!(
            kl_value_and_grad(KlEstimator::K3, -6.0, -1.0),
            (K3_CLAMP, 0.0)
        );
        // Tiny δ keeps precision: k3 ≈ δ²/2.
        close(
            kl_value(KlEstimator::K3, -1.0, -1.0 + 1e-7),
            0.5e-14,
            1e-20,
            "k3 small δ",
        );
    }

    fn row(traj: u64, turn: u32, mask: &[u8]) -> TurnRow {
        TurnRow {
            trajectory_id: traj,
            turn,
            turn_reward: 1.0,
            episode_reward: 2.0,
            response_ids: vec![0; mask.len()],
            response_logprobs: vec![0.0; mask.len()],
            response_mask: mask.to_vec(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn reward_penalty_lands_on_turn_and_episode_rewards() {
        let mut batch = Batch {
            step: 0,
            rows: vec![row(1, 0, &[1, 1, 0]), row(1, 1, &[1]), row(2, 0, &[0, 1])],
        };
        let config = ObjectiveConfig {
            kl_coef: 0.1,
            kl_estimator: KlEstimator::K1,
            ..Default::default()
        };
        // k1 per token = ℓ − ℓ_ref; masked slots hold NaN and are never read.
        let logp = vec![vec![-1.0, -2.0, f32::NAN], vec![-0.5], vec![f32::NAN, -3.0]];
        let ref_logp = vec![vec![-1.5, -1.0, f32::NAN], vec![-1.0], vec![0.0, -1.0]];
        let report = apply_kl_to_rewards(&config, &mut batch, &logp, &ref_logp).unwrap();
        // Row sums of k1: (0.5 − 1.0) = −0.5, 0.5, −2.0 → penalties −0.05, 0.05, −0.2.
        let want = [-0.05, 0.05, -0.2];
        for (got, want) in report.row_penalty.iter().zip(want) {
            close(*got, want, 1e-7, "row penalty");
        }
        close(report.mean_token_kl, -2.0 / 4.0, 1e-7, "mean token kl");
        assert_eq!(report.tokens, 4);
        let turn: Vec<f32> = batch.rows.iter().map(|r| r.turn_reward).collect();
        let episode: Vec<f32> = batch.rows.iter().map(|r| r.episode_reward).collect();
        assert_eq!(turn, vec![1.05, 0.95, 1.2]);
        // Trajectory 1 pays −0.05 + 0.05 = 0 on both rows; trajectory 2 pays −0.2.
        assert_eq!(episode, vec![2.0, 2.0, 2.2]);
        let recorded = batch.rows[2].info["kl_penalty"].as_f64();
        assert!(
            recorded.is_some_and(|p| (p + 0.2).abs() < 1e-12),
            "{recorded:?}"
        );
        // Applying it twice is refused.
        let e = apply_kl_to_rewards(&config, &mut batch, &logp, &ref_logp).unwrap_err();
        assert!(
            e.to_string().contains("applied to this batch before"),
            "{e}"
        );
    }

    #[test]
    fn reward_penalty_rejects_bad_input() {
        let config = ObjectiveConfig {
            kl_coef: 0.1,
            ..Default::default()
        };
        let mut batch = Batch {
            step: 0,
            rows: vec![row(1, 0, &[1, 1])],
        };
        let e =
            apply_kl_to_rewards(&config, &mut batch, &[vec![0.0]], &[vec![0.0, 0.0]]).unwrap_err();
        assert!(
            e.to_string()
                .contains("row 0: mask has 2 tokens but logp has 1"),
            "{e}"
        );
        let e = apply_kl_to_rewards(
            &config,
            &mut batch,
            &[vec![0.0, f32::NAN]],
            &[vec![0.0, 0.0]],
        )
        .unwrap_err();
        assert!(e.to_string().contains("row 0, token 1"), "{e}");
    }
}
