//! `edge` stacked on `grpo` and on `gigpo` (`cairn_plugin_sdk::Stack`): the estimator's
//! advantages are untouched, bit for bit; `edge` adds its teacher term and its metrics only.

use cairn_edge::Edge;
use cairn_gigpo::Gigpo;
use cairn_grpo::Grpo;
use cairn_plugin_sdk::stack::{Member, Stack};
use cairn_plugin_sdk::{Algorithm, Batch, GroupRequest, Role, Signals, TurnRow};

use crate::{plan, row, test_host};
use cairn_plugin_sdk::testing::MockHost;

fn member(name: &str, algorithm: Box<dyn Algorithm>) -> Member {
    Member {
        name: name.into(),
        requirements: algorithm.requirements(),
        algorithm,
    }
}

/// Two groups of four two-turn trajectories, slots as `edge` planned them (two E, two N).
/// Group 1: E1 succeeds via s0 → s1; E2 fails via s0 → s2; N1 fails via s0 → s2; N2 fails via
/// s0 → s3: the cell s0 is admitted (N1@s0, N2@s0), s2 is not (no arm succeeded there).
/// Group 2: both arms succeed once: nothing admitted.
fn batch(host: &MockHost) -> Batch {
    let mut edge = Edge::from_config_json("").unwrap();
    let mut rows: Vec<TurnRow> = Vec::new();
    for (group, outcomes) in [(1, [10.0, 0.0, 0.0, 0.0]), (2, [10.0, 0.0, 10.0, 0.0])] {
        let slots = plan(&mut edge, host, group);
        assert_eq!(slots[0].label, "experience:2");
        let second = ["s1", "s2", "s2", "s3"];
        for k in 0..4 {
            let t = group * 10 + k as u64;
            let r = outcomes[k];
            rows.push(row(group, t, 0, &slots[k], "s0", 0.0, r));
            let mut last = row(group, t, 1, &slots[k], second[k], r, r);
            last.last_turn = true;
            rows.push(last);
        }
    }
    Batch { step: 0, rows }
}

fn check(estimator: &str, base: Box<dyn Algorithm>, alone: Box<dyn Algorithm>) {
    let host = test_host();
    let b = batch(&host);
    let base_alone = alone;
    let want = base_alone.signals(&b, &host).unwrap();
    let edge_alone = Edge::from_config_json("").unwrap();
    let edge_signals = edge_alone.signals(&b, &host).unwrap();

    let mut stack = Stack::new(vec![
        member(estimator, base),
        member("edge", Box::new(Edge::from_config_json("").unwrap())),
    ])
    .unwrap();
    let r = stack.requirements();
    assert!(r.even_group_size && r.reflection && r.min_group_size >= 2);
    assert_eq!(r.role, Role::Estimator);
    // The planner plans the slots.
    let slots = stack
        .plan_group(
            &GroupRequest {
                group_id: 9,
                task_id: "clean-mug".into(),
                group_size: 4,
                ..GroupRequest::default()
            },
            &host,
        )
        .unwrap();
    assert_eq!(slots[0].extra["edge_arm"], "E");
    assert_eq!(slots[3].extra["edge_arm"], "N");

    let got = stack.signals(&b, &host).unwrap();
    got.validate_against(&b).unwrap();
    assert!(!want.advantages.is_empty());
    assert_eq!(
        got.advantages, want.advantages,
        "{estimator}: advantages bit for bit"
    );
    assert!(got.aux.is_empty() && got.extra_rows.is_empty());
    assert_eq!(got.dropped_groups, want.dropped_groups);
    assert_eq!(got.teacher, edge_signals.teacher);
    assert_eq!(got.teacher.len(), 1);
    assert_eq!(got.teacher[0].name, "edge-distill");
    let rows: Vec<usize> = got.teacher[0].targets.iter().map(|t| t.row).collect();
    // Rows: group 1 is rows 0..8 (two per trajectory); N1@s0 is row 4, N2@s0 row 6.
    assert_eq!(rows, [4, 6]);
    let mut metrics = want.metrics.clone();
    metrics.extend(edge_signals.metrics.clone());
    assert_eq!(got.metrics, metrics);
    assert_eq!(
        edge_signals.metrics,
        [
            ("edge/success_e".to_string(), 0.5),
            ("edge/success_n".to_string(), 0.25),
            ("edge/rows_distilled".to_string(), 2.0),
            ("edge/cells_admitted".to_string(), 1.0),
        ]
    );
    assert_eq!(
        Signals {
            teacher: Vec::new(),
            metrics: Vec::new(),
            ..got
        },
        Signals {
            teacher: Vec::new(),
            metrics: Vec::new(),
            ..want
        }
    );
}

#[test]
fn over_grpo_the_advantages_are_grpos_and_edge_adds_only_its_term() {
    check(
        "grpo",
        Box::new(Grpo::from_config_json("").unwrap()),
        Box::new(Grpo::from_config_json("").unwrap()),
    );
}

#[test]
fn over_gigpo_the_advantages_are_gigpos_and_edge_adds_only_its_term() {
    check(
        "gigpo",
        Box::new(Gigpo::from_config_json("").unwrap()),
        Box::new(Gigpo::from_config_json("").unwrap()),
    );
}
