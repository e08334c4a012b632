//! The off-policy correction of the PPO term ([`OffPolicy`]): the behaviour weight `u` of a
//! token sampled with log-prob `ℓ_behav` whose `ℓ_old` the kernel recomputed.
//!
//! With `r = exp(ℓ_old − ℓ_behav)` and cap `C`:
//!
//! * `tis` (Yao et al. 2025, truncated importance sampling): `u = min(r, C)`;
//! * `decoupled` (Fu et al. 2025, AReaL, arXiv 2505.24298): `u = r` where `r ≤ C`, else 0
//!   (the token is dropped from the PPO term, but still counts in its normaliser).
//!
//! The token's PPO term becomes `u · ℓ^pg(ρ, A)` with `ρ = π_θ/π_old` clipped around
//! `π_old`; `u` is data (no gradient).

use super::config::{ObjectiveConfig, OffPolicy};

/// `(u, capped)`: the behaviour weight of one token and whether its raw weight exceeded the
/// cap. 1 with `off_policy = none`. Compared in log space, so a huge `ℓ_old − ℓ_behav` never
/// overflows.
pub fn behaviour_weight(config: &ObjectiveConfig, old: f64, behav: f64) -> (f64, bool) {
    let log_r = old - behav;
    let cap = config.is_cap;
    let capped = log_r > cap.ln();
    let u = match (config.off_policy, capped) {
        (OffPolicy::None, _) => 1.0,
        (OffPolicy::Tis, true) => cap,
        (OffPolicy::Decoupled, true) => 0.0,
        (_, false) => log_r.exp(),
    };
    (u, capped)
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{Signals, TurnRow};

    use super::*;
    use crate::loss::{TokenLoss, TokenScores};
    use crate::objective::RlLoss;

    /// The 3-token example of docs/algorithms/objective.md ("Off-policy correction"):
    /// `ℓ_behav = [−1, −1.5, −2]`, `ℓ_old = [−1, −0.7, −2.5]` (r = [1, e^0.8 = 2.2255, e^−0.5 =
    /// 0.6065]), current `ℓ = [−1.1, −0.6, −2.5]` (ρ = [e^−0.1, e^0.1, 1], all inside the clip
    /// range), `A = [1, 1, −1]`, C = 2, token-mean. Per token `ℓ^pg = [−0.904837, −1.105171,
    /// 1]`, `∂ℓ^pg/∂ℓ = [−0.904837, −1.105171, 1]`.
    fn check(off_policy: OffPolicy, loss: f64, grads: [f64; 3], u_mean: f64) {
        let row = TurnRow {
            prompt_ids: vec![1],
            response_ids: vec![5, 6, 7],
            response_mask: vec![1, 1, 1],
            response_logprobs: vec![-1.0, -1.5, -2.0],
            old_logprobs: vec![-1.0, -0.7, -2.5],
            ..TurnRow::default()
        };
        let signals = Signals {
            advantages: vec![vec![1.0, 1.0, -1.0]],
            ..Signals::default()
        };
        let config = ObjectiveConfig {
            off_policy,
            is_cap: 2.0,
            ..Default::default()
        };
        let mut l = RlLoss::from_rows(&config, &[&row], &signals, &[0]).unwrap();
        let g = l
            .grads(0..1, &TokenScores::logp(&[vec![-1.1, -0.6, -2.5]]))
            .unwrap();
        let report = l.report();
        let what = off_policy.as_str();
        assert!((report.loss - loss).abs() < 1e-6, "{what}: {}", report.loss);
        for (k, want) in grads.iter().enumerate() {
            let got = f64::from(g.logp[0][k]);
            assert!(
                (got - want).abs() < 1e-6,
                "{what} grad {k}: {got} vs {want}"
            );
        }
        match report.off_policy {
            None => assert_eq!(off_policy, OffPolicy::None),
            Some(o) => {
                assert!((o.is_weight_mean - u_mean).abs() < 1e-6, "{what}: {o:?}");
                assert!(
                    (o.capped_fraction - 1.0 / 3.0).abs() < 1e-12,
                    "{what}: {o:?}"
                );
            }
        }
    }

    #[test]
    fn three_token_example_none_tis_decoupled() {
        // No correction: (−0.904837 − 1.105171 + 1) / 3.
        check(
            OffPolicy::None,
            -0.336_669_445,
            [-0.301_612_473, -0.368_390_306, 1.0 / 3.0],
            1.0,
        );
        // TIS: u = [1, min(2.2255, 2) = 2, 0.606531].
        check(
            OffPolicy::Tis,
            -0.836_216_198,
            [-0.301_612_473, -0.736_780_612, 0.202_176_887],
            1.202_176_887,
        );
        // Decoupled: u = [1, 0 (r > C: dropped), 0.606531]; the token still counts in the
        // token-mean denominator (3).
        check(
            OffPolicy::Decoupled,
            -0.099_435_586,
            [-0.301_612_473, 0.0, 0.202_176_887],
            0.535_510_220,
        );
    }

    #[test]
    fn weights_never_overflow_and_need_the_sampled_logprobs() {
        let tis = ObjectiveConfig {
            off_policy: OffPolicy::Tis,
            ..Default::default()
        };
        assert_eq!(behaviour_weight(&tis, 0.0, -1e6), (2.0, true));
        let dec = ObjectiveConfig {
            off_policy: OffPolicy::Decoupled,
            ..tis.clone()
        };
        assert_eq!(behaviour_weight(&dec, 0.0, -1e6), (0.0, true));
        assert_eq!(behaviour_weight(&dec, -3.0, -3.0), (1.0, false));
        // A masked slot may hold NaN in response_logprobs; a trainable one may not.
        let mut row = TurnRow {
            prompt_ids: vec![1],
            response_ids: vec![5, 6],
            response_mask: vec![1, 0],
            response_logprobs: vec![-1.0, f32::NAN],
            old_logprobs: vec![-1.0, f32::NAN],
            ..TurnRow::default()
        };
        let signals = Signals {
            advantages: vec![vec![1.0, f32::NAN]],
            ..Signals::default()
        };
        let mut l = RlLoss::from_rows(&tis, &[&row], &signals, &[0]).unwrap();
        l.grads(0..1, &TokenScores::logp(&[vec![-1.0, f32::NAN]]))
            .unwrap();
        let o = l.report().off_policy.unwrap();
        assert_eq!((o.is_weight_mean, o.capped_fraction), (1.0, 0.0));
        row.response_logprobs[0] = f32::NAN;
        let e = RlLoss::from_rows(&tis, &[&row], &signals, &[0])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 0, token 0: response_logprobs (ℓ_behav) is NaN"),
            "{e}"
        );
    }
}
