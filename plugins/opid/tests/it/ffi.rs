//! The built `cdylib` through the loader, as the kernel opens it: requests with their JSON
//! reply format, answers, and `advantage_add` cross the boundary unchanged.

use cairn_opid::Opid;
use cairn_plugin_sdk::host::foreign::PluginKind;
use cairn_plugin_sdk::testing::load_test_cdylib;
use cairn_plugin_sdk::{Algorithm, Batch, EntryKind, Role, StepReport, TurnRow};
use serde_json::json;

use crate::{answer, row, test_host};
use cairn_plugin_sdk::testing::MockHost;

fn two(group: u64, fail: u64, win: u64) -> Vec<TurnRow> {
    let mut rows = Vec::new();
    for (traj, anchors, success) in [(fail, ["s0", "s1"], false), (win, ["s0", "s2"], true)] {
        for (turn, anchor) in anchors.iter().enumerate() {
            let mut r = row(group, traj, turn as u32, anchor, success);
            r.last_turn = turn == 1;
            rows.push(r);
        }
    }
    rows
}

/// Step 0 observed, both analyses answered, step 1 observed; the signals of step 2.
fn play(opid: &mut dyn Algorithm, host: &MockHost) -> Vec<Vec<f32>> {
    let report = |step: u64, rows: Vec<TurnRow>, new_entries: Vec<u64>| StepReport {
        step,
        policy_version: step + 1,
        batch: Batch { step, rows },
        new_entries,
        ..StepReport::default()
    };
    opid.observe(&report(0, two(1, 1, 2), vec![]), host)
        .unwrap();
    let a = answer(
        host,
        1,
        json!({"episode_skill": "do not go to the sofa", "step_skills": {"1": "look in the drawer"}}),
    );
    let b = answer(
        host,
        2,
        json!({"episode_skill": "open the drawer first", "step_skills": {}}),
    );
    opid.observe(&report(1, two(2, 11, 12), vec![a, b]), host)
        .unwrap();
    let batch = Batch {
        step: 2,
        rows: two(3, 31, 32),
    };
    opid.signals(&batch, host).unwrap().advantage_add
}

#[test]
fn the_cdylib_loads_and_gives_the_rlibs_teacher_advantages() {
    let plugin = load_test_cdylib("cairn_opid");
    assert_eq!(plugin.info.name, "opid");
    assert_eq!(plugin.info.kind, PluginKind::Algorithm);
    let err = plugin
        .create_algorithm(r#"{"w_ep": -1}"#)
        .err()
        .expect("w_ep out of range");
    assert!(err.message.contains("`w_ep` = -1"), "{err}");

    let mut foreign = plugin.create_algorithm("").unwrap();
    let r = foreign.try_requirements().unwrap();
    assert_eq!(r.role, Role::Auxiliary);
    assert!(r.teacher_scores && r.reflection && !r.anchor_keys);
    assert_eq!(r.bank, [EntryKind::Skill]);

    let host = test_host();
    let through = play(&mut foreign, &host);
    let local_host = test_host();
    let mut local = Opid::from_config_json("").unwrap();
    let here = play(&mut local, &local_host);
    assert_eq!(through, here);
    // Failed row at s1 (the step skill), the success at s0 (the success's episode skill).
    for (got, want) in through[1].iter().zip([0.0004, 0.0006, 0.0001]) {
        assert!((f64::from(*got) - want).abs() < 1e-9, "{:?}", through[1]);
    }
    assert_eq!(
        host.reflections.lock().unwrap()[0].extra,
        local_host.reflections.lock().unwrap()[0].extra
    );
    assert_eq!(foreign.save_state().unwrap(), local.save_state().unwrap());
}
