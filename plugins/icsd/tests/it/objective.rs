//! The worked example of docs/algorithms/icsd.md end to end: `icsd` scores the teacher through
//! the host, calibrates the weights and builds the term; the kernel's objective
//! (`cairn_kernel::objective::RlLoss`) computes the loss and its gradient, so a wrong weight,
//! sign or coefficient fails here.

use std::collections::HashMap;

use cairn_icsd::Icsd;
use cairn_kernel::loss::{TokenLoss, TokenScores};
use cairn_kernel::objective::{ObjectiveConfig, RlLoss};
use cairn_opsd::testing::{mock_host, row, skill, Teacher};
use cairn_plugin_sdk::{Algorithm, Batch, TurnRow};

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() < tol, "{what}: {got}, want {want}");
}

#[test]
fn the_worked_example_through_the_objective() {
    // Two turns of one trajectory: turn 1 (ℓ^S, ℓ^T) = (−0.2, −0.1), (−1.5, −0.3),
    // (−0.9, −1.4); turn 2 (−0.05, −0.05), (−2.0, −0.5).
    let host = mock_host(Teacher {
        logprobs: HashMap::from([
            (vec![5, 6, 7], vec![-0.1, -0.3, -1.4]),
            (vec![8, 9], vec![-0.05, -0.5]),
        ]),
        ..Teacher::default()
    });
    host.put(skill(1, Some("t"), "open the drawer first"));
    let mut second = row(1, 1, "t", &[8, 9], &[-0.05, -2.0]);
    second.turn = 1;
    let batch = Batch {
        step: 0,
        rows: vec![row(1, 1, "t", &[5, 6, 7], &[-0.2, -1.5, -0.9]), second],
    };
    let icsd = Icsd::from_config_json("").unwrap();
    let mut signals = icsd.signals(&batch, &host).unwrap();
    signals.advantages = batch.zeros_like_responses();
    let refs: Vec<&TurnRow> = batch.rows.iter().collect();
    let mut loss =
        RlLoss::from_rows(&ObjectiveConfig::default(), &refs, &signals, &[0, 1]).unwrap();
    assert!(
        loss.teacher_requests(0..2).unwrap().is_empty(),
        "fixed teacher"
    );
    let student = vec![vec![-0.2f32, -1.5, -0.9], vec![-0.05, -2.0]];
    let grads = loss.grads(0..2, &TokenScores::logp(&student)).unwrap();
    loss.check_complete().unwrap();
    // ∂L/∂ℓ^S_l = λ w_l (ℓ^S_l − ℓ^T_l) / 5 = −λ (w·Δ)_l / 5 over the 5 active tokens.
    let g: Vec<f64> = grads.logp.iter().flatten().map(|&g| f64::from(g)).collect();
    for (l, want) in [0.0265, 2.3164, -0.4021, 0.0, 2.6667].iter().enumerate() {
        close(-g[l] * 5.0 / 0.1, *want, 5e-4, "w·Δ from the gradient");
    }
    // The weights sum to each turn's token count, so the term has unweighted OPSD's mass:
    // the reported value is λ·(1/5)·Σ w·sg(ℓ^S − ℓ^T)·ℓ^S.
    let w = [0.2654, 1.9303, 0.8043, 0.2222, 1.7778];
    let ls = [-0.2, -1.5, -0.9, -0.05, -2.0];
    let lt = [-0.1, -0.3, -1.4, -0.05, -0.5];
    let want: f64 = (0..5).map(|l| w[l] * (ls[l] - lt[l]) * ls[l]).sum::<f64>() * 0.1 / 5.0;
    let report = loss.report();
    let t = &report.teacher[0];
    assert_eq!((t.name.as_str(), t.active_tokens), ("icsd-distill", 5));
    close(t.loss, want, 5e-5, "teacher loss");
    close(report.loss, t.loss, 1e-9, "only the icsd term acts");
}
