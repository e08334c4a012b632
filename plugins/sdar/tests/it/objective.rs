//! The worked example of docs/algorithms/sdar.md end to end: `sdar` builds the term, the kernel's objective
//! (`cairn_kernel::objective::RlLoss`) computes the loss and its gradient, so a wrong sign or
//! coefficient in either form fails here.

use std::collections::HashMap;

use cairn_kernel::loss::{TokenLoss, TokenScores};
use cairn_kernel::objective::{LossReport, ObjectiveConfig, RlLoss};
use cairn_opsd::testing::{mock_host, row, skill, MockHost, Teacher};
use cairn_plugin_sdk::{Algorithm, Batch, TurnRow};
use cairn_sdar::Sdar;

/// One row, `(ℓ^S, ℓ^T)` = (−1.2, −0.4), (−0.2, −0.9), (−2.5, −2.5); the teacher's log-probs
/// come from the host's scorer under the skill context.
fn example() -> (Batch, MockHost) {
    let host = mock_host(Teacher {
        logprobs: HashMap::from([(vec![5, 6, 7], vec![-0.4, -0.9, -2.5])]),
        ..Teacher::default()
    });
    host.put(skill(1, Some("t"), "open the drawer first"));
    let batch = Batch {
        step: 0,
        rows: vec![row(1, 1, "t", &[5, 6, 7], &[-1.2, -0.2, -2.5])],
    };
    (batch, host)
}

/// The loss of one update step on the example's row at `ℓ = ℓ^S` (zero advantages, so only
/// the sdar term acts), and `∂L/∂ℓ`.
fn loss(config: &str) -> (LossReport, Vec<f32>) {
    let (batch, host) = example();
    let sdar = Sdar::from_config_json(config).unwrap();
    let mut signals = sdar.signals(&batch, &host).unwrap();
    signals.advantages = batch.zeros_like_responses();
    let refs: Vec<&TurnRow> = batch.rows.iter().collect();
    let mut loss = RlLoss::from_rows(&ObjectiveConfig::default(), &refs, &signals, &[0]).unwrap();
    // A fixed sampled-token teacher needs no teacher pass.
    assert!(loss.teacher_requests(0..1).unwrap().is_empty());
    let student = vec![vec![-1.2f32, -0.2, -2.5]];
    let grads = loss.grads(0..1, &TokenScores::logp(&student)).unwrap();
    loss.check_complete().unwrap();
    (loss.report(), grads.logp[0].clone())
}

const GATES: [f64; 3] = [0.982_013_8, 0.029_312_2, 0.5];

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() < tol, "{what}: {got}, want {want}");
}

#[test]
fn the_ucob_form_descends_minus_lambda_g_grad_l_s() {
    let (report, grad) = loss("");
    // ∂L/∂ℓ^S_l = −λ g_l / N (token mean over N = 3): every gated token is pushed up, the
    // endorsed one most.
    for (l, g) in GATES.iter().enumerate() {
        close(f64::from(grad[l]), -0.1 * g / 3.0, 1e-7, "∂L/∂ℓ");
    }
    // The objective reports λ·agg(−g·ℓ^S); the reimplementation's value λ·agg(g·(ℓ^T − ℓ^S))
    // differs from it by λ·agg(g·ℓ^T), a constant without gradient: 0.0255 (the worked example).
    let aux = &report.aux_losses[0];
    assert_eq!(aux.name, "sdar-distill");
    let student = [-1.2, -0.2, -2.5];
    let teacher = [-0.4, -0.9, -2.5];
    let want: f64 = GATES.iter().zip(student).map(|(g, s)| -g * s).sum::<f64>() * 0.1 / 3.0;
    close(aux.value, want, 1e-6, "aux loss");
    close(aux.value, 0.081_142_6, 1e-6, "aux loss");
    let constant: f64 = GATES.iter().zip(teacher).map(|(g, t)| g * t).sum::<f64>() * 0.1 / 3.0;
    close(aux.value + constant, 0.0255, 5e-5, "the worked example");
    close(report.loss, aux.value, 1e-9, "only the aux term acts");
}

#[test]
fn the_reverse_kl_form_descends_minus_lambda_g_delta_grad_l_s() {
    let (report, grad) = loss(r#"{"form": "reverse_kl"}"#);
    // ∂L/∂ℓ^S_l = λ g_l (ℓ^S_l − ℓ^T_l) / N = −λ g_l Δ_l / 3: the endorsed token (Δ = 0.8)
    // is pushed up, the rejected one (Δ = −0.7) slightly down, the tie not at all.
    let gd = [0.7856, -0.0205, 0.0];
    for l in 0..3 {
        close(f64::from(grad[l]) * 3.0 / 0.1, -gd[l], 5e-5, "−g·Δ");
    }
    assert!(grad[0] < 0.0 && grad[1] > 0.0 && grad[2] == 0.0);
    // −Σ ∂L/∂ℓ = λ · token mean of g·Δ = 0.0255 (the worked example).
    let total: f64 = grad.iter().map(|&g| -f64::from(g)).sum();
    close(total, 0.0255, 5e-5, "the worked example");
    let t = &report.teacher[0];
    assert_eq!((t.name.as_str(), t.active_tokens), ("sdar-distill", 3));
    // The surrogate's value: λ·mean(g·sg(ℓ^S − ℓ^T)·ℓ^S).
    close(t.loss, 0.031_287_6, 1e-6, "teacher loss");
    close(report.loss, t.loss, 1e-9, "only the teacher term acts");
}

#[test]
fn naive_opsd_is_the_ungated_reverse_kl() {
    let (_, grad) = loss(r#"{"form": "reverse_kl", "gate": false}"#);
    // −λ Δ / 3 with Δ = [0.8, −0.7, 0].
    for (l, d) in [0.8, -0.7, 0.0].iter().enumerate() {
        close(f64::from(grad[l]), -0.1 * d / 3.0, 1e-7, "−λΔ/N");
    }
}
