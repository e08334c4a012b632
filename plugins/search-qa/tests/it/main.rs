//! Integration tests of the search-qa plugin, in one binary.
//!
//! Most tests drive [`SearchQa`] in-process through the SDK's traits; `answers` re-derives
//! every answer from the raw corpus text without the crate's parser; `bridge` runs the
//! `search-qa-env` binary; `ffi` loads the built `cdylib` as the kernel does.

mod answers;
mod bridge;
mod config;
mod episodes;
mod ffi;
mod search;
mod splits;

use cairn_plugin_sdk::{ContextVariant, Environment, Episode, Split, StepOutcome, TaskRef};
use cairn_search_qa::SearchQa;

pub fn env() -> SearchQa {
    SearchQa::from_config_json("{}").expect("the default config is valid")
}

pub fn env_with(json: &str) -> SearchQa {
    SearchQa::from_config_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

pub fn train(index: u64) -> TaskRef {
    TaskRef {
        split: Split::Train,
        index,
    }
}

pub fn test(index: u64) -> TaskRef {
    TaskRef {
        split: Split::Test,
        index,
    }
}

pub fn variant(tools_enabled: bool) -> ContextVariant {
    ContextVariant {
        label: if tools_enabled { "plain" } else { "tools-off" }.into(),
        tools_enabled,
        ..Default::default()
    }
}

/// Everything observable about one step, for exact comparisons.
#[derive(Debug, PartialEq)]
pub struct Record {
    pub action: String,
    pub outcome: StepOutcome,
    pub expert: Option<String>,
}

/// Plays `policy` until the episode ends; the first observation and one record per step.
pub fn play(
    env: &dyn Environment,
    task: TaskRef,
    seed: u64,
    tools: bool,
    mut policy: impl FnMut(&dyn Episode, u32) -> String,
) -> (cairn_plugin_sdk::Observation, Vec<Record>) {
    let mut episode = env
        .start(task, seed, &variant(tools))
        .expect("task in range");
    let first = episode.observation();
    let mut records = Vec::new();
    for turn in 0.. {
        let action = policy(episode.as_ref(), turn);
        let outcome = episode.step(&action).expect("stepping a live episode");
        let done = outcome.done;
        records.push(Record {
            action,
            outcome,
            expert: episode.expert_action(),
        });
        if done {
            break;
        }
    }
    (first, records)
}

/// The expert as a policy.
pub fn expert(episode: &dyn Episode, _turn: u32) -> String {
    episode
        .expert_action()
        .expect("the expert acts while the episode runs")
}

/// A scripted policy: a fixed list of actions, then `answer[none]`.
pub fn script(actions: &[&str]) -> impl FnMut(&dyn Episode, u32) -> String {
    let actions: Vec<String> = actions.iter().map(|s| s.to_string()).collect();
    move |_, turn| {
        actions
            .get(turn as usize)
            .cloned()
            .unwrap_or_else(|| "answer[none]".into())
    }
}

pub fn info(outcome: &StepOutcome) -> serde_json::Value {
    serde_json::from_str(&outcome.info_json).expect("info is JSON")
}

pub fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The task whose question is `text`, in either split.
pub fn task_of(env: &SearchQa, text: &str) -> TaskRef {
    for split in [Split::Train, Split::Test] {
        if let Some(i) = env.questions(split).iter().position(|q| q.text == text) {
            return TaskRef {
                split,
                index: i as u64,
            };
        }
    }
    panic!("no question `{text}`")
}
