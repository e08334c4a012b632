//! The per-token PPO clipped surrogate with asymmetric and dual clipping (verl
//! `compute_policy_loss`; docs/algorithms/objective.md),
//! its derivative, and which branch produced the value.

use super::config::ObjectiveConfig;

/// Which term of the clipped surrogate gave a token's loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipBranch {
    /// `−A·ρ` (ties with the clipped term count here: clipping changed nothing).
    Unclipped,
    /// `−A·clip(ρ, 1 − ε_lo, 1 + ε_hi)` strictly exceeded `−A·ρ`.
    Clipped,
    /// `A < 0` and the dual-clip cap `−A·c` was strictly below the clipped surrogate.
    DualClipped,
}

/// The clip constants of one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipRange {
    pub low: f64,
    pub high: f64,
    pub dual: Option<f64>,
}

impl From<&ObjectiveConfig> for ClipRange {
    fn from(c: &ObjectiveConfig) -> Self {
        ClipRange {
            low: c.clip_low,
            high: c.clip_high,
            dual: c.dual_clip,
        }
    }
}

/// One token's surrogate loss.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Surrogate {
    /// `ℓ^pg`.
    pub loss: f64,
    /// `∂ℓ^pg/∂ρ`: `−A` on the unclipped branch, 0 on a clipped one (the value is a constant
    /// there).
    pub dloss_dratio: f64,
    pub branch: ClipBranch,
}

/// `ℓ^pg = max(−Aρ, −A·clip(ρ, 1 − ε_lo, 1 + ε_hi))`, then for `A < 0` with dual clip `c`:
/// `min(ℓ^pg, −A·c)` (verl `compute_policy_loss`).
pub fn clipped_surrogate(ratio: f64, advantage: f64, clip: ClipRange) -> Surrogate {
    let unclipped = -advantage * ratio;
    let clipped = -advantage * ratio.clamp(1.0 - clip.low, 1.0 + clip.high);
    let mut out = if clipped > unclipped {
        Surrogate {
            loss: clipped,
            dloss_dratio: 0.0,
            branch: ClipBranch::Clipped,
        }
    } else {
        Surrogate {
            loss: unclipped,
            dloss_dratio: -advantage,
            branch: ClipBranch::Unclipped,
        }
    };
    if let Some(c) = clip.dual {
        let cap = -advantage * c;
        if advantage < 0.0 && out.loss > cap {
            out = Surrogate {
                loss: cap,
                dloss_dratio: 0.0,
                branch: ClipBranch::DualClipped,
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PPO: ClipRange = ClipRange {
        low: 0.2,
        high: 0.2,
        dual: Some(3.0),
    };

    /// `check(ρ, A, clip, expected loss, expected branch)`; also checks the derivative against a
    /// central finite difference where the branch is smooth.
    fn check(ratio: f64, adv: f64, clip: ClipRange, loss: f64, branch: ClipBranch) {
        let s = clipped_surrogate(ratio, adv, clip);
        assert!(
            (s.loss - loss).abs() < 1e-12,
            "(ρ={ratio}, A={adv}): loss {} want {loss}",
            s.loss
        );
        assert_eq!(s.branch, branch, "(ρ={ratio}, A={adv})");
        let h = 1e-7;
        let fd = (clipped_surrogate(ratio + h, adv, clip).loss
            - clipped_surrogate(ratio - h, adv, clip).loss)
            / (2.0 * h);
        assert!(
            (s.dloss_dratio - fd).abs() < 1e-6,
            "(ρ={ratio}, A={adv}): d/dρ {} vs fd {fd}",
            s.dloss_dratio
        );
    }

    #[test]
    fn worked_example_section_1e() {
        check(1.3, 1.0, PPO, -1.2, ClipBranch::Clipped);
        check(0.7, 1.0, PPO, -0.7, ClipBranch::Unclipped);
        check(0.7, -1.0, PPO, 0.8, ClipBranch::Clipped);
        check(1.3, -1.0, PPO, 1.3, ClipBranch::Unclipped);
        check(4.0, -1.0, PPO, 3.0, ClipBranch::DualClipped);
    }

    #[test]
    fn asymmetric_clip_and_no_dual() {
        let dapo = ClipRange {
            low: 0.2,
            high: 0.28,
            dual: None,
        };
        check(1.3, 1.0, dapo, -1.28, ClipBranch::Clipped);
        check(1.25, 1.0, dapo, -1.25, ClipBranch::Unclipped);
        check(4.0, -1.0, dapo, 4.0, ClipBranch::Unclipped);
        check(0.5, -2.0, dapo, 1.6, ClipBranch::Clipped);
    }

    #[test]
    fn zero_advantage_is_never_clipped() {
        check(5.0, 0.0, PPO, 0.0, ClipBranch::Unclipped);
        check(0.1, 0.0, PPO, 0.0, ClipBranch::Unclipped);
    }
}
