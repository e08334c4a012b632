//! §3e's worked example end to end: `edge` admits the rows and builds the targets, the
//! kernel's objective (`cairn_kernel::objective::RlLoss`, the reference implementation of the
//! sampled reverse KL term) computes the loss and its gradient.

use cairn_edge::Edge;
use cairn_kernel::loss::{TeacherScores, TokenLoss, TokenScores};
use cairn_kernel::objective::{ObjectiveConfig, RlLoss};
use cairn_plugin_sdk::{Algorithm, Batch, TeacherSource, TurnRow};

use crate::{plan, render, row, test_host};

#[test]
fn the_worked_example_gives_the_papers_loss_and_gradient() {
    let host = test_host();
    let mut edge = Edge::from_config_json("").unwrap();
    let slots = plan(&mut edge, &host, 1);
    // E1 succeeds; E2, N1, N2 fail; all at `s0`.
    let rows: Vec<TurnRow> = [1.0, 0.0, 0.0, 0.0]
        .iter()
        .enumerate()
        .map(|(k, &r)| row(1, 10 + k as u64, 0, &slots[k], "s0", r, r))
        .collect();
    let batch = Batch { step: 0, rows };
    let mut signals = edge.signals(&batch, &host).unwrap();
    let term = &signals.teacher[0];
    let targets: Vec<(usize, Vec<f32>)> = term
        .targets
        .iter()
        .map(|t| (t.row, t.weights.clone()))
        .collect();
    assert_eq!(
        targets,
        [(2, vec![1.0; 3]), (3, vec![1.0; 3])],
        "w = 1 on N1, N2"
    );
    let context = render(&slots[0].inject, "you are at s0");
    assert_eq!(
        term.targets[0].source,
        TeacherSource::Context {
            context_ids: context.clone()
        }
    );

    // The kernel's loss on the step of the two targets, with zero advantages (so only the
    // teacher term acts), ℓ^S = [−0.5, −2.0, −0.1] and the live teacher's ℓ^T =
    // [−0.3, −0.8, −0.1]: per token sg(ℓ^S − ℓ^T)·ℓ^S = [0.1, 2.4, 0], token mean 0.8333,
    // gradient coefficients on ℓ^S [−0.2, −1.2, 0] (each ÷ 6 tokens for the token mean).
    signals.advantages = batch.zeros_like_responses();
    let refs: Vec<&TurnRow> = batch.rows.iter().collect();
    let mut loss =
        RlLoss::from_rows(&ObjectiveConfig::default(), &refs, &signals, &[2, 3]).unwrap();
    let requests = loss.teacher_requests(0..2).unwrap();
    assert_eq!(requests.len(), 2);
    assert!(requests
        .iter()
        .all(|r| r.context_ids.as_deref() == Some(&context[..]) && r.top_k == 0));
    let answers = vec![
        TeacherScores {
            logprobs: vec![-0.3, -0.8, -0.1],
            ..TeacherScores::default()
        };
        2
    ];
    let student = vec![vec![-0.5f32, -2.0, -0.1]; 2];
    let grads = loss
        .grads(
            0..2,
            &TokenScores {
                logp: &student,
                entropy: &[],
                teacher: &answers,
            },
        )
        .unwrap();
    loss.check_complete().unwrap();
    let report = loss.report();
    let t = &report.teacher[0];
    assert_eq!((t.name.as_str(), t.active_tokens), ("edge-distill", 6));
    assert!((t.loss - 0.8333).abs() < 5e-5, "{}", t.loss);
    assert!((report.loss - 0.8333).abs() < 5e-5, "{}", report.loss);
    for g in &grads.logp {
        for (l, want) in [-0.2, -1.2, 0.0].iter().enumerate() {
            let got = f64::from(g[l]) * 6.0;
            assert!((got - want).abs() < 1e-6, "token {l}: {got}");
        }
    }
}
