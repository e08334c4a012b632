//! Plays one task with the expert and prints every observation and action: what the policy
//! sees.
//!
//! ```text
//! cargo run -p cairn-search-qa --example play -- [train|test] INDEX ['CONFIG JSON'] [--tools-off]
//! ```

use cairn_plugin_sdk::{Episode, Split, TaskRef};
use cairn_search_qa::SearchQa;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = if args.first().map(String::as_str) == Some("test") {
        Split::Test
    } else {
        Split::Train
    };
    let index = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let config = args
        .get(2)
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_default();
    let tools = !args.iter().any(|a| a == "--tools-off");
    let env = match SearchQa::from_config_json(&config) {
        Ok(env) => env,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut episode = match env.episode(TaskRef { split, index }, tools) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "task {}: {}\n",
        episode.question().id,
        episode.question().answer
    );
    while let Some(action) = episode.expert_action() {
        let observation = episode.observation();
        println!(
            "--- observation ({} words)\n{}",
            observation.text.split_whitespace().count(),
            observation.text
        );
        println!("--- anchor: {}", observation.anchor.unwrap_or_default());
        println!("> {action}");
        let outcome = episode.step(&action).expect("a live episode");
        println!(
            "reward {} feedback {} tool_calls {} done {}\n",
            outcome.reward, outcome.feedback, outcome.tool_calls, outcome.done
        );
    }
}
