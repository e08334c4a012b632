//! Tasks: fixed by split and index, disjoint splits that together hold every problem once,
//! and config errors that name the key.

use std::collections::HashSet;

use cairn_arith::{split_of, Arith, ArithConfig, Op, Problem};
use cairn_plugin_sdk::{Environment, Split};

use super::{env, test, train};

fn expressions(env: &Arith, split: Split) -> Vec<String> {
    let info = env.info();
    let count = match split {
        Split::Train => info.train_tasks,
        Split::Test => info.test_tasks,
    };
    (0..count)
        .map(|i| {
            let task = match split {
                Split::Train => train(i),
                Split::Test => test(i),
            };
            env.problem(task).unwrap().expression()
        })
        .collect()
}

#[test]
fn the_default_tasks_are_fixed_by_split_and_index() {
    let env = env();
    let info = env.info();
    assert_eq!((info.train_tasks, info.test_tasks), (498, 174));
    assert_eq!(info.max_turns, 2);
    assert_eq!(info.task_kinds, vec!["add", "sub"]);
    assert!(info.feedback && info.step_rewards && !info.anchor_keys && !info.tools);
    let first: Vec<String> = (0..4)
        .map(|i| env.problem(train(i)).unwrap().expression())
        .collect();
    assert_eq!(first, ["6 + 6", "16 + 20", "12 + 2", "19 - 18"]);
    let first: Vec<String> = (0..4)
        .map(|i| env.problem(test(i)).unwrap().expression())
        .collect();
    assert_eq!(first, ["17 - 6", "6 - 4", "7 + 14", "12 - 2"]);
    let task = env.task(test(0)).unwrap();
    assert_eq!(
        (task.id.as_str(), task.kind.as_str(), task.goal.as_str()),
        ("arith/test/0", "sub", "compute 17 - 6")
    );
    let err = env.task(test(174)).unwrap_err().to_string();
    assert!(
        err.contains("arith has 174 test tasks, no task 174"),
        "{err}"
    );
    assert!(env.problem(train(u64::MAX)).is_err());
}

#[test]
fn the_splits_are_disjoint_and_hold_every_problem_once() {
    let env = env();
    let train = expressions(&env, Split::Train);
    let test = expressions(&env, Split::Test);
    let train_set: HashSet<&String> = train.iter().collect();
    let test_set: HashSet<&String> = test.iter().collect();
    assert_eq!(train_set.len(), train.len(), "a training task repeats");
    assert_eq!(test_set.len(), test.len(), "a held-out task repeats");
    assert!(train_set.is_disjoint(&test_set));
    // 21 × 21 sums and the 231 differences with a ≥ b.
    let mut all = HashSet::new();
    for a in 0..=20u32 {
        for b in 0..=20u32 {
            all.insert(format!("{a} + {b}"));
            if a >= b {
                all.insert(format!("{a} - {b}"));
            }
        }
    }
    let union: HashSet<String> = train.iter().chain(&test).cloned().collect();
    assert_eq!(union, all);
}

/// A problem's split depends on its text only, so no config can move a held-out problem into
/// training; the order within a split is a spread, not the enumeration order.
#[test]
fn a_problem_keeps_its_split_under_every_config() {
    let narrow = env();
    let wide = Arith::new(ArithConfig {
        ops: vec!["*".into(), "-".into(), "+".into()],
        min_operand: 0,
        max_operand: 40,
        ..ArithConfig::default()
    })
    .unwrap();
    let wide_test: HashSet<String> = expressions(&wide, Split::Test).into_iter().collect();
    let wide_train: HashSet<String> = expressions(&wide, Split::Train).into_iter().collect();
    for e in expressions(&narrow, Split::Test) {
        assert!(wide_test.contains(&e), "{e} left the held-out split");
    }
    for e in expressions(&narrow, Split::Train) {
        assert!(wide_train.contains(&e), "{e} left the training split");
    }
    let p = Problem {
        a: 7,
        op: Op::Add,
        b: 8,
    };
    assert_eq!(split_of(&p, 4), Split::Train);
    // The first held-out tasks mix operators and sizes.
    let head = expressions(&narrow, Split::Test);
    let head = &head[..20];
    assert!(head.iter().any(|e| e.contains('+')) && head.iter().any(|e| e.contains('-')));
    assert!(head.iter().any(|e| e.starts_with("1")) && head.iter().any(|e| e.len() < 6));
    // Building twice gives the same lists.
    assert_eq!(
        expressions(&env(), Split::Test),
        expressions(&narrow, Split::Test)
    );
}

#[test]
fn answers_follow_the_operator() {
    let p = |a, op, b| Problem { a, op, b }.answer();
    assert_eq!(p(7, Op::Add, 8), 15);
    assert_eq!(p(20, Op::Sub, 13), 7);
    assert_eq!(p(12, Op::Mul, 11), 132);
    let sub = Arith::new(ArithConfig {
        ops: vec!["-".into()],
        ..ArithConfig::default()
    })
    .unwrap();
    for i in 0..sub.info().train_tasks {
        let q = sub.problem(train(i)).unwrap();
        assert!(q.a >= q.b && q.answer() >= 0, "{}", q.expression());
    }
}

#[test]
fn config_errors_name_the_key() {
    let err = |json: &str| Arith::from_config_json(json).err().unwrap().to_string();
    assert!(err(r#"{"max_turn": 3}"#).contains("unknown field `max_turn`"));
    assert!(err(r#"{"ops": ["/"]}"#).contains("`ops`: unknown operator `/`"));
    assert!(err(r#"{"ops": []}"#).contains("`ops` must name at least one operator"));
    assert!(err(r#"{"ops": ["+", "+"]}"#).contains("operator `+` is listed twice"));
    assert!(err(r#"{"min_operand": 5, "max_operand": 4}"#)
        .contains("`min_operand` (5) must not exceed `max_operand` (4)"));
    assert!(err(r#"{"max_operand": 2000000}"#).contains("`max_operand` must be at most 1000000"));
    assert!(err(r#"{"max_turns": 0}"#).contains("`max_turns` must be 1 to 16"));
    assert!(err(r#"{"max_turns": 17}"#).contains("`max_turns` must be 1 to 16"));
    assert!(err(r#"{"test_share": 1}"#).contains("`test_share` must be at least 2"));
    assert!(err(r#"{"min_operand": 0, "max_operand": 1000000}"#)
        .contains("narrow `min_operand`..`max_operand`"));
    // One problem cannot fill two splits.
    assert!(err(r#"{"ops": ["+"], "min_operand": 3, "max_operand": 3}"#).contains("split is empty"));
    // An empty config text is the default config.
    assert_eq!(
        Arith::from_config_json(" ").unwrap().config(),
        &ArithConfig::default()
    );
}
