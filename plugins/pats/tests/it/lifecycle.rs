//! `observe`: evidence cards, the keep / revise / remove evaluation, creation requests, and
//! the skill creator's answers.

use cairn_pats::arms::{scaffolded_variant, ScaffoldRef};
use cairn_pats::card::CardCounts;
use cairn_pats::state::{Removal, Removed};
use cairn_pats::Pats;
use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{Algorithm, Batch, EntryKind, EntryStatus, ReflectionRequest, StepReport};
use serde_json::json;

use super::{lab_host, labels, play, row, wins, Lab, Play};

/// Per-slot success of a group: the scaffolded arm first, then the plain one.
fn arms(succ_with: usize, n_with: usize, succ_without: usize, n_without: usize) -> Vec<bool> {
    let mut s = wins(succ_with, n_with);
    s.extend(wins(succ_without, n_without));
    s
}

/// Every `pats/<name>` counter logged at the last `observe`.
fn counters(lab: &MockHost) -> serde_json::Value {
    let names = [
        "cards",
        "kept",
        "removed_graduated",
        "removed_no_effect",
        "revised",
        "undecided",
        "new_requested",
        "accepted",
        "too_long",
        "reflections_failed",
    ];
    let map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| {
            let v = lab.metric(&format!("pats/{n}")).expect("logged every step");
            (n.to_string(), json!(v as u64))
        })
        .collect();
    serde_json::Value::Object(map)
}

/// `counters` with these non-zero values.
fn only(nonzero: serde_json::Value) -> serde_json::Value {
    let mut all = json!({
        "cards": 0, "kept": 0, "removed_graduated": 0, "removed_no_effect": 0, "revised": 0,
        "undecided": 0, "new_requested": 0, "accepted": 0, "too_long": 0,
        "reflections_failed": 0,
    });
    for (k, v) in nonzero.as_object().unwrap() {
        all[k] = v.clone();
    }
    all
}

fn status(lab: &MockHost, id: u64) -> EntryStatus {
    lab.entry(id).unwrap().status
}

#[test]
fn the_worked_example_keeps_graduates_and_revises() {
    // §5e of the proposal: groups of 16, 8 scaffolded.
    let lab = lab_host();
    let a = lab.seed("task_a", "scaffold a", EntryStatus::Active);
    let b = lab.seed("task_b", "scaffold b", EntryStatus::Active);
    let c = lab.seed("task_c", "scaffold c", EntryStatus::Active);
    let mut pats = Pats::from_config_json(r#"{"scaffolded_slots": 8}"#).unwrap();
    let report = play(
        &mut pats,
        &lab,
        0,
        &[
            Play {
                group: 1,
                task: "task_a",
                success: arms(6, 8, 3, 8),
            },
            Play {
                group: 2,
                task: "task_b",
                success: arms(7, 8, 7, 8),
            },
            Play {
                group: 3,
                task: "task_c",
                success: arms(2, 8, 4, 8),
            },
        ],
    );
    pats.observe(&report, &lab).unwrap();
    assert_eq!(
        counters(&lab),
        only(json!({"cards": 3, "kept": 1, "removed_graduated": 1, "revised": 1}))
    );
    // task_a kept, task_b graduated (retired), task_c still in play while its revision runs.
    assert_eq!(status(&lab, a), EntryStatus::Active);
    assert_eq!(status(&lab, b), EntryStatus::Retired);
    assert_eq!(status(&lab, c), EntryStatus::Active);
    assert_eq!(
        pats.state().tasks["task_b"].removed,
        Some(Removed {
            reason: Removal::Graduated,
            scaffold: ScaffoldRef::Bank(b),
            step: 0
        })
    );
    assert_eq!(labels(&mut pats, &lab, "task_b", 9), ["plain"; 9]);
    let first_and_last = |pats: &mut Pats, task: &str| {
        let l = labels(pats, &lab, task, 9);
        (l[7].clone(), l[8].clone())
    };
    let expected = |id: u64| (format!("scaffold:{id}"), "plain".to_string());
    assert_eq!(first_and_last(&mut pats, "task_a"), expected(a));
    assert_eq!(first_and_last(&mut pats, "task_c"), expected(c));

    let cards = lab.entries(EntryKind::EvidenceCard);
    let tasks: Vec<_> = cards.iter().map(|e| e.task_id.clone().unwrap()).collect();
    assert_eq!(tasks, ["task_a", "task_b", "task_c"]);
    let counts = |i: usize| {
        let e = &cards[i].extra;
        [
            &e["succ_with"],
            &e["n_with"],
            &e["succ_without"],
            &e["n_without"],
        ]
        .map(|v| v.clone())
    };
    assert_eq!(counts(0), [json!(6), json!(8), json!(3), json!(8)]);
    assert_eq!(counts(1), [json!(7), json!(8), json!(7), json!(8)]);
    assert_eq!(counts(2), [json!(2), json!(8), json!(4), json!(8)]);
    assert_eq!(cards[0].extra["scaffold_id"], json!(1));
    // Tool calls are `slot % 3`: 7/8 with, 8/8 without.
    assert_eq!(
        cards[0].text,
        "task task_a, scaffold 1, step 0: with the scaffold 6/8 solved (mean reward 0.75, 0.88 \
         tool calls), without 3/8 (0.38, 1.00 tool calls)"
    );
    assert_eq!(cards[0].provenance.source_trajectories.len(), 16);

    let requests = lab.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(
        (r.kind, r.task_id.as_deref(), r.parent, r.status),
        (
            EntryKind::Scaffold,
            Some("task_c"),
            Some(c),
            EntryStatus::UnderTest
        )
    );
    // The first success (slot 0), then the first failure (slot 2, scaffolded).
    assert_eq!(r.trajectories, [300, 302]);
    assert_eq!(
        serde_json::Value::Object(r.extra.clone()),
        json!({"pats_request": 1})
    );
    for part in [
        "shown on task `task_c`",
        "over the last 1 evidence cards its gain in success rate was -0.250 (plain success \
         rate 0.500)",
        "at most 600 characters",
        "Scaffold: scaffold c\n",
        "Evidence cards:\n- step 0: with the scaffold 2/8 solved, without 4/8",
    ] {
        assert!(r.prompt.contains(part), "{part:?} not in {:?}", r.prompt);
    }
}

#[test]
fn no_effect_removes_a_scaffold_only_after_a_full_window() {
    let lab = lab_host();
    let id = lab.seed("t", "hint", EntryStatus::Active);
    let mut pats = Pats::from_config_json("").unwrap();
    for step in 0..3 {
        let report = play(
            &mut pats,
            &lab,
            step,
            &[Play {
                group: step + 1,
                task: "t",
                success: arms(2, 4, 2, 4),
            }],
        );
        pats.observe(&report, &lab).unwrap();
        if step < 2 {
            assert_eq!(
                counters(&lab),
                only(json!({"cards": 1, "undecided": 1})),
                "{step}"
            );
            assert_eq!(status(&lab, id), EntryStatus::Active);
            assert_eq!(pats.state().tasks["t"].cards.len(), step as usize + 1);
        }
    }
    assert_eq!(
        counters(&lab),
        only(json!({"cards": 1, "removed_no_effect": 1}))
    );
    assert_eq!(status(&lab, id), EntryStatus::Retired);
    assert_eq!(
        pats.state().tasks["t"].removed.map(|r| r.reason),
        Some(Removal::NoEffect)
    );
    // Removal is final: plain from now on, and no new scaffold is asked for.
    let report = play(
        &mut pats,
        &lab,
        3,
        &[Play {
            group: 9,
            task: "t",
            success: wins(1, 4),
        }],
    );
    assert_eq!(labels(&mut pats, &lab, "t", 4), ["plain"; 4]);
    pats.observe(&report, &lab).unwrap();
    assert_eq!(counters(&lab), only(json!({})));
    assert!(lab.requests().is_empty());
}

#[test]
fn creation_asks_with_the_success_first_at_most_max_new_scaffolds_per_step() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json(r#"{"max_new_scaffolds": 2}"#).unwrap();
    let groups = |base: u64| {
        vec![
            Play {
                group: base + 1,
                task: "t1",
                success: vec![false, true, false, true],
            },
            Play {
                group: base + 2,
                task: "t2",
                success: wins(0, 4),
            },
            Play {
                group: base + 3,
                task: "t3",
                success: vec![true, false],
            },
            Play {
                group: base + 4,
                task: "t4",
                success: vec![false, true],
            },
        ]
    };
    let report = play(&mut pats, &lab, 0, &groups(0));
    pats.observe(&report, &lab).unwrap();
    assert_eq!(counters(&lab), only(json!({"new_requested": 2})));
    let summary = |r: &ReflectionRequest| {
        (
            r.task_id.clone().unwrap(),
            r.trajectories.clone(),
            r.parent,
            r.status,
            r.extra["pats_request"].clone(),
        )
    };
    let got: Vec<_> = lab.requests().iter().map(summary).collect();
    let under_test = EntryStatus::UnderTest;
    assert_eq!(
        got,
        [
            ("t1".to_string(), vec![101, 100], None, under_test, json!(1)),
            ("t3".to_string(), vec![300, 301], None, under_test, json!(2)),
        ]
    );
    let r = &lab.requests()[0];
    assert_eq!(r.kind, EntryKind::Scaffold);
    assert!(r.prompt.contains("for task `t1`"), "{}", r.prompt);
    assert!(r.prompt.contains("at most 600 characters"), "{}", r.prompt);
    // Next step: t1 and t3 wait for their answers; t4 gets its turn; t2 never succeeded.
    let report = play(&mut pats, &lab, 1, &groups(10));
    pats.observe(&report, &lab).unwrap();
    assert_eq!(counters(&lab), only(json!({"new_requested": 1})));
    let got: Vec<_> = lab.requests().iter().map(summary).collect();
    assert_eq!(
        got[2],
        (
            "t4".to_string(),
            vec![1401, 1400],
            None,
            under_test,
            json!(3)
        )
    );
    assert_eq!(pats.state().pending.len(), 3);
}

#[test]
fn an_answer_becomes_the_scaffold_and_a_revision_replaces_it() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json("").unwrap();
    let step = |pats: &mut Pats, k: u64, success: Vec<bool>| {
        let report = play(
            pats,
            &lab,
            k,
            &[Play {
                group: k,
                task: "t",
                success,
            }],
        );
        pats.observe(&report, &lab).unwrap();
    };
    step(&mut pats, 0, vec![true, false, false, false]);
    assert_eq!(lab.requests()[0].trajectories, [0, 1]);
    let first = lab.answer(1, "check the map");
    // Written but not yet checked: not injected.
    assert_eq!(labels(&mut pats, &lab, "t", 2), ["plain", "plain"]);
    step(&mut pats, 1, wins(0, 4));
    assert_eq!(counters(&lab), only(json!({"accepted": 1})));
    assert_eq!(status(&lab, first), EntryStatus::Active);
    assert_eq!(
        pats.state().tasks["t"].scaffold,
        Some(ScaffoldRef::Bank(first))
    );

    // Step 2: with 0/4, without 2/4 → Δ = −0.5 → a revision of `first`.
    assert_eq!(labels(&mut pats, &lab, "t", 2), ["scaffold:1", "plain"]);
    step(&mut pats, 2, arms(0, 4, 2, 4));
    assert_eq!(counters(&lab), only(json!({"cards": 1, "revised": 1})));
    let r = &lab.requests()[1];
    assert_eq!(
        (r.parent, r.trajectories.clone()),
        (Some(first), vec![204, 200])
    );
    let revised = lab.answer(2, "check the map, then the drawer");
    assert_eq!(lab.entry(revised).unwrap().version, 2);

    // Step 3 still plays `first` (judged with it: pooled 3/8 vs 3/8, undecided), then the
    // revision replaces it.
    step(&mut pats, 3, arms(3, 4, 1, 4));
    assert_eq!(
        counters(&lab),
        only(json!({"cards": 1, "undecided": 1, "accepted": 1}))
    );
    assert_eq!(status(&lab, first), EntryStatus::Retired);
    assert_eq!(status(&lab, revised), EntryStatus::Active);
    assert_eq!(
        labels(&mut pats, &lab, "t", 2),
        [format!("scaffold:{revised}"), "plain".into()]
    );

    // The revision is judged from a fresh window.
    step(&mut pats, 4, arms(4, 4, 1, 4));
    assert_eq!(counters(&lab), only(json!({"cards": 1, "kept": 1})));
    let track = &pats.state().tasks["t"];
    assert_eq!(track.scaffold, Some(ScaffoldRef::Bank(revised)));
    assert_eq!(
        track.cards,
        [CardCounts {
            step: 4,
            n_with: 4,
            succ_with: 4,
            n_without: 4,
            succ_without: 1
        }]
    );
    assert_eq!(track.replaced, [ScaffoldRef::Bank(first)]);

    // A late group still playing the replaced scaffold is carded but not judged.
    let old = scaffolded_variant(ScaffoldRef::Bank(first), "check the map");
    let rows = vec![
        row(50, "t", 0, old, false),
        row(50, "t", 1, cairn_pats::arms::plain_variant(), true),
    ];
    let report = StepReport {
        step: 5,
        batch: Batch { step: 5, rows },
        ..StepReport::default()
    };
    pats.observe(&report, &lab).unwrap();
    assert_eq!(counters(&lab), only(json!({"cards": 1})));
    assert_eq!(pats.state().tasks["t"].cards.len(), 1);
}

#[test]
fn a_too_long_answer_is_retired_and_never_injected() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json(r#"{"max_scaffold_chars": 10}"#).unwrap();
    let step = |pats: &mut Pats, k: u64| {
        let report = play(
            pats,
            &lab,
            k,
            &[Play {
                group: k,
                task: "t",
                success: vec![true, false],
            }],
        );
        pats.observe(&report, &lab).unwrap();
    };
    step(&mut pats, 0);
    assert!(lab.requests()[0].prompt.contains("at most 10 characters"));
    let long = lab.answer(1, "12345678901");
    step(&mut pats, 1);
    assert_eq!(counters(&lab), only(json!({"too_long": 1})));
    assert_eq!(status(&lab, long), EntryStatus::Retired);
    assert_eq!(labels(&mut pats, &lab, "t", 2), ["plain", "plain"]);
    // The task is asked again at the next step, and a text of exactly 10 characters is fine.
    step(&mut pats, 2);
    assert_eq!(counters(&lab), only(json!({"new_requested": 1})));
    let fits = lab.answer(2, "1234567890");
    step(&mut pats, 3);
    assert_eq!(counters(&lab), only(json!({"accepted": 1})));
    assert_eq!(
        labels(&mut pats, &lab, "t", 2),
        [format!("scaffold:{fits}"), "plain".into()]
    );
}

#[test]
fn failed_and_refused_reflections_are_counted_and_training_goes_on() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json("").unwrap();
    let report = play(
        &mut pats,
        &lab,
        0,
        &[Play {
            group: 1,
            task: "t1",
            success: vec![true, false],
        }],
    );
    pats.observe(&report, &lab).unwrap();
    // Ticket 1 failed; ticket 99 is another plugin's.
    let mut report = play(
        &mut pats,
        &lab,
        1,
        &[Play {
            group: 2,
            task: "t1",
            success: vec![true, false],
        }],
    );
    report.failed_reflections = vec![
        (1, "trajectories came without rows".into()),
        (99, "not ours".into()),
    ];
    pats.observe(&report, &lab).unwrap();
    // The failure frees the task, so the same step asks again (ticket 2).
    assert_eq!(
        counters(&lab),
        only(json!({"reflections_failed": 1, "new_requested": 1}))
    );
    let tickets: Vec<u64> = pats.state().pending.values().map(|p| p.ticket).collect();
    assert_eq!(tickets, [2]);

    lab.set_queue_full(true);
    let report = play(
        &mut pats,
        &lab,
        2,
        &[Play {
            group: 3,
            task: "t2",
            success: vec![false, true],
        }],
    );
    pats.observe(&report, &lab).unwrap();
    assert_eq!(counters(&lab), only(json!({"reflections_failed": 1})));
    assert!(!pats.state().is_pending("t2"));
    lab.set_queue_full(false);
    let report = play(
        &mut pats,
        &lab,
        3,
        &[Play {
            group: 4,
            task: "t2",
            success: vec![false, true],
        }],
    );
    pats.observe(&report, &lab).unwrap();
    assert_eq!(counters(&lab), only(json!({"new_requested": 1})));
    assert!(pats.state().is_pending("t2"));
    assert_eq!(pats.state().totals.reflections_failed, 2);
    assert_eq!(pats.state().totals.new_requested, 3);
    assert_eq!(pats.state().steps, 4);
}
