//! `sdar` stacked on `grpo` and on `gigpo` (`cairn_plugin_sdk::Stack`): the estimator's
//! advantages are untouched, bit for bit; `sdar` adds its term (on the rows with a skill,
//! with the gate's weights) and its metrics only.

use cairn_gigpo::Gigpo;
use cairn_grpo::Grpo;
use cairn_opsd::testing::{mock_host, row, skill, MockHost, Teacher};
use cairn_plugin_sdk::stack::{Member, Stack};
use cairn_plugin_sdk::{Algorithm, Batch, EntryKind, Role, Signals, TeacherSource, TurnRow};
use cairn_sdar::Sdar;

fn member(name: &str, algorithm: Box<dyn Algorithm>) -> Member {
    Member {
        name: name.into(),
        requirements: algorithm.requirements(),
        algorithm,
    }
}

/// Two groups of two two-turn trajectories; group 1 plays task `t` (which has a skill),
/// group 2 task `u` (none). Every row has `ℓ_old = [−1.0, −0.2]`; the teacher scores every
/// response at −0.5, so `Δ = [0.5, −0.3]` and `g = [σ(2.5), σ(−1.5)]`.
fn batch() -> Batch {
    let mut rows: Vec<TurnRow> = Vec::new();
    for (group, task, rewards) in [(1, "t", [1.0, 0.0]), (2, "u", [0.0, 1.0])] {
        for (k, r) in rewards.iter().enumerate() {
            let traj = group * 10 + k as u64;
            for turn in 0..2u32 {
                let mut row = row(group, traj, task, &[5, 6], &[-1.0, -0.2]);
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
        default_logprob: -0.5,
        ..Teacher::default()
    });
    host.put(skill(1, Some("t"), "open the drawer first"));
    host
}

fn sigmoid(x: f64) -> f32 {
    (1.0 / (1.0 + (-x).exp())) as f32
}

fn check(estimator: &str, base: Box<dyn Algorithm>, alone: Box<dyn Algorithm>, config: &str) {
    let host = host();
    let b = batch();
    let base_alone = alone;
    let want = base_alone.signals(&b, &host).unwrap();
    let stack = Stack::new(vec![
        member(estimator, base),
        member("sdar", Box::new(Sdar::from_config_json(config).unwrap())),
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
    assert!(got.extra_rows.is_empty());
    let g = [sigmoid(2.5), sigmoid(-1.5)];
    // Rows 0..4 are group 1 (task t, with a skill), rows 4..8 group 2 (no skill).
    if config.is_empty() {
        assert!(got.teacher.is_empty());
        assert_eq!(got.aux.len(), 1);
        let c = &got.aux[0].coefficients;
        for (i, c) in c.iter().enumerate() {
            let want: Vec<f32> = if i < 4 {
                vec![-g[0], -g[1]]
            } else {
                vec![0.0; 2]
            };
            assert_eq!(c, &want, "row {i}");
        }
    } else {
        assert!(got.aux.is_empty());
        let term = &got.teacher[0];
        let rows: Vec<usize> = term.targets.iter().map(|t| t.row).collect();
        assert_eq!(rows, [0, 1, 2, 3]);
        for t in &term.targets {
            assert_eq!(t.weights, g);
            assert_eq!(
                t.source,
                TeacherSource::Fixed {
                    logprobs: vec![-0.5, -0.5],
                    top_ids: vec![],
                    top_logprobs: vec![],
                }
            );
        }
    }
    let sdar_metrics: Vec<&(String, f64)> = got
        .metrics
        .iter()
        .filter(|(n, _)| n.starts_with("sdar/"))
        .collect();
    let get = |name: &str| sdar_metrics.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(get("sdar/rows_with_teacher"), 4.0);
    assert_eq!(get("sdar/rows_without_skill"), 4.0);
    assert_eq!(
        got.metrics.len(),
        want.metrics.len() + sdar_metrics.len(),
        "the estimator's metrics and sdar's"
    );
    assert_eq!(
        Signals {
            aux: Vec::new(),
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
fn over_grpo_the_advantages_are_grpos_and_sdar_adds_only_its_term() {
    for config in ["", r#"{"form": "reverse_kl"}"#] {
        check(
            "grpo",
            Box::new(Grpo::from_config_json("").unwrap()),
            Box::new(Grpo::from_config_json("").unwrap()),
            config,
        );
    }
}

#[test]
fn over_gigpo_the_advantages_are_gigpos_and_sdar_adds_only_its_term() {
    for config in ["", r#"{"form": "reverse_kl"}"#] {
        check(
            "gigpo",
            Box::new(Gigpo::from_config_json("").unwrap()),
            Box::new(Gigpo::from_config_json("").unwrap()),
            config,
        );
    }
}
