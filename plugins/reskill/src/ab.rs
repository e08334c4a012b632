//! The A/B test of a skill bundle: Beta posteriors of the new and the old version, the
//! discounted once-per-step flush, the decision, and the empirical-Bayes fit of the discount
//! horizon `M`.
//!
//! Source: ReSkill (arXiv 2606.01619), "Thompson sampling with adaptive discounting";
//! amazon-science/reskill `skill_serving/skill_ab_tracker.py`, whose update rules, defaults,
//! M grid and the 1e-6 floor of the replayed prior are followed exactly. Only the estimate
//! of `P[θ_new > θ_old]` differs: quadrature instead of 10 000 draws ([`crate::beta`]).

use serde::{Deserialize, Serialize};

use crate::beta::{log_beta_binomial, prob_greater};

/// How a flush discounts the outcomes of earlier steps (`weighting_strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightingStrategy {
    /// No discount: `w = 1`.
    None,
    /// Only the last step counts: the posterior is reset to `Beta(1 + m, 1 + n − m)`.
    LastStep,
    /// `w = M̂/(M̂ + n)` with `M̂` fitted after two finished tests (before: no discount).
    #[default]
    Dynamic,
}

impl WeightingStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            WeightingStrategy::None => "none",
            WeightingStrategy::LastStep => "last_step",
            WeightingStrategy::Dynamic => "dynamic",
        }
    }
}

/// What one flush does with the prior, once the strategy and `M̂` are known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Discount {
    /// `α ← α + m`, `β ← β + (n − m)`.
    Keep,
    /// `α ← 1 + m`, `β ← 1 + (n − m)`.
    Reset,
    /// Horizon `M` (episodes): `w = M/(M + n)` when `n > 0`, else 1; `α ← wα + m`,
    /// `β ← wβ + (n − m)`.
    Horizon(f64),
}

impl Discount {
    /// The discount of a flush under `strategy` with the current horizon estimate.
    pub fn of(strategy: WeightingStrategy, m_hat: Option<u32>) -> Discount {
        match (strategy, m_hat) {
            (WeightingStrategy::None, _) | (WeightingStrategy::Dynamic, None) => Discount::Keep,
            (WeightingStrategy::LastStep, _) => Discount::Reset,
            (WeightingStrategy::Dynamic, Some(m)) => Discount::Horizon(f64::from(m)),
        }
    }
}

/// A Beta posterior over a version's success probability.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BetaPosterior {
    pub alpha: f64,
    pub beta: f64,
}

impl Default for BetaPosterior {
    /// The uniform prior Beta(1, 1).
    fn default() -> Self {
        BetaPosterior {
            alpha: 1.0,
            beta: 1.0,
        }
    }
}

impl BetaPosterior {
    pub fn mean(&self) -> f64 {
        self.alpha / (self.alpha + self.beta)
    }

    /// Adds `m` successes out of `n` episodes of one step (`m ≤ n`).
    pub fn flush(&mut self, m: u64, n: u64, discount: Discount) {
        let (m, f) = (m as f64, n.saturating_sub(m) as f64);
        match discount {
            Discount::Keep => {
                self.alpha += m;
                self.beta += f;
            }
            Discount::Reset => {
                self.alpha = 1.0 + m;
                self.beta = 1.0 + f;
            }
            Discount::Horizon(horizon) => {
                let w = horizon_weight(horizon, n);
                self.alpha = w * self.alpha + m;
                self.beta = w * self.beta + f;
            }
        }
    }
}

/// `w = M/(M + n)` for `n > 0`, else 1.
pub fn horizon_weight(horizon: f64, n: u64) -> f64 {
    if n > 0 {
        horizon / (horizon + n as f64)
    } else {
        1.0
    }
}

/// `clamp(P[θ_new > θ_old], lo, hi)`: the probability that a slot plays the new version.
pub fn assignment_probability(new: &BetaPosterior, old: &BetaPosterior, lo: f64, hi: f64) -> f64 {
    prob_greater(new.alpha, new.beta, old.alpha, old.beta).clamp(lo, hi)
}

/// The outcomes of one step of a test: successes `m` out of episodes `n`, per version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepCounts {
    pub new_m: u64,
    pub new_n: u64,
    pub old_m: u64,
    pub old_n: u64,
}

/// A running A/B test of one skill bundle: the bundle with the skill under test ("new")
/// against the active skills alone ("old").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbTest {
    /// Test id, from 1 (recorded as `extra.test` on the slots it plans).
    pub id: u64,
    /// The bank entry under test.
    pub skill: u64,
    /// The active skill it replaces (a MODIFY), retired on accept.
    pub parent: Option<u64>,
    /// The step the test started at.
    pub started_step: u64,
    pub new: BetaPosterior,
    pub old: BetaPosterior,
    /// Counts of every flushed step, in order (the replay data of the `M` fit).
    pub steps: Vec<StepCounts>,
    /// Episodes counted so far (both versions).
    pub episodes: u64,
    /// The current assignment probability of the new version.
    pub p_new: f64,
}

impl AbTest {
    /// A test with both posteriors at Beta(1, 1), so `p_new` starts at ½ (clamped).
    pub fn new(id: u64, skill: u64, parent: Option<u64>, step: u64, lo: f64, hi: f64) -> AbTest {
        AbTest {
            id,
            skill,
            parent,
            started_step: step,
            new: BetaPosterior::default(),
            old: BetaPosterior::default(),
            steps: Vec::new(),
            episodes: 0,
            p_new: 0.5f64.clamp(lo, hi),
        }
    }

    /// Flushes one step's outcomes into both posteriors and recomputes `p_new`. Called once
    /// per step while the test runs, also with zero counts (a step counts toward
    /// `test_steps` either way, as in the ReSkill code).
    pub fn flush(&mut self, counts: StepCounts, discount: Discount, lo: f64, hi: f64) {
        self.new.flush(counts.new_m, counts.new_n, discount);
        self.old.flush(counts.old_m, counts.old_n, discount);
        self.steps.push(counts);
        self.episodes += counts.new_n + counts.old_n;
        self.p_new = assignment_probability(&self.new, &self.old, lo, hi);
    }

    /// At least `test_steps` flushed steps and `min_episodes` episodes.
    pub fn ready(&self, test_steps: u32, min_episodes: u64) -> bool {
        self.steps.len() >= test_steps as usize && self.episodes >= min_episodes
    }

    /// The decision: accept iff the posterior mean of the new version is the higher.
    pub fn accepts(&self) -> bool {
        self.new.mean() > self.old.mean()
    }

    /// Successes and episodes of the new version over the whole test.
    pub fn new_totals(&self) -> (u64, u64) {
        self.steps
            .iter()
            .fold((0, 0), |(m, n), s| (m + s.new_m, n + s.new_n))
    }
}

/// The log marginal likelihood of a finished test's step counts under horizon `M`: both
/// versions start at Beta(1, 1); at each step the prior is discounted (`w = M/(M + n)`,
/// floored at 1e-6 as in the ReSkill code), the step's count is scored with
/// `log BB(m | n, wα, wβ)` (steps with `n = 0` score nothing), then the count is added.
pub fn replay_log_likelihood(steps: &[StepCounts], horizon: f64) -> f64 {
    const FLOOR: f64 = 1e-6;
    let mut total = 0.0;
    let mut versions = [BetaPosterior::default(); 2];
    for s in steps {
        for (post, (m, n)) in versions
            .iter_mut()
            .zip([(s.new_m, s.new_n), (s.old_m, s.old_n)])
        {
            let w = horizon_weight(horizon, n);
            let a = (w * post.alpha).max(FLOOR);
            let b = (w * post.beta).max(FLOOR);
            if n > 0 {
                total += log_beta_binomial(m, n, a, b);
            }
            post.alpha = a + m as f64;
            post.beta = b + n.saturating_sub(m) as f64;
        }
    }
    total
}

/// The running empirical-Bayes fit of the discount horizon: for every `M` in `1..=grid_max`
/// the summed replay log-likelihood of all finished tests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HorizonFit {
    /// `log_likelihood[i]` is the total for `M = i + 1`.
    pub log_likelihood: Vec<f64>,
    /// Tests scored so far.
    pub completed_tests: u64,
}

impl HorizonFit {
    pub fn new(grid_max: u32) -> HorizonFit {
        HorizonFit {
            log_likelihood: vec![0.0; grid_max as usize],
            completed_tests: 0,
        }
    }

    /// Adds a finished test's replay log-likelihood to every grid point.
    pub fn score(&mut self, steps: &[StepCounts]) {
        for (i, total) in self.log_likelihood.iter_mut().enumerate() {
            *total += replay_log_likelihood(steps, (i + 1) as f64);
        }
        self.completed_tests += 1;
    }

    /// `M̂ = argmax_M` of the totals (the smallest `M` on ties), once two tests have been
    /// scored; `None` (no discount) before.
    pub fn m_hat(&self) -> Option<u32> {
        if self.completed_tests < 2 {
            return None;
        }
        let mut best = 0;
        for (i, &ll) in self.log_likelihood.iter().enumerate() {
            if ll > self.log_likelihood[best] {
                best = i;
            }
        }
        u32::try_from(best + 1).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::beta::regularized_incomplete_beta;
    use rand::{Rng, SeedableRng};

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 5e-5, "got {got}, want {want}");
    }

    fn step(new_m: u64, new_n: u64, old_m: u64, old_n: u64) -> StepCounts {
        StepCounts {
            new_m,
            new_n,
            old_m,
            old_n,
        }
    }

    fn test() -> AbTest {
        AbTest::new(1, 7, None, 0, 0.15, 0.85)
    }

    #[test]
    fn the_worked_example_without_discount() {
        let mut t = test();
        assert_eq!(t.p_new, 0.5);
        // Step 1: new 3/4, old 1/4 → Beta(4, 2), Beta(2, 4); P = 0.8968 → clamped to 0.85.
        t.flush(step(3, 4, 1, 4), Discount::Keep, 0.15, 0.85);
        assert_eq!((t.new.alpha, t.new.beta), (4.0, 2.0));
        assert_eq!((t.old.alpha, t.old.beta), (2.0, 4.0));
        close(t.new.mean(), 0.6667);
        close(t.old.mean(), 0.3333);
        close(prob_greater(4.0, 2.0, 2.0, 4.0), 0.8968);
        assert_eq!(t.p_new, 0.85);
        // Step 2: new 2/5, old 2/3 → Beta(6, 5), Beta(4, 5); P = 0.6814.
        t.flush(step(2, 5, 2, 3), Discount::Keep, 0.15, 0.85);
        assert_eq!((t.new.alpha, t.new.beta), (6.0, 5.0));
        assert_eq!((t.old.alpha, t.old.beta), (4.0, 5.0));
        close(t.new.mean(), 0.5455);
        close(t.old.mean(), 0.4444);
        close(t.p_new, 0.6814);
        assert_eq!(t.episodes, 16);
        assert_eq!(t.steps.len(), 2);
        assert!(t.accepts());
    }

    #[test]
    fn the_worked_example_with_horizon_20() {
        let mut t = test();
        let d = Discount::Horizon(20.0);
        // Step 1: w = 20/24 = 0.8333 on both → Beta(3.8333, 1.8333), Beta(1.8333, 3.8333).
        close(horizon_weight(20.0, 4), 0.8333);
        t.flush(step(3, 4, 1, 4), d, 0.15, 0.85);
        close(t.new.alpha, 3.8333);
        close(t.new.beta, 1.8333);
        close(t.old.alpha, 1.8333);
        close(t.old.beta, 3.8333);
        close(
            prob_greater(t.new.alpha, t.new.beta, t.old.alpha, t.old.beta),
            0.9047,
        );
        assert_eq!(t.p_new, 0.85);
        // Step 2: w_new = 20/25 = 0.8, w_old = 20/23 = 0.8696.
        close(horizon_weight(20.0, 5), 0.8);
        close(horizon_weight(20.0, 3), 0.8696);
        t.flush(step(2, 5, 2, 3), d, 0.15, 0.85);
        close(t.new.alpha, 5.0667);
        close(t.new.beta, 4.4667);
        close(t.old.alpha, 3.5942);
        close(t.old.beta, 4.3333);
        close(t.new.mean(), 0.5315);
        close(t.old.mean(), 0.4534);
        close(t.p_new, 0.6343);
        assert!(t.accepts(), "the test would accept if it ended here");
    }

    #[test]
    fn the_clamp_holds_at_both_ends() {
        let strong = BetaPosterior {
            alpha: 30.0,
            beta: 2.0,
        };
        let weak = BetaPosterior {
            alpha: 2.0,
            beta: 30.0,
        };
        assert_eq!(assignment_probability(&strong, &weak, 0.15, 0.85), 0.85);
        assert_eq!(assignment_probability(&weak, &strong, 0.15, 0.85), 0.15);
        // Inside the bounds the probability passes through: P = 1 − 0.8968.
        let (a, b) = (
            BetaPosterior {
                alpha: 2.0,
                beta: 4.0,
            },
            BetaPosterior {
                alpha: 4.0,
                beta: 2.0,
            },
        );
        assert_eq!(assignment_probability(&a, &b, 0.15, 0.85), 0.15);
        close(assignment_probability(&a, &b, 0.05, 0.95), 0.1032);
    }

    #[test]
    fn none_keeps_everything_and_last_step_keeps_only_the_last_step() {
        let counts = [step(3, 4, 1, 4), step(2, 5, 2, 3), step(0, 0, 1, 2)];
        let mut keep = test();
        let mut last = test();
        for c in counts {
            keep.flush(
                c,
                Discount::of(WeightingStrategy::None, Some(3)),
                0.15,
                0.85,
            );
            last.flush(
                c,
                Discount::of(WeightingStrategy::LastStep, None),
                0.15,
                0.85,
            );
        }
        assert_eq!((keep.new.alpha, keep.new.beta), (6.0, 5.0));
        assert_eq!((keep.old.alpha, keep.old.beta), (5.0, 6.0));
        // The last step had no new-version episode: Beta(1, 1), as in the ReSkill code.
        assert_eq!((last.new.alpha, last.new.beta), (1.0, 1.0));
        assert_eq!((last.old.alpha, last.old.beta), (2.0, 2.0));
        assert_eq!(
            Discount::of(WeightingStrategy::Dynamic, None),
            Discount::Keep,
            "no discount until M̂ is known"
        );
        assert_eq!(
            Discount::of(WeightingStrategy::Dynamic, Some(20)),
            Discount::Horizon(20.0)
        );
    }

    #[test]
    fn the_decision_waits_for_steps_and_episodes() {
        let mut t = test();
        for _ in 0..4 {
            t.flush(step(5, 10, 5, 10), Discount::Keep, 0.15, 0.85);
        }
        assert!(!t.ready(5, 50), "4 steps < 5");
        t.flush(step(0, 2, 0, 2), Discount::Keep, 0.15, 0.85);
        assert!(!t.ready(5, 85), "84 episodes < 85");
        assert!(t.ready(5, 84));
        assert!(!t.accepts(), "equal means do not accept");
        assert_eq!(t.new_totals(), (20, 42));
    }

    #[test]
    fn the_replay_scores_the_discounted_prior() {
        // One step of 3/4 on the new version under any M: log BB(3 | 4, w, w).
        let steps = [step(3, 4, 0, 0)];
        close(replay_log_likelihood(&steps, 1e12), -1.6094);
        let w = 20.0 / 24.0;
        let want = log_beta_binomial(3, 4, w, w);
        assert!((replay_log_likelihood(&steps, 20.0) - want).abs() < 1e-12);
        // Two steps: the second is scored under the discounted first posterior.
        let steps = [step(3, 4, 1, 4), step(2, 5, 2, 3)];
        let want = log_beta_binomial(3, 4, w, w)
            + log_beta_binomial(1, 4, w, w)
            + log_beta_binomial(2, 5, 0.8 * (w + 3.0), 0.8 * (w + 1.0))
            + log_beta_binomial(2, 3, 20.0 / 23.0 * (w + 1.0), 20.0 / 23.0 * (w + 3.0));
        assert!((replay_log_likelihood(&steps, 20.0) - want).abs() < 1e-12);
        let mut fit = HorizonFit::new(2000);
        fit.score(&steps);
        assert_eq!(fit.m_hat(), None, "M̂ needs two finished tests");
        fit.score(&steps);
        assert!(fit.m_hat().is_some());
        assert!((fit.log_likelihood[19] - 2.0 * want).abs() < 1e-9);
    }

    /// Draws Beta(a, b) by inverting the CDF (bisection on `I_x`).
    fn draw_beta(rng: &mut impl Rng, a: f64, b: f64) -> f64 {
        let u: f64 = rng.gen();
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if regularized_incomplete_beta(a, b, mid) < u {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    }

    /// Tests generated by the model the replay scores: at each step a version's success
    /// probability is drawn from its discounted posterior `Beta(wα, wβ)`, `w = M/(M + n)`,
    /// then `n` episodes succeed with it.
    fn synthetic_tests(horizon: f64, tests: usize, seed: u64) -> Vec<Vec<StepCounts>> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n = 16u64;
        (0..tests)
            .map(|_| {
                let mut versions = [BetaPosterior::default(); 2];
                (0..8)
                    .map(|_| {
                        let mut m = [0u64; 2];
                        for (v, post) in versions.iter_mut().enumerate() {
                            let w = horizon_weight(horizon, n);
                            let theta = draw_beta(&mut rng, w * post.alpha, w * post.beta);
                            m[v] = (0..n).filter(|_| rng.gen::<f64>() < theta).count() as u64;
                            post.flush(m[v], n, Discount::Horizon(horizon));
                        }
                        step(m[0], n, m[1], n)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn m_hat_recovers_the_horizon_that_generated_the_tests() {
        for (horizon, lo, hi) in [(5.0, 3, 8), (20.0, 13, 30)] {
            let mut fit = HorizonFit::new(2000);
            for steps in synthetic_tests(horizon, 30, 7) {
                fit.score(&steps);
            }
            let m_hat = fit.m_hat().unwrap_or(0);
            assert!(
                (lo..=hi).contains(&m_hat),
                "true M = {horizon}: M̂ = {m_hat}, expected in {lo}..={hi}"
            );
        }
        // Stationary tests (no drift at all) push M̂ far out.
        let mut fit = HorizonFit::new(2000);
        for steps in synthetic_tests(1e9, 30, 7) {
            fit.score(&steps);
        }
        assert!(fit.m_hat().unwrap_or(0) > 100, "{:?}", fit.m_hat());
    }
}
