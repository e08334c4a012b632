//! Beta-distribution numerics for the A/B test: log-gamma, the regularised incomplete beta
//! function, the Beta-Binomial log-pmf, and `P[θ_new > θ_old]` for two Beta posteriors by
//! deterministic quadrature.
//!
//! The ReSkill code (arXiv 2606.01619; amazon-science/reskill,
//! `skill_serving/skill_ab_tracker.py`) estimates `P[θ_new > θ_old]` from 10 000 paired
//! draws, which carries Monte-Carlo noise of about `sqrt(p(1 − p)/10 000) ≈ 0.003` and makes
//! plans depend on a global RNG. Here the probability is the integral
//! `∫₀¹ f_new(x) · F_old(x) dx` (density of the new posterior times the CDF of the old one),
//! computed by composite Gauss–Legendre quadrature, so the same posteriors always give the
//! same number to about 1e-10.

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, nine terms; relative error about 1e-15). Below 0.5
/// it uses `Γ(x) = Γ(x + 1)/x`, so tiny shapes (a discounted posterior can reach 1e-6) stay
/// accurate.
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const P: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return ln_gamma(x + 1.0) - x.ln();
    }
    let z = x - 1.0;
    let mut a = P[0];
    for (i, &p) in P.iter().enumerate().skip(1) {
        a += p / (z + i as f64);
    }
    let t = z + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (z + 0.5) * t.ln() - t + a.ln()
}

/// `ln B(a, b) = ln Γ(a) + ln Γ(b) − ln Γ(a + b)`.
pub fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

/// `log BB(m | n, a, b)`: the Beta-Binomial log-pmf of `m` successes in `n` trials under a
/// Beta(a, b) prior, `ln C(n, m) + ln B(m + a, n − m + b) − ln B(a, b)`. `m ≤ n` and
/// `a, b > 0` are the caller's to ensure.
pub fn log_beta_binomial(m: u64, n: u64, a: f64, b: f64) -> f64 {
    let (m, n) = (m as f64, n as f64);
    ln_gamma(n + 1.0) - ln_gamma(m + 1.0) - ln_gamma(n - m + 1.0) + ln_beta(m + a, n - m + b)
        - ln_beta(a, b)
}

/// A point of `(0, 1)` given with its complement and both logarithms, each computed without
/// cancellation (near 0, `x` may underflow while `ln x` stays exact).
#[derive(Clone, Copy, Debug)]
struct Point {
    x: f64,
    y: f64,
    ln_x: f64,
    ln_y: f64,
}

impl Point {
    fn new(x: f64) -> Point {
        Point {
            x,
            y: 1.0 - x,
            ln_x: x.ln(),
            ln_y: (-x).ln_1p(),
        }
    }
}

/// The regularised incomplete beta function `I_x(a, b)` (the Beta(a, b) CDF at `x`), by the
/// continued fraction of Numerical Recipes §6.4 (modified Lentz), on the side of the mean
/// where it converges fast.
pub fn regularized_incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    inc_beta_at(a, b, Point::new(x), ln_beta(a, b))
}

fn inc_beta_at(a: f64, b: f64, p: Point, ln_b: f64) -> f64 {
    let front = a * p.ln_x + b * p.ln_y - ln_b;
    if p.x < (a + 1.0) / (a + b + 2.0) {
        (front.exp() * beta_cf(a, b, p.x) / a).clamp(0.0, 1.0)
    } else {
        (1.0 - front.exp() * beta_cf(b, a, p.y) / b).clamp(0.0, 1.0)
    }
}

/// The continued fraction of `I_x(a, b)`. It needs about `sqrt(max(a, b))` terms; the cap
/// of 10 000 covers posteriors with some 10⁸ episodes, and the last convergent is returned if
/// it is reached.
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPS: f64 = 1e-16;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - qab * x / qap);
    let mut h = d;
    for m in 1..=10_000 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 / guard(1.0 + aa * d);
        c = guard(1.0 + aa / c);
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 / guard(1.0 + aa * d);
        c = guard(1.0 + aa / c);
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < EPS {
            break;
        }
    }
    h
}

/// Gauss–Legendre nodes and weights on `[0, 1]`, by Newton's method on the Legendre
/// polynomial (Numerical Recipes `gauleg`).
fn gauss_legendre(n: usize) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); n];
    let nf = n as f64;
    for i in 0..n.div_ceil(2) {
        let mut z = (std::f64::consts::PI * (i as f64 + 0.75) / (nf + 0.5)).cos();
        let mut dp = 1.0;
        for _ in 0..100 {
            let (mut p1, mut p2) = (1.0, 0.0);
            for j in 0..n {
                let jf = j as f64;
                let p3 = p2;
                p2 = p1;
                p1 = ((2.0 * jf + 1.0) * z * p2 - jf * p3) / (jf + 1.0);
            }
            dp = nf * (z * p1 - p2) / (z * z - 1.0);
            let step = p1 / dp;
            z -= step;
            if step.abs() < 1e-16 {
                break;
            }
        }
        let w = 1.0 / ((1.0 - z * z) * dp * dp);
        // Mapped from [-1, 1] to [0, 1]: x = (1 ± z)/2, weight w/2.
        out[i] = ((1.0 - z) / 2.0, w);
        out[n - 1 - i] = ((1.0 + z) / 2.0, w);
    }
    out
}

/// Standard deviation of Beta(a, b).
fn beta_sd(a: f64, b: f64) -> f64 {
    let s = a + b;
    (a * b / (s * s * (s + 1.0))).sqrt()
}

/// `P[X > Y]` for independent `X ~ Beta(a_x, b_x)` and `Y ~ Beta(a_y, b_y)`, all shapes
/// `> 0`: `∫₀¹ f_X(x) F_Y(x) dx`.
///
/// The interval is split at ½. Near 0 the integrand behaves like `x^(a_x + a_y − 1)` and near
/// 1 like `(1 − x)^(b_x − 1)`, which is singular for small shapes; the substitutions
/// `x = ½ v^(1/p)` and `1 − x = ½ v^(1/q)`, with `p = s/⌈s⌉` for `s = a_x + a_y` and
/// `q = b_x/⌈b_x⌉`, turn those ends into integer powers of `v`. Each half is then integrated
/// with 16-point Gauss–Legendre on `N` equal panels in `v`, `N = clamp(⌈1/σ⌉, 64, 4096)` for
/// the smaller of the two posterior standard deviations `σ`, so even a sharp posterior is
/// resolved by several panels. Everything is evaluated in logarithms (a shape of 1e-6 puts
/// mass at `x` far below the smallest `f64`).
pub fn prob_greater(a_x: f64, b_x: f64, a_y: f64, b_y: f64) -> f64 {
    let sigma = beta_sd(a_x, b_x).min(beta_sd(a_y, b_y));
    let panels = (1.0 / sigma).ceil().clamp(64.0, 4096.0) as usize;
    let rule = gauss_legendre(16);
    let (ln_bx, ln_by) = (ln_beta(a_x, b_x), ln_beta(a_y, b_y));
    let s = a_x + a_y;
    let p = s / s.ceil();
    let q = b_x / b_x.ceil();
    let half = 0.5f64.ln();
    let mut left = 0.0;
    let mut right = 0.0;
    for k in 0..panels {
        let (lo, width) = (k as f64 / panels as f64, 1.0 / panels as f64);
        for &(node, weight) in &rule {
            let v = lo + width * node;
            let ln_v = v.ln();
            let w = weight * width;
            // Left half: x = ½ v^(1/p), dx = x/(p v) dv.
            let ln_x = half + ln_v / p;
            let x = ln_x.exp();
            let pt = Point {
                x,
                y: 1.0 - x,
                ln_x,
                ln_y: (-x).ln_1p(),
            };
            let ln_f = a_x * pt.ln_x + (b_x - 1.0) * pt.ln_y - ln_bx - p.ln() - ln_v;
            left += w * ln_f.exp() * inc_beta_at(a_y, b_y, pt, ln_by);
            // Right half: 1 − x = ½ v^(1/q), |dx| = (1 − x)/(q v) dv.
            let ln_y = half + ln_v / q;
            let y = ln_y.exp();
            let pt = Point {
                x: 1.0 - y,
                y,
                ln_x: (-y).ln_1p(),
                ln_y,
            };
            let ln_f = (a_x - 1.0) * pt.ln_x + b_x * pt.ln_y - ln_bx - q.ln() - ln_v;
            right += w * ln_f.exp() * inc_beta_at(a_y, b_y, pt, ln_by);
        }
    }
    (left + right).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, tol: f64) {
        assert!((got - want).abs() < tol, "got {got}, want {want}");
    }

    #[test]
    fn ln_gamma_matches_factorials_and_half_integers() {
        close(ln_gamma(1.0), 0.0, 1e-14);
        close(ln_gamma(5.0), 24f64.ln(), 1e-13);
        close(ln_gamma(0.5), std::f64::consts::PI.sqrt().ln(), 1e-14);
        // Γ(1e-6) ≈ 1/1e-6 − γ.
        close(
            ln_gamma(1e-6),
            (1e6 - 0.577_215_664_901_532_9f64).ln(),
            1e-9,
        );
        // Python: math.lgamma(1001.0) = 5912.128178488163 (ln 1000!).
        close(ln_gamma(1001.0), 5_912.128_178_488_163, 1e-9);
    }

    #[test]
    fn beta_binomial_pmf_of_the_worked_example_and_sums_to_one() {
        // log BB(3 | 4, 1, 1) = log 1/5 (the helper value of the worked example).
        close(log_beta_binomial(3, 4, 1.0, 1.0), -1.6094, 5e-5);
        close(log_beta_binomial(3, 4, 1.0, 1.0), (0.2f64).ln(), 1e-12);
        let total: f64 = (0..=7)
            .map(|m| log_beta_binomial(m, 7, 2.5, 0.3).exp())
            .sum();
        close(total, 1.0, 1e-12);
    }

    #[test]
    fn incomplete_beta_matches_closed_forms() {
        // I_x(1, 1) = x; I_x(2, 1) = x²; I_x(1, 3) = 1 − (1 − x)³; I_x(a, b) = 1 − I_{1−x}(b, a).
        close(regularized_incomplete_beta(1.0, 1.0, 0.3), 0.3, 1e-14);
        close(regularized_incomplete_beta(2.0, 1.0, 0.3), 0.09, 1e-14);
        close(
            regularized_incomplete_beta(1.0, 3.0, 0.2),
            1.0 - 0.8f64.powi(3),
            1e-14,
        );
        let (a, b, x) = (3.7, 0.4, 0.91);
        close(
            regularized_incomplete_beta(a, b, x),
            1.0 - regularized_incomplete_beta(b, a, 1.0 - x),
            1e-14,
        );
        assert_eq!(regularized_incomplete_beta(2.0, 2.0, 0.0), 0.0);
        assert_eq!(regularized_incomplete_beta(2.0, 2.0, 1.0), 1.0);
    }

    #[test]
    fn prob_greater_of_the_worked_example_posteriors() {
        // The worked example (docs/algorithms/reskill.md) without discount: Beta(4, 2) vs Beta(2, 4), then Beta(6, 5) vs Beta(4, 5).
        close(prob_greater(4.0, 2.0, 2.0, 4.0), 0.8968, 5e-5);
        close(prob_greater(6.0, 5.0, 4.0, 5.0), 0.6814, 5e-5);
        // The worked example with M = 20.
        let w = 20.0 / 24.0;
        close(
            prob_greater(w + 3.0, w + 1.0, w + 1.0, w + 3.0),
            0.9047,
            5e-5,
        );
        close(
            prob_greater(
                5.066_666_666_666_666,
                4.466_666_666_666_667,
                3.594_202_898_550_725,
                4.333_333_333_333_333,
            ),
            0.6343,
            5e-5,
        );
    }

    #[test]
    fn prob_greater_matches_closed_forms_even_for_tiny_and_sharp_shapes() {
        // Equal posteriors: ½. P[Beta(2, 1) > U] = E[X] = 2/3 for a uniform Y.
        close(prob_greater(1.0, 1.0, 1.0, 1.0), 0.5, 1e-12);
        close(prob_greater(7.3, 2.1, 7.3, 2.1), 0.5, 1e-10);
        close(prob_greater(2.0, 1.0, 1.0, 1.0), 2.0 / 3.0, 1e-12);
        // Against a uniform Y the answer is E[X] = a/(a + b), also for singular densities.
        for (a, b) in [
            (1e-6, 1.0),
            (1e-3, 5.0),
            (5.0, 1e-3),
            (0.3, 0.2),
            (0.02, 40.0),
        ] {
            close(prob_greater(a, b, 1.0, 1.0), a / (a + b), 1e-9);
        }
        // A uniform X against Y: P = 1 − E[Y].
        close(
            prob_greater(1.0, 1.0, 1e-6, 3.0),
            1.0 - 1e-6 / 3.000_001,
            1e-9,
        );
        // Complementary events sum to one; sharp posteriors far apart give 0 or 1.
        let (p, q) = (
            prob_greater(40.5, 60.2, 3.1, 0.7),
            prob_greater(3.1, 0.7, 40.5, 60.2),
        );
        close(p + q, 1.0, 1e-10);
        close(prob_greater(9000.0, 1000.0, 1000.0, 9000.0), 1.0, 1e-12);
        // Two sharp posteriors close together (σ ≈ 0.005): the exact finite sum for integer
        // shapes (Evan Miller's formula, in 40-digit arithmetic) gives 0.921372019141896.
        close(
            prob_greater(5100.0, 4900.0, 5000.0, 5000.0),
            0.921_372_019_141_896,
            1e-9,
        );
    }
}
