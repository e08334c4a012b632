//! Integration tests for the household plugin, in one binary (see `style.md`).
//!
//! Most tests drive [`Household`] in-process through the SDK's [`Environment`] trait; `ffi`
//! also goes through the FFI adapter and through the built `cdylib`.

mod config;
mod episodes;
mod expert;
mod ffi;
mod knowledge;
mod splits;

use cairn_household::{Household, HouseholdConfig};
use cairn_plugin_sdk::{ContextVariant, Environment, Episode, Split, StepOutcome, TaskRef};

pub fn env() -> Household {
    Household::new(HouseholdConfig::default()).expect("default config is valid")
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

/// Everything observable about one step, for exact comparisons.
#[derive(Debug, PartialEq)]
pub struct Record {
    pub action: String,
    pub outcome: StepOutcome,
    pub expert: Option<String>,
}

/// Plays `policy` from the start of an episode until it ends; returns the first observation
/// text and one record per step.
pub fn play(
    env: &dyn Environment,
    task: TaskRef,
    seed: u64,
    mut policy: impl FnMut(&dyn Episode, u32) -> String,
) -> (String, Vec<Record>) {
    let mut episode = env
        .start(task, seed, &ContextVariant::default())
        .expect("task in range");
    let first = episode.observation().text;
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

/// A fixed scripted "random" policy: mostly admissible actions picked by a hash of
/// `(seed, turn)`, sometimes text the environment must reject.
pub fn scripted(seed: u64) -> impl FnMut(&dyn Episode, u32) -> String {
    move |episode, turn| {
        let h = hash(seed.wrapping_mul(1_000_003) ^ u64::from(turn));
        const JUNK: [&str; 6] = [
            "",
            "jump",
            "go to cabinet 99",
            "take apple",
            "look .",
            "  put  ",
        ];
        if h.is_multiple_of(5) {
            return JUNK[(h / 5 % JUNK.len() as u64) as usize].to_string();
        }
        let actions = episode.observation().admissible_actions;
        let action = &actions[(h / 5 % actions.len() as u64) as usize];
        // Loose whitespace and case must be accepted as the same action.
        if h.is_multiple_of(7) {
            format!("  {}\n", action.to_uppercase())
        } else {
            action.clone()
        }
    }
}

/// SplitMix64's mixer, for the scripted policy.
pub fn hash(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
