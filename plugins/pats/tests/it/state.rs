//! `save_state` / `load_state`: the windows, removals, pending requests and counters survive a
//! checkpoint, and a resume settles the reflections the new skill creator will never answer.

use cairn_pats::state::Purpose;
use cairn_pats::Pats;
use cairn_plugin_sdk::{Algorithm, EntryStatus, ErrorKind, StepReport};
use serde_json::json;

use super::{lab_host, labels, play, wins, Lab, Play};

#[test]
fn the_state_round_trips() {
    let lab = lab_host();
    lab.seed("a", "scaffold a", EntryStatus::Active);
    lab.seed("b", "scaffold b", EntryStatus::Active);
    lab.seed("c", "scaffold c", EntryStatus::Active);
    let mut pats = Pats::from_config_json("").unwrap();
    for step in 0..2 {
        let report = play(
            &mut pats,
            &lab,
            step,
            &[
                Play {
                    group: 10 * step + 1,
                    task: "a",
                    success: vec![true, true, false, true],
                },
                Play {
                    group: 10 * step + 2,
                    task: "b",
                    success: vec![true, true, true, true],
                },
                Play {
                    group: 10 * step + 3,
                    task: "c",
                    success: vec![false, false, true, false],
                },
                Play {
                    group: 10 * step + 4,
                    task: "d",
                    success: vec![true, false],
                },
            ],
        );
        pats.observe(&report, &lab).unwrap();
    }
    let state = pats.state().clone();
    // a: kept twice (window of 2 cards); b: graduated at step 0; c and d: requests in flight.
    assert_eq!(state.tasks["a"].cards.len(), 2);
    assert!(state.tasks["b"].removed.is_some());
    let pending: Vec<(&str, Purpose)> = state
        .pending
        .values()
        .map(|p| (p.task_id.as_str(), p.purpose))
        .collect();
    assert_eq!(
        pending,
        [
            (
                "c",
                Purpose::Revise {
                    replaces: cairn_pats::arms::ScaffoldRef::Bank(3)
                }
            ),
            ("d", Purpose::Create)
        ]
    );
    assert_eq!(
        (state.steps, state.totals.kept, state.next_request),
        (2, 2, 2)
    );

    let saved = pats.save_state().unwrap();
    let mut again = Pats::from_config_json("").unwrap();
    again.load_state(&saved).unwrap();
    assert_eq!(again.state(), &state);
    assert_eq!(again.save_state().unwrap(), saved);
    assert_eq!(labels(&mut again, &lab, "b", 2), ["plain", "plain"]);
    // An empty state (a fresh run) is no state; a malformed one is an input error.
    again.load_state("").unwrap();
    assert_eq!(again.state(), &state);
    let e = again.load_state(r#"{"steps": "two"}"#).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Input);
    assert!(e.message.starts_with("the pats state is not valid"), "{e}");
}

#[test]
fn a_resume_collects_answers_already_in_the_bank_and_forgets_the_rest() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json("").unwrap();
    let report = play(
        &mut pats,
        &lab,
        0,
        &[
            Play {
                group: 1,
                task: "t1",
                success: vec![true, false],
            },
            Play {
                group: 2,
                task: "t2",
                success: vec![true, false],
            },
        ],
    );
    pats.observe(&report, &lab).unwrap();
    // t1's answer reached the bank before the checkpoint; t2's never will.
    let answer = lab.answer(1, "look under the bed");
    let saved = pats.save_state().unwrap();

    let mut resumed = Pats::from_config_json("").unwrap();
    resumed.load_state(&saved).unwrap();
    assert_eq!(resumed.state().pending.len(), 2);
    resumed
        .observe(
            &StepReport {
                step: 1,
                ..StepReport::default()
            },
            &lab,
        )
        .unwrap();
    assert_eq!(lab.metric("pats/accepted"), Some(1.0));
    assert_eq!(lab.metric("pats/reflections_failed"), Some(1.0));
    assert!(resumed.state().pending.is_empty());
    assert_eq!(lab.entry(answer).unwrap().status, EntryStatus::Active);
    assert_eq!(
        labels(&mut resumed, &lab, "t1", 2),
        [format!("scaffold:{answer}"), "plain".into()]
    );
    // t2 can be asked again.
    let report = play(
        &mut resumed,
        &lab,
        2,
        &[Play {
            group: 3,
            task: "t2",
            success: wins(1, 2),
        }],
    );
    resumed.observe(&report, &lab).unwrap();
    assert_eq!(lab.metric("pats/new_requested"), Some(1.0));
    assert_eq!(
        lab.requests()[2].extra["pats_request"],
        json!(3),
        "request ids continue from the checkpoint"
    );
}
