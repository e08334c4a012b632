//! Scoring v2 and teacher terms on the tiny model: top-k scoring against a direct forward,
//! live teachers against a plain score of the concatenated context, teacher-term gradients
//! against finite differences of the loss in a weight, split invariance, and past versions.

use std::ops::Range;

use cairn_kernel::backend::{PolicyBackend, Sequence, Weights};
use cairn_kernel::loss::{SftLoss, TeacherScores, TokenGrads, TokenLoss, TokenScores};
use cairn_kernel::objective::{LossReport, ObjectiveConfig, RlLoss};
use cairn_plugin_sdk::{Signals, TeacherForm, TeacherSource, TeacherTarget, TeacherTerm, TurnRow};
use cairn_torch::TorchBackend;
use tch::{Kind, Tensor};

use crate::common::{
    assert_tensors_close, backend, direct_logprobs, max_abs_diff, sequences, to_vec,
};

/// The top-k of one unpadded forward over the whole vocabulary, `[L·k]` ids and log-probs.
fn direct_top_k(backend: &TorchBackend, seq: &Sequence, t: f64, k: i64) -> (Vec<u32>, Vec<f32>) {
    let ids = [seq.prompt_ids.as_slice(), seq.response_ids.as_slice()].concat();
    let logits = backend.policy().forward_ids(&ids).unwrap().squeeze_dim(0);
    let (p, r) = (seq.prompt_ids.len() as i64, seq.response_ids.len() as i64);
    let logp = (logits.narrow(0, p - 1, r) / t).log_softmax(-1, Kind::Float);
    let (values, indices) = logp.topk(k, -1, true, true);
    let ids: Vec<i64> = Vec::try_from(indices.contiguous().view([-1])).unwrap();
    (ids.into_iter().map(|i| i as u32).collect(), to_vec(&values))
}

#[test]
fn top_k_scoring_equals_a_direct_forward() {
    let mut b = backend(40);
    let seqs = sequences(41, &[(3, 4), (6, 2), (2, 5)]);
    let scored = b.score_top_k(&seqs, 0.8, Weights::Current, 5).unwrap();
    let plain = b.score(&seqs, 0.8, Weights::Current).unwrap();
    for (i, (s, seq)) in scored.iter().zip(&seqs).enumerate() {
        assert_eq!(
            s.logprobs, plain[i],
            "sequence {i}: same log-probs as score"
        );
        let direct = to_vec(&direct_logprobs(b.policy(), seq, 0.8));
        assert!(max_abs_diff(&s.logprobs, &direct) < 1e-5);
        let (ids, values) = direct_top_k(&b, seq, 0.8, 5);
        assert_eq!(s.top_ids.len(), seq.response_ids.len() * 5);
        assert_eq!(s.top_ids, ids, "sequence {i}: top-k ids");
        assert!(max_abs_diff(&s.top_logprobs, &values) < 1e-5);
        assert!(s
            .top_logprobs
            .chunks(5)
            .all(|c| c.windows(2).all(|w| w[0] >= w[1])));
    }
    let e = b
        .score_top_k(&seqs, 1.0, Weights::Current, 65)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("65 is larger than the vocabulary (64 ids)"),
        "{e}"
    );
}

/// Asks for live teachers on every row (sampled form, and top-k with k = 4 on even rows),
/// records the answers and returns zero gradients.
struct Probe {
    contexts: Vec<Vec<u32>>,
    answers: Vec<(usize, TeacherScores)>,
}

impl TokenLoss for Probe {
    fn teacher_requests(
        &self,
        rows: Range<usize>,
    ) -> cairn_kernel::Result<Vec<cairn_kernel::loss::TeacherRequest>> {
        Ok(rows
            .map(|r| cairn_kernel::loss::TeacherRequest {
                row: r,
                context_ids: Some(self.contexts[r].clone()),
                top_k: if r % 2 == 0 { 4 } else { 0 },
                ids: Vec::new(),
            })
            .collect())
    }

    fn grads(
        &mut self,
        rows: Range<usize>,
        scores: &TokenScores<'_>,
    ) -> cairn_kernel::Result<TokenGrads> {
        self.answers
            .extend(rows.clone().zip(scores.teacher.iter().cloned()));
        Ok(TokenGrads {
            logp: scores.logp.iter().map(|l| vec![0.0; l.len()]).collect(),
            entropy: Vec::new(),
            teacher: scores
                .teacher
                .iter()
                .map(|t| vec![0.0; t.student_top_logprobs.len()])
                .collect(),
        })
    }
}

#[test]
fn live_teacher_equals_a_plain_score_of_the_concatenated_context() {
    let mut b = backend(42);
    let seqs = sequences(43, &[(3, 4), (5, 3), (2, 2)]);
    let contexts = sequences(44, &[(7, 0), (4, 0), (9, 0)])
        .into_iter()
        .map(|s| s.prompt_ids)
        .collect::<Vec<_>>();
    let mut probe = Probe {
        contexts: contexts.clone(),
        answers: Vec::new(),
    };
    let split = [0..2, 2..3];
    b.accumulate_gradients(&seqs, &split, 0.9, &mut probe)
        .unwrap();
    assert_eq!(probe.answers.len(), 3);
    let teacher_seq = |r: usize| Sequence {
        prompt_ids: contexts[r].clone(),
        response_ids: seqs[r].response_ids.clone(),
    };
    for range in split {
        // A plain score of the micro-batch's (context ++ response) sequences, batched as the
        // train step batches its teacher pass.
        let plain: Vec<Sequence> = range.clone().map(teacher_seq).collect();
        let direct = b.score_top_k(&plain, 0.9, Weights::Current, 4).unwrap();
        for (r, want) in range.zip(direct) {
            let (row, answer) = &probe.answers[r];
            assert_eq!(*row, r);
            let k = if r % 2 == 0 { 4 } else { 0 };
            assert!(
                max_abs_diff(&answer.logprobs, &want.logprobs) <= 1e-6,
                "row {r}"
            );
            let unbatched = to_vec(&direct_logprobs(b.policy(), &teacher_seq(r), 0.9));
            assert!(
                max_abs_diff(&answer.logprobs, &unbatched) <= 1e-5,
                "row {r}"
            );
            if k == 0 {
                assert!(answer.top_ids.is_empty() && answer.student_top_logprobs.is_empty());
                continue;
            }
            assert_eq!(answer.top_ids, want.top_ids, "row {r}");
            assert!(max_abs_diff(&answer.top_logprobs, &want.top_logprobs) <= 1e-6);
            // The student's log-probs at the teacher's ids: its own full distribution there.
            let student = b
                .score_top_k(std::slice::from_ref(&seqs[r]), 0.9, Weights::Current, 64)
                .unwrap()
                .remove(0);
            for (j, &id) in answer.top_ids.iter().enumerate() {
                let l = j / 4;
                let full = &student.top_ids[l * 64..(l + 1) * 64];
                let at = full.iter().position(|&x| x == id).unwrap();
                let want = student.top_logprobs[l * 64 + at];
                assert!(
                    (answer.student_top_logprobs[j] - want).abs() <= 1e-5,
                    "row {r}"
                );
            }
        }
    }
}

/// Two rows; a PG term; a sampled and a top-k teacher term on both rows, fixed to what the
/// current weights give under another context (or live, with the same values).
fn teacher_step(b: &mut TorchBackend, live: bool) -> (Vec<TurnRow>, Signals, Vec<Sequence>) {
    let seqs = sequences(50, &[(3, 4), (4, 3)]);
    let contexts: Vec<Vec<u32>> = sequences(51, &[(5, 0), (6, 0)])
        .into_iter()
        .map(|s| s.prompt_ids)
        .collect();
    let current = b.score(&seqs, 1.0, Weights::Current).unwrap();
    let rows: Vec<TurnRow> = seqs
        .iter()
        .zip(&current)
        .enumerate()
        .map(|(i, (s, lp))| TurnRow {
            trajectory_id: i as u64,
            prompt_ids: s.prompt_ids.clone(),
            response_ids: s.response_ids.clone(),
            response_logprobs: lp.clone(),
            response_mask: vec![1; s.response_ids.len()],
            old_logprobs: lp.iter().map(|x| x + 0.05).collect(),
            ..TurnRow::default()
        })
        .collect();
    let mut sampled = Vec::new();
    let mut top = Vec::new();
    for (r, s) in seqs.iter().enumerate() {
        let teacher_seq = Sequence {
            prompt_ids: contexts[r].clone(),
            response_ids: s.response_ids.clone(),
        };
        let t = b
            .score_top_k(std::slice::from_ref(&teacher_seq), 1.0, Weights::Current, 3)
            .unwrap()
            .remove(0);
        let weights: Vec<f32> = (0..s.response_ids.len())
            .map(|l| 0.5 + 0.25 * l as f32)
            .collect();
        let (sampled_source, top_source) = if live {
            let c = TeacherSource::Context {
                context_ids: contexts[r].clone(),
            };
            (c.clone(), c)
        } else {
            (
                TeacherSource::Fixed {
                    logprobs: t.logprobs.clone(),
                    top_ids: vec![],
                    top_logprobs: vec![],
                },
                TeacherSource::Fixed {
                    logprobs: vec![],
                    top_ids: t.top_ids.clone(),
                    top_logprobs: t.top_logprobs.clone(),
                },
            )
        };
        sampled.push(TeacherTarget {
            row: r,
            weights: weights.clone(),
            source: sampled_source,
        });
        top.push(TeacherTarget {
            row: r,
            weights,
            source: top_source,
        });
    }
    let signals = Signals {
        advantages: vec![vec![0.3, -0.2, 0.5, 0.1], vec![-0.4, 0.2, 0.6]],
        teacher: vec![
            TeacherTerm {
                name: "sampled".into(),
                coef: 0.8,
                form: TeacherForm::SampledReverseKl,
                targets: sampled,
            },
            TeacherTerm {
                name: "top3".into(),
                coef: 1.5,
                form: TeacherForm::TopKReverseKl { k: 3 },
                targets: top,
            },
        ],
        ..Signals::default()
    };
    (rows, signals, seqs)
}

/// The loss value and the accumulated gradients of one step (weights unchanged).
fn loss_and_gradients(
    b: &mut TorchBackend,
    rows: &[TurnRow],
    signals: &Signals,
    seqs: &[Sequence],
    split: &[Range<usize>],
) -> (f64, Vec<(String, Tensor)>) {
    let (report, grads) = report_and_gradients(b, rows, signals, seqs, split);
    (report.loss, grads)
}

fn report_and_gradients(
    b: &mut TorchBackend,
    rows: &[TurnRow],
    signals: &Signals,
    seqs: &[Sequence],
    split: &[Range<usize>],
) -> (LossReport, Vec<(String, Tensor)>) {
    let refs: Vec<&TurnRow> = rows.iter().collect();
    let mut loss = RlLoss::from_rows(&ObjectiveConfig::default(), &refs, signals, &[0, 1]).unwrap();
    b.accumulate_gradients(seqs, split, 1.0, &mut loss).unwrap();
    loss.check_complete().unwrap();
    let report = loss.report();
    assert!(
        report.teacher.iter().all(|t| t.loss.abs() > 1e-4),
        "{report:?}"
    );
    (report, b.gradients())
}

/// The function whose gradient the step's gradient is, at the backend's current weights: the
/// sampled term's reported value is EDGE's surrogate `w·sg(ℓ^S − ℓ^T)·ℓ^S` (its own
/// derivative also hits the stopped factor); its gradient `w(ℓ^S − ℓ^T)∇ℓ^S` is that of
/// `w·½(ℓ^S − ℓ^T)²` with the teacher fixed, computed here from a plain score (token-mean over
/// the term's 7 active tokens).
fn potential(b: &mut TorchBackend, rows: &[TurnRow], signals: &Signals, seqs: &[Sequence]) -> f64 {
    let (report, _) = report_and_gradients(b, rows, signals, seqs, &[0..2]);
    let student = b.score(seqs, 1.0, Weights::Current).unwrap();
    let term = &signals.teacher[0];
    assert_eq!(term.form, TeacherForm::SampledReverseKl);
    let active: usize = term.targets.iter().map(|t| t.weights.len()).sum();
    let mut value = report.loss - report.teacher[0].loss;
    for t in &term.targets {
        let TeacherSource::Fixed { logprobs, .. } = &t.source else {
            panic!("the finite-difference step has fixed teachers");
        };
        for (l, &w) in t.weights.iter().enumerate() {
            let d = f64::from(student[t.row][l]) - f64::from(logprobs[l]);
            value += f64::from(term.coef) * f64::from(w) * 0.5 * d * d / active as f64;
        }
    }
    value
}

#[test]
fn teacher_gradients_match_finite_differences_in_a_weight() {
    let mut b = backend(52);
    let (rows, signals, seqs) = teacher_step(&mut b, false);
    let (_, grads) = loss_and_gradients(&mut b, &rows, &signals, &seqs, &[0..2]);
    // The final norm's weight scales every logit: check its three largest gradient entries.
    let (name, g) = grads
        .iter()
        .find(|(n, _)| n == "model.norm.weight")
        .expect("the model has a final norm");
    let g = to_vec(g);
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by(|&a, &c| g[c].abs().total_cmp(&g[a].abs()));
    let param = b
        .policy()
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1;
    for &i in order.iter().take(3) {
        let h = 1e-2f64;
        let mut at = |delta: f64| {
            tch::no_grad(|| {
                let mut entry = param.get(i as i64);
                entry += delta;
            });
            let value = potential(&mut b, &rows, &signals, &seqs);
            tch::no_grad(|| {
                let mut entry = param.get(i as i64);
                entry -= delta;
            });
            value
        };
        let fd = (at(h) - at(-h)) / (2.0 * h);
        let autograd = f64::from(g[i]);
        assert!(
            autograd.abs() > 1e-3,
            "entry {i}: gradient {autograd} too small to test"
        );
        assert!(
            (autograd - fd).abs() <= 2e-3 * autograd.abs().max(fd.abs()) + 1e-5,
            "{name}[{i}]: autograd {autograd} vs finite difference {fd}"
        );
    }
}

#[test]
fn live_teachers_give_the_fixed_gradients_and_any_split_the_same() {
    let mut b = backend(53);
    let (rows, fixed, seqs) = teacher_step(&mut b, false);
    let (_, live, _) = teacher_step(&mut b, true);
    let (loss_fixed, g_fixed) = loss_and_gradients(&mut b, &rows, &fixed, &seqs, &[0..2]);
    let (loss_live, g_live) = loss_and_gradients(&mut b, &rows, &live, &seqs, &[0..2]);
    assert!(
        (loss_fixed - loss_live).abs() < 1e-6,
        "{loss_fixed} vs {loss_live}"
    );
    assert_tensors_close(&g_fixed, &g_live, 1e-6);
    // Another split pads the student's and the live teacher's forwards differently: the same
    // loss and gradient up to f32 rounding of the forward (the objective itself is exactly
    // split-invariant; see the kernel's tests).
    for split in [&[0..1, 1..2][..], &[0..0, 0..1, 1..2][..]] {
        let (loss_split, g_split) = loss_and_gradients(&mut b, &rows, &live, &seqs, split);
        assert!(
            (loss_split - loss_live).abs() < 1e-5,
            "{split:?}: {loss_split} vs {loss_live}"
        );
        assert_tensors_close(&g_split, &g_live, 1e-5);
    }
}

#[test]
fn past_versions_score_as_they_were_and_missing_ones_are_errors() {
    let mut b = backend(54);
    let seqs = sequences(55, &[(3, 4), (2, 3)]);
    let masks: Vec<Vec<u8>> = seqs.iter().map(|s| vec![1; s.response_ids.len()]).collect();
    let step = |b: &mut TorchBackend| {
        b.train_step(&seqs, &[0..2], 1.0, &mut SftLoss::new(masks.clone()))
            .unwrap();
    };
    // Default: only the live weights.
    let v0 = b.score(&seqs, 1.0, Weights::Current).unwrap();
    assert_eq!(b.score(&seqs, 1.0, Weights::Version(0)).unwrap(), v0);
    step(&mut b);
    let e = b
        .score(&seqs, 1.0, Weights::Version(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy version 0 is not kept") && e.contains("keeps [1] (retain_versions = 1)"),
        "{e}"
    );
    b.retain_versions(3).unwrap();
    let v1 = b.score(&seqs, 1.0, Weights::Current).unwrap();
    step(&mut b);
    let v2 = b.score(&seqs, 1.0, Weights::Current).unwrap();
    assert!(
        max_abs_diff(&v1[0], &v2[0]) > 1e-4,
        "the step changed the policy"
    );
    assert_eq!(b.score(&seqs, 1.0, Weights::Version(1)).unwrap(), v1);
    assert_eq!(b.score(&seqs, 1.0, Weights::Version(2)).unwrap(), v2);
    let top = b.score_top_k(&seqs, 1.0, Weights::Version(1), 2).unwrap();
    assert_eq!(top[0].logprobs, v1[0]);
    step(&mut b);
    step(&mut b);
    assert_eq!(b.kept_versions(), vec![2, 3, 4]);
    assert_eq!(b.score(&seqs, 1.0, Weights::Version(2)).unwrap(), v2);
    let e = b
        .score(&seqs, 1.0, Weights::Version(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("keeps [2, 3, 4] (retain_versions = 3)"), "{e}");
    // Shrinking drops the oldest; the reference is untouched by all of this.
    b.retain_versions(2).unwrap();
    assert_eq!(b.kept_versions(), vec![3, 4]);
    assert_eq!(b.score(&seqs, 1.0, Weights::Reference).unwrap(), v0);
}
