//! The whole pipeline on a tiny model: warm start, RL steps, evaluations, metrics, plot,
//! checkpoints, `cairn eval`, resume after completion and after a kill.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{cairn, jsonl, stderr, stdout, tiny_config, write_config};

const RL_KEYS: &[&str] = &[
    "reward/episode_mean",
    "success_rate",
    "loss",
    "clip_fraction",
    "response_length/mean",
    "tokens_per_s",
    "truncation_rate",
    "groups/zero_advantage_fraction",
    "logprob_mismatch/mean_abs",
];

#[test]
fn smoke_run_trains_evaluates_records_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "tiny.toml", &tiny_config(&run, 2));
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("after_rl"), "{}", stdout(&out));

    let metrics = jsonl(&run.join("metrics.jsonl"));
    let rl: Vec<_> = metrics.iter().filter(|m| m["phase"] == "rl").collect();
    let sft: Vec<_> = metrics
        .iter()
        .filter(|m| m["phase"] == "warm_start")
        .collect();
    assert_eq!(rl.len(), 2);
    assert!(
        !sft.is_empty()
            && sft
                .iter()
                .all(|m| m["sft_loss"].as_f64().is_some_and(f64::is_finite))
    );
    for m in &rl {
        // The tiny config has the KL off, so no reference pass runs and no KL is reported.
        assert!(m["kl"].is_null(), "{m}");
        for key in RL_KEYS {
            assert!(
                m[*key].as_f64().is_some_and(f64::is_finite),
                "{key} missing or not finite in {m}"
            );
        }
    }
    // Policy versions increase by one per optimizer step, across SFT and RL.
    let versions: Vec<u64> = metrics
        .iter()
        .map(|m| m["policy_version"].as_u64().unwrap())
        .collect();
    assert!(
        versions.windows(2).all(|w| w[1] == w[0] + 1),
        "{versions:?}"
    );
    // The rollout and the trainer agree on the sampled tokens' log-probs.
    for m in &rl {
        assert!(
            m["logprob_mismatch/max_abs"].as_f64().unwrap() < 1e-3,
            "{m}"
        );
    }

    let evals = jsonl(&run.join("eval.jsonl"));
    let labels: Vec<&str> = evals.iter().map(|e| e["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["after_warm_start", "after_rl"]);
    assert!(evals.iter().all(|e| e["tasks"] == 4));

    let png = std::fs::read(run.join("curves.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let checkpoint = run.join("checkpoints").join(latest.trim());
    assert!(checkpoint.join("policy").is_dir());

    // `cairn eval` on the final checkpoint reproduces the final evaluation (greedy, same seed).
    let out = cairn(&["eval", checkpoint.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["successes"], evals[1]["successes"]);
    assert_eq!(report["policy_version"], evals[1]["policy_version"]);

    // Resume a finished run with more steps: it continues, and no step is duplicated.
    let out = cairn(&["train", cfg.to_str().unwrap(), "--steps", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("resumed from"), "{}", stderr(&out));
    let metrics = jsonl(&run.join("metrics.jsonl"));
    let steps: Vec<u64> = metrics
        .iter()
        .filter_map(|m| m["rl_step"].as_u64())
        .collect();
    assert_eq!(steps, [1, 2, 3]);
}

#[test]
fn a_killed_run_resumes_from_its_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "tiny.toml", &tiny_config(&run, 40));
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["train", cfg.to_str().unwrap()])
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until a checkpoint after at least one RL step exists, then kill -9.
    let deadline = Instant::now() + Duration::from_secs(300);
    let killed_at = loop {
        let state = std::fs::read_to_string(run.join("checkpoints/latest"))
            .ok()
            .and_then(|name| {
                std::fs::read_to_string(
                    run.join("checkpoints")
                        .join(name.trim())
                        .join("trainer.json"),
                )
                .ok()
            })
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        if let Some(s) = state.filter(|s| s["rl_steps"].as_u64().unwrap_or(0) >= 1) {
            child.kill().unwrap();
            child.wait().unwrap();
            break s["rl_steps"].as_u64().unwrap();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it could be killed");
        }
        assert!(Instant::now() < deadline, "no RL checkpoint within 300 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let target = killed_at + 2;
    let out = cairn(&[
        "train",
        cfg.to_str().unwrap(),
        "--steps",
        &target.to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("resumed from"), "{}", stderr(&out));
    let metrics = jsonl(&run.join("metrics.jsonl"));
    let steps: Vec<u64> = metrics
        .iter()
        .filter_map(|m| m["rl_step"].as_u64())
        .collect();
    assert_eq!(
        steps,
        (1..=target).collect::<Vec<_>>(),
        "every RL step exactly once"
    );
    let evals = jsonl(&run.join("eval.jsonl"));
    assert_eq!(evals.last().unwrap()["label"], "after_rl");
}
