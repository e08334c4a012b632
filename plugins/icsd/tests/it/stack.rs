//! `icsd` stacked on `grpo` and on `gigpo` (`cairn_plugin_sdk::Stack`): the estimator's
//! advantages are untouched, bit for bit; `icsd` adds its term (on the rows with a skill, with
//! the calibrated weights) and its metrics only.

use std::collections::HashMap;

use cairn_gigpo::Gigpo;
use cairn_grpo::Grpo;
use cairn_icsd::{calibrate, Icsd};
use cairn_opsd::testing::{mock_host, row, skill, MockHost, Teacher};
use cairn_plugin_sdk::stack::{Member, Stack};
use cairn_plugin_sdk::{Algorithm, Batch, EntryKind, Role, Signals, TurnRow};

fn member(name: &str, algorithm: Box<dyn Algorithm>) -> Member {
    Member {
        name: name.into(),
        requirements: algorithm.requirements(),
        algorithm,
    }
}

/// Two groups of two two-turn trajectories; group 1 plays task `t` (which has a skill),
/// group 2 task `u` (none). Turn 0 responds `[5, 6]`, turn 1 `[7, 8]`; `ℓ_old = [−1.0, −0.2]`
/// everywhere; the teacher scores `[5, 6]` at `[−0.5, −0.5]` and `[7, 8]` at `[−2.0, −0.2]`,
/// so `|Δ|` is `[0.5, 0.3]` on turn 0 and `[1.0, 0.0]` on turn 1.
fn batch() -> Batch {
    let mut rows: Vec<TurnRow> = Vec::new();
    for (group, task, rewards) in [(1, "t", [1.0, 0.0]), (2, "u", [0.0, 1.0])] {
        for (k, r) in rewards.iter().enumerate() {
            let traj = group * 10 + k as u64;
            for turn in 0..2u32 {
                let ids = if turn == 0 { [5, 6] } else { [7, 8] };
                let mut row = row(group, traj, task, &ids, &[-1.0, -0.2]);
                row.turn = turn;
                row.anchor = Some(format!("s{turn}"));
                row.turn_reward = if turn == 1 { *r } else { 0.0 };
                row.episode_reward = *r;
                row.success = *r > 0.0;
                row.last_turn = turn == 1;
                rows.push(row);
            }
        }
    }
    Batch { step: 0, rows }
}

fn host() -> MockHost {
    let host = mock_host(Teacher {
        logprobs: HashMap::from([
            (vec![5, 6], vec![-0.5, -0.5]),
            (vec![7, 8], vec![-2.0, -0.2]),
        ]),
        ..Teacher::default()
    });
    host.put(skill(1, Some("t"), "open the drawer first"));
    host
}

fn check(estimator: &str, base: Box<dyn Algorithm>, alone: Box<dyn Algorithm>) {
    let host = host();
    let b = batch();
    let base_alone = alone;
    let want = base_alone.signals(&b, &host).unwrap();
    let stack = Stack::new(vec![
        member(estimator, base),
        member("icsd", Box::new(Icsd::from_config_json("").unwrap())),
    ])
    .unwrap();
    let r = stack.requirements();
    assert_eq!(r.role, Role::Estimator);
    assert!(r.teacher_scores && r.reflection);
    assert_eq!(r.bank, [EntryKind::Skill]);
    assert_eq!(r.anchor_keys, estimator == "gigpo");

    let got = stack.signals(&b, &host).unwrap();
    got.validate_against(&b).unwrap();
    assert!(!want.advantages.is_empty());
    assert_eq!(got.advantages, want.advantages, "{estimator}: bit for bit");
    assert!(got.aux.is_empty() && got.extra_rows.is_empty());
    let term = &got.teacher[0];
    assert_eq!(term.name, "icsd-distill");
    // Rows 0..4 are group 1 (task t), turns 0, 1, 0, 1; group 2 has no skill.
    let rows: Vec<usize> = term.targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [0, 1, 2, 3]);
    let influence = [
        vec![0.5, 0.3],
        vec![1.0, 0.0],
        vec![0.5, 0.3],
        vec![1.0, 0.0],
    ];
    let c = calibrate(&influence, 0.25, 2.0, 1);
    for (t, w) in term.targets.iter().zip(&c.weights) {
        let w: Vec<f32> = w.iter().map(|&w| w as f32).collect();
        assert_eq!(t.weights, w);
        let mass: f32 = t.weights.iter().sum();
        assert!(
            (mass - 2.0).abs() < 1e-6,
            "each turn keeps its mass: {mass}"
        );
    }
    // mean I = 0.45: z = [1.111, 0.667 | 2.222, 0] → [1.111, 0.667 | 2.0, 0.25] → turn 0
    // [1.25, 0.75], turn 1 [1.7778, 0.2222].
    assert!((term.targets[0].weights[0] - 1.25).abs() < 1e-5);
    assert!((term.targets[1].weights[0] - 1.777_778).abs() < 1e-5);
    let metric = |name: &str| got.metrics.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(metric("icsd/rows_with_teacher"), 4.0);
    assert_eq!(metric("icsd/rows_without_skill"), 4.0);
    assert!((metric("icsd/influence_mean") - 0.45).abs() < 1e-6);
    let icsd_metrics = got
        .metrics
        .iter()
        .filter(|(n, _)| n.starts_with("icsd/"))
        .count();
    assert_eq!(got.metrics.len(), want.metrics.len() + icsd_metrics);
    assert_eq!(
        Signals {
            teacher: Vec::new(),
            metrics: Vec::new(),
            ..got
        },
        Signals {
            metrics: Vec::new(),
            ..want
        }
    );
}

#[test]
fn over_grpo_the_advantages_are_grpos_and_icsd_adds_only_its_term() {
    check(
        "grpo",
        Box::new(Grpo::from_config_json("").unwrap()),
        Box::new(Grpo::from_config_json("").unwrap()),
    );
}

#[test]
fn over_gigpo_the_advantages_are_gigpos_and_icsd_adds_only_its_term() {
    check(
        "gigpo",
        Box::new(Gigpo::from_config_json("").unwrap()),
        Box::new(Gigpo::from_config_json("").unwrap()),
    );
}
