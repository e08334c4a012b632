//! The built `cdylib` through the loader, as the kernel opens it.

use cairn_plugin_sdk::ffi::PluginKind;
use cairn_plugin_sdk::foreign::load_plugin;
use cairn_plugin_sdk::{Algorithm, EntryKind, Role};
use cairn_reskill::Reskill;

use crate::lab::{lab_host, run};

const CONFIG: &str =
    r#"{"test_steps": 3, "min_episodes": 8, "min_reservoir": 8, "reservoir_size": 40}"#;

/// Cargo writes the `cdylib` of this test run to `target/<profile>/deps/`, beside this test
/// binary.
#[test]
fn the_cdylib_loads_and_runs_the_same_steps_as_the_rlib() {
    let exe = std::env::current_exe().unwrap();
    let file = format!(
        "{}cairn_reskill{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let path = exe.with_file_name(file);
    let plugin = load_plugin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
