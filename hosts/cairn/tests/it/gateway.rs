//! The gateway end to end: the Python `openai` client plays episodes against `cairn train`
//! with a gateway source on loopback, and the one training step consumes exactly the ids the
//! API returned; the run then ends under requests in flight and exits cleanly; bad input
//! against `cairn serve` gets OpenAI errors and disturbs nothing.
//!
//! Streams are sent as the ids are sampled: their chunks concatenate to the non-streaming
//! answer, and a client that closes a stream after its first chunk stops the generation.
//! SmolLM2-135M-Instruct, imported from the set-up GGUF, answers the `openai` client through
//! `cairn serve`.
//!
//! The model is a 1-layer random Qwen3-layout model with the committed Qwen3 tokenizer
//! fixture (its chat template renders tools), except in the SmolLM2 test. Python comes from
//! the project's `.venv` (scripts/setup.sh installs `openai` there); a missing venv fails with
//! that instruction.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{jsonl, write_config};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's python, with `openai` importable.
fn python() -> PathBuf {
    let python = repo().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh (it creates .venv and installs scripts/requirements.txt)",
        python.display()
    );
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .status()
        .expect("run the venv python");
    assert!(
        ok.success(),
        "the venv has no `openai` package: run scripts/setup.sh (scripts/requirements.txt lists it)"
    );
    python
}

pub(crate) fn gateway_config(run: &Path, steps: u64, extra_source: &str) -> String {
    let tokenizer = repo().join("kernel/fixtures/text/qwen3");
    format!(
        r#"[run]
dir = "{run}"
seed = 5
steps = {steps}

[source]
kind = "gateway"
bind = "127.0.0.1:0"
{extra_source}

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
tasks_per_step = 3
group_size = 2
temperature = 0.7
max_new_tokens = 8
max_turns = 4

[optimizer]
lr = 1e-3
"#,
        run = run.display(),
        tokenizer = tokenizer.display()
    )
}

/// A `cairn` child whose gateway address was read from its stderr.
pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) url: String,
    stderr: mpsc::Receiver<String>,
}

impl Gateway {
    pub(crate) fn start(args: &[&str]) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
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
        panic!(
            "cairn did not start its gateway; stderr:\n{}",
            seen.join("\n")
        );
    }

    /// Waits for the process to exit by itself and succeed; its whole stderr (after the
    /// address line), read to the end, so nothing printed while the process exits is missed.
    fn wait(mut self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut log = Vec::new();
                // The reader thread ends at EOF, which follows the exit at once.
                while let Ok(line) = self.stderr.recv_timeout(Duration::from_secs(10)) {
                    log.push(line);
                }
                assert!(
                    status.success(),
                    "cairn failed ({status}):\n{}",
                    log.join("\n")
                );
                return log.join("\n");
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let log: Vec<String> = self.stderr.try_iter().collect();
                panic!("cairn did not finish in {limit:?}:\n{}", log.join("\n"));
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

fn run_python(args: &[&str]) -> String {
    let out = Command::new(python())
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

/// The e2e check: every trained row is built from the calls' returned ids (prompt of the
/// first call, sampled ids with mask 1, the next prompt's extra ids with mask 0), the sampled
/// log-probs are those the API reported, and every returned id is trained on exactly once.
///
/// Shutdown (issue 10, item 5): the step's last group is rewarded while harness clients keep
/// long requests in flight, so the run ends under them. It must exit 0 with no panic on
/// stderr (a generation still running as the process tore libtorch down used to panic in a
/// linear layer), and every request in flight must be answered or refused with a 503, never
/// cut or left hanging.
#[test]
fn gateway_episodes_train_on_exactly_the_returned_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // Three groups from the minimal agent, the fourth from the shutdown script.
    let text = gateway_config(&run, 1, "").replace("tasks_per_step = 3", "tasks_per_step = 4");
    let cfg = write_config(tmp.path(), "gateway.toml", &text);
    let gateway = Gateway::start(&["train", cfg.to_str().unwrap()]);
    let log = tmp.path().join("calls.json");
    let script = repo().join("examples/gateway/minimal_agent.py");
    run_python(&[
        script.to_str().unwrap(),
        "--base-url",
        &gateway.url,
        "--tasks",
        "2",
        "--group-size",
        "2",
        "--token-episodes",
        "2",
        "--log",
        log.to_str().unwrap(),
    ]);
    let late = repo().join("hosts/cairn/tests/it/gateway_shutdown.py");
    let late = run_python(&[late.to_str().unwrap(), "--base-url", &gateway.url]);
    let stderr = gateway.wait(Duration::from_secs(180));
    assert!(
        !stderr.contains("panicked"),
        "a thread panicked after training:\n{stderr}"
    );
    check_requests_in_flight_at_shutdown(
        &serde_json::from_str(late.trim()).expect("a JSON summary"),
    );

    let episodes: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
    assert_eq!(episodes.len(), 6);
    // The step's rows, as the data pool recorded them (source `gateway`).
    let recorded = crate::pool::rows(&run, Some("gateway"));
    let steps: std::collections::BTreeSet<&String> = recorded.iter().map(|(s, _)| s).collect();
    assert_eq!(steps.len(), 1, "{steps:?}");
    let rows: Vec<Value> = recorded.iter().map(|(_, r)| r.clone()).collect();

    let mut returned_tokens = 0;
    let mut trained_tokens = 0;
    let mut merged_rows = 0;
    for episode in &episodes {
        let id = episode["episode_id"].as_str().unwrap();
        let calls = episode["calls"].as_array().unwrap();
        returned_tokens += calls
            .iter()
            .map(|c| ids(&c["token_ids"]).len())
            .sum::<usize>();
        let mine: Vec<&Value> = rows
            .iter()
            .filter(|r| r["info"]["episode_id"] == id)
            .collect();
        assert!(!mine.is_empty(), "episode {id} was not trained on");
        for row in mine {
            let members: Vec<usize> = row["info"]["calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c[0].as_u64().unwrap() as usize)
                .collect();
            merged_rows += usize::from(members.len() > 1);
            let first = &calls[members[0]];
            assert_eq!(
                ids(&row["prompt_ids"]),
                ids(&first["prompt_token_ids"]),
                "{id}"
            );
            // Rebuild the row from the calls: sampled ids (mask 1), then the next prompt's
            // ids past them (mask 0).
            let (mut expect_ids, mut expect_mask, mut expect_lp) = (vec![], vec![], vec![]);
            let mut so_far = ids(&first["prompt_token_ids"]);
            for (k, &c) in members.iter().enumerate() {
                let call = &calls[c];
                if k > 0 {
                    let prompt = ids(&call["prompt_token_ids"]);
                    assert_eq!(prompt[..so_far.len()], so_far[..], "merged prompt extends");
                    let observation = &prompt[so_far.len()..];
                    expect_ids.extend_from_slice(observation);
                    expect_mask.extend(std::iter::repeat_n(0, observation.len()));
                    expect_lp.extend(std::iter::repeat_n(0.0, observation.len()));
                    so_far = prompt;
                }
                let sampled = ids(&call["token_ids"]);
                expect_ids.extend_from_slice(&sampled);
                expect_mask.extend(std::iter::repeat_n(1, sampled.len()));
                let logprobs: Vec<f64> = call["logprobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                assert_eq!(logprobs.len(), sampled.len());
                expect_lp.extend(logprobs);
                so_far.extend(sampled);
            }
            assert_eq!(ids(&row["response_ids"]), expect_ids, "{id}");
            assert_eq!(ids(&row["response_mask"]), expect_mask, "{id}");
            let lp: Vec<f64> = row["response_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            for (a, b) in lp.iter().zip(&expect_lp) {
                assert!(
                    (a - b).abs() < 1e-6,
                    "{id}: trained log-prob {a} vs returned {b}"
                );
            }
            assert_eq!(
                row["episode_reward"].as_f64(),
                episode["reward"].as_f64(),
                "{id}"
            );
            trained_tokens += expect_mask.iter().filter(|&&m| m == 1).count();
        }
        // trl #4159: episode calls are sampled at the training temperature (0.7), whatever
        // the harness asked (1.0), and the response says so.
        for call in calls.iter().filter(|c| !c["cairn"].is_null()) {
            assert_eq!(call["cairn"]["temperature"].as_f64(), Some(0.7f32 as f64));
        }
    }
    assert_eq!(
        trained_tokens, returned_tokens,
        "every returned id trained once"
    );
    assert!(
        merged_rows >= 2,
        "the token-level episodes merge their calls"
    );

    let metrics = jsonl(&run.join("metrics.jsonl"));
    let rl: Vec<&Value> = metrics.iter().filter(|m| m["phase"] == "rl").collect();
    assert_eq!(rl.len(), 1);
    // The log-probs the gateway reported are those the trainer recomputes (same
    // temperature, same ids): the importance ratio starts at 1.
    let mismatch = rl[0]["logprob_mismatch/max_abs"].as_f64().unwrap();
    assert!(
        mismatch < 1e-3,
        "reported vs trained log-probs differ by {mismatch}"
    );
    assert_eq!(rl[0]["policy_version"].as_u64(), Some(1));
}

/// Each request the shutdown script's clients sent around the end of the run was answered
/// (200), refused with the OpenAI-style 503 that names it and says what to do, or, once the
/// server had stopped accepting, refused a connection at once. None hung, and none was held
/// and then dropped (that fails only after the server's shutdown grace, 1 s). At least one
/// request was waiting in the gateway's queue when the run ended, and got the 503.
fn check_requests_in_flight_at_shutdown(summary: &Value) {
    assert_eq!(summary["hung_clients"], 0, "{summary:#}");
    let mut refused = 0;
    for outcome in summary["outcomes"].as_array().expect("outcomes") {
        match outcome["status"].as_u64() {
            Some(200) => {}
            Some(503) => {
                let e = &outcome["body"]["error"];
                assert_eq!(e["type"], "service_unavailable_error", "{outcome}");
                assert_eq!(e["code"], "shutting_down", "{outcome}");
                let message = e["message"].as_str().unwrap_or_default();
                assert!(
                    message.starts_with("POST /v1/completions: ")
                        && message.contains("shutting down")
                        && message.contains("cairn serve"),
                    "{outcome}"
                );
                refused += 1;
            }
            Some(status) => panic!("a request in flight got {status}: {outcome}"),
            None => {
                let elapsed = outcome["elapsed"].as_f64().expect("elapsed");
                assert!(
                    elapsed < 1.0,
                    "a request the server had taken was dropped after {elapsed} s: {outcome}"
                );
            }
        }
    }
    assert!(
        refused >= 1,
        "no request was waiting when the run ended: {summary:#}"
    );
}

/// Malformed JSON, an unknown model, a prompt past the context window, a negative
/// `max_tokens`, options the gateway cannot honour (`logprobs: 5`, `top_logprobs: 5`), a prompt
/// of the wrong shape, an unknown episode, a reward posted twice and clients that disconnect:
/// each an OpenAI error (or a dropped stream), the server up, another episode untouched.
#[test]
fn gateway_bad_input_gets_openai_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "serve.toml", &gateway_config(&run, 1, ""));
    let gateway = Gateway::start(&["serve", cfg.to_str().unwrap()]);
    let script = repo().join("hosts/cairn/tests/it/gateway_bad_input.py");
    let context = cairn::setup::SCRATCH_CONTEXT.to_string();
    let out = run_python(&[script.to_str().unwrap(), &gateway.url, &context]);
    let summary: Value = serde_json::from_str(out.trim()).expect("a JSON summary");
    assert_eq!(summary["context_window"], 400);
    assert_eq!(summary["reward_twice"], 409);
    assert_eq!(summary["steady_calls"], 2);
    assert_eq!(summary["refused_options"], 7);
}

/// Streaming with the `openai` client (gateway_stream.py): chunks concatenate to the
/// non-streaming answer of the same request (chat `n = 2`; completions with two prompts,
/// `n = 2`, a stop string and usage); concurrent streams in episodes are recorded with the
/// ids their chunks carried; a client that reads the first chunk of a 900-token answer and
/// closes the stream stops its generation (the request is abandoned after a few ids, where
/// the same request unstreamed samples all 900); and the server answers the first request
/// again identically afterwards.
#[test]
fn gateway_streams_tokens_as_they_are_sampled() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "serve.toml", &gateway_config(&run, 1, ""));
    let gateway = Gateway::start(&["serve", cfg.to_str().unwrap()]);
    let script = repo().join("hosts/cairn/tests/it/gateway_stream.py");
    let out = run_python(&[
        script.to_str().unwrap(),
        &gateway.url,
        "--long-tokens",
        "900",
    ]);
    let summary: Value = serde_json::from_str(out.trim()).expect("a JSON summary");
    let abandoned = &summary["abandoned"];
    assert_eq!(abandoned["abandoned"], 1, "{summary}");
    let sampled = abandoned["sampled"].as_u64().unwrap();
    assert!(
        sampled < 450,
        "the closed stream sampled {sampled} of 900 ids"
    );
    assert_eq!(summary["episode_streams"], 4);
}

/// Ctrl-C stops `cairn serve` in its shutdown order (gateway_signal.py): a stream in flight
/// at the signal arrives whole, a later request is refused (503 or connection), the episode
/// finished before is in `--record`, and the process exits 0 without a panic.
#[test]
fn serve_stops_cleanly_on_ctrl_c() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "serve.toml", &gateway_config(&run, 1, ""));
    let record = tmp.path().join("episodes.jsonl");
    let gateway = Gateway::start(&[
        "serve",
        cfg.to_str().unwrap(),
        "--record",
        record.to_str().unwrap(),
    ]);
    let script = repo().join("hosts/cairn/tests/it/gateway_signal.py");
    let pid = gateway.child.id().to_string();
    let out = run_python(&[script.to_str().unwrap(), &gateway.url, &pid, "600"]);
    let summary: Value = serde_json::from_str(out.trim()).expect("a JSON summary");
    let stderr = gateway.wait(Duration::from_secs(120));
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("gateway: interrupted (SIGINT): answering the requests in flight"),
        "{stderr}"
    );
    assert_eq!(summary["stream_ids"], 600);
    let recorded = jsonl(&record);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["episode_id"], summary["episode"]);
    assert_eq!(recorded[0]["reward"].as_f64(), Some(1.0));
}

/// The set-up GGUF, imported into `dir` by `cairn import gguf`.
fn import_smollm2(dir: &Path) -> PathBuf {
    let out = dir.join("smollm2");
    crate::import::import(&out, &[]);
    out
}

/// SmolLM2-135M-Instruct through `cairn serve` (gateway_smollm2.py), greedy: "What is the
/// capital of France?" gets "The capital of France is Paris.", streamed one chunk per id with
/// the same text and ids, and a prompt past its 8192-token context is refused with the
/// lengths.
#[test]
fn smollm2_answers_the_openai_client_through_the_gateway() {
    let tmp = tempfile::tempdir().unwrap();
    let model = import_smollm2(tmp.path());
    let config = format!(
        r#"[run]
dir = "{run}"
seed = 1
steps = 1

[source]
kind = "gateway"
bind = "127.0.0.1:0"
model_name = "smollm2"

[algorithm]
plugin = "grpo"

[model]
path = "{model}"
device = "cpu"

[rollout]
tasks_per_step = 1
group_size = 2
temperature = 1.0
max_new_tokens = 16
max_turns = 2

[optimizer]
lr = 1e-6
"#,
        run = tmp.path().join("run").display(),
        model = model.display()
    );
    let cfg = write_config(tmp.path(), "smollm2.toml", &config);
    let gateway = Gateway::start(&["serve", cfg.to_str().unwrap()]);
    let script = repo().join("hosts/cairn/tests/it/gateway_smollm2.py");
    let out = run_python(&[script.to_str().unwrap(), &gateway.url]);
    let summary: Value = serde_json::from_str(out.trim()).expect("a JSON summary");
    assert_eq!(summary["answer"], "The capital of France is Paris.");
    assert_eq!(
        ids(&summary["token_ids"]),
        [504, 3575, 282, 4649, 314, 7042, 30, 2]
    );
    assert_eq!(summary["stream_chunks"], 8);
}

/// A bad `[source]` is a config error naming the key, before anything starts.
#[test]
fn gateway_config_errors_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = gateway_config(&run, 1, "episode_timeout_s = -1");
    let cfg = write_config(tmp.path(), "bad.toml", &text);
    let out = crate::cairn(&["train", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = crate::stderr(&out);
    assert!(err.contains("source.episode_timeout_s"), "{err}");
}

/// A training gateway whose clients never pause still trains: with clients always sending,
/// the policy's generation pass never ends by itself, and the step's policy calls (its
/// version, the scoring, the update) used to wait behind it for as long as the load lasted
/// (the soak benchmark's trainer took 1 step in 40 s, and that one only at SIGINT). Sampling
/// now pauses for the whole step, so RL steps land while the load goes on. Sixteen clients:
/// with four, the pass still ended now and then between requests and the old code crept on;
/// with sixteen it trained 0 steps in 240 s, and now trains 2 in a few seconds.
#[test]
fn a_training_gateway_trains_while_clients_keep_sampling() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = gateway_config(&run, 1000, "").replace("tasks_per_step = 3", "tasks_per_step = 2");
    let cfg = write_config(tmp.path(), "train.toml", &text);
    let gateway = Gateway::start(&["train", cfg.to_str().unwrap()]);
    // Sixteen clients, each playing episodes back to back for up to 300 s (killed below).
    let script = repo().join("examples/gateway/load.py");
    let mut load = Command::new(python())
        .args([
            script.to_str().unwrap(),
            "--base-url",
            &gateway.url,
            "--clients",
            "16",
            "--episodes",
            "100000",
            "--time-limit",
            "300",
        ])
        .current_dir(repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run python");
    let deadline = Instant::now() + Duration::from_secs(240);
    let metrics = run.join("metrics.jsonl");
    let steps = loop {
        let steps = std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count());
        let still_loading = load.try_wait().unwrap().is_none();
        if steps >= 2 || !still_loading || Instant::now() > deadline {
            break (steps, still_loading);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = load.kill();
    let _ = load.wait();
    assert!(
        steps.1,
        "the load ended before two RL steps: the steps did not run under load"
    );
    assert!(
        steps.0 >= 2,
        "{} RL steps in 240 s under a constant load: the trainer is starved",
        steps.0
    );
}
