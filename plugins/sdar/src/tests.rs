use std::collections::HashMap;

use cairn_opsd::testing::{mock_host, render, row, skill, MockHost, Teacher};
use cairn_opsd::{RowTeacher, TeacherCounts};
use cairn_plugin_sdk::{ScoreWeights, TeacherForm};

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

/// The worked example of docs/algorithms/sdar.md: one row, `(ℓ^S, ℓ^T)` = (−1.2, −0.4), (−0.2, −0.9), (−2.5, −2.5), β = 5.
fn worked_example() -> (Batch, Teachers) {
    let batch = Batch {
        step: 0,
        rows: vec![row(1, 1, "t", &[5, 6, 7], &[-1.2, -0.2, -2.5])],
    };
    let teachers = Teachers {
        rows: vec![RowTeacher {
            row: 0,
            skill_ids: vec![1],
            logprobs: vec![-0.4, -0.9, -2.5],
            ..RowTeacher::default()
        }],
        counts: TeacherCounts {
            trainable_rows: 1,
            with_teacher: 1,
            skills_injected: 1,
            ..TeacherCounts::default()
        },
    };
    (batch, teachers)
}

#[test]
fn the_worked_example_gates_and_gated_gaps() {
    let (batch, teachers) = worked_example();
    let config = SdarConfig::default();
    let deltas = teachers.rows[0].gaps(&batch.rows[0]);
    for (d, want) in deltas.iter().zip([0.8, -0.7, 0.0]) {
        close(*d, want, 1e-6, "Δ");
    }
    let g = gates(&config, &batch.rows[0], &deltas);
    for (got, want) in g.iter().zip([0.9820, 0.0293, 0.5]) {
        close(*got, want, 5e-5, "gate");
    }
    let gd: Vec<f64> = g.iter().zip(&deltas).map(|(g, d)| g * d).collect();
    for (got, want) in gd.iter().zip([0.7856, -0.0205, 0.0]) {
        close(*got, want, 5e-5, "g·Δ");
    }
    close(gd.iter().sum::<f64>() / 3.0, 0.2550, 5e-5, "token mean");

    let s = distill(&config, &batch, &teachers);
    close(metric(&s, "sdar/gap_loss"), 0.0255, 5e-5, "× λ");
    close(
        metric(&s, "sdar/gate_mean"),
        (0.9820 + 0.0293 + 0.5) / 3.0,
        1e-4,
        "gate mean",
    );
    close(
        metric(&s, "sdar/gate_active_ratio"),
        1.0 / 3.0,
        1e-12,
        "g > 0.5",
    );
    close(metric(&s, "sdar/gap_mean"), 0.1 / 3.0, 1e-6, "Δ mean");
    assert_eq!(metric(&s, "sdar/rows_with_teacher"), 1.0);
    // The ucob form: an aux term, c = −g (the objective adds λ·agg(c·ℓ^S), whose gradient
    // −λ g ∇ℓ^S pushes the endorsed token up).
    assert!(s.teacher.is_empty());
    assert_eq!(s.aux.len(), 1);
    assert_eq!((s.aux[0].name.as_str(), s.aux[0].coef), (TERM, 0.1));
    for (c, want) in s.aux[0].coefficients[0]
        .iter()
        .zip([-0.9820, -0.0293, -0.5])
    {
        close(f64::from(*c), want, 5e-5, "c");
    }
    s.validate_against(&batch).unwrap();
}

#[test]
fn the_reverse_kl_form_weights_a_fixed_teacher_by_the_gate() {
    let (batch, teachers) = worked_example();
    let config = SdarConfig::from_json(r#"{"form": "reverse_kl"}"#).unwrap();
    let s = distill(&config, &batch, &teachers);
    assert!(s.aux.is_empty());
    let term = &s.teacher[0];
    assert_eq!((term.name.as_str(), term.coef), (TERM, 0.1));
    assert_eq!(term.form, TeacherForm::SampledReverseKl);
    assert_eq!(term.targets.len(), 1);
    assert_eq!(term.targets[0].row, 0);
    for (w, want) in term.targets[0].weights.iter().zip([0.9820, 0.0293, 0.5]) {
        close(f64::from(*w), want, 5e-5, "w = g");
    }
    assert_eq!(
        term.targets[0].source,
        TeacherSource::Fixed {
            logprobs: vec![-0.4, -0.9, -2.5],
            top_ids: vec![],
            top_logprobs: vec![],
        }
    );
    s.validate_against(&batch).unwrap();
}

#[test]
fn ungated_is_naive_opsd_with_unit_weights() {
    let (batch, teachers) = worked_example();
    let config = SdarConfig::from_json(r#"{"gate": false, "form": "reverse_kl"}"#).unwrap();
    let s = distill(&config, &batch, &teachers);
    assert_eq!(s.teacher[0].targets[0].weights, [1.0, 1.0, 1.0]);
    close(
        metric(&s, "sdar/gap_loss"),
        0.1 * 0.1 / 3.0,
        1e-7,
        "λ·mean Δ",
    );
    let config = SdarConfig::from_json(r#"{"gate": false}"#).unwrap();
    let s = distill(&config, &batch, &teachers);
    assert_eq!(s.aux[0].coefficients[0], [-1.0, -1.0, -1.0]);
}

#[test]
fn masked_tokens_get_no_gate_and_no_coefficient() {
    let (mut batch, teachers) = worked_example();
    batch.rows[0].response_mask = vec![1, 0, 1];
    // A masked slot may hold anything, NaN included.
    batch.rows[0].old_logprobs[1] = f32::NAN;
    let config = SdarConfig::default();
    let s = distill(&config, &batch, &teachers);
    let c = &s.aux[0].coefficients[0];
    assert_eq!(c[1], 0.0);
    close(f64::from(c[0]), -0.9820, 5e-5, "c0");
    close(
        metric(&s, "sdar/gap_mean"),
        0.4,
        1e-6,
        "Δ mean over two tokens",
    );
}

/// A batch of two tasks, one with a skill: rows 0 and 1 (task `t`, different responses) get a
/// teacher, row 2 (task `u`) has no skill, row 3 has no trainable token.
fn scored_batch() -> (Batch, MockHost) {
    scored_batch_with(|_| {})
}

/// [`scored_batch`] with the teacher's answers changed by `edit`.
fn scored_batch_with(edit: impl FnOnce(&mut Teacher)) -> (Batch, MockHost) {
    let mut teacher = Teacher {
        logprobs: HashMap::from([
            (vec![5, 6], vec![-0.4, -0.9]),
            (vec![7, 8], vec![-2.0, -0.1]),
        ]),
        default_logprob: -3.0,
        ..Teacher::default()
    };
    edit(&mut teacher);
    let host = mock_host(teacher);
    host.put(skill(1, Some("t"), "open the drawer first"));
    let mut masked = row(2, 4, "t", &[9], &[-1.0]);
    masked.response_mask = vec![0];
    let batch = Batch {
        step: 0,
        rows: vec![
            row(1, 1, "t", &[5, 6], &[-1.2, -0.2]),
            row(1, 2, "t", &[7, 8], &[-1.0, -1.0]),
            row(2, 3, "u", &[5, 6], &[-1.0, -1.0]),
            masked,
        ],
    };
    (batch, host)
}

#[test]
fn signals_score_the_rows_with_a_skill_under_the_skill_context() {
    let (batch, host) = scored_batch();
    let sdar = Sdar::from_config_json(r#"{"form": "reverse_kl"}"#).unwrap();
    let s = sdar.signals(&batch, &host).unwrap();
    s.validate_against(&batch).unwrap();
    let scored = host.scores.lock().unwrap().clone();
    assert_eq!(
        scored.len(),
        2,
        "one request per row with a skill, in one call"
    );
    let context = render(
        "Skills from earlier successful attempts:\n- open the drawer first",
        "you are in room t",
    );
    for (r, ids) in scored.iter().zip([vec![5, 6], vec![7, 8]]) {
        assert_eq!(r.context_ids, context);
        assert_eq!(r.response_ids, ids);
        assert_eq!(
            (r.weights, r.temperature, r.top_k),
            (ScoreWeights::Current, None, 0)
        );
    }
    let term = &s.teacher[0];
    let rows: Vec<usize> = term.targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [0, 1]);
    // Row 1: Δ = [−1.0, 0.9] → g = [σ(−5), σ(4.5)].
    let w = &term.targets[1].weights;
    close(f64::from(w[0]), 1.0 / (1.0 + 5f64.exp()), 1e-6, "σ(−5)");
    close(
        f64::from(w[1]),
        1.0 / (1.0 + (-4.5f64).exp()),
        1e-6,
        "σ(4.5)",
    );
    assert_eq!(metric(&s, "sdar/rows_with_teacher"), 2.0);
    assert_eq!(metric(&s, "sdar/rows_without_skill"), 1.0);
    assert_eq!(metric(&s, "sdar/context_mismatch_rows"), 0.0);
    assert_eq!(metric(&s, "sdar/skills_per_row"), 1.0);
    // The bank was asked once per (task, observation).
    let queries = host.queries.lock().unwrap();
    let texts: Vec<(&str, Option<&str>)> = queries
        .iter()
        .map(|q| (q.text.as_str(), q.task_id.as_deref()))
        .collect();
    assert_eq!(
        texts,
        [
            ("you are in room t", Some("t")),
            ("you are in room u", Some("u")),
            ("", Some("u")),
        ]
    );
}

#[test]
fn the_top_k_forms_ask_for_the_teachers_top_k_and_keep_the_gate() {
    let (batch, host) = scored_batch();
    let sdar = Sdar::from_config_json(r#"{"form": "top_k_forward_kl", "top_k": 2}"#).unwrap();
    assert!(sdar.requirements().teacher_topk);
    let s = sdar.signals(&batch, &host).unwrap();
    s.validate_against(&batch).unwrap();
    assert!(host.scores.lock().unwrap().iter().all(|r| r.top_k == 2));
    let term = &s.teacher[0];
    assert_eq!(term.form, TeacherForm::TopKForwardKl { k: 2 });
    let TeacherSource::Fixed {
        top_ids,
        top_logprobs,
        ..
    } = &term.targets[0].source
    else {
        panic!("a fixed teacher")
    };
    assert_eq!(top_ids, &[0, 1, 0, 1]);
    assert_eq!(top_logprobs, &[-1.0, -2.0, -1.0, -2.0]);
    // Row 0: Δ = [0.8, −0.7], the worked example's gates.
    close(f64::from(term.targets[0].weights[0]), 0.9820, 5e-5, "g");
    close(f64::from(term.targets[0].weights[1]), 0.0293, 5e-5, "g");
}

#[test]
fn bad_teacher_values_are_counted_drops_and_a_missing_l_old_is_an_error() {
    let (batch, host) = scored_batch_with(|t| {
        t.logprobs.insert(vec![7, 8], vec![f32::NEG_INFINITY, -0.1]);
    });
    let sdar = Sdar::from_config_json("").unwrap();
    let s = sdar.signals(&batch, &host).unwrap();
    assert_eq!(metric(&s, "sdar/rows_nonfinite"), 1.0);
    assert_eq!(metric(&s, "sdar/rows_with_teacher"), 1.0);
    assert!(s.aux[0].coefficients[1].iter().all(|&c| c == 0.0));
    let mut no_old = batch.clone();
    no_old.rows[1].old_logprobs.clear();
    let e = sdar.signals(&no_old, &host).unwrap_err();
    assert!(e.message.starts_with("row 1 has no old_logprobs"), "{e}");
    // A host without a bank says so instead of training blind.
    assert!(sdar
        .signals(&batch, &cairn_plugin_sdk::OfflineHost::default())
        .is_err());
}

#[test]
fn a_row_whose_prompt_is_not_its_observations_render_is_counted() {
    let (mut batch, host) = scored_batch();
    batch.rows[0].prompt_ids = vec![1, 2, 3];
    let s = Sdar::from_config_json("")
        .unwrap()
        .signals(&batch, &host)
        .unwrap();
    assert_eq!(metric(&s, "sdar/context_mismatch_rows"), 1.0);
}

#[test]
fn requirements_are_declared_honestly() {
    let r = Sdar::from_config_json("").unwrap().requirements();
    assert_eq!(r.role, Role::Auxiliary);
    assert!(r.teacher_scores && r.reflection && !r.teacher_topk);
    assert_eq!(r.bank, [EntryKind::Skill]);
    let r = Sdar::from_config_json(r#"{"skills": {"reflect": false}}"#)
        .unwrap()
        .requirements();
    assert!(!r.reflection);
}

#[test]
fn observe_asks_the_skill_creator_and_the_counters_are_checkpointed() {
    let (mut batch, host) = scored_batch();
    for r in &mut batch.rows {
        r.success = r.task_id == "u";
        r.episode_reward = f32::from(u8::from(r.success));
    }
    let mut sdar = Sdar::from_config_json("").unwrap();
    let report = StepReport {
        step: 0,
        batch,
        ..StepReport::default()
    };
    sdar.observe(&report, &host).unwrap();
    let asked = host.reflections.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].task_id.as_deref(), Some("u"));
    assert_eq!(asked[0].kind, EntryKind::Skill);
    assert_eq!(host.metric("sdar/reflections_requested"), Some(1.0));
    assert_eq!(host.metric("sdar/skills_in_bank"), Some(1.0));
    let saved = sdar.save_state().unwrap();
    let mut back = Sdar::from_config_json("").unwrap();
    back.load_state(&saved).unwrap();
    assert_eq!(back.state().steps, 1);
    assert_eq!(back.state().creator.requested, 1);
    back.load_state("").unwrap();
    let e = back.load_state(r#"{"steps": -1}"#).unwrap_err();
    assert!(e.message.starts_with("the sdar state is not valid"), "{e}");
}
