//! Tests of the hooks, on the mock host.

use cairn_plugin_sdk::{
    Algorithm, EntryKind, Role, ScoreWeights, StepReport, TeacherForm, TeacherSource, TurnRow,
};

use crate::cbsd::{aux_info, TERM};
use crate::config::{Branch, UcobConfig};
use crate::plan::{skill_ids, BRANCH_KEY};
use crate::testing::{
    batch, group_request, host_without_topk, mock_host, render, row, score, skill, top, trajectory,
};
use crate::tokens::gate;
use crate::Ucob;

fn metric(signals: &cairn_plugin_sdk::Signals, name: &str) -> f64 {
    signals
        .metrics
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no metric {name}: {:?}", signals.metrics))
        .1
}

/// The worked example as a step: at `s0` the cell returns are (none, 0.9025), (good, 0.95),
/// (none, 0), (good, 0) (γ = 0.95: rewards of 1 two and one turns later, and none). Rows:
/// A 0..3 (s0 → a1 → a2), B 3..5 (s0 → b1), C 5, D 6.
fn example_rows() -> Vec<TurnRow> {
    let mut rows = trajectory(1, 10, false, &["s0", "a1", "a2"], 1.0);
    rows.extend(trajectory(1, 11, true, &["s0", "b1"], 1.0));
    rows.extend(trajectory(1, 12, false, &["s0"], 0.0));
    rows.extend(trajectory(1, 13, true, &["s0"], 0.0));
    rows
}

#[test]
fn requirements_declare_a_planner_over_anchor_groups_with_scores_bank_and_reflection() {
    let r = Ucob::from_config_json("").unwrap().requirements();
    assert_eq!(r.role, Role::Planner);
    assert!(r.anchor_keys && r.step_rewards && r.teacher_scores && r.teacher_topk);
    assert!(r.reflection && r.bank == [EntryKind::Skill] && r.min_group_size == 2);
    assert!(!r.even_group_size && !r.turn_context && !r.tool_free_slots);
    let r = Ucob::from_config_json(r#"{"loss": "sampled", "max_reflections_per_step": 0}"#)
        .unwrap()
        .requirements();
    assert!(!r.teacher_topk && !r.reflection && r.teacher_scores);
}

#[test]
fn plan_group_splits_the_group_and_injects_the_retrieved_skills() {
    let host = mock_host();
    host.put(skill(3, None, "open containers before searching them"));
    host.put(skill(4, Some("t1"), "the mug is usually in the cabinet"));
    let mut ucob = Ucob::from_config_json("").unwrap();
    let slots = ucob.plan_group(&group_request(1), &host).unwrap();
    let branches: Vec<&str> = slots
        .iter()
        .map(|v| v.extra[BRANCH_KEY].as_str().unwrap())
        .collect();
    assert_eq!(branches, ["none", "none", "good", "good"]);
    assert_eq!(
        (slots[0].label.as_str(), slots[0].inject.as_str()),
        ("plain", "")
    );
    assert_eq!(slots[2].label, "skill:2");
    assert_eq!(skill_ids(&slots[3]), [3, 4]);
    assert_eq!(
        slots[2].inject,
        "Skills for tasks like this one:\n- open containers before searching them\n- the mug \
         is usually in the cabinet"
    );
    assert_eq!(host.metric("ucob/skills_too_long"), Some(0.0));

    // An empty bank: every slot runs without skills, and the group is counted.
    let empty = mock_host();
    let slots = ucob.plan_group(&group_request(2), &empty).unwrap();
    assert!(slots.iter().all(|v| v.extra[BRANCH_KEY] == "none"));
    assert_eq!(empty.metric("ucob/groups_without_skills"), Some(1.0));

    let mut one = group_request(3);
    one.group_size = 1;
    let e = ucob.plan_group(&one, &host).unwrap_err();
    assert!(e.message.contains("rollout.group_size ≥ 2"), "{e}");
}

#[test]
fn the_worked_example_trains_the_winners_sampled_ids_under_the_targets_no_skill_prompts() {
    let host = mock_host();
    let rows = example_rows();
    let b = batch(0, rows.clone());
    let ucob = Ucob::from_config_json("").unwrap();
    let s = ucob.signals(&b, &host).unwrap();
    s.validate_against(&b).unwrap();
    assert!(s.advantages.is_empty(), "a planner gives no advantages");

    // The cell at s0: winner B@s0 (good, 0.95); A@s0 dropped (gap 0.0475 ≤ 0.05); C@s0 and
    // D@s0 kept with w = 2.0. The singleton cells a1, a2, b1 give gap 0 and are filtered.
    assert_eq!(metric(&s, "ucob/records"), 7.0);
    assert_eq!(metric(&s, "ucob/cells"), 4.0);
    assert_eq!(metric(&s, "ucob/raw_pairs"), 6.0);
    assert_eq!(metric(&s, "ucob/margin_filtered"), 4.0);
    assert_eq!(metric(&s, "ucob/pairs"), 2.0);
    assert_eq!(metric(&s, "ucob/pairs_good_to_none"), 2.0);
    assert_eq!(metric(&s, "ucob/pairs_none_to_good"), 0.0);
    assert_eq!(metric(&s, "ucob/fallback_pairs"), 0.0);
    assert!((metric(&s, "ucob/gap_mean") - 0.95).abs() < 1e-6);
    assert_eq!(metric(&s, "ucob/weight_mean"), 2.0);
    assert_eq!(metric(&s, "ucob/topk_unavailable"), 0.0);
    assert_eq!(metric(&s, "ucob/success_good"), 0.5);
    assert_eq!(metric(&s, "ucob/success_none"), 0.5);

    let winner = &rows[3];
    assert_eq!((winner.trajectory_id, winner.turn), (11, 0));
    assert_eq!(s.extra_rows.len(), 2);
    // The auxiliary rows are the winner's row with its sampled ids, bit for bit.
    for aux in &s.extra_rows {
        assert_eq!(aux.response_ids, winner.response_ids);
        assert_eq!(aux.response_mask, winner.response_mask);
        assert_eq!(aux.response_logprobs, winner.response_logprobs);
        assert_eq!(aux.prompt_ids, winner.prompt_ids, "what the policy saw");
        assert_eq!(
            (aux.group_id, aux.trajectory_id, aux.turn),
            (1, 11, 0),
            "named by the row it copies"
        );
        assert_eq!(aux.finish_reason, winner.finish_reason);
        let info = aux_info(aux).unwrap();
        assert_eq!(info["source_branch"], "good");
        assert_eq!(info["target_branch"], "none");
        assert_eq!(info["weight"], 2.0);
    }
    // Student prompts: C's own (no-skill) prompt, verbatim; D's prompt rendered without skills.
    assert_eq!(
        s.extra_rows[0].train_prompt_ids.as_ref(),
        Some(&rows[5].prompt_ids)
    );
    let d_plain = render("", &rows[6].observation);
    assert_ne!(d_plain, rows[6].prompt_ids, "D saw the skills");
    assert_eq!(s.extra_rows[1].train_prompt_ids.as_ref(), Some(&d_plain));
    assert_eq!(
        aux_info(&s.extra_rows[0]).unwrap()["target"],
        serde_json::json!([12, 0])
    );
    assert_eq!(
        aux_info(&s.extra_rows[1]).unwrap()["target"],
        serde_json::json!([13, 0])
    );

    // One teacher term: top-k forward KL over the teacher's 32 ids, the winner's own prompt
    // as the (fixed, re-scored) teacher, weights w · action factor · gate.
    assert!(s.aux.is_empty());
    assert_eq!(s.teacher.len(), 1);
    let term = &s.teacher[0];
    assert_eq!(
        (term.name.as_str(), term.coef, term.form),
        (TERM, 0.1, TeacherForm::TopKForwardKl { k: 32 })
    );
    let teacher_lp: Vec<f32> = (0..3)
        .map(|l| score(&winner.prompt_ids, winner.response_ids[l], l))
        .collect();
    for (j, t) in term.targets.iter().enumerate() {
        assert_eq!(t.row, 7 + j, "extra rows follow the batch's 7");
        let student = s.extra_rows[j].train_prompt_ids.as_ref().unwrap();
        let student_lp: Vec<f32> = (0..3)
            .map(|l| score(student, winner.response_ids[l], l))
            .collect();
        assert_eq!(s.extra_rows[j].old_logprobs, student_lp);
        // Plain action span: the two action tokens get w · 2.0 = 4, the stop id w = 2.
        for (l, factor) in [4.0, 4.0, 2.0].iter().enumerate() {
            let g = gate(5.0, f64::from(teacher_lp[l]), f64::from(student_lp[l]));
            let want = (factor * g) as f32;
            assert!(
                (t.weights[l] - want).abs() < 1e-6,
                "{j} {l}: {}",
                t.weights[l]
            );
        }
        let TeacherSource::Fixed {
            logprobs,
            top_ids,
            top_logprobs,
        } = &t.source
        else {
            panic!("a fixed teacher");
        };
        assert_eq!(logprobs, &teacher_lp);
        let (ids, lps) = top(32);
        assert_eq!(&top_ids[..32], &ids[..]);
        assert_eq!(&top_logprobs[64..96], &lps[..]);
        assert_eq!(top_ids.len(), 3 * 32);
    }

    // Scoring: the winner once, with top-k, after its own prompt; each student after its
    // target prompt; both with the current weights.
    let calls = host.scores.lock().unwrap().clone();
    assert_eq!(calls.len(), 3);
    assert_eq!(
        (calls[0].context_ids.clone(), calls[0].top_k),
        (winner.prompt_ids.clone(), 32)
    );
    assert_eq!(calls[1].context_ids, rows[5].prompt_ids);
    assert_eq!(calls[2].context_ids, d_plain);
    assert!(calls.iter().all(|c| c.weights == ScoreWeights::Current
        && c.temperature.is_none()
        && c.response_ids == winner.response_ids));
    assert!(calls[1..].iter().all(|c| c.top_k == 0));
}

#[test]
fn an_empty_bank_gives_no_pairs_and_counts_the_cells() {
    let host = mock_host();
    let mut rows = trajectory(1, 10, false, &["s0"], 1.0);
    rows.extend(trajectory(1, 11, false, &["s0"], 0.0));
    let ucob = Ucob::from_config_json("").unwrap();
    let s = ucob.signals(&batch(0, rows), &host).unwrap();
    // The winner (none, 1.0) would teach the skill view, which this group never had.
    assert_eq!(metric(&s, "ucob/cells_without_skills"), 1.0);
    assert_eq!(metric(&s, "ucob/pairs"), 0.0);
    assert_eq!(metric(&s, "ucob/missing_prompt"), 1.0);
    assert!(s.teacher.is_empty() && s.aux.is_empty() && s.extra_rows.is_empty());
    assert!(host.scores.lock().unwrap().is_empty(), "nothing to score");
    assert!(!s.metrics.iter().any(|(n, _)| n == "ucob/topk_unavailable"));
}

#[test]
fn a_no_skill_winner_teaches_the_skill_view_through_the_groups_skill_prompt() {
    let host = mock_host();
    let mut rows = trajectory(1, 10, false, &["s0"], 1.0);
    rows.extend(trajectory(1, 11, false, &["s0"], 0.0));
    rows.extend(trajectory(1, 12, true, &["s0"], 0.0));
    let ucob = Ucob::from_config_json("").unwrap();
    let s = ucob.signals(&batch(0, rows.clone()), &host).unwrap();
    assert_eq!(metric(&s, "ucob/pairs_none_to_good"), 2.0);
    // Row 1 (none) gets the skill view of its observation; row 2 (good) its own prompt.
    let skilled = render(&rows[2].variant.inject, &rows[1].observation);
    let prompts: Vec<&Vec<u32>> = s
        .extra_rows
        .iter()
        .map(|r| r.train_prompt_ids.as_ref().unwrap())
        .collect();
    assert_eq!(prompts, [&skilled, &rows[2].prompt_ids]);
    assert!(s
        .extra_rows
        .iter()
        .all(|r| r.response_ids == rows[0].response_ids));
}

#[test]
fn without_top_k_scores_the_gated_sampled_form_is_used_and_counted() {
    let host = host_without_topk();
    let rows = example_rows();
    let b = batch(0, rows.clone());
    let ucob = Ucob::from_config_json("").unwrap();
    let s = ucob.signals(&b, &host).unwrap();
    s.validate_against(&b).unwrap();
    assert_eq!(metric(&s, "ucob/topk_unavailable"), 1.0);
    assert!(s.teacher.is_empty());
    assert_eq!(s.aux.len(), 1);
    let term = &s.aux[0];
    assert_eq!((term.name.as_str(), term.coef), (TERM, 0.1));
    assert_eq!(term.coefficients.len(), 9);
    assert!(term.coefficients[..7].iter().flatten().all(|&c| c == 0.0));
    // c_l = −W_l: descending the loss raises the winner's tokens under the target prompt.
    let winner = &rows[3];
    for j in 0..2 {
        let student = s.extra_rows[j].train_prompt_ids.as_ref().unwrap();
        for (l, factor) in [4.0, 4.0, 2.0].iter().enumerate() {
            let g = gate(
                5.0,
                f64::from(score(&winner.prompt_ids, winner.response_ids[l], l)),
                f64::from(score(student, winner.response_ids[l], l)),
            );
            let got = term.coefficients[7 + j][l];
            assert!((got + (factor * g) as f32).abs() < 1e-6, "{got}");
        }
    }
    let tops: Vec<u32> = host
        .scores
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.top_k)
        .collect();
    assert_eq!(
        tops,
        [32, 0, 0, 0],
        "the refused top-k request, then plain scores"
    );

    // `loss = "sampled"` never asks for top-k.
    let host = mock_host();
    let ucob = Ucob::from_config_json(r#"{"loss": "sampled"}"#).unwrap();
    let s = ucob.signals(&b, &host).unwrap();
    assert_eq!(s.aux.len(), 1);
    assert!(!s.metrics.iter().any(|(n, _)| n == "ucob/topk_unavailable"));
    assert!(host.scores.lock().unwrap().iter().all(|c| c.top_k == 0));
}

#[test]
fn a_row_whose_prompt_the_builder_does_not_reproduce_has_no_other_view() {
    let host = mock_host();
    let mut rows = example_rows();
    // D's prompt came from somewhere else (a per-turn hook, a tool schema).
    rows[6].prompt_ids.push(99);
    let ucob = Ucob::from_config_json("").unwrap();
    let s = ucob.signals(&batch(0, rows.clone()), &host).unwrap();
    assert_eq!(metric(&s, "ucob/render_mismatch"), 1.0);
    assert_eq!(metric(&s, "ucob/pairs"), 1.0);
    assert_eq!(
        s.extra_rows[0].train_prompt_ids.as_ref(),
        Some(&rows[5].prompt_ids)
    );
}

#[test]
fn rejected_and_unsampled_turns_are_not_records() {
    let host = mock_host();
    let mut rows = example_rows();
    rows[5].feedback = -1; // C@s0: an invalid action
    rows[6].response_mask = vec![0, 0, 0]; // D@s0: nothing sampled
    let ucob = Ucob::from_config_json("").unwrap();
    let s = ucob.signals(&batch(0, rows.clone()), &host).unwrap();
    assert_eq!(metric(&s, "ucob/records"), 5.0);
    assert_eq!(metric(&s, "ucob/pairs"), 0.0);
    let ucob = Ucob::from_config_json(r#"{"skip_invalid": false}"#).unwrap();
    let s = ucob.signals(&batch(0, rows), &host).unwrap();
    assert_eq!(metric(&s, "ucob/records"), 6.0);
    assert_eq!(metric(&s, "ucob/pairs"), 1.0);
}

#[test]
fn bad_rows_are_errors_that_name_them() {
    let host = mock_host();
    let mut rows = example_rows();
    rows[2].anchor = None;
    let ucob = Ucob::from_config_json("").unwrap();
    let e = ucob.signals(&batch(0, rows), &host).unwrap_err();
    assert!(
        e.message
            .contains("row 2 (trajectory 10, turn 2) has no anchor"),
        "{e}"
    );
    let mut rows = example_rows();
    rows[1].response_mask.pop();
    let e = ucob.signals(&batch(0, rows), &host).unwrap_err();
    assert!(e.message.starts_with("row 1:"), "{e}");
}

#[test]
fn action_scope_and_tagged_spans_weigh_only_the_action() {
    let host = mock_host();
    let mut rows = example_rows();
    // B@s0 answers `x<a>yz` + stop, C@s0 `<a>c` + stop: the bytes of "<a>" are [60, 97, 62].
    rows[3].response_ids = vec![120, 60, 97, 62, 121, 122, 2];
    rows[3].response_logprobs = vec![-0.5; 7];
    rows[3].old_logprobs = vec![-0.5; 7];
    rows[3].response_mask = vec![1; 7];
    rows[5].response_ids = vec![60, 97, 62, 99, 2];
    rows[5].response_logprobs = vec![-0.5; 5];
    rows[5].old_logprobs = vec![-0.5; 5];
    rows[5].response_mask = vec![1; 5];
    let ucob = Ucob::from_config_json(
        r#"{"action_span": "tagged", "action_open": "<a>", "action_close": "</a>",
            "scope": "action"}"#,
    )
    .unwrap();
    let s = ucob.signals(&batch(0, rows.clone()), &host).unwrap();
    // The other records have no tag: not records under the action scope.
    assert_eq!(metric(&s, "ucob/action_span_missing"), 5.0);
    assert_eq!(metric(&s, "ucob/records"), 2.0);
    assert_eq!(s.extra_rows[0].response_ids, rows[3].response_ids);
    let w = &s.teacher[0].targets[0].weights;
    let active: Vec<usize> = (0..w.len()).filter(|&l| w[l] > 0.0).collect();
    assert_eq!(active, [4, 5], "between the open tag and the stop id");
}

fn report(step: u64, rows: Vec<TurnRow>) -> StepReport {
    StepReport {
        step,
        batch: batch(step, rows),
        ..StepReport::default()
    }
}

#[test]
fn observe_asks_the_skill_creator_about_a_success_and_its_contrast_with_a_cooldown() {
    let host = mock_host();
    host.put(skill(7, None, "look first"));
    let mut ucob = Ucob::from_config_json(r#"{"reflection_cooldown": 2}"#).unwrap();
    // Group 1: A (none) and B (good) succeed, C and D fail; group 2: nobody succeeds.
    let mut rows = example_rows();
    rows.extend(trajectory(2, 20, false, &["s9"], 0.0));
    ucob.observe(&report(0, rows.clone()), &host).unwrap();
    let asked = host.reflections.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let r = &asked[0];
    assert_eq!(r.kind, EntryKind::Skill);
    assert_eq!(
        r.trajectories,
        [10, 12],
        "the first best success, then the first worst"
    );
    assert_eq!(r.task_id.as_deref(), Some("t1"));
    assert_eq!(r.extra["ucob_task"], "t1");
    assert!(
        r.prompt
            .contains("Trajectory 10 succeeded; trajectory 12 failed"),
        "{}",
        r.prompt
    );
    assert_eq!(host.metric("ucob/reflections_requested"), Some(1.0));
    assert_eq!(ucob.state().last_request["t1"], 0);
    // The good trajectories B (success) and D (failure) saw skill 7.
    let updates = host.updates.lock().unwrap().clone();
    assert_eq!(updates.len(), 1);
    assert_eq!(
        (
            updates[0].id,
            updates[0].add_exposures,
            updates[0].add_successes
        ),
        (7, 2, 1)
    );

    // Within the cooldown: no new request for t1.
    ucob.observe(&report(1, rows.clone()), &host).unwrap();
    assert_eq!(host.reflections.lock().unwrap().len(), 1);
    assert_eq!(host.metric("ucob/reflections_requested"), Some(0.0));
    ucob.observe(&report(2, rows.clone()), &host).unwrap();
    assert_eq!(host.reflections.lock().unwrap().len(), 2);

    // A task whose bank holds `max_skills_per_task` skills gets no more.
    let full = mock_host();
    for id in 1..=3 {
        full.put(skill(id, Some("t1"), "a skill"));
    }
    let mut fresh = Ucob::from_config_json("").unwrap();
    fresh.observe(&report(0, rows.clone()), &full).unwrap();
    assert!(full.reflections.lock().unwrap().is_empty());

    // A refused call is counted; training goes on.
    let busy = mock_host().refusing_reflections();
    let mut fresh = Ucob::from_config_json("").unwrap();
    fresh.observe(&report(0, rows), &busy).unwrap();
    assert_eq!(busy.metric("ucob/reflections_refused"), Some(1.0));
    assert!(fresh.state().last_request.is_empty());
}

#[test]
fn observe_caps_the_requests_per_step_and_can_be_switched_off() {
    let host = mock_host();
    let mut rows = Vec::new();
    for g in 1..=4 {
        rows.extend(trajectory(g, g * 10, false, &["s0"], 1.0));
    }
    let mut ucob = Ucob::from_config_json(r#"{"max_reflections_per_step": 3}"#).unwrap();
    ucob.observe(&report(0, rows.clone()), &host).unwrap();
    let tasks: Vec<Option<String>> = host
        .reflections
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.task_id.clone())
        .collect();
    assert_eq!(
        tasks,
        [Some("t1".into()), Some("t2".into()), Some("t3".into())]
    );
    let off = mock_host();
    let mut ucob = Ucob::from_config_json(r#"{"max_reflections_per_step": 0}"#).unwrap();
    ucob.observe(&report(0, rows), &off).unwrap();
    assert!(off.reflections.lock().unwrap().is_empty());
    assert_eq!(off.metric("ucob/reflections_requested"), None);
}

#[test]
fn the_state_round_trips_and_a_bad_state_is_refused() {
    let host = mock_host();
    let mut ucob = Ucob::from_config_json("").unwrap();
    ucob.observe(&report(3, example_rows()), &host).unwrap();
    let saved = ucob.save_state().unwrap();
    let mut other = Ucob::from_config_json("").unwrap();
    other.load_state(&saved).unwrap();
    assert_eq!(other.state(), ucob.state());
    assert_eq!(other.state().steps, 1);
    other.load_state("").unwrap();
    assert_eq!(other.state(), ucob.state());
    let e = other.load_state("[1, 2]").unwrap_err();
    assert!(e.message.contains("the ucob state is not valid"), "{e}");
}

#[test]
fn branches_read_from_rows_match_the_plan() {
    assert_eq!(
        crate::plan::branch_of(&row(1, 1, 0, true, "s", 0.0, 0.0)),
        Branch::Good
    );
    assert_eq!(
        crate::plan::branch_of(&row(1, 1, 0, false, "s", 0.0, 0.0)),
        Branch::NoSkill
    );
    assert_eq!(UcobConfig::default().skills_top_k, 3);
}
