//! Train and held-out tasks are disjoint, and each split's tasks are varied.

use std::collections::HashSet;

use cairn_household::split_of_signature;
use cairn_plugin_sdk::{Environment, Split};

use super::{env, test, train};

#[test]
fn no_task_is_in_both_splits() {
    let env = env();
    let held_out: HashSet<String> = (0..env.info().test_tasks)
        .map(|i| {
            let signature = env.signature(test(i)).unwrap();
            assert_eq!(split_of_signature(&signature), Split::Test);
            signature
        })
        .collect();
    for index in 0..5_000 {
        let signature = env.signature(train(index)).unwrap();
        assert_eq!(split_of_signature(&signature), Split::Train);
        assert!(
            !held_out.contains(&signature),
            "train {index} is also a test task: {signature}"
        );
    }
}

#[test]
fn tasks_are_varied() {
    let env = env();
    let train: HashSet<String> = (0..2_000)
        .map(|i| env.signature(train(i)).unwrap())
        .collect();
    let test: HashSet<String> = (0..500).map(|i| env.signature(test(i)).unwrap()).collect();
    assert_eq!(
        (train.len(), test.len()),
        (2_000, 500),
        "duplicate tasks within a split"
    );
    let goals: HashSet<String> = (0..2_000)
        .map(|i| env.task(super::train(i)).unwrap().goal)
        .collect();
    assert!(goals.len() > 500, "only {} distinct goals", goals.len());
}
