//! The creator pipeline end to end (diagnosis → skill creator → verification → A/B test →
//! decision), the verification gates, and failed reflections.

use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{Algorithm, Batch, EntryKind, EntryStatus, Role, StepReport};
use cairn_reskill::assertion::Assertion;
use cairn_reskill::config::ReskillConfig;
use cairn_reskill::creator::Episode;
use cairn_reskill::{Pending, Reskill, ReskillState, Verdict};

use crate::lab::{lab_host, run, template, Lab};

const SMALL: &str =
    r#"{"test_steps": 3, "min_episodes": 8, "min_reservoir": 8, "reservoir_size": 64}"#;

#[test]
fn requirements_declare_a_planner_with_turn_context_skills_and_reflection() {
    let r = Reskill::from_config_json("").unwrap().requirements();
    assert_eq!(r.role, Role::Planner);
    assert!(r.turn_context && r.reflection);
    assert_eq!(r.bank, [EntryKind::Skill]);
    assert!(!r.anchor_keys && !r.teacher_scores && !r.dynamic_sampling);
}

#[test]
fn a_skill_goes_from_diagnosis_through_the_skill_creator_to_an_accepted_test() {
    let lab = lab_host();
    let mut p = Reskill::from_config_json(SMALL).unwrap();
    let mut delivered = Vec::new();
    let batches = run(&mut p, &lab, 1..=1, &mut delivered);

    // Step 1: plain slots; the diagnosis asks for one skill.
    let asked = lab.reflections.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let r = &asked[0];
    assert_eq!(
        (r.kind, r.status, r.parent, r.task_id.as_deref()),
        (EntryKind::Skill, EntryStatus::UnderTest, None, None)
    );
    let pending = p.state().pending.clone().unwrap();
    // Both kinds separate equally well; the alphabetically first wins the tie.
    assert_eq!(pending.task_kind, "cool");
    // Successes end by heating the apple, failures never do: the first candidate with the
    // full gap of 1 − 0.
    assert_eq!(
        pending.assertion,
        Assertion::FinalMatches {
            pattern: r"^\s*heat apple \d+ with microwave \d+\s*$".into()
        },
    );
    assert_eq!(
        r.extra["assertion"],
        serde_json::to_value(&pending.assertion).unwrap()
    );
    assert_eq!(r.extra["trigger"], r"\bcool\b");
    assert_eq!(r.extra["task_kind"], "cool");
    assert!(r.prompt.contains(r"`final_matches(/^\s*heat apple \d+ with microwave \d+\s*$/)` holds in 100% of the successful episodes and in 0%"), "{}", r.prompt);
    // A success of the current step first, then a failure.
    let traj = |id: u64| {
        batches[0]
            .rows
            .iter()
            .find(|row| row.trajectory_id == id)
            .unwrap()
            .clone()
    };
    assert_eq!(r.trajectories.len(), 2);
    assert!(traj(r.trajectories[0]).success && !traj(r.trajectories[1]).success);
    assert!(r.prompt.contains(&format!(
        "Trajectory {} below succeeded and trajectory {} failed",
        r.trajectories[0], r.trajectories[1]
    )));
    assert_eq!(p.state().assertions[0].verdict, Verdict::Requested);
    assert_eq!(lab.metric("reskill/reflections_requested"), Some(1.0));

    // Step 2: the entry arrives, is verified and its test starts.
    assert_eq!(delivered, [1]);
    run(&mut p, &lab, 2..=2, &mut delivered);
    let test = p.state().test.clone().unwrap();
    assert_eq!(
        (test.id, test.skill, test.parent, test.started_step),
        (1, 1, None, 2)
    );
    assert_eq!(test.steps.len(), 0);
    assert_eq!(p.state().skills[&1].status, EntryStatus::UnderTest);
    assert_eq!(p.state().skills[&1].text, "solved in 4 turns: go to drawer 1; open drawer 1; take apple 1 from drawer 1; heat apple 1 with microwave 1");
    assert_eq!(p.state().skills[&1].trigger.as_deref(), Some(r"\bcool\b"));
    assert_eq!(lab.metric("reskill/trigger_rate"), Some(1.0));
    assert_eq!(p.state().assertions[0].verdict, Verdict::Testing);
    assert!(p.state().pending.is_none());

    // Steps 3–5: cool slots are split new/old; the skill helps, and after three flushed steps
    // (48 episodes) the test accepts it.
    let batches = run(&mut p, &lab, 3..=5, &mut delivered);
    let labels: Vec<&str> = batches[0]
        .rows
        .iter()
        .filter(|r| r.turn == 0)
        .map(|r| r.variant.label.as_str())
        .collect();
    assert!(
        labels.contains(&"skill:new") && labels.contains(&"skill:old"),
        "{labels:?}"
    );
    let c = &p.state().counters;
    assert_eq!((c.accepted, c.reverted), (1, 0));
    assert_eq!(lab.entry(1).unwrap().status, EntryStatus::Active);
    let exposures = lab.entry(1).unwrap().stats.exposures;
    assert!(exposures > 0 && lab.entry(1).unwrap().stats.successes <= exposures);
    assert_eq!(p.state().skills[&1].status, EntryStatus::Active);
    assert_eq!(p.state().assertions[0].verdict, Verdict::Accepted);
    assert_eq!(p.state().fit.completed_tests, 1);
    assert_eq!(lab.metric("reskill/accepted"), Some(1.0));
    assert_eq!(lab.metric("reskill/active_skills"), Some(1.0));
    assert!(lab
        .metric("reskill/p_new")
        .is_some_and(|v| (0.15..=0.85).contains(&v)));
    // The creator asked again at once: the next assertion for the same kind (ties go to the
    // first kind again), so the new skill revises the active one.
    let asked = lab.reflections.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[1].extra["task_kind"], "cool");
    assert_eq!(
        asked[1].extra["assertion"],
        serde_json::json!({"check": "no_consecutive_repeat"})
    );
    assert_eq!(asked[1].parent, Some(1));
    assert!(
        asked[1].prompt.contains("It replaces this skill"),
        "{}",
        asked[1].prompt
    );

    // Step 6: every slot plays the active skill; the revision arrives and is tested against
    // it (new bundle [2], old bundle [1]) until step 9.
    let batches = run(&mut p, &lab, 6..=9, &mut delivered);
    assert!(batches[0]
        .rows
        .iter()
        .all(|r| r.variant.extra["skills"] == serde_json::json!([1])));
    let new_rows: Vec<_> = batches[1]
        .rows
        .iter()
        .filter(|r| r.variant.label == "skill:new")
        .collect();
    assert!(
        !new_rows.is_empty()
            && new_rows
                .iter()
                .all(|r| r.variant.extra["skills"] == serde_json::json!([2]))
    );
    assert_eq!(p.state().fit.completed_tests, 2);
    assert!(p.state().fit.m_hat().is_some());
    assert!(lab.metric("reskill/m_hat").is_some());
    let c = p.state().counters.clone();
    assert_eq!(c.accepted + c.reverted, 2);
    // Both versions hold the same text (the same winning trajectory), so the outcome is a
    // fair coin; with these seeds the revision wins, and its parent is retired.
    assert_eq!((c.accepted, c.reverted), (2, 0));
    assert_eq!(p.state().active(), [2]);
    assert_eq!(
        (lab.entry(1).unwrap().status, lab.entry(2).unwrap().status),
        (EntryStatus::Retired, EntryStatus::Active)
    );
    assert_eq!(lab.entry(2).unwrap().parent, Some(1));
}

fn heat(id: u64, observation: &str) -> Episode {
    Episode {
        step: 0,
        trajectory_id: id,
        task_id: format!("heat-{id}"),
        task_kind: "heat".into(),
        success: id.is_multiple_of(2),
        actions: vec!["look".into()],
        observations: vec!["task : heat an egg .".into(), observation.into()],
    }
}

/// A plugin waiting for ticket 1, with ten heat episodes of which `open` see an open drawer,
/// and cool episodes (not targets) that all do.
fn waiting(open: u64, config: &str) -> Reskill {
    let config = ReskillConfig::from_json(config).unwrap();
    let mut state = ReskillState::new(&config);
    for id in 0..10 {
        state.reservoir.push_back(heat(
            id,
            if id < open {
                "the drawer is open ."
            } else {
                "the drawer is closed ."
            },
        ));
    }
    for id in 10..14 {
        let mut e = heat(id, "the drawer is open .");
        e.task_kind = "cool".into();
        state.reservoir.push_back(e);
    }
    let assertion = Assertion::NoConsecutiveRepeat;
    state.pending = Some(Pending {
        ticket: 1,
        task_kind: "heat".into(),
        assertion: assertion.clone(),
        parent: None,
        step: 0,
    });
    state.assertions.push(cairn_reskill::TrackedAssertion {
        task_kind: "heat".into(),
        assertion,
        success_rate: 1.0,
        failure_rate: 0.0,
        step: 0,
        verdict: Verdict::Requested,
        skill: None,
    });
    Reskill::new(config, state).unwrap()
}

/// Writes the answer to ticket 1 and reports it.
fn deliver(
    p: &mut Reskill,
    lab: &MockHost,
    text: &str,
    trigger: Option<&str>,
    extra_trigger: &str,
) {
    lab.pending.lock().unwrap().push((
        1,
        cairn_plugin_sdk::ReflectionRequest {
            kind: EntryKind::Skill,
            status: EntryStatus::UnderTest,
            extra: serde_json::from_value(serde_json::json!({"trigger": extra_trigger})).unwrap(),
            ..Default::default()
        },
    ));
    let ids = lab.answer(|_| text.to_string(), trigger);
    let report = StepReport {
        step: 3,
        batch: Batch::default(),
        new_entries: ids,
        ..StepReport::default()
    };
    p.observe(&report, lab).unwrap();
}

#[test]
fn a_skill_whose_trigger_fires_often_enough_starts_a_test() {
    // The entry's own trigger wins over the proposed one: 6 of 10 heat episodes ≥ 0.5.
    let lab = lab_host();
    let mut p = waiting(6, "");
    deliver(
        &mut p,
        &lab,
        "Close nothing.",
        Some("drawer is OPEN"),
        "never matches",
    );
    assert_eq!(lab.metric("reskill/trigger_rate"), Some(0.6));
    let test = p.state().test.clone().unwrap();
    assert_eq!((test.id, test.skill, test.p_new), (1, 1, 0.5));
    assert_eq!(
        p.state().skills[&1].trigger.as_deref(),
        Some("drawer is OPEN")
    );
    assert_eq!(p.state().assertions[0].verdict, Verdict::Testing);
    assert_eq!(p.state().assertions[0].skill, Some(1));
    // Without a trigger of its own, the proposed one is used.
    let lab = lab_host();
    let mut p = waiting(6, "");
    deliver(&mut p, &lab, "Close nothing.", None, r"drawer is open");
    assert_eq!(
        p.state().skills[&1].trigger.as_deref(),
        Some("drawer is open")
    );
    assert!(p.state().test.is_some());
}

#[test]
fn a_skill_that_fires_too_rarely_is_long_or_has_a_broken_trigger_is_retired_and_counted() {
    // 4 of 10 heat episodes < 0.5 (the cool episodes, which all fire, are not targets).
    let lab = lab_host();
    let mut p = waiting(4, "");
    deliver(&mut p, &lab, "Close nothing.", Some("drawer is open"), "");
    assert_eq!(lab.metric("reskill/trigger_rate"), Some(0.4));
    assert!(p.state().test.is_none() && p.state().pending.is_none());
    assert!(p.state().skills.is_empty());
    assert_eq!(lab.entry(1).unwrap().status, EntryStatus::Retired);
    assert_eq!(p.state().counters.rejected_trigger_rate, 1);
    assert_eq!(lab.metric("reskill/rejected_trigger_rate"), Some(1.0));
    assert_eq!(p.state().assertions[0].verdict, Verdict::Rejected);
    // The same skill passes with a lower bar.
    let lab = lab_host();
    let mut p = waiting(4, r#"{"min_trigger_rate": 0.4}"#);
    deliver(&mut p, &lab, "Close nothing.", Some("drawer is open"), "");
    assert!(p.state().test.is_some());

    // Over max_skill_chars (counted in characters, not bytes).
    let lab = lab_host();
    let mut p = waiting(10, r#"{"max_skill_chars": 5}"#);
    deliver(&mut p, &lab, "ééééé", Some("open"), "");
    assert!(p.state().test.is_some(), "5 characters (10 bytes) pass");
    let lab = lab_host();
    let mut p = waiting(10, r#"{"max_skill_chars": 5}"#);
    deliver(&mut p, &lab, "ééééé!", Some("open"), "");
    assert!(p.state().test.is_none());
    assert_eq!(lab.entry(1).unwrap().status, EntryStatus::Retired);
    assert_eq!(p.state().counters.rejected_too_long, 1);
    assert_eq!(lab.metric("reskill/rejected_too_long"), Some(1.0));

    // A trigger that is not a regex.
    let lab = lab_host();
    let mut p = waiting(10, "");
    deliver(&mut p, &lab, "Open it.", Some("(open"), "");
    assert!(p.state().test.is_none());
    assert_eq!(lab.entry(1).unwrap().status, EntryStatus::Retired);
    assert_eq!(p.state().counters.rejected_invalid_trigger, 1);
}

#[test]
fn an_entry_for_another_ticket_is_not_taken() {
    let lab = lab_host();
    let mut p = waiting(10, "");
    lab.pending.lock().unwrap().push((
        5,
        cairn_plugin_sdk::ReflectionRequest {
            kind: EntryKind::Skill,
            status: EntryStatus::UnderTest,
            ..Default::default()
        },
    ));
    let ids = lab.answer(|_| "someone else's".into(), None);
    p.observe(
        &StepReport {
            step: 1,
            new_entries: ids,
            ..StepReport::default()
        },
        &lab,
    )
    .unwrap();
    assert!(p.state().test.is_none());
    assert_eq!(p.state().pending.as_ref().map(|p| p.ticket), Some(1));
    assert_eq!(
        lab.entry(1).unwrap().status,
        EntryStatus::UnderTest,
        "not ours to retire"
    );
}

#[test]
fn failed_reflections_are_counted_and_the_creator_tries_again_at_the_next_window() {
    let lab = lab_host();
    let mut p = Reskill::from_config_json(r#"{"min_reservoir": 8, "create_every": 3}"#).unwrap();
    let mut delivered = Vec::new();
    let batches = run(&mut p, &lab, 1..=1, &mut delivered);
    let first = lab.reflections.lock().unwrap()[0].clone();
    // The skill creator failed on ticket 1; nothing was written.
    lab.entries.lock().unwrap().clear();
    let batch = crate::lab::play(&mut p, &lab, 2);
    p.observe(
        &StepReport {
            step: 2,
            batch,
            failed_reflections: vec![(1, "endpoint timed out".into())],
            ..StepReport::default()
        },
        &lab,
    )
    .unwrap();
    assert!(p.state().pending.is_none());
    assert_eq!(p.state().counters.reflections_failed, 1);
    assert_eq!(lab.metric("reskill/reflections_failed"), Some(1.0));
    assert!(
        p.state().assertions.is_empty(),
        "the assertion may be proposed again"
    );
    // Step 3 is inside the window (1 + 3); step 4 asks again, for the same diagnosis.
    let mut none = Vec::new();
    run(&mut p, &lab, 3..=3, &mut none);
    assert_eq!(lab.reflections.lock().unwrap().len(), 1);
    lab.pending.lock().unwrap().clear();
    run(&mut p, &lab, 4..=4, &mut none);
    let asked = lab.reflections.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[1].extra["assertion"], first.extra["assertion"]);
    assert_eq!(
        p.state().pending.as_ref().map(|p| (p.ticket, p.step)),
        Some((2, 4))
    );
    let _ = batches;

    // A refused request (a full queue) is counted the same way; training goes on.
    let lab = lab_host();
    lab.set_queue_full(true);
    let mut p = Reskill::from_config_json(r#"{"min_reservoir": 8}"#).unwrap();
    let mut none = Vec::new();
    run(&mut p, &lab, 1..=2, &mut none);
    assert_eq!(p.state().counters.reflections_failed, 2);
    assert!(p.state().pending.is_none());
}

#[test]
fn signals_give_no_advantages_and_the_share_of_rows_with_skills() {
    let lab = lab_host();
    let mut p = Reskill::from_config_json(SMALL).unwrap();
    let mut delivered = Vec::new();
    run(&mut p, &lab, 1..=2, &mut delivered);
    let batch = crate::lab::play(&mut p, &lab, 3);
    let s = p.signals(&batch, &lab).unwrap();
    assert!(s.advantages.is_empty() && s.aux.is_empty() && s.teacher.is_empty());
    let with = batch
        .rows
        .iter()
        .filter(|r| {
            r.variant.extra["triggered"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        })
        .count();
    assert!(with > 0);
    assert_eq!(
        s.metrics,
        vec![(
            "reskill/rows_with_skills".to_string(),
            with as f64 / batch.rows.len() as f64
        )]
    );
    let again = p.signals(&batch, &lab).unwrap();
    assert_eq!(again, s, "signals are pure");
    let _ = template(&batch);
}
