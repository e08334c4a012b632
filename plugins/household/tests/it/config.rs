//! Config parsing: defaults, named-key errors, validation.

use cairn_household::{Household, HouseholdConfig};
use cairn_plugin_sdk::{Environment, ErrorKind};

/// Asserts that `json` is rejected as a config error whose message contains every `needle`.
pub fn check_rejected(json: &str, needles: &[&str]) {
    let err = Household::from_config_json(json).expect_err(json);
    assert_eq!(err.kind, ErrorKind::Config, "{json}: {err}");
    for needle in needles {
        assert!(
            err.message.contains(needle),
            "{json}: `{}` lacks `{needle}`",
            err.message
        );
    }
}

#[test]
fn empty_and_null_configs_give_the_defaults() {
    for json in ["", "  ", "null", "{}"] {
        let env = Household::from_config_json(json).unwrap();
        assert_eq!(env.config(), &HouseholdConfig::default(), "{json:?}");
    }
    let info = super::env().info();
    assert_eq!(
        (info.train_tasks, info.test_tasks, info.max_turns),
        (10_000, 500, 20)
    );
    assert!(info.anchor_keys && info.step_rewards && info.feedback && !info.tools);
    assert_eq!(
        info.task_kinds,
        [
            "pick_and_place",
            "look_at_obj_in_light",
            "pick_clean_then_place",
            "pick_heat_then_place",
            "pick_cool_then_place",
            "pick_two_obj_and_place"
        ]
    );
}

#[test]
fn unknown_key_is_named_with_the_allowed_keys() {
    check_rejected(
        r#"{"max_turns": 20, "max_turn": 5}"#,
        &["max_turn`", "max_turns", "invalid_penalty", "task_kinds"],
    );
}

#[test]
fn bad_values_name_their_key() {
    check_rejected(r#"{"max_turns": "twenty"}"#, &["`max_turns`"]);
    check_rejected(r#"{"invalid_penalty": -0.5}"#, &["`invalid_penalty`"]);
    check_rejected(
        r#"{"task_kinds": ["pick_and_place", "juggle"]}"#,
        &["`task_kinds`", "juggle", "pick_two_obj_and_place"],
    );
    check_rejected(r#"{"task_kinds": []}"#, &["`task_kinds`"]);
    check_rejected(
        r#"{"task_kinds": ["pick_and_place", "pick_and_place"]}"#,
        &["twice"],
    );
    check_rejected(
        r#"{"min_receptacles": 10, "max_receptacles": 8}"#,
        &["`max_receptacles`"],
    );
    check_rejected(r#"{"max_receptacles": 40}"#, &["`max_receptacles`"]);
    check_rejected(
        r#"{"max_distractors": 1, "min_distractors": 2}"#,
        &["`max_distractors`"],
    );
    check_rejected(r#"{"max_turns": 12}"#, &["`max_expert_steps`"]);
    check_rejected(r#"{"max_expert_steps": 5}"#, &["`max_expert_steps`"]);
    check_rejected(r#"[1, 2]"#, &["JSON object"]);
    check_rejected(r#"{"max_turns": "#, &["not valid JSON"]);
}

#[test]
fn subset_of_kinds_and_knobs_are_honoured() {
    let json = r#"{"task_kinds": ["pick_heat_then_place", "look_at_obj_in_light"], "max_turns": 30,
        "max_expert_steps": 20, "train_tasks": 50, "test_tasks": 7, "min_receptacles": 12,
        "max_receptacles": 14, "min_distractors": 0, "max_distractors": 0, "invalid_penalty": 0.1}"#;
    let env = Household::from_config_json(json).unwrap();
    let info = env.info();
    assert_eq!(
        info.task_kinds,
        ["pick_heat_then_place", "look_at_obj_in_light"]
    );
    assert_eq!(
        (info.train_tasks, info.test_tasks, info.max_turns),
        (50, 7, 30)
    );
    for index in 0..50 {
        let task = env.task(super::train(index)).unwrap();
        let expected = if index % 2 == 0 {
            "pick_heat_then_place"
        } else {
            "look_at_obj_in_light"
        };
        assert_eq!(task.kind, expected);
        let signature = env.signature(super::train(index)).unwrap();
        let receptacles = signature.matches(':').count() - 1; // one `name :` per receptacle, one goal
        assert!(
            (12..=14).contains(&receptacles),
            "{receptacles} in {signature}"
        );
    }
}
