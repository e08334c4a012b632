//! The plugin through the stable ABI: the SDK's adapter in-process, and the built `cdylib`.

use cairn_household::Household;
use cairn_plugin_sdk::export::{create_environment, RStr};
use cairn_plugin_sdk::host::ffi::FfiContextVariant;
use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, ErrorKind, Observation, Split, StepOutcome,
};

use super::{env, expert, play, train};

#[test]
fn the_adapter_serves_info_tasks_and_episodes() {
    let ffi = create_environment(
        RStr::from(r#"{"test_tasks": 40}"#),
        Household::from_config_json,
    )
    .into_result()
    .map_err(|e| e.message.to_string())
    .unwrap();
    let info: EnvironmentInfo =
        serde_json::from_str(ffi.info_json().into_result().unwrap().as_str()).unwrap();
    assert_eq!(info.test_tasks, 40);
    assert_eq!(info.task_kinds.len(), 6);
    let task = ffi.task_json(Split::Test, 39).into_result().unwrap();
    assert!(
        task.as_str().contains("household/test/39"),
        "{}",
        task.as_str()
    );
    assert!(ffi.task_json(Split::Test, 40).into_result().is_err());

    // An expert episode through the FFI equals the in-process one.
    let (first, records) = play(&env(), train(5), 0, expert);
    let variant = FfiContextVariant::from(&ContextVariant::default());
    let mut episode = ffi
        .start(Split::Train, 5, 0, &variant)
        .into_result()
        .unwrap();
    let observation: Observation =
        serde_json::from_str(episode.observation_json().into_result().unwrap().as_str()).unwrap();
    assert_eq!(observation.text, first);
    for record in &records {
        let action = episode
            .expert_action()
            .into_result()
            .unwrap()
            .into_option()
            .unwrap();
        assert_eq!(action.as_str(), record.action);
        let out = episode
            .step_json(RStr::from(action.as_str()))
            .into_result()
            .unwrap();
        let out: StepOutcome = serde_json::from_str(out.as_str()).unwrap();
        assert_eq!(out, record.outcome);
    }
    assert!(records.last().unwrap().outcome.success);
    // Stepping a finished episode is an error value, not a panic.
    assert!(episode.step_json(RStr::from("look")).into_result().is_err());
}

#[test]
fn a_bad_config_is_an_error_through_the_adapter() {
    let err = create_environment(RStr::from(r#"{"turns": 3}"#), Household::from_config_json)
        .into_result()
        .err()
        .expect("unknown key");
    assert_eq!(err.kind, ErrorKind::Config);
    assert!(
        err.message.as_str().contains("`turns`"),
        "{}",
        err.message.as_str()
    );
}

/// Loads the `cdylib` cargo built for this test run, as the kernel would.
#[test]
fn the_cdylib_loads_and_plays() {
    let plugin = load_test_cdylib("cairn_household");
    assert_eq!(plugin.info.name, "household");

    let err = plugin
        .create_environment(r#"{"max_turn": 3}"#)
        .err()
        .expect("unknown key");
    assert!(
        err.message.contains("plugin `household`") && err.message.contains("`max_turn`"),
        "{err}"
    );

    let foreign = plugin.create_environment("{}").unwrap();
    assert_eq!(foreign.info(), env().info());
    for index in 0..6 {
        assert_eq!(
            play(&foreign, train(index), 0, expert),
            play(&env(), train(index), 0, expert)
        );
    }
}
