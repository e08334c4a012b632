//! Prints one expert episode per task kind, the expert's mean episode length per kind and
//! split, and the vocabulary size of the text a tokenizer would be trained on.
//!
//! `cargo run -p cairn-household --example household_demo [-- EPISODES]`

use std::collections::{BTreeMap, BTreeSet};

use cairn_household::{Household, HouseholdConfig, TaskKind};
use cairn_plugin_sdk::{Environment, Episode, Split, TaskRef};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let episodes: u64 = std::env::args().nth(1).map_or(Ok(2000), |a| a.parse())?;
    let env = Household::new(HouseholdConfig::default())?;

    for (k, kind) in TaskKind::ALL.iter().enumerate() {
        let task = TaskRef {
            split: Split::Train,
            index: k as u64,
        };
        let mut episode = env.episode(task)?;
        println!("== {} ({})", kind.name(), env.task(task)?.id);
        println!("   obs: {}", episode.observation().text);
        while let Some(action) = episode.expert_action() {
            let out = episode.step(&action)?;
            println!(
                "   act: {action}   [reward {} feedback {}]",
                out.reward, out.feedback
            );
            println!("   obs: {}", out.observation.text);
        }
        println!();
    }

    let mut vocabulary = BTreeSet::new();
    let mut lengths: BTreeMap<(&str, &str), (u64, u64, u64)> = BTreeMap::new();
    let mut words_per_obs = (0u64, 0u64, 0usize);
    for split in [Split::Train, Split::Test] {
        let count = match split {
            Split::Train => episodes,
            Split::Test => episodes.min(env.config().test_tasks),
        };
        for index in 0..count {
            let task = TaskRef { split, index };
            let kind = env.kind(task)?.name();
            let mut episode = env.episode(task)?;
            // Everything a tokenizer would see: the goal, each observation, each action.
            let mut texts = vec![episode.goal(), episode.observation().text];
            let mut steps = 0;
            while let Some(action) = episode.expert_action() {
                let out = episode.step(&action)?;
                texts.push(action);
                texts.push(out.observation.text);
                steps += 1;
            }
            for (i, text) in texts.iter().enumerate() {
                let words = text.split_whitespace();
                if i == 1 || (i > 1 && i % 2 == 1) {
                    let n = words.clone().count();
                    words_per_obs.0 += n as u64;
                    words_per_obs.1 += 1;
                    words_per_obs.2 = words_per_obs.2.max(n);
                }
                vocabulary.extend(words.map(String::from));
            }
            let entry = lengths.entry((split.as_str(), kind)).or_default();
            entry.0 += 1;
            entry.1 += steps;
            entry.2 = entry.2.max(steps);
        }
    }
    println!("expert episode length (mean, max) per split and kind:");
    for ((split, kind), (n, total, max)) in &lengths {
        println!(
            "   {split:5} {kind:24} {:5.2} {max:3}   ({n} episodes)",
            *total as f64 / *n as f64
        );
    }
    println!(
        "observation words: mean {:.1}, max {} over {} observations",
        words_per_obs.0 as f64 / words_per_obs.1 as f64,
        words_per_obs.2,
        words_per_obs.1
    );
    println!(
        "vocabulary: {} distinct words (goals, observations, expert actions)",
        vocabulary.len()
    );

    // Add what other policies can make the environment say, and every admissible action.
    for index in 0..episodes {
        let task = TaskRef {
            split: Split::Train,
            index,
        };
        let mut episode = env.episode(task)?;
        for turn in 0..env.config().max_turns {
            let observation = episode.observation();
            vocabulary.extend(observation.text.split_whitespace().map(String::from));
            for action in &observation.admissible_actions {
                vocabulary.extend(action.split_whitespace().map(String::from));
            }
            let actions = &observation.admissible_actions;
            if actions.is_empty() {
                break;
            }
            // A fixed pseudo-random pick, with an invalid action now and then.
            let pick = (index * 7919 + u64::from(turn) * 104_729) % 11;
            let action = match pick {
                0 => "jump",
                _ => actions[pick as usize % actions.len()].as_str(),
            };
            episode.step(action)?;
        }
    }
    println!(
        "vocabulary adding admissible actions and a scripted random policy: {}",
        vocabulary.len()
    );
    Ok(())
}
