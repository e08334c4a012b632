//! Batch-adaptive calibration of per-token influences to bounded weights, with the auxiliary
//! mass of every action turn preserved (proposal; docs/algorithms/icsd.md).
//!
//! With `I_l` the influences of the batch's active tokens (trainable tokens of the rows that
//! have a teacher) and turn `j` one row's active tokens (`n_j` of them):
//! 1. `z_l = I_l / (mean_batch I + 1e-8)`;
//! 2. `ŵ_l = clip(z_l, w_min, w_max)`;
//! 3. `w_l = ŵ_l · n_j / Σ_{l∈j} ŵ_l`, so `Σ_{l∈j} w_l = n_j`: each turn keeps the total
//!    auxiliary weight of unweighted OPSD, only its spread over the turn's tokens changes.
//!    `w_min > 0` keeps `Σ ŵ ≥ n_j w_min > 0`.
//!
//! The rescale may move a weight outside `[w_min, w_max]`: far outside when one token of a
//! long turn carries most of the influence (one token at `w_max` and `n − 1` at `w_min` end at
//! `n w_max / (w_max + (n − 1) w_min)`, up to `w_max / w_min`). With `rounds = 1` (the
//! default) that is accepted: one clip, one rescale. Each further round clips the weights to
//! `[w_min, w_max]` again and rescales, which pulls them back toward the range; the mass stays
//! exact, since every round ends with a rescale.

/// The `ε` of step 1.
pub const EPS: f64 = 1e-8;

/// What [`calibrate`] returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Calibration {
    /// `w`, shaped like the input: one vector per turn, one weight per active token.
    pub weights: Vec<Vec<f64>>,
    /// `mean_batch I` (0 without tokens).
    pub mean: f64,
    /// Tokens whose `z` was outside `[w_min, w_max]`.
    pub clipped: usize,
    /// Active tokens.
    pub tokens: usize,
}

/// Calibrates `influence[j][l]` (turn `j`, its `l`-th active token; finite, ≥ 0) to weights
/// with `rounds ≥ 1` clip-and-rescale rounds (see the module docs; 0 counts as 1). A turn
/// without tokens gets an empty vector. `clipped` counts the first round's clips.
pub fn calibrate(influence: &[Vec<f64>], w_min: f64, w_max: f64, rounds: u32) -> Calibration {
    let tokens: usize = influence.iter().map(Vec::len).sum();
    let mean = if tokens == 0 {
        0.0
    } else {
        influence.iter().flatten().sum::<f64>() / tokens as f64
    };
    let mut clipped = 0;
    let weights = influence
        .iter()
        .map(|turn| {
            let hat: Vec<f64> = turn
                .iter()
                .map(|&i| {
                    let z = i / (mean + EPS);
                    clipped += usize::from(z < w_min || z > w_max);
                    z.clamp(w_min, w_max)
                })
                .collect();
            let n = hat.len() as f64;
            let rescale = |hat: &[f64]| {
                let sum: f64 = hat.iter().sum();
                hat.iter().map(|w| w * n / sum).collect::<Vec<f64>>()
            };
            let mut w = rescale(&hat);
            for _ in 1..rounds {
                let hat: Vec<f64> = w.iter().map(|w| w.clamp(w_min, w_max)).collect();
                w = rescale(&hat);
            }
            w
        })
        .collect();
    Calibration {
        weights,
        mean,
        clipped,
        tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, tol: f64, what: &str) {
        assert!((got - want).abs() < tol, "{what}: {got}, want {want}");
    }

    #[test]
    fn the_worked_example() {
        // Turn 1 (ℓ^S, ℓ^T): (−0.2, −0.1), (−1.5, −0.3), (−0.9, −1.4); turn 2: (−0.05, −0.05),
        // (−2.0, −0.5). I = |Δ| = [0.1, 1.2, 0.5 | 0, 1.5].
        let c = calibrate(&[vec![0.1, 1.2, 0.5], vec![0.0, 1.5]], 0.25, 2.0, 1);
        close(c.mean, 0.66, 1e-12, "mean");
        let z: Vec<f64> = [0.1, 1.2, 0.5, 0.0, 1.5]
            .iter()
            .map(|i| i / (0.66 + EPS))
            .collect();
        for (got, want) in z.iter().zip([0.1515, 1.8182, 0.7576, 0.0, 2.2727]) {
            close(*got, want, 5e-5, "z");
        }
        // Clipped [0.25, 1.8182, 0.7576, 0.25, 2.0]: three of five outside the range.
        assert_eq!((c.clipped, c.tokens), (3, 5));
        let w: Vec<f64> = c.weights.iter().flatten().copied().collect();
        for (got, want) in w.iter().zip([0.2654, 1.9303, 0.8043, 0.2222, 1.7778]) {
            close(*got, want, 5e-5, "w");
        }
        close(c.weights[0].iter().sum(), 3.0, 1e-12, "turn 1 mass");
        close(c.weights[1].iter().sum(), 2.0, 1e-12, "turn 2 mass");
        let delta = [0.1, 1.2, -0.5, 0.0, 1.5];
        for ((w, d), want) in w
            .iter()
            .zip(delta)
            .zip([0.0265, 2.3164, -0.4021, 0.0, 2.6667])
        {
            close(w * d, want, 5e-5, "w·Δ");
        }
    }

    /// A small deterministic generator (64-bit LCG, Knuth's constants), uniform in [0, 1).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() * n as f64) as usize
        }
    }

    #[test]
    fn every_turn_keeps_its_mass_on_random_inputs() {
        let mut rng = Lcg(13);
        for case in 0..2000 {
            let turns: Vec<Vec<f64>> = (0..1 + rng.below(8))
                .map(|_| {
                    (0..rng.below(13))
                        .map(|_| match rng.below(5) {
                            0 => 0.0,
                            1 => rng.next() * 1e-6,
                            2 => rng.next() * 50.0,
                            _ => rng.next() * 3.0,
                        })
                        .collect()
                })
                .collect();
            let w_min = 0.01 + rng.next();
            let w_max = w_min + rng.next() * 3.0;
            let rounds = 1 + rng.below(4) as u32;
            let c = calibrate(&turns, w_min, w_max, rounds);
            assert_eq!(c.weights.len(), turns.len());
            for (j, (w, i)) in c.weights.iter().zip(&turns).enumerate() {
                assert_eq!(w.len(), i.len());
                let mass: f64 = w.iter().sum();
                let n = i.len() as f64;
                assert!(
                    (mass - n).abs() <= 1e-9 * n.max(1.0),
                    "case {case}, turn {j}: Σw = {mass}, n = {n}"
                );
                assert!(w.iter().all(|w| w.is_finite() && *w > 0.0), "case {case}");
                // Within a turn the order of influences is kept.
                for a in 0..i.len() {
                    for b in 0..i.len() {
                        if i[a] < i[b] {
                            assert!(w[a] <= w[b] + 1e-12, "case {case}: order");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn all_zero_influence_gives_unweighted_opsd() {
        let c = calibrate(&[vec![0.0; 3], vec![0.0], vec![]], 0.25, 2.0, 1);
        assert_eq!(c.mean, 0.0);
        assert_eq!(c.weights, [vec![1.0; 3], vec![1.0], vec![]]);
        let c = calibrate(&[], 0.25, 2.0, 1);
        assert_eq!((c.tokens, c.mean), (0, 0.0));
    }

    #[test]
    fn a_dominant_token_overshoots_the_clip_once_and_further_rounds_pull_it_back() {
        // One turn of 8 tokens, one of them carrying all the influence: z = [8, 0, …, 0].
        let mut turn = vec![0.0; 8];
        turn[0] = 1.0;
        let once = calibrate(&[turn.clone()], 0.25, 2.0, 1);
        // ŵ = [2, 0.25 × 7], Σ = 3.75: w_0 = 2 · 8 / 3.75 = 4.2667, the others 0.5333.
        close(
            once.weights[0][0],
            16.0 / 3.75,
            1e-12,
            "w_0 after one round",
        );
        close(once.weights[0][1], 2.0 / 3.75, 1e-12, "w_1 after one round");
        // Round 2 clips w_0 to 2 (Σ = 2 + 7 · 0.5333 = 5.7333): w_0 = 2.7907, the others 0.7442.
        let twice = calibrate(&[turn.clone()], 0.25, 2.0, 2);
        close(
            twice.weights[0][0],
            16.0 / (2.0 + 14.0 / 3.75),
            1e-12,
            "w_0 after two rounds",
        );
        let many = calibrate(&[turn], 0.25, 2.0, 50);
        for c in [&once, &twice, &many] {
            close(c.weights[0].iter().sum(), 8.0, 1e-9, "mass");
        }
        assert!(many.weights[0][0] < twice.weights[0][0]);
        assert!(many.weights[0][0] < 2.0 + 1e-3, "{}", many.weights[0][0]);
    }
}
