//! Checkpointing: a run resumed from `save_state` continues exactly as the uninterrupted one.

use cairn_plugin_sdk::Algorithm;
use cairn_reskill::ab::{HorizonFit, StepCounts};
use cairn_reskill::config::ReskillConfig;
use cairn_reskill::{Reskill, ReskillState};

use crate::lab::{lab_host, run};

const CONFIG: &str =
    r#"{"test_steps": 3, "min_episodes": 8, "min_reservoir": 8, "reservoir_size": 40}"#;

/// A fresh state whose horizon fit has already scored two drifting tests, so the flushes
/// of this run discount with a finite `M̂`.
fn start() -> Reskill {
    let config = ReskillConfig::from_json(CONFIG).unwrap();
    let mut state = ReskillState::new(&config);
    let drift = |a: u64, b: u64| StepCounts {
        new_m: a,
        new_n: 8,
        old_m: b,
        old_n: 8,
    };
    state.fit = HorizonFit::new(config.m_grid_max);
    state
        .fit
        .score(&[drift(8, 0), drift(0, 8), drift(8, 0), drift(0, 8)]);
    state.fit.score(&[drift(1, 7), drift(7, 1), drift(1, 7)]);
    assert!(
        state.fit.m_hat().is_some_and(|m| m < 50),
        "{:?}",
        state.fit.m_hat()
    );
    Reskill::new(config, state).unwrap()
}

#[test]
fn a_resumed_run_equals_the_uninterrupted_one() {
    let (lab, mut straight, mut delivered) = (lab_host(), start(), Vec::new());
    run(&mut straight, &lab, 1..=8, &mut delivered);

    let (lab2, mut first, mut delivered2) = (lab_host(), start(), Vec::new());
    run(&mut first, &lab2, 1..=4, &mut delivered2);
    // The checkpoint falls inside a test whose posteriors have moved, with no reflection
    // pending (those are not checkpointed by the kernel).
    let at_save = first.state().clone();
    let test = at_save.test.clone().unwrap();
    assert!(!test.steps.is_empty() && test.new.alpha != 1.0);
    assert!(at_save.pending.is_none());
    let saved = first.save_state().unwrap();
    drop(first);
    let mut resumed = Reskill::from_config_json(CONFIG).unwrap();
    resumed.load_state(&saved).unwrap();
    assert_eq!(resumed.state(), &at_save);
    run(&mut resumed, &lab2, 5..=8, &mut delivered2);

    assert_eq!(resumed.state(), straight.state());
    assert_eq!(
        resumed.save_state().unwrap(),
        straight.save_state().unwrap()
    );
    assert_eq!(*lab2.entries.lock().unwrap(), *lab.entries.lock().unwrap());
    // The run got somewhere: a decided test, a second one running, the fit grown.
    let s = straight.state();
    assert_eq!(s.fit.completed_tests, 3);
    assert_eq!(s.counters.accepted + s.counters.reverted, 1);
    assert!(s
        .test
        .as_ref()
        .is_some_and(|t| t.id == 2 && !t.steps.is_empty()));
    assert_eq!(s.reservoir.len(), 40);
}

#[test]
fn a_state_from_another_grid_or_with_a_broken_trigger_is_refused() {
    let mut p = Reskill::from_config_json("").unwrap();
    let saved = p.save_state().unwrap();
    let mut other = Reskill::from_config_json(r#"{"m_grid_max": 10}"#).unwrap();
    let e = other.load_state(&saved).unwrap_err();
    assert!(
        e.message
            .starts_with("`m_grid_max` = 10 but the saved horizon fit has 2000"),
        "{e}"
    );
    let mut state = p.state().clone();
    state.skills.insert(
        4,
        cairn_reskill::Skill {
            text: "x".into(),
            trigger: Some("(".into()),
            task_kind: String::new(),
            status: cairn_plugin_sdk::EntryStatus::Active,
        },
    );
    let e = p
        .load_state(&serde_json::to_string(&state).unwrap())
        .unwrap_err();
    assert!(
        e.message
            .starts_with("the trigger of skill 4 `(` is not a valid regex"),
        "{e}"
    );
    let e = p.load_state("{").unwrap_err();
    assert!(
        e.message.starts_with("the reskill state is not valid"),
        "{e}"
    );
    p.load_state("").unwrap();
}
