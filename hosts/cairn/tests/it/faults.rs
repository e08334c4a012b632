//! Environment and plugin faults (docs/faults.md): an environment that panics, errors or hangs
//! fails that episode only and training goes on, under both group rules; an algorithm hang
//! stops the run with an error naming the actor, the plugin and the step; an algorithm error in
//! `signals` stops the run after a checkpoint of the last good step, and a resume after the fix
//! continues from there.
//!
//! The environment is `faulty-env` (plugins/tests/faulty-env), the algorithm `faulty`
//! (plugins/tests/faulty). Hangs last 30 s against deadlines of 2 s, and the runs have no
//! backtraces (`RUST_BACKTRACE=0`: resolving one for an injected panic can take longer than a
//! deadline on a loaded machine): the tests only assert that the run finished and what it
//! reports, never how long it took.

use std::path::Path;

use serde_json::Value;

use crate::{jsonl, stderr, tiny_config, write_config};

/// In step 1 (the first RL step, which plays all three tasks): slot 0 of task 0 panics at
/// start, the first slot of task 1 errors at its first step, and the first slot of task 0 to
/// reach its second step hangs.
const ENV_FAULTS: &str = r#"[{ task = 0, call = "start", how = "panic", times = 1 }, { task = 1, call = "step", turn = 0, how = "error", times = 1 }, { task = 0, call = "step", turn = 1, how = "hang", hang_ms = 30000, times = 1 }]"#;

/// The tiny pipeline on `faulty-env` (3 training tasks of 2 turns, all played every step, 4
/// slots each), no warm start, its tokenizer trained on a corpus file (so nothing plays the
/// environment before the run), `rollout_extra` added to `[rollout]`.
fn config(dir: &Path, steps: u64, faults: &str, rollout_extra: &str) -> String {
    let corpus = dir.join("corpus.txt");
    let words = "apple brick cloud drum eagle flute grape house";
    let mut lines = vec![words.to_string()];
    for split in ["train", "test"] {
        for k in 0..4 {
            lines.push(format!("faulty-{split}-{k}: say {words}"));
            lines.push(format!("say the words of task faulty-{split}-{k}"));
        }
    }
    std::fs::write(&corpus, lines.join("\n")).unwrap();
    let text = tiny_config(&dir.join("run"), steps)
        .replace(
            "plugin = \"household\"\nconfig = { max_turns = 14 }",
            &format!(
                "plugin = \"faulty-env\"\nconfig = {{ train_tasks = 3, test_tasks = 4, turns = 2, faults = {faults} }}"
            ),
        )
        .replace(
            "tokenizer_episodes = 30",
            &format!("tokenizer_corpus = \"{}\"", corpus.display()),
        )
        .replace("tasks_per_step = 2", "tasks_per_step = 3")
        .replace(
            "max_turns = 6\n",
            &format!("max_turns = 6\nenv_timeout_s = 2\n{rollout_extra}\n"),
        )
        .replace(
            "[warm_start]\ndemonstrations = 4\nepochs = 1\nlr = 1e-3\nbatch_rows = 16\n",
            "",
        );
    assert!(text.contains("faulty-env") && !text.contains("[warm_start]"));
    text
}

fn train(dir: &Path, text: &str) -> std::process::Output {
    let cfg = write_config(dir, "faults.toml", text);
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["train", cfg.to_str().unwrap()])
        .env("CAIRN_LOG", "error")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run cairn")
}

fn rl_steps(dir: &Path) -> Vec<Value> {
    jsonl(&dir.join("run/metrics.jsonl"))
        .into_iter()
        .filter(|m| m["phase"] == "rl")
        .collect()
}

fn num(m: &Value, key: &str) -> f64 {
    m[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {m}"))
}

/// Both rules: every fault is counted by kind in its step (`panics` of them panics, one error,
/// one timeout), and training goes on.
fn assert_failures_counted(steps: &[Value], panics: f64) {
    assert_eq!(steps.len(), 2, "both RL steps ran");
    let first = &steps[0];
    assert_eq!(num(first, "episodes/failed"), panics + 2.0, "{first}");
    for (kind, n) in [("panic", panics), ("error", 1.0), ("timeout", 1.0)] {
        assert_eq!(num(first, &format!("episodes/failed_{kind}")), n, "{first}");
    }
    let second = &steps[1];
    assert_eq!(num(second, "episodes/failed"), 0.0, "{second}");
    assert_eq!(num(second, "groups/count"), 3.0, "{second}");
    assert_eq!(num(second, "episodes/failed_groups_dropped"), 0.0);
}

#[test]
fn an_environment_panic_error_or_hang_drops_its_group_and_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    // And every held-out task errors at its start, so every evaluation is all faults.
    let held_out: String = (0..4)
        .map(|k| format!("{{ split = \"test\", task = {k}, call = \"start\", how = \"error\" }}, "))
        .collect();
    let faults = ENV_FAULTS.replacen('[', &format!("[{held_out}"), 1);
    let text = config(
        tmp.path(),
        2,
        &faults,
        "on_episode_failure = \"drop_group\"",
    );
    let out = train(tmp.path(), &text);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let steps = rl_steps(tmp.path());
    assert_failures_counted(&steps, 1.0);
    // The evaluations say so, wherever they are reported, and name the version that played.
    let evals = jsonl(&tmp.path().join("run/eval.jsonl"));
    assert_eq!(evals.len(), 2, "{evals:?}");
    for e in &evals {
        assert_eq!(
            (e["failed"].as_u64(), e["successes"].as_u64()),
            (Some(4), Some(0)),
            "{e}"
        );
    }
    assert_eq!(
        evals[1]["policy_version"], steps[1]["policy_version"],
        "{evals:?}"
    );
    let err = stderr(&out);
    assert!(
        err.contains("4 of 4 episodes cut by an environment fault, counted as failures"),
        "{err}"
    );
    let summary = crate::stdout(&out);
    assert_eq!(
        summary.matches("(0/4, policy version ").count(),
        2,
        "{summary}"
    );
    assert_eq!(
        summary.matches(", 4 cut by an environment fault)").count(),
        2,
        "{summary}"
    );
    // Tasks 0 and 1 had failures: only task 2's group trained, all four of its episodes.
    let first = &steps[0];
    assert_eq!(num(first, "episodes/failed_groups_dropped"), 2.0, "{first}");
    assert_eq!(num(first, "groups/count"), 1.0, "{first}");
    assert_eq!(num(first, "trajectories/count"), 4.0, "{first}");
    // Nothing is lost: the data pool holds all 12 episodes of the step, the dropped groups'
    // untrained with the reason, each failed one with its failure and the turns it played.
    let episodes = pool_step(tmp.path(), 0);
    assert_eq!(episodes.len(), 12, "{episodes:#?}");
    let mut failed_turns: Vec<u32> = episodes
        .iter()
        .filter(|e| e.failure.is_some())
        .map(|e| e.turns)
        .collect();
    failed_turns.sort();
    assert_eq!(failed_turns, [0, 1, 2], "{episodes:#?}");
    for e in &episodes {
        let kept = e.task_id.ends_with('2');
        assert_eq!(e.trained, kept, "{e:?}");
        if !kept && e.failure.is_none() {
            let why = e.skip_reason.as_deref().unwrap_or_default();
            assert!(why.contains("group dropped"), "{e:?}");
        }
    }
}

/// The rollout episodes the data pool holds for RL step `step` (0-based), one per trajectory.
fn pool_step(dir: &Path, step: u64) -> Vec<cairn_stores::pool::EpisodeSummary> {
    let pool = cairn_stores::pool::PoolReader::open_run(&dir.join("run")).unwrap();
    let episodes = pool
        .episodes(&cairn_stores::pool::Filter {
            source: Some("rollout".into()),
            step_min: Some(step),
            step_max: Some(step),
            ..Default::default()
        })
        .unwrap();
    let mut ids: Vec<u64> = episodes.iter().map(|e| e.trajectory_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), episodes.len(), "a trajectory recorded twice");
    episodes
}

#[test]
fn an_environment_panic_error_or_hang_is_a_zero_reward_member_of_its_group() {
    let tmp = tempfile::tempdir().unwrap();
    // And one slot of task 2 fails in its first observation (an error there is a panic: the
    // call has no error return).
    let faults = ENV_FAULTS.replace(
        "times = 1 }]",
        "times = 1 }, { task = 2, call = \"observation\", how = \"error\", times = 1 }]",
    );
    let text = config(
        tmp.path(),
        2,
        &faults,
        "on_episode_failure = \"zero_reward\"",
    );
    let out = train(tmp.path(), &text);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let steps = rl_steps(tmp.path());
    assert_failures_counted(&steps, 2.0);
    // Every group trained. The two episodes that never started have no rows; the one that
    // failed at its first step keeps that turn, the hung one its two turns: 8 clean episodes
    // of two turns, then 1 + 2 rows, in 10 trajectories.
    let first = &steps[0];
    assert_eq!(num(first, "episodes/failed_groups_dropped"), 0.0, "{first}");
    assert_eq!(num(first, "groups/count"), 3.0, "{first}");
    assert_eq!(num(first, "trajectories/count"), 10.0, "{first}");
    assert_eq!(num(first, "rows/count"), 19.0, "{first}");
    // In the data pool each failed member is one episode, with its failure and the turns it
    // played, trained (with reward 0) like its siblings.
    let episodes = pool_step(tmp.path(), 0);
    assert_eq!(episodes.len(), 12, "{episodes:#?}");
    let mut failed: Vec<(u32, bool)> = episodes
        .iter()
        .filter(|e| e.failure.is_some())
        .map(|e| (e.turns, e.turns > 0 && e.trained))
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        [(0, false), (0, false), (1, true), (2, true)],
        "{episodes:#?}"
    );
    assert!(episodes
        .iter()
        .filter(|e| e.failure.is_none())
        .all(|e| e.trained));
}

#[test]
fn an_algorithm_hang_stops_the_run_naming_actor_plugin_and_step() {
    let tmp = tempfile::tempdir().unwrap();
    let text = config(tmp.path(), 2, "[]", "")
        .replace(
            "plugin = \"grpo\"",
            "plugin = \"faulty\"\nconfig = { hang_in = \"signals\", hang_ms = 30000 }",
        )
        .replace(
            "checkpoint_every = 1",
            "checkpoint_every = 1\nplugin_timeout_s = 2",
        );
    let out = train(tmp.path(), &text);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let e = stderr(&out);
    for part in [
        "the optimizer actor",
        "algorithm `faulty`",
        "`signals`",
        "RL step 0",
        "within 2 s",
        "run.plugin_timeout_s",
        "last checkpoint",
    ] {
        assert!(e.contains(part), "`{part}` missing: {e}");
    }
    let metrics = tmp.path().join("run/metrics.jsonl");
    assert!(
        !metrics.exists() || rl_steps(tmp.path()).is_empty(),
        "no RL step trained"
    );

    // A hang on the rollout side (planning a group) is named the same way.
    std::fs::remove_dir_all(tmp.path().join("run")).unwrap();
    let out = train(
        tmp.path(),
        &text.replace("hang_in = \"signals\"", "hang_in = \"plan\""),
    );
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let e = stderr(&out);
    for part in [
        "the rollout actor",
        "algorithm `faulty`",
        "`plan_group`",
        "step 0, group 0",
        "run.plugin_timeout_s",
    ] {
        assert!(e.contains(part), "`{part}` missing: {e}");
    }
}

#[test]
fn a_signals_error_stops_after_a_checkpoint_of_the_last_good_step_and_a_fixed_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let base =
        config(tmp.path(), 3, "[]", "").replace("checkpoint_every = 1", "checkpoint_every = 10");
    let faulty = base.replace(
        "plugin = \"grpo\"",
        "plugin = \"faulty\"\nconfig = { error_in = \"signals\", from_step = 2 }",
    );
    let out = train(tmp.path(), &faulty);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let e = stderr(&out);
    for part in [
        "RL step 2",
        "plugin `faulty`",
        "injected error",
        "step-000002",
    ] {
        assert!(e.contains(part), "`{part}` missing: {e}");
    }
    // RL steps 0 and 1 trained; step 2 did not, and the checkpoint holds step 2's start.
    let run = tmp.path().join("run");
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-000002");
    let trainer: Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("checkpoints/step-000002/trainer.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(trainer["rl_steps"], 2, "{trainer}");
    let done: Vec<u64> = rl_steps(tmp.path())
        .iter()
        .map(|m| m["rl_step"].as_u64().unwrap())
        .collect();
    assert_eq!(done, [1, 2]);

    // The fixed config resumes from that checkpoint and trains the last step.
    let fixed = base.replace(
        "plugin = \"grpo\"",
        "plugin = \"faulty\"\nconfig = { from_step = 2 }",
    );
    let out = train(tmp.path(), &fixed);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let done: Vec<u64> = rl_steps(tmp.path())
        .iter()
        .map(|m| m["rl_step"].as_u64().unwrap())
        .collect();
    assert_eq!(done, [1, 2, 3]);
}
