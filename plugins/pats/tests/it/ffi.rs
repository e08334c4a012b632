//! The built `cdylib` through the loader, as the kernel opens it.

use cairn_plugin_sdk::host::foreign::PluginKind;
use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::{Algorithm, EntryStatus, GroupRequest, Role};

use super::{lab_host, play, Lab, Play};

#[test]
fn the_cdylib_loads_plans_and_observes() {
    let plugin = load_test_cdylib("cairn_pats");
    assert_eq!(plugin.info.name, "pats");
    assert_eq!(plugin.info.kind, PluginKind::Algorithm);

    let err = plugin
        .create_algorithm(r#"{"tau_solve": 2}"#)
        .err()
        .expect("tau_solve out of range");
    assert!(
        err.message.contains("plugin `pats`") && err.message.contains("`tau_solve` = 2"),
        "{err}"
    );

    let mut foreign = plugin
        .create_algorithm(r#"{"scaffolded_slots": 1}"#)
        .unwrap();
    let r = foreign.try_requirements().unwrap();
    assert_eq!(
        (r.role, r.min_group_size, r.reflection),
        (Role::Planner, 2, true)
    );

    let lab = lab_host();
    let id = lab.seed("t", "count the doors", EntryStatus::Active);
    let plan = foreign
        .plan_group(
            &GroupRequest {
                task_id: "t".into(),
                group_size: 3,
                ..GroupRequest::default()
            },
            &lab,
        )
        .unwrap();
    let labels: Vec<&str> = plan.iter().map(|v| v.label.as_str()).collect();
    assert_eq!(
        labels,
        [format!("scaffold:{id}").as_str(), "plain", "plain"]
    );
    assert_eq!(plan[0].extra["scaffold_id"], id);

    // A step through the boundary: the card reaches the host's bank, the metrics its log.
    let mut local = cairn_pats::Pats::from_config_json(r#"{"scaffolded_slots": 1}"#).unwrap();
    let report = play(
        &mut local,
        &lab,
        0,
        &[Play {
            group: 1,
            task: "t",
            success: vec![true, false, false],
        }],
    );
    foreign.observe(&report, &lab).unwrap();
    assert_eq!(lab.metric("pats/cards"), Some(1.0));
    assert_eq!(lab.metric("pats/kept"), Some(1.0));
    let state = foreign.save_state().unwrap();
    assert!(state.contains(r#""steps":1"#), "{state}");
}
