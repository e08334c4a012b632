//! `plan_group`: which scaffold a task plays with, and how a group is split.

use cairn_pats::Pats;
use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{
    Algorithm, EntryKind, EntryStatus, GroupRequest, OfflineHost, Requirements, Role,
};
use serde_json::json;

use super::{lab_host, labels, Lab};

fn extras(pats: &mut Pats, lab: &MockHost, task: &str, size: u32) -> Vec<serde_json::Value> {
    pats.plan_group(
        &GroupRequest {
            task_id: task.into(),
            group_size: size,
            ..GroupRequest::default()
        },
        lab,
    )
    .unwrap()
    .into_iter()
    .map(|v| serde_json::Value::Object(v.extra))
    .collect()
}

#[test]
fn the_task_scaffold_goes_to_the_first_scaffolded_slots() {
    let lab = lab_host();
    let other = lab.seed("t2", "another task's scaffold", EntryStatus::Active);
    let id = lab.seed("t1", "open the drawer first", EntryStatus::Active);
    assert_eq!((other, id), (1, 2));
    let mut pats = Pats::from_config_json(r#"{"scaffolded_slots": 3}"#).unwrap();
    let plan = pats
        .plan_group(
            &GroupRequest {
                task_id: "t1".into(),
                group_size: 8,
                ..GroupRequest::default()
            },
            &lab,
        )
        .unwrap();
    let got: Vec<&str> = plan.iter().map(|v| v.label.as_str()).collect();
    assert_eq!(
        got,
        [
            "scaffold:2",
            "scaffold:2",
            "scaffold:2",
            "plain",
            "plain",
            "plain",
            "plain",
            "plain"
        ]
    );
    assert_eq!(plan[0].inject, "open the drawer first");
    assert_eq!(plan[3].inject, "");
    assert!(plan.iter().all(|v| v.tools_enabled));
    let e = extras(&mut pats, &lab, "t1", 8);
    assert_eq!(e[2], json!({"pats_arm": "S", "scaffold_id": 2}));
    assert_eq!(e[3], json!({"pats_arm": "0"}));
    // The default G_s is half the group, rounded down.
    let mut half = Pats::from_config_json("").unwrap();
    assert_eq!(
        labels(&mut half, &lab, "t1", 5),
        ["scaffold:2", "scaffold:2", "plain", "plain", "plain"]
    );
}

#[test]
fn the_newest_active_scaffold_wins_then_the_general_one_then_none() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json(r#"{"scaffold": "think aloud"}"#).unwrap();
    // No task scaffold: the config's general one, recorded as "config".
    assert_eq!(
        labels(&mut pats, &lab, "t1", 4),
        ["scaffold:config", "scaffold:config", "plain", "plain"]
    );
    assert_eq!(
        extras(&mut pats, &lab, "t1", 4)[0],
        json!({"pats_arm": "S", "scaffold_id": "config"})
    );
    // Under test (an answer not yet checked) and too long: never injected.
    lab.seed("t1", "not checked yet", EntryStatus::UnderTest);
    lab.seed("t1", &"x".repeat(601), EntryStatus::Active);
    assert_eq!(
        labels(&mut pats, &lab, "t1", 2),
        ["scaffold:config", "plain"]
    );
    let older = lab.seed("t1", "older", EntryStatus::Active);
    let newer = lab.seed("t1", "newer", EntryStatus::Active);
    assert_eq!((older, newer), (3, 4));
    assert_eq!(labels(&mut pats, &lab, "t1", 2), ["scaffold:4", "plain"]);
    // Without any scaffold every slot plays plain, and says so.
    let mut bare = Pats::from_config_json("").unwrap();
    assert_eq!(
        labels(&mut bare, &lab, "t9", 3),
        ["plain", "plain", "plain"]
    );
    assert_eq!(
        extras(&mut bare, &lab, "t9", 3),
        vec![json!({"pats_arm": "0"}); 3]
    );
    assert!(lab.entries(EntryKind::EvidenceCard).is_empty());
}

#[test]
fn plans_refuse_groups_without_two_arms_and_hosts_without_a_bank() {
    let lab = lab_host();
    let mut pats = Pats::from_config_json(r#"{"scaffolded_slots": 4}"#).unwrap();
    let e = pats
        .plan_group(
            &GroupRequest {
                group_size: 4,
                ..GroupRequest::default()
            },
            &lab,
        )
        .unwrap_err();
    assert!(
        e.message
            .starts_with("`scaffolded_slots` = 4 leaves no plain slot in a group of 4"),
        "{e}"
    );
    let e = pats
        .plan_group(
            &GroupRequest {
                group_size: 8,
                ..GroupRequest::default()
            },
            &OfflineHost::default(),
        )
        .unwrap_err();
    assert!(e.message.contains("experience bank"), "{e}");
    assert_eq!(
        pats.requirements(),
        Requirements {
            role: Role::Planner,
            bank: vec![EntryKind::Scaffold, EntryKind::EvidenceCard],
            reflection: true,
            min_group_size: 5,
            ..Requirements::default()
        }
    );
    assert_eq!(
        Pats::from_config_json("")
            .unwrap()
            .requirements()
            .min_group_size,
        2
    );
}
