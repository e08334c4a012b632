//! The scaffold algorithms end to end: `edge`, `pats` and `reskill` stacked on `grpo` train a
//! tiny model through the real `.so` plugins, write their knowledge into the run's bank,
//! inject it into training prompts, and never into an evaluation prompt.

use std::path::Path;

use crate::pipeline::{assert_evaluations_are_plain, hint_stack};
use crate::{cairn, jsonl, stderr, write_config};

/// Trains `stack` over grpo on two recurring training tasks for `steps` steps (a warm start
/// long enough that the tiny model solves them often, so there are successes to learn from);
/// returns the RL metrics lines.
fn train(run: &Path, stack: &str, steps: u64) -> Vec<serde_json::Value> {
    let text = hint_stack(run, stack)
        .replace("steps = 3", &format!("steps = {steps}"))
        .replace("epochs = 8", "epochs = 60")
        .replace(
            "config = { max_turns = 14 }",
            "config = { max_turns = 14, train_tasks = 2 }",
        );
    let cfg = write_config(run.parent().unwrap(), "stack.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .filter(|m| m["phase"] == "rl")
        .collect()
}

/// The distinct non-empty injections of the run's training prompts.
fn injections(run: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, row) in crate::pool::rows(run, Some("train")) {
        let inject = row["variant"]["inject"].as_str().unwrap().to_string();
        if !inject.is_empty() && !out.contains(&inject) {
            out.push(inject);
        }
    }
    out
}

/// The run's bank entries, as `cairn bank export` prints them.
fn bank(run: &Path) -> Vec<serde_json::Value> {
    let out = cairn(&["bank", "export", run.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    crate::stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn edge_writes_experiences_injects_them_into_half_of_each_group_and_distills() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let rl = train(
        &run,
        "\n[[algorithm.stack]]\nplugin = \"edge\"\nconfig = { warmup_steps = 100, header = \"\", \
         top_k = 0, task_specific_top_k = 1, update_frequency = 1 }",
        4,
    );
    let experiences: Vec<_> = bank(&run)
        .into_iter()
        .filter(|e| e["kind"] == "experience")
        .collect();
    assert!(
        !experiences.is_empty(),
        "the skill creator wrote experiences"
    );
    for e in &experiences {
        assert_eq!(e["provenance"]["writer"], "skill-creator:template", "{e}");
        assert!(e["task_id"]
            .as_str()
            .unwrap()
            .starts_with("household/train/"));
    }
    // Later steps injected them (the entry text alone, `header = ""`) into E slots.
    let injected = injections(&run);
    assert!(!injected.is_empty(), "no E slot saw an experience");
    let texts: Vec<&str> = experiences
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    for i in &injected {
        assert!(
            texts.contains(&i.as_str()),
            "injected `{i}` is no bank entry"
        );
    }
    assert!(rl.iter().all(|m| m["teacher"][0]["name"] == "edge-distill"));
    assert!(
        rl.iter().any(|m| m.get("edge/success_e").is_some()),
        "{rl:?}"
    );
    assert_evaluations_are_plain(
        &run,
        &injected.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    // EDGE's E/N curves, drawn by `cairn compare --metric`; a metric no run reports is an
    // error naming it.
    let png = tmp.path().join("en.png");
    let pair = format!("edge={}", run.display());
    let out = cairn(&[
        "compare",
        "--metric",
        "edge/success_e",
        "--metric",
        "edge/success_n",
        "--out",
        png.to_str().unwrap(),
        &pair,
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        crate::stdout(&out).contains("| edge | 1 |"),
        "{}",
        crate::stdout(&out)
    );
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let out = cairn(&[
        "compare",
        "--metric",
        "edge/nothing",
        "--out",
        png.to_str().unwrap(),
        &pair,
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no run reports `edge/nothing` in metrics.jsonl"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn pats_injects_its_scaffold_into_the_scaffolded_arm_and_writes_evidence_cards() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let scaffold = "open the receptacles first";
    let rl = train(
        &run,
        &format!(
            "\n[[algorithm.stack]]\nplugin = \"pats\"\nconfig = {{ scaffold = \"{scaffold}\", \
             coef = 0.5 }}"
        ),
        3,
    );
    let injected = injections(&run);
    assert_eq!(injected, [scaffold], "the general scaffold, and only it");
    let cards: Vec<_> = bank(&run)
        .into_iter()
        .filter(|e| e["kind"] == "evidence_card")
        .collect();
    // One card per (task, scaffold) per step while the task keeps its scaffold. A task whose
    // plain arm already solves ≥ 0.8 (`tau_solve`) has graduated: its scaffold is removed and
    // it gets no card after that one.
    let mut per_task: std::collections::BTreeMap<String, Vec<&serde_json::Value>> =
        Default::default();
    for c in &cards {
        let n_with = c["extra"]["n_with"].as_u64().unwrap();
        let n_without = c["extra"]["n_without"].as_u64().unwrap();
        // Each task is one group of 4 per step: 2 scaffolded slots, 2 plain.
        assert_eq!((n_with, n_without), (2, 2), "{c}");
        assert_eq!(c["extra"]["scaffold_id"], "config", "{c}");
        per_task
            .entry(c["task_id"].as_str().unwrap().to_string())
            .or_default()
            .push(c);
    }
    assert_eq!(per_task.len(), 2, "both tasks got a card at step 0");
    let mut graduated = 0;
    for (task, cards) in &per_task {
        assert_eq!(cards[0]["extra"]["step"], 0, "{task}");
        let solo =
            |c: &serde_json::Value| c["extra"]["succ_without"].as_u64().unwrap() as f64 / 2.0;
        if let Some(at) = cards.iter().position(|c| solo(c) >= 0.8) {
            assert_eq!(at + 1, cards.len(), "{task}: a card after graduating");
            graduated += 1;
        } else {
            assert_eq!(cards.len(), 3, "{task}: one card per step");
        }
    }
    let removed: f64 = rl
        .iter()
        .map(|m| m["pats/removed_graduated"].as_f64().unwrap())
        .sum();
    assert_eq!(removed, f64::from(graduated));
    assert!(rl.iter().all(|m| m.get("pats/cards").is_some()), "{rl:?}");
    assert_evaluations_are_plain(&run, &[scaffold]);
}

#[test]
fn reskill_creates_a_skill_tests_it_within_groups_and_injects_it_when_its_trigger_fires() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let rl = train(
        &run,
        "\n[[algorithm.stack]]\nplugin = \"reskill\"\nconfig = { min_reservoir = 8, \
         reservoir_size = 64, test_steps = 1, min_episodes = 4, min_trigger_rate = 0.1 }",
        6,
    );
    let skills: Vec<_> = bank(&run)
        .into_iter()
        .filter(|e| e["kind"] == "skill")
        .collect();
    assert!(!skills.is_empty(), "the skill creator wrote a skill");
    let last = rl.last().unwrap();
    assert!(last.get("reskill/reservoir").is_some(), "{last}");
    let injected = injections(&run);
    assert!(!injected.is_empty(), "no turn saw a skill: {rl:?}");
    assert_evaluations_are_plain(
        &run,
        &injected.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

/// The knowledge-regime example config is a valid pipeline config, with the household
/// configured for the regime.
#[test]
fn the_knowledge_example_config_parses() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/household-knowledge.toml");
    let config = cairn_kernel::config::PipelineConfig::load(&path).unwrap();
    let env = config.environment.as_ref().unwrap().config_json();
    assert!(env.contains("\"knowledge\":true"), "{env}");
    let ws = config.warm_start.as_ref().unwrap();
    assert!(ws.hinted_share > 0.0 && ws.keep_unsolved);
    assert_eq!(config.algorithm.label(), "grpo");
}

/// A reflector that is down: every reflection fails, the failures are counted by the skill
/// creator and by the plugin, training goes on, and the bank holds no garbage.
#[test]
fn edge_trains_on_when_its_reflector_is_down_and_counts_the_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // Port 9 (discard) on loopback: nothing listens, every request is refused at once.
    let rl = train(
        &run,
        "\n[[algorithm.stack]]\nplugin = \"edge\"\nconfig = { header = \"\", top_k = 0, \
         task_specific_top_k = 1, update_frequency = 1 }\n\n[skills]\nreflector = \"endpoint\"\n\
         [skills.endpoint]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"none\"\n\
         max_retries = 0\ntimeout_ms = 2000",
        4,
    );
    assert_eq!(rl.len(), 4, "every step trained");
    let requested: f64 = rl
        .iter()
        .map(|m| m["edge/reflections_requested"].as_f64().unwrap_or(0.0))
        .sum();
    let failed: f64 = rl
        .iter()
        .map(|m| m["edge/reflections_failed"].as_f64().unwrap())
        .sum();
    assert!(requested > 0.0, "{rl:?}");
    assert!(failed > 0.0, "no failure reached the plugin: {rl:?}");
    assert!(
        rl.iter()
            .any(|m| m["skills/errors"].as_f64().unwrap() > 0.0),
        "{rl:?}"
    );
    assert!(bank(&run).is_empty(), "a failed reflection writes nothing");
}

/// An injection longer than the model's context window: a clear error with the lengths and
/// what to shorten, before any update is trained on it.
#[test]
fn an_injection_longer_than_the_context_window_is_refused_with_the_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let hint = vec!["look"; 1500].join(" ");
    let text = hint_stack(
        &run,
        &format!("\n[[algorithm.stack]]\nplugin = \"hint\"\nconfig = {{ hint = \"{hint}\" }}"),
    )
    .replace("steps = 3", "steps = 1")
    .replace("epochs = 8", "epochs = 1");
    let cfg = write_config(tmp.path(), "long.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "variant `hint`): the prompt is 1536 tokens, and with max_new_tokens = 8 it \
                      does not fit the model's context window of 1024 tokens; shorten what the \
                      variant injects (7499 characters"
        ),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The warm start trained; no RL step did.
    let phases: Vec<serde_json::Value> = jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .map(|m| m["phase"].clone())
        .collect();
    assert!(phases.iter().any(|p| p == "warm_start"), "{phases:?}");
    assert!(!phases.iter().any(|p| p == "rl"), "{phases:?}");
}

/// A damaged checkpoint of a stack with plugin state and a bank: an `algorithm.state` that
/// changed, or a missing bank snapshot, makes the resume refuse that checkpoint with the file
/// named and use the one before it (the refused one is kept aside, not deleted); every RL
/// step still appears exactly once.
#[test]
fn a_damaged_checkpoint_is_refused_with_the_file_named_and_the_previous_one_used() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = hint_stack(&run, "\n[[algorithm.stack]]\nplugin = \"hint\"")
        .replace("steps = 3", "steps = 2")
        .replace("checkpoint_every = 0", "checkpoint_every = 1");
    let cfg = write_config(tmp.path(), "hint.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let latest = || {
        let name = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
        run.join("checkpoints").join(name.trim())
    };
    let rl_steps = || -> Vec<u64> {
        jsonl(&run.join("metrics.jsonl"))
            .iter()
            .filter_map(|m| m["rl_step"].as_u64())
            .collect()
    };

    for (file, steps) in [("algorithm.state", 3u64), ("bank.sqlite", 4)] {
        let dir = latest();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let path = dir.join(file);
        if file == "bank.sqlite" {
            std::fs::remove_file(&path).unwrap();
        } else {
            std::fs::write(&path, b"not json").unwrap();
        }
        let out = cairn(&[
            "train",
            cfg.to_str().unwrap(),
            "--steps",
            &steps.to_string(),
        ]);
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains(&format!("checkpoint {name} refused: {}", path.display())),
            "{file}: {err}"
        );
        assert!(
            err.contains("resuming from the earlier checkpoint"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            run.join("checkpoints")
                .join(format!("refused-{name}"))
                .is_dir(),
            "the refused checkpoint is kept aside"
        );
        assert_eq!(rl_steps(), (1..=steps).collect::<Vec<_>>(), "{file}");
    }
}
