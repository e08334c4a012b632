//! search-qa (docs/search-qa.md) through the `cairn` binary: the example configs check, a bad
//! corpus is refused before anything runs, EAPO's tool-free slots on the first environment
//! with a tool (no schema, never a search run), and the chat path: the Python harness
//! `examples/gateway/search_qa_agent.py` plays the plugin's tasks (through the
//! `search-qa-env` bridge) with the official `openai` client against `cairn train` with a
//! gateway source on loopback, and the step trains on its episodes with its rewards.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{cairn, jsonl, stderr, stdout, write_config};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The bridge binary, built beside `cairn` by `cargo build --workspace` (scripts/test.sh).
fn bridge() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_cairn")).with_file_name("search-qa-env");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` (scripts/test.sh does) before the tests",
        path.display()
    );
    path
}

#[test]
fn the_search_qa_examples_check() {
    for (example, expect) in [
        ("examples/search-qa-grpo.toml", "search-qa"),
        ("examples/search-qa-eapo.toml", "eapo"),
        ("examples/gateway/search_qa.toml", "gateway harness"),
    ] {
        let path = repo().join(example);
        let out = cairn(&["check", path.to_str().unwrap()]);
        assert!(out.status.success(), "{example}: {}", stderr(&out));
        assert!(stdout(&out).contains(expect), "{example}: {}", stdout(&out));
    }
    let out = cairn(&[
        "check",
        repo()
            .join("examples/search-qa-grpo.toml")
            .to_str()
            .unwrap(),
    ]);
    assert!(
        stdout(&out).contains("tasks        194 train, 42 held-out, up to 3 turns"),
        "{}",
        stdout(&out)
    );
}

/// A tiny pipeline on search-qa: 2 groups of 4, a 1-layer scratch model, 4 demonstrations.
fn tiny(run: &Path, environment: &str, algorithm: &str) -> String {
    format!(
        r#"[run]
dir = "{dir}"
seed = 4
steps = 1

[environment]
plugin = "search-qa"
config = {environment}

[algorithm]
{algorithm}

[model]
device = "cpu"

[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
tokenizer_episodes = 30

[rollout]
tasks_per_step = 2
group_size = 4
temperature = 1.0
max_new_tokens = 8
max_turns = 3

[optimizer]
lr = 1e-3
micro_batch_rows = 16

[warm_start]
demonstrations = 4
epochs = 1
lr = 1e-3
batch_rows = 16

[eval]
tasks = 2
"#,
        dir = run.display()
    )
}

#[test]
fn a_missing_or_corrupt_corpus_fails_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("corrupt.txt");
    std::fs::write(
        &bad,
        "iron\nSymbol: Fe\nAtomic number: twenty-six\nAtomic weight: 55.847\nMetal.\n",
    )
    .unwrap();
    for (corpus, expect) in [
        (tmp.path().join("missing.txt"), "cannot read `".to_string()),
        (
            bad.clone(),
            "entry 1 (`iron`, line 1): `Atomic number: twenty-six` is not a whole number"
                .to_string(),
        ),
    ] {
        let run = tmp.path().join("run");
        let env = format!(r#"{{ corpus = "{}" }}"#, corpus.display());
        let cfg = write_config(
            tmp.path(),
            "bad.toml",
            &tiny(&run, &env, "plugin = \"grpo\""),
        );
        for command in ["check", "train"] {
            let out = cairn(&[command, cfg.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(1), "{command}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.contains("search-qa config key `corpus`")
                    && err.contains(&corpus.display().to_string())
                    && err.contains(&expect),
                "{command}: {err}"
            );
            assert!(!run.exists(), "{command}: nothing was written");
        }
    }
}

/// EAPO on search-qa: the tool-free slots of every group see no tool schema and no mention of
/// searching, and none of their turns runs a search; the tools-on slots are offered the tool.
#[test]
fn eapo_tool_free_slots_never_search() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = tiny(
        &run,
        r#"{ kinds = ["atomic_number", "symbol"], max_turns = 3, top_k = 2, passage_words = 16 }"#,
        "plugin = \"eapo\"\nconfig = { tool_free_slots = 2 }",
    );
    let cfg = write_config(tmp.path(), "eapo.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<Value> = crate::pool::rows(&run, Some("rollout"))
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert!(!rows.is_empty());
    let off: Vec<&Value> = rows
        .iter()
        .filter(|r| r["variant"]["tools_enabled"] == false)
        .collect();
    let on: Vec<&Value> = rows
        .iter()
        .filter(|r| r["variant"]["tools_enabled"] == true)
        .collect();
    assert!(!off.is_empty() && !on.is_empty());
    for r in &off {
        assert_eq!(r["variant"]["label"], "tools-off");
        assert_eq!(r["tool_calls"], 0, "{r}");
        assert_ne!(r["info"]["action"], "search", "{r}");
        let observation = r["observation"].as_str().unwrap().to_lowercase();
        assert!(!observation.contains("search"), "{observation}");
        assert!(
            observation.contains("reply with answer[text]"),
            "{observation}"
        );
    }
    for r in &on {
        assert!(
            r["observation"].as_str().unwrap().contains("search[query]"),
            "{r}"
        );
    }
    // The first prompt of a tools-on slot holds the tool schema line; a tools-off one of the
    // same task does not, so it is shorter.
    for off_row in off.iter().filter(|r| r["turn"] == 0) {
        let on_row = on
            .iter()
            .find(|r| r["turn"] == 0 && r["task_id"] == off_row["task_id"])
            .expect("a tools-on slot of the same task");
        let len = |r: &Value| r["prompt_ids"].as_array().unwrap().len();
        assert!(
            len(on_row) > len(off_row),
            "tools-on prompt carries the schema"
        );
    }
    let metrics = jsonl(&run.join("metrics.jsonl"));
    let rl = metrics
        .iter()
        .find(|m| m["phase"] == "rl")
        .expect("an RL step");
    assert!(rl["eapo/tool_calls_mean"].is_number(), "{rl}");
}

fn python() -> PathBuf {
    let python = repo().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh (it creates .venv and installs openai)",
        python.display()
    );
    python
}

/// A `cairn train` child whose gateway address was read from its stderr.
struct Gateway {
    child: Child,
    url: String,
    stderr: mpsc::Receiver<String>,
}

impl Gateway {
    fn start(config: &Path) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["train", config.to_str().unwrap()])
            .env("CAIRN_LOG", "warn")
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start cairn");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("gateway: listening on ") {
                        return Gateway {
                            child,
                            url: addr.trim().to_string(),
                            stderr: rx,
                        };
                    }
                    seen.push(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("cairn did not start its gateway:\n{}", seen.join("\n"));
    }

    /// Waits for the run to end by itself and succeed.
    fn wait(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let log: Vec<String> = self.stderr.try_iter().collect();
                assert!(
                    status.success(),
                    "cairn failed ({status}):\n{}",
                    log.join("\n")
                );
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("cairn did not finish in {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The chat path: 2 search-qa tasks × 2 episodes played by the harness through the gateway
/// (the tool offered in `tools`, the Qwen3 template rendering it) train one GRPO step; every
/// row is one of the harness's episodes, under the question's task id, with the reward the
/// environment gave, and every returned id is trained on once.
#[test]
fn the_search_qa_harness_trains_through_the_gateway() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let tokenizer = repo().join("kernel/fixtures/text/qwen3");
    let text = format!(
        r#"[run]
dir = "{run}"
seed = 5
steps = 1

[source]
kind = "gateway"
bind = "127.0.0.1:0"

[algorithm]
plugin = "grpo"

[model]
device = "cpu"
threads = 1

[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
tokenizer = "{tokenizer}"

[rollout]
tasks_per_step = 2
group_size = 2
temperature = 1.0
max_new_tokens = 12
max_turns = 3

[optimizer]
lr = 1e-3
"#,
        run = run.display(),
        tokenizer = tokenizer.display()
    );
    let cfg = write_config(tmp.path(), "gateway.toml", &text);
    let gateway = Gateway::start(&cfg);
    let log = tmp.path().join("episodes.json");
    let script = repo().join("examples/gateway/search_qa_agent.py");
    let out = Command::new(python())
        .args([
            script.to_str().unwrap(),
            "--base-url",
            &gateway.url,
            "--env-bin",
            bridge().to_str().unwrap(),
            "--env-config",
            r#"{"kinds": ["atomic_number", "discoverer_by_number"], "max_turns": 3, "top_k": 2, "passage_words": 12}"#,
            "--tasks",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "12",
            "--log",
            log.to_str().unwrap(),
        ])
        .current_dir(repo())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "harness failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    gateway.wait(Duration::from_secs(180));
    let summary: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(summary["episodes"], 4);

    let episodes: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
    assert_eq!(episodes.len(), 4);
    let tasks: std::collections::BTreeSet<&str> = episodes
        .iter()
        .map(|e| e["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        tasks.iter().copied().collect::<Vec<_>>().len(),
        2,
        "two tasks, two episodes each"
    );
    for t in &tasks {
        assert!(t.starts_with("search-qa/train/"), "{t}");
    }
    let rows: Vec<Value> = crate::pool::rows(&run, Some("gateway"))
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let mut returned = 0;
    let mut trained = 0;
    for e in &episodes {
        let id = e["episode_id"].as_str().unwrap();
        let calls = e["calls"].as_array().unwrap();
        assert!(!calls.is_empty() && calls.len() <= 3, "{e}");
        assert_eq!(e["turns"].as_u64().unwrap() as usize, calls.len());
        returned += calls
            .iter()
            .map(|c| c["token_ids"].as_array().unwrap().len())
            .sum::<usize>();
        let mine: Vec<&Value> = rows
            .iter()
            .filter(|r| r["info"]["episode_id"] == id)
            .collect();
        assert!(!mine.is_empty(), "episode {id} was trained on");
        for r in &mine {
            assert_eq!(r["task_id"], e["task_id"], "{id}");
            assert_eq!(r["episode_reward"].as_f64(), e["reward"].as_f64(), "{id}");
            trained += r["response_mask"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m.as_u64() == Some(1))
                .count();
        }
    }
    assert_eq!(trained, returned, "every returned id trained once");
    let metrics = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(metrics.iter().filter(|m| m["phase"] == "rl").count(), 1);
}
