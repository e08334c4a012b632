//! The built `.so` through the plugin ABI (`cargo test -p cairn-sdar` builds it next to this
//! test): it names itself `sdar`, refuses a bad config naming the key, declares the same
//! requirements as the rlib, and gives the same signals through the ABI host callbacks
//! (bank, prompt renderer, scorer).

use std::collections::HashMap;

use cairn_opsd::testing::{mock_host, row, skill, Teacher};
use cairn_plugin_sdk::host::foreign::PluginKind;
use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::{Algorithm, Batch, StepReport};
use cairn_sdar::Sdar;

#[test]
fn the_plugin_runs_through_the_abi_as_the_rlib_does() {
    let plugin = load_test_cdylib("cairn_sdar");
    assert_eq!(plugin.info.name, "sdar");
    assert_eq!(plugin.info.kind, PluginKind::Algorithm);
    let e = plugin.create_algorithm(r#"{"beta": 0}"#).err().unwrap();
    assert!(e.message.contains("`beta` = 0"), "{e}");

    let config = r#"{"form": "reverse_kl"}"#;
    let mut foreign = plugin.create_algorithm(config).unwrap();
    let local = Sdar::from_config_json(config).unwrap();
    assert_eq!(foreign.try_requirements().unwrap(), local.requirements());

    let host = mock_host(Teacher {
        logprobs: HashMap::from([(vec![5, 6, 7], vec![-0.4, -0.9, -2.5])]),
        ..Teacher::default()
    });
    host.put(skill(1, Some("t"), "open the drawer first"));
    // Task t has a skill, task u none; both trajectories succeed.
    let mut rows = vec![
        row(1, 1, "t", &[5, 6, 7], &[-1.2, -0.2, -2.5]),
        row(2, 2, "u", &[5, 6, 7], &[-1.0; 3]),
    ];
    for r in &mut rows {
        r.success = true;
        r.episode_reward = 1.0;
    }
    let batch = Batch { step: 0, rows };
    let got = foreign.signals(&batch, &host).unwrap();
    assert_eq!(got, local.signals(&batch, &host).unwrap());
    assert_eq!(got.teacher[0].targets.len(), 1);
    let report = StepReport {
        batch,
        ..StepReport::default()
    };
    foreign.observe(&report, &host).unwrap();
    let asked = host.reflections.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "only task u, which has no skill yet");
    assert_eq!(asked[0].task_id.as_deref(), Some("u"));
    let state = foreign.save_state().unwrap();
    assert!(state.contains("\"requested\":1"), "{state}");
}
