//! The expert solves every task of every kind, in both splits, within the turn limit.

use std::collections::BTreeMap;

use cairn_household::{Household, TaskKind};
use cairn_plugin_sdk::{Environment, Split, TaskRef};

use super::{expert, play};

#[test]
fn the_expert_solves_200_tasks_of_each_kind_in_each_split() {
    // 1200 tasks per split: 200 of each of the six kinds (indices cycle through the kinds).
    let env = Household::from_config_json(r#"{"test_tasks": 1200}"#).unwrap();
    let max_turns = env.info().max_turns as usize;
    for split in [Split::Train, Split::Test] {
        let mut solved: BTreeMap<&str, (u32, u32, usize)> = BTreeMap::new();
        for index in 0..1200 {
            let task = TaskRef { split, index };
            let kind = env.task(task).unwrap().kind;
            let (_, records) = play(&env, task, index, expert);
            let last = &records.last().unwrap().outcome;
            let entry = solved
                .entry(TaskKind::from_name(&kind).unwrap().name())
                .or_default();
            entry.0 += u32::from(last.success);
            entry.1 += 1;
            entry.2 = entry.2.max(records.len());
            assert!(records.len() <= max_turns);
        }
        assert_eq!(solved.len(), 6);
        for (kind, (wins, total, longest)) in &solved {
            assert_eq!((*wins, *total), (200, 200), "{split:?} {kind}");
            assert!(
                *longest <= 14,
                "{split:?} {kind}: expert took {longest} steps"
            );
        }
    }
}

#[test]
fn expert_episodes_are_short_on_average() {
    let env = super::env();
    let mut steps: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for index in 0..600 {
        let task = super::train(index);
        let (_, records) = play(&env, task, 0, expert);
        let entry = steps.entry(env.task(task).unwrap().kind).or_default();
        entry.0 += records.len();
        entry.1 += 1;
    }
    for (kind, (total, n)) in steps {
        let mean = total as f64 / n as f64;
        assert!(
            (4.0..=11.0).contains(&mean),
            "{kind}: mean expert length {mean}"
        );
    }
}
