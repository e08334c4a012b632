//! Tests of the plugin's hooks, with exact values. The admission rules, the retrieval and the
//! config have their own tests in their modules.

use super::*;
use crate::management::{ema, retain_score, update_streak, Tally};
use crate::testing::{
    arm_row, batch, entry, entry_at, group_request, group_rows, render, variant, MockHost,
};
use cairn_plugin_sdk::{BankEntry, EntryStats, EntryStatus, OfflineHost, TeacherForm, TurnRow};

fn edge(config: &str) -> Edge {
    Edge::from_config_json(config).unwrap()
}

fn report(step: u64, rows: Vec<TurnRow>) -> StepReport {
    StepReport {
        step,
        batch: batch(step, rows),
        ..StepReport::default()
    }
}

/// The §3e group: E1 succeeds; E2, N1, N2 fail; all at anchor `s0`.
fn worked_example() -> Vec<TurnRow> {
    group_rows(
        1,
        &[
            (10, Arm::E, 1.0),
            (11, Arm::E, 0.0),
            (12, Arm::N, 0.0),
            (13, Arm::N, 0.0),
        ],
    )
}

fn labels(plan: &[ContextVariant]) -> Vec<&str> {
    plan.iter().map(|v| v.label.as_str()).collect()
}

#[test]
fn requirements_declare_a_planner_with_even_groups_a_bank_and_reflection() {
    let r = edge("").requirements();
    assert_eq!(
        r,
        Requirements {
            role: Role::Planner,
            even_group_size: true,
            min_group_size: 2,
            bank: vec![EntryKind::Experience],
            reflection: true,
            ..Requirements::default()
        }
    );
    // The top-k form needs the teacher's top-k ids.
    let topk = edge(r#"{"token_selection": "teacher_topk"}"#);
    assert!(topk.requirements().teacher_topk);
    let s = topk
        .signals(&batch(0, worked_example()), &MockHost::default())
        .unwrap();
    assert_eq!(s.teacher[0].form, TeacherForm::TopKReverseKl { k: 20 });
    let s = edge(r#"{"token_selection": "teacher_topk", "top_k_tokens": 5}"#)
        .signals(&batch(0, worked_example()), &MockHost::default())
        .unwrap();
    assert_eq!(s.teacher[0].form, TeacherForm::TopKReverseKl { k: 5 });
}

#[test]
fn the_first_half_of_a_group_sees_the_experiences_until_the_warmup_ends() {
    let host = MockHost::default();
    host.put(entry(3, None, "open the drawer first"));
    let mut e = edge(r#"{"warmup_steps": 3}"#);
    let mut request = group_request(1);
    request.step = 2;
    let plan = e.plan_group(&request, &host).unwrap();
    assert_eq!(
        labels(&plan),
        ["experience:1", "experience:1", "plain", "plain"]
    );
    assert_eq!(
        plan[0].inject,
        "Experiences from earlier attempts at tasks like this one:\n- open the drawer first"
    );
    assert_eq!(plan[0].extra["edge_arm"], "E");
    assert_eq!(plan[0].extra["experience_ids"], serde_json::json!([3]));
    assert_eq!(plan[0].extra["task_kind"], "clean");
    assert_eq!(plan[2].extra["edge_arm"], "N");
    assert_eq!(plan[2].inject, "");
    // Step 3 = EDGE's global step 4 > exp_rollout_warmup_steps = 3: every slot plain.
    request.step = 3;
    let plan = e.plan_group(&request, &host).unwrap();
    assert_eq!(labels(&plan), ["plain"; 4]);
    assert!(plan.iter().all(|v| v.extra["edge_arm"] == "N"));
    // No bank query after the warm-up.
    assert_eq!(host.queries.lock().unwrap().len(), 1);
}

#[test]
fn a_group_without_experiences_plays_all_n_and_odd_groups_are_refused() {
    let mut e = edge("");
    let plan = e
        .plan_group(&group_request(1), &MockHost::default())
        .unwrap();
    assert_eq!(labels(&plan), ["plain"; 4]);
    let mut odd = group_request(1);
    odd.group_size = 3;
    let err = e.plan_group(&odd, &MockHost::default()).unwrap_err();
    assert!(err.message.starts_with("group 1 has 3 slots"), "{err}");
    // Without a bank the planner says so instead of planning blind.
    assert!(e
        .plan_group(&group_request(1), &OfflineHost::default())
        .is_err());
}

#[test]
fn an_over_long_entry_is_skipped_at_planning_and_counted_by_observe() {
    let host = MockHost::default();
    host.put(entry(1, None, &"y".repeat(601)));
    host.put(entry(2, None, "short"));
    let mut e = edge("");
    let plan = e.plan_group(&group_request(1), &host).unwrap();
    assert_eq!(plan[0].extra["experience_ids"], serde_json::json!([2]));
    assert_eq!(e.state().entries_too_long, 1);
    e.observe(&report(0, vec![]), &host).unwrap();
    assert_eq!(host.metric("edge/entries_too_long"), Some(1.0));
    e.observe(&report(1, vec![]), &host).unwrap();
    assert_eq!(host.metric("edge/entries_too_long"), Some(0.0));
}

#[test]
fn the_worked_example_distills_the_n_rows_toward_the_e_prompt() {
    let e = edge(r#"{"coef": 0.5}"#);
    let b = batch(0, worked_example());
    let s = e.signals(&b, &MockHost::default()).unwrap();
    s.validate_against(&b).unwrap();
    assert!(s.advantages.is_empty(), "a planner gives no advantages");
    assert_eq!(s.teacher.len(), 1);
    let term = &s.teacher[0];
    assert_eq!(
        (term.name.as_str(), term.coef, term.form),
        ("edge-distill", 0.5, TeacherForm::SampledReverseKl)
    );
    let rows: Vec<usize> = term.targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [2, 3]);
    let e_inject = variant(1, Arm::E).inject;
    for t in &term.targets {
        assert_eq!(t.weights, [1.0, 1.0, 1.0]);
        assert_eq!(
            t.source,
            TeacherSource::Context {
                context_ids: render(&e_inject, "at s0")
            }
        );
    }
    assert_eq!(
        s.metrics,
        [
            ("edge/success_e".to_string(), 0.5),
            ("edge/success_n".to_string(), 0.0),
            ("edge/rows_distilled".to_string(), 2.0),
            ("edge/cells_admitted".to_string(), 1.0),
        ]
    );
}

#[test]
fn token_weights_are_w_times_the_mask_and_warmup_ends_distillation() {
    let mut rows = group_rows(
        1,
        &[
            (10, Arm::E, 1.0),
            (11, Arm::E, 0.5),
            (12, Arm::N, 0.25),
            (13, Arm::N, 0.0),
        ],
    );
    rows[3].response_mask = vec![1, 0, 1];
    let e = edge(r#"{"level": "trajectory", "score": "reward", "warmup_steps": 3}"#);
    let s = e
        .signals(&batch(2, rows.clone()), &MockHost::default())
        .unwrap();
    let t = &s.teacher[0].targets;
    assert_eq!(t.iter().map(|t| t.row).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(t[0].weights, [0.625; 3]);
    assert_eq!(t[1].weights, [0.625, 0.0, 0.625]);
    // The batch of step 3 was planned after the warm-up: the term stays, without targets.
    let s = e.signals(&batch(3, rows), &MockHost::default()).unwrap();
    assert!(s.teacher[0].targets.is_empty());
    assert_eq!(s.metrics[2], ("edge/rows_distilled".to_string(), 0.0));
    assert_eq!(s.metrics[3], ("edge/cells_admitted".to_string(), 0.0));
}

#[test]
fn signals_are_pure() {
    let e = edge("");
    let before = e.state().clone();
    let b = batch(0, worked_example());
    let first = e.signals(&b, &MockHost::default()).unwrap();
    assert_eq!(e.signals(&b, &MockHost::default()).unwrap(), first);
    assert_eq!(e.state(), &before);
}

/// Group 1 (4 slots): E [1, 0], N [0, 0] → g = 0.5. Group 2 (8 slots): E [0, 0, 0, 0],
/// N [1, 0, 0, 0] → g = −0.25. Both E arms saw experience 7.
fn two_credit_groups() -> Vec<TurnRow> {
    let mut rows = group_rows(
        1,
        &[
            (10, Arm::E, 1.0),
            (11, Arm::E, 0.0),
            (12, Arm::N, 0.0),
            (13, Arm::N, 0.0),
        ],
    );
    rows.extend(group_rows(
        2,
        &[
            (20, Arm::E, 0.0),
            (21, Arm::E, 0.0),
            (22, Arm::E, 0.0),
            (23, Arm::E, 0.0),
            (24, Arm::N, 1.0),
            (25, Arm::N, 0.0),
            (26, Arm::N, 0.0),
            (27, Arm::N, 0.0),
        ],
    ));
    rows
}

#[test]
fn credits_of_one_window_move_the_utility_by_beta_times_their_mean() {
    // §3e: credits [0.5, −0.25] from u = 0 → u = 0.9 · 0 + 0.1 · 0.125 = 0.0125.
    assert!((ema(0.0, &[0.5, -0.25], 0.1) - 0.0125).abs() < 1e-12);
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    let mut e = edge(r#"{"update_frequency": 1}"#);
    e.observe(&report(0, two_credit_groups()), &host).unwrap();
    let stats = host.entry(7).unwrap().stats;
    assert!((stats.utility_ema - 0.0125).abs() < 1e-12, "{stats:?}");
    // Exposures: 2 + 4 E trajectories; one of them succeeded.
    assert_eq!((stats.exposures, stats.successes), (6, 1));
    assert_eq!((stats.negative_streak, stats.last_negative_step), (0, None));
    assert_eq!(host.metric("edge/credited"), Some(1.0));
    assert_eq!(host.metric("edge/bank_size"), Some(1.0));
    assert!((host.metric("edge/bank_utility_mean").unwrap() - 0.0125).abs() < 1e-12);
    // The window was reset.
    assert_eq!(e.state().window, Window::default());
    assert_eq!(e.state().windows, 1);
    // beta = 0.5: u = 0.5 · 0.125.
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    let mut e = edge(r#"{"update_frequency": 1, "beta": 0.5}"#);
    e.observe(&report(0, two_credit_groups()), &host).unwrap();
    assert!((host.entry(7).unwrap().stats.utility_ema - 0.0625).abs() < 1e-12);
}

#[test]
fn credits_are_buffered_until_the_window_closes() {
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    let mut e = edge(r#"{"update_frequency": 2}"#);
    let rows = two_credit_groups();
    e.observe(&report(0, rows[..4].to_vec()), &host).unwrap();
    assert_eq!(host.entry(7).unwrap().stats, EntryStats::default());
    assert_eq!(e.state().window.credits[&7], [0.5]);
    assert_eq!(host.metric("edge/bank_size"), None);
    e.observe(&report(1, rows[4..].to_vec()), &host).unwrap();
    assert!((host.entry(7).unwrap().stats.utility_ema - 0.0125).abs() < 1e-12);
}

/// A group whose E arm (experience 7) failed where the N arm succeeded once: g = −0.5.
fn hurt_group(group: u64) -> Vec<TurnRow> {
    let t = group * 10;
    group_rows(
        group,
        &[
            (t, Arm::E, 0.0),
            (t + 1, Arm::E, 0.0),
            (t + 2, Arm::N, 1.0),
            (t + 3, Arm::N, 0.0),
        ],
    )
}

#[test]
fn the_negative_streak_grows_only_over_consecutive_windows() {
    let mut stats = EntryStats::default();
    update_streak(&mut stats, -0.1, 4, 5);
    assert_eq!(
        (stats.negative_streak, stats.last_negative_step),
        (1, Some(4))
    );
    update_streak(&mut stats, -0.1, 9, 5);
    assert_eq!(
        (stats.negative_streak, stats.last_negative_step),
        (2, Some(9))
    );
    update_streak(&mut stats, 0.0, 14, 5);
    assert_eq!(
        (stats.negative_streak, stats.last_negative_step),
        (0, Some(9))
    );
    update_streak(&mut stats, -0.1, 19, 5);
    assert_eq!(
        (stats.negative_streak, stats.last_negative_step),
        (1, Some(19))
    );

    // Through observe: windows close after steps 4, 9, 14, 19; experience 7 is hurt in the
    // windows of steps 4 and 9, unseen in 14's, hurt again in 19's.
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    let mut e = edge(r#"{"update_frequency": 5, "bootstrap": false}"#);
    let mut seen = Vec::new();
    for step in 0..20 {
        let rows = if [2, 9, 17].contains(&step) {
            hurt_group(step + 1)
        } else {
            Vec::new()
        };
        e.observe(&report(step, rows), &host).unwrap();
        if (step + 1) % 5 == 0 {
            let s = host.entry(7).unwrap().stats;
            seen.push((s.negative_streak, s.last_negative_step));
        }
    }
    assert_eq!(
        seen,
        [(1, Some(4)), (2, Some(9)), (0, Some(9)), (1, Some(19))]
    );
}

fn with_stats(mut e: BankEntry, exposures: u64, utility: f64, streak: u32, last: u64) -> BankEntry {
    e.stats = EntryStats {
        exposures,
        utility_ema: utility,
        negative_streak: streak,
        last_negative_step: Some(last),
        ..EntryStats::default()
    };
    e
}

/// Three experiences credited −0.5 in the window closing at step 9; returns the retired ids
/// and the host. From u = −0.25: u = 0.9 · (−0.25) − 0.05 = −0.275 for all three.
fn prune_with(config: &str) -> (Vec<u64>, MockHost) {
    let host = MockHost::default();
    host.put(with_stats(entry(1, None, "a"), 5, -0.25, 1, 4)); // n 6, streak 2
    host.put(with_stats(entry(2, None, "b"), 5, -0.25, 1, 3)); // streak restarts at 1
    host.put(with_stats(entry(3, None, "c"), 3, -0.25, 1, 4)); // n 4, streak 2
    let mut window = Window::default();
    for id in [1, 2, 3] {
        window.credits.insert(id, vec![-0.5]);
        window.exposures.insert(
            id,
            Tally {
                trajectories: 1,
                successes: 0,
            },
        );
    }
    let config = EdgeConfig::from_json(config).unwrap();
    let m = manage(&config, &window, 9, &[], &host).unwrap();
    assert_eq!(m.credited, 3);
    assert_eq!((m.bank_size, m.evicted.len()), (3 - m.retired.len(), 0));
    (m.retired, host)
}

#[test]
fn hard_pruning_needs_exposures_low_utility_and_a_long_streak() {
    let (retired, host) = prune_with("");
    assert_eq!(retired, [1]);
    let status: Vec<EntryStatus> = [1, 2, 3].map(|id| host.entry(id).unwrap().status).to_vec();
    assert_eq!(
        status,
        [
            EntryStatus::Retired,
            EntryStatus::Active,
            EntryStatus::Active
        ]
    );
    for id in [1, 2, 3] {
        assert!((host.entry(id).unwrap().stats.utility_ema - -0.275).abs() < 1e-12);
    }
    let streaks: Vec<u32> = [1, 2, 3]
        .map(|id| host.entry(id).unwrap().stats.negative_streak)
        .to_vec();
    assert_eq!(streaks, [2, 1, 2]);
    assert_eq!(prune_with(r#"{"negative_windows": 1}"#).0, [1, 2]);
    assert_eq!(prune_with(r#"{"min_exposures": 4}"#).0, [1, 3]);
    assert!(prune_with(r#"{"utility_threshold": -0.3}"#).0.is_empty());
}

/// The general pool of the trim test (see below) plus one task entry; returns the evicted ids.
fn trim_with(config: &str) -> Vec<u64> {
    let host = MockHost::default();
    for (id, u, n, step) in [
        (1, 0.0, 4, 0),
        (2, -0.1, 0, 0),
        (3, 0.2, 4, 0),
        (4, -0.5, 2, 18),
    ] {
        let mut e = entry_at(id, None, step);
        e.stats.utility_ema = u;
        e.stats.exposures = n;
        host.put(e);
    }
    host.put(entry_at(5, Some("t1"), 0));
    let config = EdgeConfig::from_json(config).unwrap();
    let m = manage(&config, &Window::default(), 19, &[], &host).unwrap();
    assert!(m.retired.is_empty());
    assert_eq!(m.bank_size, 5 - m.evicted.len());
    for &id in &m.evicted {
        assert_eq!(host.entry(id).unwrap().status, EntryStatus::Retired);
    }
    m.evicted
}

#[test]
fn the_capacity_trim_removes_the_lowest_retain_scores_but_never_recent_entries() {
    // General pool, max 2, at step 19 with protect_recent_steps 5. N = 10 exposures:
    //   1: u 0.0,  n 4 → 0.0 + sqrt(ln 11 / 5) = 0.692516
    //   2: u −0.1, n 0 → −0.1 + sqrt(ln 11)     = 1.448514 (unexplored: kept)
    //   3: u 0.2,  n 4 → 0.892516
    //   4: u −0.5, n 2 → 0.394035, but written at step 18: protected.
    // Evicted: 1, then 3. The task pool (one entry) is under its capacity.
    let s = |u, n| retain_score(u, n, 10, 1.0, 1.0);
    for (got, want) in [
        (s(0.0, 4), 0.692_516),
        (s(-0.1, 0), 1.448_514),
        (s(0.2, 4), 0.892_516),
        (s(-0.5, 2), 0.394_035),
    ] {
        assert!((got - want).abs() < 5e-7, "{got} vs {want}");
    }
    assert!((retain_score(0.1, 3, 10, 0.5, 2.0) - (0.1 + (11f64.ln() / 4.0).sqrt())).abs() < 1e-12);
    let base = r#""max_items": 2, "protect_recent_steps": 5, "bootstrap": false"#;
    assert_eq!(trim_with(&format!("{{{base}}}")), [1, 3]);
    // Without the exploration bonus the lowest utilities go: 2 (−0.1), then 1 (0.0).
    assert_eq!(trim_with(&format!(r#"{{{base}, "c_ucb": 0}}"#)), [2, 1]);
    assert_eq!(trim_with(&format!(r#"{{{base}, "score_c": 0}}"#)), [2, 1]);
    // Without protection entry 4 has the lowest score.
    assert_eq!(
        trim_with(r#"{"max_items": 2, "protect_recent_steps": 0, "bootstrap": false}"#),
        [4, 1]
    );
    // With everything recent, nothing can go: the pool stays over its capacity.
    assert!(trim_with(r#"{"max_items": 2, "bootstrap": false}"#).is_empty());
}

/// Sets the task kind recorded on rows.
fn kind(mut rows: Vec<TurnRow>, kind: &str) -> Vec<TurnRow> {
    for r in &mut rows {
        r.variant.extra.insert("task_kind".into(), kind.into());
    }
    rows
}

#[test]
fn experience_hurt_contrasts_become_reflections_weakest_kind_first() {
    // Group 1 (kind a): E [0, 1], N [1, 0] → rate 0.5. Groups 2 and 3 (kind b): rate 0.25.
    let mut rows = kind(
        group_rows(
            1,
            &[
                (10, Arm::E, 0.0),
                (11, Arm::E, 1.0),
                (12, Arm::N, 1.0),
                (13, Arm::N, 0.0),
            ],
        ),
        "a",
    );
    rows.extend(kind(hurt_group(2), "b"));
    rows.extend(kind(hurt_group(3), "b"));
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    let mut e =
        edge(r#"{"update_frequency": 1, "max_failed_trajectories": 2, "max_new_experiences": 2}"#);
    e.observe(&report(0, rows.clone()), &host).unwrap();
    let r = host.reflections.lock().unwrap().clone();
    // Candidates: groups 1 and 2 (the first two contrasts); kind b (0.25) before a (0.5).
    let got: Vec<(Option<&str>, &[u64])> = r
        .iter()
        .map(|r| (r.task_id.as_deref(), r.trajectories.as_slice()))
        .collect();
    assert_eq!(
        got,
        [(Some("t2"), &[22, 20][..]), (Some("t1"), &[12, 10][..])]
    );
    assert!(r.iter().all(|r| r.kind == EntryKind::Experience));
    assert_eq!(r[0].extra["edge_source"], "contrast");
    assert_eq!(r[0].extra["edge_group"], 2);
    assert!(
        r[0].prompt.contains("at most 600 characters"),
        "{}",
        r[0].prompt
    );
    assert!(r[0].prompt.ends_with("- look first"), "{}", r[0].prompt);
    assert_eq!(host.metric("edge/reflections_requested"), Some(2.0));

    // No kind below the threshold: no contrasts; the bootstrap reflects on the first
    // successful trajectory of tasks without an experience of their own.
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    let mut e =
        edge(r#"{"update_frequency": 1, "update_threshold": 0.2, "max_new_experiences": 2}"#);
    e.observe(&report(0, rows.clone()), &host).unwrap();
    let r = host.reflections.lock().unwrap().clone();
    let got: Vec<(Option<&str>, &[u64])> = r
        .iter()
        .map(|r| (r.task_id.as_deref(), r.trajectories.as_slice()))
        .collect();
    assert_eq!(got, [(Some("t1"), &[11][..]), (Some("t2"), &[22][..])]);
    assert_eq!(r[0].extra["edge_source"], "bootstrap");

    // A task with an experience of its own is not bootstrapped; `bootstrap = false` stops it.
    let host = MockHost::default();
    host.put(entry(8, Some("t1"), "t1's own"));
    let mut e = edge(r#"{"update_frequency": 1, "update_threshold": 0.2}"#);
    e.observe(&report(0, rows.clone()), &host).unwrap();
    let tasks: Vec<Option<String>> = host
        .reflections
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.task_id.clone())
        .collect();
    assert_eq!(tasks, [Some("t2".to_string()), Some("t3".to_string())]);
    let host = MockHost::default();
    let mut e = edge(r#"{"update_frequency": 1, "update_threshold": 0.2, "bootstrap": false}"#);
    e.observe(&report(0, rows.clone()), &host).unwrap();
    assert!(host.reflections.lock().unwrap().is_empty());

    // `scope = "general"`: the experiences are general entries (any task may retrieve them),
    // and the source task, kept in `extra.edge_task`, still counts as known to the bootstrap.
    let host = MockHost::default();
    let mut own = entry(9, None, "t1's own, general");
    own.extra.insert("edge_task".into(), "t1".into());
    host.put(own);
    let mut e = edge(r#"{"update_frequency": 1, "update_threshold": 0.2, "scope": "general"}"#);
    e.observe(&report(0, rows.clone()), &host).unwrap();
    let r = host.reflections.lock().unwrap().clone();
    let got: Vec<(Option<&str>, &serde_json::Value)> = r
        .iter()
        .map(|r| (r.task_id.as_deref(), &r.extra["edge_task"]))
        .collect();
    assert_eq!(
        got,
        [
            (None, &serde_json::json!("t2")),
            (None, &serde_json::json!("t3"))
        ]
    );

    // After the warm-up nothing reads new experiences: no reflections.
    let host = MockHost::default();
    let mut e = edge(r#"{"update_frequency": 1, "warmup_steps": 1}"#);
    e.observe(&report(1, rows), &host).unwrap();
    assert!(host.reflections.lock().unwrap().is_empty());
}

#[test]
fn reflector_failures_and_a_refused_request_are_counted_and_training_goes_on() {
    let host = MockHost::default().refusing_reflections();
    host.put(entry(7, None, "look first"));
    let mut e = edge(r#"{"update_frequency": 1}"#);
    let mut r = report(0, hurt_group(2));
    r.failed_reflections = vec![
        (3, "the endpoint timed out".into()),
        (4, "unparseable reply".into()),
    ];
    e.observe(&r, &host).unwrap();
    assert_eq!(host.metric("edge/reflections_failed"), Some(2.0));
    // The contrast of group 2 was asked for and refused (the queue was full).
    assert_eq!(host.metric("edge/reflections_refused"), Some(1.0));
    assert_eq!(host.metric("edge/reflections_requested"), Some(0.0));
    // The credits were still applied.
    assert!((host.entry(7).unwrap().stats.utility_ema - -0.05).abs() < 1e-12);
}

#[test]
fn the_state_round_trips_through_a_checkpoint() {
    let host = MockHost::default();
    host.put(entry(7, None, "look first"));
    host.put(entry(1, None, &"z".repeat(700)));
    let mut e = edge(r#"{"update_frequency": 2}"#);
    e.plan_group(&group_request(1), &host).unwrap();
    let rows = two_credit_groups();
    e.observe(&report(0, rows[..4].to_vec()), &host).unwrap();
    e.plan_group(&group_request(2), &host).unwrap();
    let saved = e.save_state().unwrap();
    let mut again = edge(r#"{"update_frequency": 2}"#);
    again.load_state(&saved).unwrap();
    assert_eq!(again.state(), e.state());
    assert_eq!(
        again.state().window.credits.get(&7).map(Vec::as_slice),
        Some(&[0.5][..])
    );
    assert_eq!(
        (again.state().steps, again.state().entries_too_long),
        (1, 1)
    );
    // The resumed plugin closes the window with the same numbers.
    again
        .observe(&report(1, rows[4..].to_vec()), &host)
        .unwrap();
    assert!((host.entry(7).unwrap().stats.utility_ema - 0.0125).abs() < 1e-12);
    again.load_state("").unwrap();
    let err = again.load_state("not json").unwrap_err();
    assert!(
        err.message.starts_with("the edge state is not valid"),
        "{err}"
    );
}

#[test]
fn rows_without_anchor_keep_their_turn_cells_in_signals() {
    let rows = vec![
        arm_row(1, 10, 0, Arm::E, 1.0, None),
        arm_row(1, 11, 0, Arm::N, 0.0, None),
        arm_row(1, 11, 1, Arm::N, 0.0, None),
    ];
    let s = edge("")
        .signals(&batch(0, rows), &MockHost::default())
        .unwrap();
    let rows: Vec<usize> = s.teacher[0].targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [1]);
}
