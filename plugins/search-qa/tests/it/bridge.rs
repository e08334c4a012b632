//! The `search-qa-env` bridge: the environment over JSON lines, as the gateway harness uses it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use super::{env, expert, play, train};

struct Bridge {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Bridge {
    fn start(config: &str) -> Bridge {
        let mut child = Command::new(env!("CARGO_BIN_EXE_search-qa-env"))
            .args(["--config", config])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start search-qa-env");
        let out = BufReader::new(child.stdout.take().unwrap());
        Bridge { child, out }
    }

    fn ask(&mut self, request: &str) -> Value {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{request}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn the_bridge_plays_the_same_episodes() {
    let mut b = Bridge::start(r#"{"max_turns": 5}"#);
    let info = b.ask(r#"{"op": "info"}"#);
    assert_eq!(info["train_tasks"], 524);
    assert_eq!(info["tools"], true);
    let task = b.ask(r#"{"op": "task", "split": "train", "index": 2}"#);
    let mine = cairn_plugin_sdk::Environment::task(&env(), train(2)).unwrap();
    assert_eq!(task, serde_json::to_value(&mine).unwrap());
    let (first, records) = play(
        &super::env_with(r#"{"max_turns": 5}"#),
        train(2),
        0,
        true,
        expert,
    );
    let started = b.ask(r#"{"op": "start", "split": "train", "index": 2, "tools": true}"#);
    assert_eq!(
        started["observation"],
        serde_json::to_value(&first).unwrap()
    );
    let id = started["episode"].as_u64().unwrap();
    for record in &records {
        let action = b.ask(&json!({"op": "expert", "episode": id}).to_string());
        assert_eq!(action["action"], record.action.as_str());
        let out = b.ask(&json!({"op": "step", "episode": id, "action": record.action}).to_string());
        assert_eq!(out["reward"], json!(record.outcome.reward));
        assert_eq!(out["done"], record.outcome.done);
        assert_eq!(out["tool_calls"], record.outcome.tool_calls);
        assert_eq!(
            out["observation"]["text"],
            record.outcome.observation.text.as_str()
        );
        let info: Value = serde_json::from_str(&record.outcome.info_json).unwrap();
        assert_eq!(out["info"], info);
    }
    assert_eq!(records.last().unwrap().outcome.reward, 1.0);
    let over = b.ask(&json!({"op": "expert", "episode": id}).to_string());
    assert_eq!(over["action"], Value::Null);
    // Tools off through the bridge: refused.
    let started = b.ask(r#"{"op": "start", "split": "test", "index": 0, "tools": false}"#);
    let off = started["episode"].as_u64().unwrap();
    assert_eq!(started["observation"].get("tools"), None);
    let out = b.ask(&json!({"op": "step", "episode": off, "action": "search[iron]"}).to_string());
    assert_eq!(
        (out["feedback"].as_i64(), out["tool_calls"].as_u64()),
        (Some(-1), Some(0))
    );
    assert_eq!(out["info"]["refused_tool_call"], true);
    // Bad requests are answered with an error and the bridge goes on.
    for (request, expect) in [
        ("not json", "not a JSON request"),
        (r#"{"op": "fly"}"#, "unknown op `fly`"),
        (
            r#"{"op": "task", "split": "dev", "index": 0}"#,
            "unknown split `dev`",
        ),
        (
            r#"{"op": "task", "split": "test", "index": 999}"#,
            "no task 999",
        ),
        (
            r#"{"op": "step", "episode": 77, "action": "x"}"#,
            "no open episode 77",
        ),
        (
            &json!({"op": "step", "episode": id, "action": "x"}).to_string(),
            "step after the episode ended",
        ),
    ] {
        let reply = b.ask(request);
        let message = reply["error"].as_str().unwrap_or_else(|| panic!("{reply}"));
        assert!(message.contains(expect), "{request}: {message}");
    }
    assert_eq!(
        b.ask(&json!({"op": "close", "episode": id}).to_string())["closed"],
        true
    );
    assert!(b.ask(&json!({"op": "expert", "episode": id}).to_string())["error"].is_string());
}

#[test]
fn a_bad_config_stops_the_bridge_with_the_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_search-qa-env"))
        .args(["--config", r#"{"top_k": 0}"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`top_k`: is 0"), "{stderr}");
}
