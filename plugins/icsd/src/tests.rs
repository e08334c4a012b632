use cairn_opsd::testing::{mock_host, row, skill, Teacher};
use cairn_opsd::{RowTeacher, TeacherCounts};
use cairn_plugin_sdk::{ScoreWeights, TurnRow};

use super::*;

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() < tol, "{what}: {got}, want {want}");
}

fn metric(signals: &Signals, name: &str) -> f64 {
    signals
        .metrics
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no metric {name}: {:?}", signals.metrics))
        .1
}

fn teacher(row: usize, logprobs: &[f32]) -> RowTeacher {
    RowTeacher {
        row,
        skill_ids: vec![1],
        logprobs: logprobs.to_vec(),
        ..RowTeacher::default()
    }
}

fn teachers(rows: Vec<RowTeacher>) -> Teachers {
    let n = rows.len();
    Teachers {
        rows,
        counts: TeacherCounts {
            trainable_rows: n,
            with_teacher: n,
            skills_injected: n,
            ..TeacherCounts::default()
        },
    }
}

/// The worked example of docs/algorithms/icsd.md: one trajectory, turn 1 `(ℓ^S, ℓ^T)` = (−0.2, −0.1), (−1.5, −0.3), (−0.9, −1.4);
/// turn 2 (−0.05, −0.05), (−2.0, −0.5).
fn worked_example() -> (Batch, Teachers) {
    let mut second = row(1, 1, "t", &[8, 9], &[-0.05, -2.0]);
    second.turn = 1;
    let batch = Batch {
        step: 0,
        rows: vec![row(1, 1, "t", &[5, 6, 7], &[-0.2, -1.5, -0.9]), second],
    };
    let t = teachers(vec![
        teacher(0, &[-0.1, -0.3, -1.4]),
        teacher(1, &[-0.05, -0.5]),
    ]);
    (batch, t)
}

#[test]
fn the_worked_example_weights_and_weighted_coefficients() {
    let (batch, t) = worked_example();
    let s = distill(&IcsdConfig::default(), &batch, &t).unwrap();
    s.validate_against(&batch).unwrap();
    assert!(s.aux.is_empty());
    let term = &s.teacher[0];
    assert_eq!((term.name.as_str(), term.coef), (TERM, 0.1));
    assert_eq!(term.form, TeacherForm::SampledReverseKl);
    let w: Vec<f64> = term
        .targets
        .iter()
        .flat_map(|t| t.weights.iter().map(|&w| f64::from(w)))
        .collect();
    for (got, want) in w.iter().zip([0.2654, 1.9303, 0.8043, 0.2222, 1.7778]) {
        close(*got, want, 5e-5, "w");
    }
    close(w[..3].iter().sum(), 3.0, 1e-6, "turn 1 keeps its mass");
    close(w[3..].iter().sum(), 2.0, 1e-6, "turn 2 keeps its mass");
    let delta = [0.1, 1.2, -0.5, 0.0, 1.5];
    for ((w, d), want) in w
        .iter()
        .zip(delta)
        .zip([0.0265, 2.3164, -0.4021, 0.0, 2.6667])
    {
        close(w * d, want, 5e-5, "w·Δ");
    }
    assert_eq!(
        term.targets[1].source,
        TeacherSource::Fixed {
            logprobs: vec![-0.05, -0.5],
            top_ids: vec![],
            top_logprobs: vec![],
        }
    );
    close(metric(&s, "icsd/influence_mean"), 0.66, 1e-6, "mean I");
    close(
        metric(&s, "icsd/clipped_fraction"),
        0.6,
        1e-12,
        "3 of 5 clipped",
    );
    close(metric(&s, "icsd/weight_min"), 0.2222, 5e-5, "min w");
    close(metric(&s, "icsd/weight_max"), 1.9303, 5e-5, "max w");
    close(
        metric(&s, "icsd/gap_loss"),
        0.1 * (0.0265 + 2.3164 - 0.4021 + 2.6667) / 5.0,
        5e-5,
        "λ·mean(w·Δ)",
    );
}

#[test]
fn the_gated_bases_multiply_the_weights_by_the_gate() {
    let (batch, t) = worked_example();
    let plain = distill(&IcsdConfig::default(), &batch, &t).unwrap();
    let w: Vec<f32> = plain.teacher[0]
        .targets
        .iter()
        .flat_map(|t| t.weights.clone())
        .collect();
    let g: Vec<f64> = [0.1, 1.2, -0.5, 0.0, 1.5]
        .iter()
        .map(|&d| cairn_opsd::gate(5.0, d))
        .collect();
    let config = IcsdConfig::from_json(r#"{"base": "gated_reverse_kl"}"#).unwrap();
    let s = distill(&config, &batch, &t).unwrap();
    let wg: Vec<f32> = s.teacher[0]
        .targets
        .iter()
        .flat_map(|t| t.weights.clone())
        .collect();
    for l in 0..5 {
        close(f64::from(wg[l]), f64::from(w[l]) * g[l], 1e-6, "w·g");
    }
    let config = IcsdConfig::from_json(r#"{"base": "gated_ucob"}"#).unwrap();
    let s = distill(&config, &batch, &t).unwrap();
    assert!(s.teacher.is_empty());
    let c: Vec<f32> = s.aux[0].coefficients.iter().flatten().copied().collect();
    for l in 0..5 {
        close(f64::from(c[l]), -f64::from(w[l]) * g[l], 1e-6, "c = −w·g");
    }
    s.validate_against(&batch).unwrap();
}

#[test]
fn advantage_weighted_influence_recomputes_grpos_outcome_advantage() {
    // Group 1: three single-turn trajectories with rewards 1, 0, 0; group 2: a constant group
    // (Â = 0, so its influences vanish and its weights are uniform).
    let mut rows: Vec<TurnRow> = Vec::new();
    for (k, (group, r)) in [(1, 1.0), (1, 0.0), (1, 0.0), (2, 1.0), (2, 1.0)]
        .iter()
        .enumerate()
    {
        let mut row = row(*group, k as u64, "t", &[5, 6], &[-1.0, -1.0]);
        row.episode_reward = *r;
        rows.push(row);
    }
    let batch = Batch { step: 0, rows };
    let lt: [[f32; 2]; 5] = [
        [-0.5, -1.5],
        [-0.2, -1.0],
        [-1.9, -0.6],
        [-0.5, -0.1],
        [-3.0, -1.0],
    ];
    let t = teachers(lt.iter().enumerate().map(|(i, l)| teacher(i, l)).collect());
    let config = IcsdConfig::from_json(r#"{"influence": "gap_times_advantage"}"#).unwrap();
    let a = abs_advantages(&batch).unwrap();
    // Mean 1/3, unbiased std 0.57735: |Â| = 1.1547 and 0.57735 (twice); group 2: 0.
    for (got, want) in a
        .iter()
        .zip([1.154_700_5, 0.577_350_3, 0.577_350_3, 0.0, 0.0])
    {
        close(*got, want, 1e-5, "|Â|");
    }
    let influence: Vec<Vec<f64>> = lt
        .iter()
        .zip(&a)
        .map(|(l, a)| l.iter().map(|&t| (f64::from(t) + 1.0).abs() * a).collect())
        .collect();
    let want = calibrate(&influence, 0.25, 2.0, 1);
    let s = distill(&config, &batch, &t).unwrap();
    for (target, want) in s.teacher[0].targets.iter().zip(&want.weights) {
        for (got, w) in target.weights.iter().zip(want) {
            close(f64::from(*got), *w, 1e-6, "w");
        }
    }
    assert_eq!(s.teacher[0].targets[3].weights, [1.0, 1.0]);
    assert_eq!(s.teacher[0].targets[4].weights, [1.0, 1.0]);
}

/// A small deterministic generator (64-bit LCG, Knuth's constants), uniform in [0, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() * n as f64) as usize
    }
}

#[test]
fn every_turn_keeps_its_auxiliary_mass_through_the_plugin_on_random_batches() {
    let mut rng = Lcg(2026);
    for case in 0..300 {
        let n_rows = 1 + rng.below(10);
        let mut rows = Vec::new();
        let mut ts = Vec::new();
        for i in 0..n_rows {
            let l = 1 + rng.below(12);
            let old: Vec<f32> = (0..l).map(|_| -(rng.next() * 4.0) as f32).collect();
            let mut r = row(i as u64, i as u64, "t", &vec![5; l], &old);
            // Some observation tokens (mask 0) holding garbage.
            for t in 0..l {
                if rng.below(4) == 0 {
                    r.response_mask[t] = 0;
                    r.old_logprobs[t] = f32::NAN;
                }
            }
            let lt: Vec<f32> = old
                .iter()
                .map(|&s| {
                    if rng.below(5) == 0 {
                        s
                    } else {
                        -(rng.next() * 4.0) as f32
                    }
                })
                .collect();
            ts.push(teacher(i, &lt));
            rows.push(r);
        }
        let batch = Batch { step: 0, rows };
        let w_min = 0.05 + rng.next();
        let w_max = w_min + rng.next() * 2.5;
        let config = IcsdConfig {
            w_min,
            w_max,
            ..IcsdConfig::default()
        };
        let s = distill(&config, &batch, &teachers(ts)).unwrap();
        s.validate_against(&batch).unwrap();
        for target in &s.teacher[0].targets {
            let row = &batch.rows[target.row];
            let n = row.trainable_tokens() as f64;
            let mass: f64 = target.weights.iter().map(|&w| f64::from(w)).sum();
            assert!(
                (mass - n).abs() <= 1e-5 * n.max(1.0),
                "case {case}: {mass} vs {n}"
            );
            for (w, m) in target.weights.iter().zip(&row.response_mask) {
                assert!(w.is_finite());
                assert_eq!(
                    *m == 1,
                    *w > 0.0,
                    "case {case}: weight only on trainable tokens"
                );
            }
        }
    }
}

#[test]
fn signals_score_only_rows_with_a_skill_and_count_the_rest() {
    let host = mock_host(Teacher::default());
    host.put(skill(1, Some("t"), "open the drawer first"));
    let batch = Batch {
        step: 0,
        rows: vec![
            row(1, 1, "t", &[5, 6], &[-1.2, -0.2]),
            row(2, 2, "u", &[5, 6], &[-1.2, -0.2]),
        ],
    };
    let icsd = Icsd::from_config_json("").unwrap();
    let s = icsd.signals(&batch, &host).unwrap();
    s.validate_against(&batch).unwrap();
    let scored = host.scores.lock().unwrap().clone();
    assert_eq!(scored.len(), 1);
    assert_eq!(
        (scored[0].weights, scored[0].top_k),
        (ScoreWeights::Current, 0)
    );
    let rows: Vec<usize> = s.teacher[0].targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [0]);
    assert_eq!(metric(&s, "icsd/rows_with_teacher"), 1.0);
    assert_eq!(metric(&s, "icsd/rows_without_skill"), 1.0);
    // No teacher anywhere: an empty term, no weight metrics.
    let host = mock_host(Teacher::default());
    let s = icsd.signals(&batch, &host).unwrap();
    assert!(s.teacher[0].targets.is_empty());
    assert!(!s.metrics.iter().any(|(n, _)| n == "icsd/influence_mean"));
}

#[test]
fn requirements_observe_and_state() {
    let icsd = Icsd::from_config_json("").unwrap();
    let r = icsd.requirements();
    assert_eq!(r.role, Role::Auxiliary);
    assert!(r.teacher_scores && r.reflection && !r.teacher_topk);
    assert_eq!(r.bank, [EntryKind::Skill]);
    let mut icsd = icsd;
    let host = mock_host(Teacher::default());
    let mut won = row(1, 1, "t", &[5], &[-1.0]);
    won.success = true;
    won.episode_reward = 1.0;
    let report = StepReport {
        batch: Batch {
            step: 0,
            rows: vec![won],
        },
        ..StepReport::default()
    };
    icsd.observe(&report, &host).unwrap();
    assert_eq!(host.reflections.lock().unwrap().len(), 1);
    assert_eq!(
        host.reflections.lock().unwrap()[0].extra["skill_writer"],
        "icsd"
    );
    assert_eq!(host.metric("icsd/reflections_requested"), Some(1.0));
    let mut back = Icsd::from_config_json("").unwrap();
    back.load_state(&icsd.save_state().unwrap()).unwrap();
    assert_eq!((back.state().steps, back.state().creator.requested), (1, 1));
    let e = back.load_state("{").unwrap_err();
    assert!(e.message.starts_with("the icsd state is not valid"), "{e}");
}
