//! `echo` stacked on `grpo` and on `gigpo` through `cairn_plugin_sdk::Stack`: the worked
//! example's final advantages exactly, routing only on the success's evidence turns and
//! selection tokens, and the estimator's advantages untouched everywhere else, bit for bit.

use cairn_echo::testing::Toy;
use cairn_echo::Echo;
use cairn_gigpo::Gigpo;
use cairn_grpo::Grpo;
use cairn_plugin_sdk::stack::{Member, Stack};
use cairn_plugin_sdk::{Algorithm, Batch, Role, TurnRow};
use serde_json::json;

fn member(name: &str, algorithm: Box<dyn Algorithm>) -> Member {
    Member {
        name: name.into(),
        requirements: algorithm.requirements(),
        algorithm,
    }
}

const STOP: u32 = 99_999;

/// One group of five trajectories of task `iron`: trajectory 0 is the worked example (a
/// success whose answer turn t4 cites records 1 and 3), trajectories 1–4 fail (reward 0) and
/// cite records too. Every row has its own anchor, so GiGPO's step groups are singletons.
fn batch(toy: &Toy) -> Batch {
    let success = [
        "search[iron]",
        "search[iron atomic number]",
        "search[gold]",
        "search[iron discoverer]",
        "select[1,3] answer[26]",
    ];
    let failure = [
        "search[tin]",
        "select[0] search[lead]",
        "select[0,1] answer[82]",
    ];
    let mut rows = Vec::new();
    for traj in 0..5u64 {
        let (actions, reward): (&[&str], f32) = if traj == 0 {
            (&success, 1.0)
        } else {
            (&failure, 0.0)
        };
        for (t, action) in actions.iter().enumerate() {
            let mut ids = toy.ids(action);
            ids.push(STOP);
            let l = ids.len();
            let mut info = serde_json::Map::new();
            info.insert("action".into(), json!(action));
            let mut extra = serde_json::Map::new();
            if t > 0 {
                extra.insert("echo_selected".into(), json!([]));
            }
            rows.push(TurnRow {
                group_id: 3,
                trajectory_id: traj,
                turn: t as u32,
                task_id: "iron".into(),
                prompt_ids: vec![1, 2],
                response_ids: ids,
                response_logprobs: vec![-0.5; l],
                response_mask: vec![1; l],
                old_logprobs: vec![-0.5; l],
                turn_reward: if t + 1 == actions.len() { reward } else { 0.0 },
                episode_reward: reward,
                success: reward > 0.0,
                last_turn: t + 1 == actions.len(),
                anchor: Some(format!("traj {traj} turn {t}")),
                observation: format!("observation {t}"),
                info,
                extra,
                ..TurnRow::default()
            });
        }
    }
    Batch { step: 0, rows }
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{what}: {got:?} vs {want:?}");
    }
}

fn check(estimator: &str, base: Box<dyn Algorithm>, alone: Box<dyn Algorithm>) {
    let toy = Toy::default();
    let host = toy.host();
    let b = batch(&toy);
    let alone = alone;
    let want = alone.signals(&b, &host).unwrap();
    let stack = Stack::new(vec![
        member(estimator, base),
        member("echo", Box::new(Echo::from_config_json("").unwrap())),
    ])
    .unwrap();
    let r = stack.requirements();
    assert!(r.turn_context && r.bank.contains(&cairn_plugin_sdk::EntryKind::MemoryRecord));
    assert_eq!(r.role, Role::Estimator);
    let got = stack.signals(&b, &host).unwrap();
    got.validate_against(&b).unwrap();
    assert!(
        got.advantage_scale.is_empty(),
        "the stack applies the scale once"
    );
    // The estimator's own advantage of the success is 0.8 (R − mean = 1 − 0.2), −0.2 for
    // each failure.
    for (i, row) in b.rows.iter().enumerate() {
        let a = if row.trajectory_id == 0 { 0.8 } else { -0.2 };
        close(
            &want.advantages[i],
            &vec![a; row.response_ids.len()],
            estimator,
        );
    }
    // The worked example: t1 → 1.2, t2 → 0.8, t3 → 1.2, t4 (selection + answer) → 1.2;
    // t0 0.8.
    let n = |i: usize| b.rows[i].response_ids.len();
    close(&got.advantages[0], &vec![0.8; n(0)], "t0");
    close(&got.advantages[1], &vec![1.2; n(1)], "t1");
    close(&got.advantages[2], &vec![0.8; n(2)], "t2");
    close(&got.advantages[3], &vec![1.2; n(3)], "t3");
    assert_eq!(toy.text(&b.rows[4].response_ids[..6]), "select[1,3]");
    close(&got.advantages[4], &vec![1.2; n(4)], "t4");
    // Everything else is the estimator's, bit for bit: the failures cite records and get
    // no routing.
    for i in 5..b.rows.len() {
        assert_eq!(
            got.advantages[i], want.advantages[i],
            "{estimator}: row {i}"
        );
    }
    for i in [0, 2] {
        assert_eq!(
            got.advantages[i], want.advantages[i],
            "{estimator}: row {i}"
        );
    }
    // The stack's metrics are the estimator's then echo's.
    assert!(got
        .metrics
        .iter()
        .any(|(n, v)| n == "echo/routed_trajectories" && *v == 1.0));
}

#[test]
fn over_grpo_the_worked_example_gives_its_exact_advantages() {
    let config = r#"{"norm_adv_by_std": false, "compute_mean_std_cross_steps": false}"#;
    check(
        "grpo",
        Box::new(Grpo::from_config_json(config).unwrap()),
        Box::new(Grpo::from_config_json(config).unwrap()),
    );
}

#[test]
fn over_gigpo_the_worked_example_gives_its_exact_advantages() {
    let config = r#"{"compute_mean_std_cross_steps": false}"#;
    check(
        "gigpo",
        Box::new(Gigpo::from_config_json(config).unwrap()),
        Box::new(Gigpo::from_config_json(config).unwrap()),
    );
}
