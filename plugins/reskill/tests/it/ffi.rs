//! The built `cdylib` through the loader, as the kernel opens it.

use cairn_plugin_sdk::host::foreign::PluginKind;
use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::{Algorithm, EntryKind, Role};
use cairn_reskill::Reskill;

use crate::lab::{lab_host, run};

const CONFIG: &str =
    r#"{"test_steps": 3, "min_episodes": 8, "min_reservoir": 8, "reservoir_size": 40}"#;

#[test]
fn the_cdylib_loads_and_runs_the_same_steps_as_the_rlib() {
    let plugin = load_test_cdylib("cairn_reskill");
    assert_eq!(plugin.info.name, "reskill");
    assert_eq!(plugin.info.kind, PluginKind::Algorithm);
    let err = plugin
        .create_algorithm(r#"{"min_trigger_rate": 1.5}"#)
        .err()
        .expect("min_trigger_rate out of range");
    assert!(err.message.contains("`min_trigger_rate` = 1.5"), "{err}");

    let mut foreign = plugin.create_algorithm(CONFIG).unwrap();
    let r = foreign.try_requirements().unwrap();
    assert_eq!(
        (r.role, r.turn_context, r.reflection),
        (Role::Planner, true, true)
    );
    assert_eq!(r.bank, [EntryKind::Skill]);

    // Five steps through the boundary (a request, an arrival, a decided test, the next
    // request) end in the same state as in process.
    let (lab, mut delivered) = (lab_host(), Vec::new());
    run(&mut foreign, &lab, 1..=5, &mut delivered);
    let mut local = Reskill::from_config_json(CONFIG).unwrap();
    let (lab2, mut delivered2) = (lab_host(), Vec::new());
    run(&mut local, &lab2, 1..=5, &mut delivered2);
    let state = foreign.save_state().unwrap();
    assert_eq!(state, local.save_state().unwrap());
    let s = local.state();
    assert_eq!(s.counters.accepted + s.counters.reverted, 1);
    assert!(s.pending.is_some());
    assert_eq!(lab.metric("reskill/p_new"), lab2.metric("reskill/p_new"));
    foreign.load_state(&state).unwrap();
}
