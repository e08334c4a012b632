//! `search-qa-env`: the search-qa environment over JSON lines, for harnesses that are not
//! Rust (`examples/gateway/search_qa_agent.py` plays the same tasks through the gateway with
//! it). One request per line on stdin, one reply per line on stdout:
//!
//! | request | reply |
//! |---|---|
//! | `{"op": "info"}` | the `EnvironmentInfo` |
//! | `{"op": "task", "split": "train", "index": 0}` | the `TaskInfo` (`id`, `kind`, `goal`) |
//! | `{"op": "start", "split": "test", "index": 3, "tools": true}` | `{"episode": 1, "observation": {...}}` |
//! | `{"op": "step", "episode": 1, "action": "search[iron]"}` | the `StepOutcome`, `info` as an object |
//! | `{"op": "expert", "episode": 1}` | `{"action": "answer[26]"}` (`null` when over) |
//! | `{"op": "close", "episode": 1}` | `{"closed": true}` |
//!
//! A bad request gets `{"error": "..."}` and the process goes on; end of input ends it.
//! `--config JSON` is the plugin's config (as `[environment] config` in a pipeline).
//!
//! ```text
//! search-qa-env --config '{"max_turns": 4, "kinds": ["atomic_number"]}'
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use cairn_plugin_sdk::{Environment, Episode, Split, TaskRef};
use cairn_search_qa::{SearchQa, SearchQaEpisode};
use serde_json::{json, Value as Json};

fn task_ref(request: &Json) -> Result<TaskRef, String> {
    let split = match request["split"].as_str() {
        Some("train") | None => Split::Train,
        Some("test") => Split::Test,
        Some(other) => return Err(format!("unknown split `{other}`; use train or test")),
    };
    let index = request["index"]
        .as_u64()
        .ok_or("`index` must be a whole number")?;
    Ok(TaskRef { split, index })
}

struct Bridge {
    env: SearchQa,
    episodes: BTreeMap<u64, SearchQaEpisode>,
    next: u64,
}

impl Bridge {
    fn episode(&mut self, request: &Json) -> Result<(u64, &mut SearchQaEpisode), String> {
        let id = request["episode"]
            .as_u64()
            .ok_or("`episode` must be the id `start` returned")?;
        let episode = self
            .episodes
            .get_mut(&id)
            .ok_or(format!("no open episode {id}"))?;
        Ok((id, episode))
    }

    fn handle(&mut self, request: &Json) -> Result<Json, String> {
        match request["op"].as_str().unwrap_or_default() {
            "info" => serde_json::to_value(self.env.info()).map_err(|e| e.to_string()),
            "task" => {
                let info = self
                    .env
                    .task(task_ref(request)?)
                    .map_err(|e| e.to_string())?;
                serde_json::to_value(info).map_err(|e| e.to_string())
            }
            "start" => {
                let tools = request["tools"].as_bool().unwrap_or(true);
                let episode = self
                    .env
                    .episode(task_ref(request)?, tools)
                    .map_err(|e| e.to_string())?;
                self.next += 1;
                let observation = episode.observation();
                self.episodes.insert(self.next, episode);
                Ok(json!({"episode": self.next, "observation": observation}))
            }
            "step" => {
                let action = request["action"]
                    .as_str()
                    .ok_or("`action` must be the response text")?
                    .to_string();
                let (_, episode) = self.episode(request)?;
                let outcome = episode.step(&action).map_err(|e| e.to_string())?;
                let mut value = serde_json::to_value(&outcome).map_err(|e| e.to_string())?;
                value["info"] = serde_json::from_str(&outcome.info_json).unwrap_or(Json::Null);
                value
                    .as_object_mut()
                    .expect("an object")
                    .remove("info_json");
                Ok(value)
            }
            "expert" => {
                let (_, episode) = self.episode(request)?;
                Ok(json!({"action": episode.expert_action()}))
            }
            "close" => {
                let (id, _) = self.episode(request)?;
                self.episodes.remove(&id);
                Ok(json!({"closed": true}))
            }
            other => Err(format!(
                "unknown op `{other}`; use info, task, start, step, expert or close"
            )),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match args.as_slice() {
        [] => String::new(),
        [flag, json] if flag == "--config" => json.clone(),
        _ => {
            eprintln!("usage: search-qa-env [--config JSON]");
            std::process::exit(2);
        }
    };
    let env = match SearchQa::from_config_json(&config) {
        Ok(env) => env,
        Err(e) => {
            eprintln!("search-qa-env: {e}");
            std::process::exit(1);
        }
    };
    let mut bridge = Bridge {
        env,
        episodes: BTreeMap::new(),
        next: 0,
    };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Json>(&line) {
            Ok(request) => bridge
                .handle(&request)
                .unwrap_or_else(|e| json!({"error": e})),
            Err(e) => json!({"error": format!("not a JSON request: {e}")}),
        };
        if writeln!(stdout, "{reply}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
}
