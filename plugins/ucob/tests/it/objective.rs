//! The worked example's top-k toy end to end: `ucob` builds the auxiliary row, its gate and
//! weight; the kernel's objective (`cairn_kernel::objective::RlLoss`, the reference
//! implementation of the `top_k_forward_kl` term) computes the distillation loss.
//!
//! Toy (k = 3): teacher logits [2, 1, 0] → log p^T = [−0.4076, −1.4076, −2.4076]; student
//! [1, 1.5, 0] → [−1.1041, −0.6041, −2.1041]; d = Σ p^T (log p^T − log p^S) = 0.2394. The
//! sampled token is id 0: Δ = 0.6965, g = σ(5 · 0.6965) = σ(3.4825) = 0.9702; on an action
//! token with w = 1 the term is 0.9702 × 0.2394 × 2.0 = 0.4645.

use cairn_kernel::loss::{TeacherScores, TokenLoss, TokenScores};
use cairn_kernel::objective::{ObjectiveConfig, RlLoss};
use cairn_plugin_sdk::{
    Algorithm, Batch, FinishReason, Scored, TeacherForm, TeacherSource, TurnRow,
};
use cairn_ucob::Ucob;

use crate::{plan, row, test_host, Toy};

fn log_softmax(x: [f64; 3]) -> [f64; 3] {
    let lse = x.iter().map(|v| v.exp()).sum::<f64>().ln();
    x.map(|v| v - lse)
}

#[test]
fn the_top_k_toy_gives_the_papers_gated_loss_through_the_kernels_objective() {
    let t = log_softmax([2.0, 1.0, 0.0]);
    let s = log_softmax([1.0, 1.5, 0.0]);
    for (got, want) in t.iter().zip([-0.4076, -1.4076, -2.4076]) {
        assert!((got - want).abs() < 5e-5);
    }
    for (got, want) in s.iter().zip([-1.1041, -0.6041, -2.1041]) {
        assert!((got - want).abs() < 5e-5);
    }
    let f = |x: [f64; 3]| x.map(|v| v as f32).to_vec();

    // Group 1: the winner (good) reaches return 0.2 at s0, the target (none) 0: gap 0.2,
    // w = 0.2 / 0.2 = 1. The winner's response is one sampled action token, id 0 (cut at
    // `length`, so no stop id).
    let host = test_host(None);
    let mut u = Ucob::from_config_json(r#"{"coef": 1.0, "topk_k": 3}"#).unwrap();
    let slots = plan(&mut u, &host, 1);
    let mut target = row(1, 10, 0, &slots[0], "s0", 0.0, 0.0);
    target.last_turn = true;
    let mut winner = row(1, 11, 0, &slots[2], "s0", 0.2, 0.2);
    winner.last_turn = true;
    winner.response_ids = vec![0];
    winner.response_logprobs = vec![t[0] as f32];
    winner.response_mask = vec![1];
    winner.old_logprobs = vec![t[0] as f32];
    winner.finish_reason = FinishReason::Length;
    // The same bank, now scoring with the toy's answers.
    let host = test_host(Some(Toy {
        context: winner.prompt_ids.clone(),
        teacher: Scored {
            logprobs: vec![t[0] as f32],
            top_ids: vec![0, 1, 2],
            top_logprobs: f(t),
        },
        student: Scored {
            logprobs: vec![s[0] as f32],
            ..Scored::default()
        },
    }));
    let batch = Batch {
        step: 0,
        rows: vec![target.clone(), winner.clone()],
    };
    let mut signals = u.signals(&batch, &host).unwrap();
    signals.validate_against(&batch).unwrap();
    assert_eq!(signals.extra_rows.len(), 1);
    let aux = &signals.extra_rows[0];
    assert_eq!(aux.response_ids, [0]);
    assert_eq!(aux.train_prompt_ids.as_ref(), Some(&target.prompt_ids));
    let term = &signals.teacher[0];
    assert_eq!(term.form, TeacherForm::TopKForwardKl { k: 3 });
    let target_of_aux = &term.targets[0];
    assert_eq!(target_of_aux.row, 2);
    // g · w · action_weight = 0.9702 × 1 × 2.0.
    let weight = f64::from(target_of_aux.weights[0]);
    assert!((weight - 0.9702 * 2.0).abs() < 2e-4, "{weight}");
    let TeacherSource::Fixed { top_ids, .. } = &target_of_aux.source else {
        panic!("a fixed teacher");
    };
    assert_eq!(top_ids, &[0, 1, 2]);

    // The kernel's loss on the auxiliary row alone, with zero advantages: only the term acts.
    signals.advantages = vec![vec![0.0; 3], vec![0.0], vec![0.0]];
    let rows: Vec<&TurnRow> = batch.rows.iter().chain(&signals.extra_rows).collect();
    let mut loss = RlLoss::from_rows(&ObjectiveConfig::default(), &rows, &signals, &[2]).unwrap();
    let requests = loss.teacher_requests(0..1).unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        (requests[0].context_ids.as_ref(), requests[0].top_k),
        (None, 3)
    );
    assert_eq!(requests[0].ids, [0, 1, 2]);
    let answers = vec![TeacherScores {
        student_top_logprobs: f(s),
        ..TeacherScores::default()
    }];
    let student = vec![vec![s[0] as f32]];
    let grads = loss
        .grads(
            0..1,
            &TokenScores {
                logp: &student,
                entropy: &[],
                teacher: &answers,
            },
        )
        .unwrap();
    loss.check_complete().unwrap();
    let report = loss.report();
    let r = &report.teacher[0];
    assert_eq!((r.name.as_str(), r.active_tokens), ("ucob-cbsd", 1));
    assert!((r.kl - 0.2394).abs() < 5e-5, "d = {}", r.kl);
    assert!((r.loss - 0.4645).abs() < 5e-5, "{}", r.loss);
    assert!((report.loss - 0.4645).abs() < 5e-5, "{}", report.loss);
    // ∂/∂s_v = coef · W · (p^S_v − p^T_v), the teacher detached.
    let g = &grads.teacher[0];
    for v in 0..3 {
        let want = weight * (s[v].exp() - t[v].exp());
        assert!(
            (f64::from(g[v]) - want).abs() < 1e-5,
            "{v}: {} vs {want}",
            g[v]
        );
    }
}
