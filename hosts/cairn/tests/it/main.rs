//! End-to-end tests of the `cairn` binary: a smoke run of the whole pipeline on a tiny model,
//! resume after a kill, and the bad inputs that must give an error naming the thing.
//!
//! Plugins are found next to the binary (`target/<profile>/`), where `cargo build --workspace`
//! puts them (scripts/test.sh builds before testing).

mod bad_input;
mod bank;
mod check;
mod engine;
mod faults;
mod gateway;
mod gateway_auth;
mod import;
mod logprobs;
mod outputs;
mod pipeline;
mod pool;
mod resume;
mod scaffolds;
mod search_qa;
mod skills;
mod smoke;
mod tools;
mod ui;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A tiny pipeline: a 1-layer scratch model, 2 groups of 4 per step, a 4-demonstration warm
/// start, 4 held-out tasks. `extra` is appended (later keys of a table cannot repeat earlier
/// ones, so callers replace whole lines with `replace` instead when needed).
pub fn tiny_config(run_dir: &Path, steps: u64) -> String {
    format!(
        r#"[run]
dir = "{dir}"
seed = 3
steps = {steps}
checkpoint_every = 1

[environment]
plugin = "household"
config = {{ max_turns = 14 }}

[algorithm]
plugin = "grpo"

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
max_turns = 6

[optimizer]
lr = 1e-3
micro_batch_rows = 16

[warm_start]
demonstrations = 4
epochs = 1
lr = 1e-3
batch_rows = 16

[eval]
tasks = 4
"#,
        dir = run_dir.display()
    )
}

/// Writes `text` as a config file in `dir` and returns its path.
pub fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

/// Runs `cairn` with `args`.
pub fn cairn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_LOG", "error")
        .output()
        .expect("run cairn")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Lines of a JSONL file, parsed.
pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}
