//! Measures what knowing the homes is worth in the knowledge regime: the share of training tasks
//! the blind expert solves within `max_turns`, the share a scripted policy that searches the
//! home kind first solves, and how often the home kind heads the first `unsearched :` list
//! (over all tasks, and over those the blind expert solves).
//!
//! `cargo run -p cairn-household --example knowledge_rates [-- TASKS [CONFIG_JSON]]`
//! (default: 600 tasks of the suggested config in the crate docs).

use cairn_household::Household;
use cairn_plugin_sdk::{ContextVariant, Environment, Episode, Split, TaskRef};

const SUGGESTED: &str = r#"{"knowledge": true, "max_turns": 8, "max_expert_steps": 20,
    "min_receptacles": 12, "max_receptacles": 14,
    "task_kinds": ["pick_and_place", "look_at_obj_in_light", "pick_clean_then_place",
                   "pick_heat_then_place", "pick_cool_then_place"]}"#;

/// The places of the observation's `unsearched :` list, in order.
fn unsearched(text: &str) -> Vec<String> {
    text.split_once("unsearched : ")
        .map(|(_, rest)| {
            rest.trim_end_matches(" .")
                .split(" , ")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The expert, except that a search goes to the first listed instance of `home` first.
fn knowing(episode: &dyn Episode, home: &str) -> Option<String> {
    let expert = episode.expert_action()?;
    let listed = unsearched(&episode.observation().text);
    let searching = expert
        .strip_prefix("go to ")
        .is_some_and(|r| listed.iter().any(|p| p == r));
    let at_home = listed
        .iter()
        .find(|p| p.rsplit_once(' ').is_some_and(|(kind, _)| kind == home));
    match at_home {
        Some(place) if searching => Some(format!("go to {place}")),
        _ => Some(expert),
    }
}

fn solved(
    env: &Household,
    task: TaskRef,
    mut policy: impl FnMut(&dyn Episode) -> Option<String>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let mut episode = env.start(task, 0, &ContextVariant::default())?;
    while let Some(action) = policy(episode.as_ref()) {
        let out = episode.step(&action)?;
        if out.done {
            return Ok(out.success);
        }
    }
    Ok(false)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tasks: u64 = std::env::args().nth(1).map_or(Ok(600), |a| a.parse())?;
    let config = std::env::args()
        .nth(2)
        .unwrap_or_else(|| SUGGESTED.to_string());
    let env = Household::from_config_json(&config)?;
    // A config with fewer training tasks (`train_tasks`) is measured on all of them.
    let tasks = tasks.min(cairn_plugin_sdk::Environment::info(&env).train_tasks);
    let (mut blind, mut knows, mut first, mut first_solved) = (0u64, 0u64, 0u64, 0u64);
    for index in 0..tasks {
        let task = TaskRef {
            split: Split::Train,
            index,
        };
        let home = env
            .home(task)?
            .ok_or("the config must set knowledge = true")?;
        let listed = unsearched(&env.episode(task)?.observation().text);
        let home_first = listed
            .first()
            .is_some_and(|p| p.rsplit_once(' ').is_some_and(|(kind, _)| kind == home));
        let blind_solved = solved(&env, task, |e| e.expert_action())?;
        first += u64::from(home_first);
        blind += u64::from(blind_solved);
        first_solved += u64::from(home_first && blind_solved);
        knows += u64::from(solved(&env, task, |e| knowing(e, home))?);
    }
    let share = |n: u64| n as f64 / tasks as f64;
    println!("config: {config}");
    println!(
        "{tasks} training tasks: blind expert {:.3}, knows the homes {:.3}, home kind first in \
         the list {:.3}",
        share(blind),
        share(knows),
        share(first)
    );
    // Expert demonstrations that keep only solved episodes over-sample these tasks.
    println!(
        "among the tasks the blind expert solves, the home kind is first in {:.3}",
        first_solved as f64 / blind.max(1) as f64
    );
    Ok(())
}
