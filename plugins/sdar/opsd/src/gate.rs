//! The teacher–student gap and SDAR's sigmoid gate (arXiv 2605.15155; the public
//! reimplementation in github TU2021/UCOB, `verl/trainer/ppo/sdar_utils.py`).

/// `Δ = ℓ^T − ℓ^S` of one sampled token, in nats, computed in `f64` (both inputs are log-probs
/// of the same token: the teacher's under the skill context, the student's `ℓ_old`). Positive:
/// the teacher gives the token more probability than the student.
pub fn gap(student: f32, teacher: f32) -> f64 {
    f64::from(teacher) - f64::from(student)
}

/// `σ(β Δ)`, the gate of one token, in `[0, 1]`.
///
/// Evaluated in the form that never overflows: `1 / (1 + e^{−x})` for `x ≥ 0` and
/// `e^{x} / (1 + e^{x})` for `x < 0`, `x = β Δ`. So a huge positive gap gives exactly 1 (in
/// `f32` from `x ≈ 17` on), a huge negative one gives 0 or a tiny positive number, and `Δ = 0`
/// gives 0.5; no input that is finite gives NaN or infinity. A NaN input gives NaN (callers
/// drop non-finite log-probs before this).
pub fn gate(beta: f64, delta: f64) -> f64 {
    let x = beta * delta;
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_is_teacher_minus_student() {
        assert!((gap(-1.2, -0.4) - 0.8).abs() < 1e-6);
        assert!((gap(-0.2, -0.9) + 0.7).abs() < 1e-6);
        assert_eq!(gap(-2.5, -2.5), 0.0);
    }

    #[test]
    fn the_gate_at_its_extremes() {
        // Exactly 0.5 at no gap.
        assert_eq!(gate(5.0, 0.0), 0.5);
        // A large positive gap: exactly 1 in f32 (and in f64 for |x| ≥ 37).
        for d in [4.0, 10.0, 1e4, 1e30] {
            let g = gate(5.0, d);
            assert!(g.is_finite() && g <= 1.0);
            assert_eq!(g as f32, 1.0, "Δ = {d}");
        }
        assert_eq!(gate(5.0, 1e4), 1.0);
        // A large negative gap: → 0, never NaN or infinite, never negative.
        for d in [-4.0, -10.0, -1e4, -1e30] {
            let g = gate(5.0, d);
            assert!(g.is_finite() && (0.0..3e-9).contains(&g), "Δ = {d}: {g}");
        }
        assert_eq!(gate(5.0, -1e4), 0.0);
        // Symmetry: σ(x) + σ(−x) = 1.
        for d in [0.01, 0.3, 1.7] {
            assert!((gate(5.0, d) + gate(5.0, -d) - 1.0).abs() < 1e-15);
        }
        // Monotone in Δ.
        let gs: Vec<f64> = (-40..=40).map(|i| gate(5.0, f64::from(i) * 0.1)).collect();
        assert!(gs.windows(2).all(|w| w[0] <= w[1]));
    }
}
