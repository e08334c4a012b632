//! The task-specific evaluation of a scaffold: keep, revise, or remove it.
//!
//! Over the window of the last `K` cards of a (task, scaffold), counts are **pooled** (a plain
//! mean weighted by trajectories, not an EMA: with equal arms per card it is the mean of the
//! cards' rates, and one card gives that card's rates exactly):
//!
//! * solo rate `p_0 = Σ succ_without / Σ n_without`;
//! * gain `Δ = Σ succ_with / Σ n_with − p_0`.
//!
//! The rules, in this order (all ours; Pats is a proposal):
//! 1. `p_0 ≥ τ_solve` → remove, *graduated*: the policy solves the task alone;
//! 2. `Δ > δ` → keep;
//! 3. `Δ < −δ` → revise through the skill creator;
//! 4. `|Δ| ≤ δ` with `K` cards in the window → remove, *no effect*;
//! 5. otherwise (`|Δ| ≤ δ`, fewer than `K` cards) → undecided: wait for more cards.

use serde::{Deserialize, Serialize};

use crate::card::CardCounts;
use crate::config::PatsConfig;

/// What the evaluation decided for a scaffold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Keep,
    /// Removed: `p_0 ≥ τ_solve`.
    Graduated,
    /// Removed: `|Δ| ≤ δ` over a full window.
    NoEffect,
    /// `Δ < −δ`: ask the skill creator for a revision.
    Revise,
    /// `|Δ| ≤ δ` with fewer than `K` cards.
    Undecided,
}

/// The evaluation of a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judgement {
    /// `Δ`, the pooled gain of the scaffolded arm over the plain one.
    pub gain: f64,
    /// `p_0`, the pooled plain success rate.
    pub solo: f64,
    /// Cards in the window.
    pub cards: usize,
    pub decision: Decision,
}

/// Judges the last `config.window` cards of `history` (oldest first). `None` when the window
/// is empty or an arm has no trajectory in it.
pub fn judge(history: &[CardCounts], config: &PatsConfig) -> Option<Judgement> {
    let k = config.window as usize;
    let window = &history[history.len().saturating_sub(k)..];
    let sum = |f: fn(&CardCounts) -> u32| window.iter().map(|c| u64::from(f(c))).sum::<u64>();
    let (n_with, n_without) = (sum(|c| c.n_with), sum(|c| c.n_without));
    if n_with == 0 || n_without == 0 {
        return None;
    }
    let solo = sum(|c| c.succ_without) as f64 / n_without as f64;
    let gain = sum(|c| c.succ_with) as f64 / n_with as f64 - solo;
    let decision = if solo >= config.tau_solve {
        Decision::Graduated
    } else if gain > config.delta {
        Decision::Keep
    } else if gain < -config.delta {
        Decision::Revise
    } else if window.len() >= k {
        Decision::NoEffect
    } else {
        Decision::Undecided
    };
    Some(Judgement {
        gain,
        solo,
        cards: window.len(),
        decision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(succ_with: u32, n_with: u32, succ_without: u32, n_without: u32) -> CardCounts {
        CardCounts {
            step: 0,
            n_with,
            succ_with,
            n_without,
            succ_without,
        }
    }

    /// Judges `history` with the default config and checks `(Δ, p_0, decision)` to 4 places.
    fn check(history: &[CardCounts], gain: f64, solo: f64, decision: Decision) {
        let j = judge(history, &PatsConfig::default()).expect("both arms played");
        assert!((j.gain - gain).abs() < 5e-5, "Δ = {} ≠ {gain}", j.gain);
        assert!((j.solo - solo).abs() < 5e-5, "p_0 = {} ≠ {solo}", j.solo);
        assert_eq!(j.decision, decision, "{history:?}");
    }

    #[test]
    fn the_worked_example_of_the_proposal() {
        // task_a: with 6/8, without 3/8 → Δ = 0.375 → keep.
        check(&[card(6, 8, 3, 8)], 0.375, 0.375, Decision::Keep);
        // task_b: 7/8 vs 7/8 → p_0 = 0.875 ≥ 0.8 → graduated (before any gain rule).
        check(&[card(7, 8, 7, 8)], 0.0, 0.875, Decision::Graduated);
        // task_c: 2/8 vs 4/8 → Δ = −0.25 → revise.
        check(&[card(2, 8, 4, 8)], -0.25, 0.5, Decision::Revise);
    }

    #[test]
    fn no_effect_needs_a_full_window() {
        let flat = card(4, 8, 4, 8);
        check(&[flat], 0.0, 0.5, Decision::Undecided);
        check(&[flat, flat], 0.0, 0.5, Decision::Undecided);
        check(&[flat, flat, flat], 0.0, 0.5, Decision::NoEffect);
        // Inside the band but not at zero: 13/24 − 12/24 = 0.0417 ≤ 0.05.
        check(
            &[card(4, 8, 4, 8), card(5, 8, 4, 8), card(4, 8, 4, 8)],
            0.0417,
            0.5,
            Decision::NoEffect,
        );
    }

    #[test]
    fn the_window_pools_the_last_k_cards() {
        // The oldest card (a large gain) has left the window of 3: 7/24 − 9/24 = −0.0833.
        let history = [
            card(8, 8, 0, 8),
            card(3, 8, 3, 8),
            card(2, 8, 3, 8),
            card(2, 8, 3, 8),
        ];
        check(&history, -0.0833, 0.375, Decision::Revise);
        // Pooling weighs by trajectories: (1 + 6)/(2 + 8) − (0 + 4)/(2 + 8) = 0.3.
        check(
            &[card(1, 2, 0, 2), card(6, 8, 4, 8)],
            0.3,
            0.4,
            Decision::Keep,
        );
        assert_eq!(judge(&[], &PatsConfig::default()), None);
        assert_eq!(judge(&[card(0, 0, 1, 2)], &PatsConfig::default()), None);
    }

    #[test]
    fn the_thresholds_come_from_the_config() {
        let config = PatsConfig {
            delta: 0.3,
            tau_solve: 0.9,
            window: 1,
            ..PatsConfig::default()
        };
        let decide = |c: CardCounts| judge(&[c], &config).map(|j| j.decision);
        // Δ = 0.25 is inside a band of 0.3, and one card fills a window of 1.
        assert_eq!(decide(card(6, 8, 4, 8)), Some(Decision::NoEffect));
        // p_0 = 0.875 < 0.9: not graduated; Δ = 0.125 inside the band.
        assert_eq!(decide(card(8, 8, 7, 8)), Some(Decision::NoEffect));
        assert_eq!(decide(card(1, 8, 4, 8)), Some(Decision::Revise));
    }
}
