//! The actor pipeline on a tiny model: at `rollout.max_staleness = 0` it reproduces, to the
//! last bit, the metric stream of the trainer it replaced (`tests/fixtures/sync-golden/`, see
//! its README); with `max_staleness = 2` (one RL step of lead at two updates per batch) every
//! row is exactly one step behind and two runs agree; a scaffold plugin stacked on `grpo` works end to end through the
//! `.so`; bad stacks, another stack on resume and a second run on one directory are refused.

use std::path::Path;

use crate::{cairn, jsonl, stderr, write_config};

/// Wall-clock times and throughputs differ from run to run; every other value must not.
fn timed(key: &str) -> bool {
    key.ends_with("_time_s") || key.ends_with("tokens_per_s")
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sync-golden")
        .join(name)
}

/// The golden config with `[rollout]` extended by `rollout_extra`, writing to `run`.
fn golden_config(dir: &Path, run: &Path, rollout_extra: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(fixture("config.toml"))
        .expect("fixture config")
        .replace("{dir}", &run.display().to_string())
        .replace("[rollout]\n", &format!("[rollout]\n{rollout_extra}\n"));
    write_config(dir, "golden.toml", &text)
}

/// The golden file `name` (`metrics`, `eval`) of this machine's CPU class: libtorch rounds
/// differently on each class (`cairn_torch::CpuClass`), so the old trainer's run was recorded
/// once per class.
fn golden(name: &str) -> Vec<serde_json::Value> {
    let class = cairn_torch::CpuClass::detect();
    let path = fixture(&format!("{name}.{}.jsonl", class.name()));
    assert!(
        path.is_file(),
        "{}: no golden run for this machine's CPU class {class}; record one as \
         tests/fixtures/sync-golden/README.md says",
        path.display()
    );
    jsonl(&path)
}

#[test]
fn synchronous_pipeline_reproduces_the_old_trainers_metrics_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = golden_config(tmp.path(), &run, "max_staleness = 0");
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));

    let recorded = golden("metrics");
    let got = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(got.len(), recorded.len(), "one line per step");
    let mut compared = 0;
    for (i, (g, n)) in recorded.iter().zip(&got).enumerate() {
        let (g, n) = (g.as_object().unwrap(), n.as_object().unwrap());
        for (key, want) in g {
            if timed(key) {
                continue;
            }
            // Renamed since the fixture was made: the failed-episode count (which now also
            // counts timeouts and panics, each kind under its own key).
            let key = match key.as_str() {
                "episodes_aborted" => "episodes/failed",
                k => k,
            };
            let values = n.get("values").and_then(|v| v.as_object());
            let have = n.get(key).or_else(|| values.and_then(|v| v.get(key)));
            assert_eq!(have, Some(want), "line {i}, key `{key}`");
            compared += 1;
        }
    }
    assert!(compared > 100, "only {compared} values compared");
    // Held-out evaluations: equal, apart from the failed-episode count added since the
    // fixture was made (no episode fails here).
    let mut evals = jsonl(&run.join("eval.jsonl"));
    for e in &mut evals {
        let failed = e.as_object_mut().unwrap().remove("failed");
        assert_eq!(failed, Some(serde_json::json!(0)), "{e}");
    }
    assert_eq!(evals, golden("eval"), "held-out evaluations");
}

/// One RL step of lead (`max_staleness = 2` at two updates per batch): step `s` is played by
/// exactly the weights after step `s − 2` (two versions behind from step 1 on, never more),
/// and a second run with the same seed writes the same metrics, wall times aside.
#[test]
fn async_pipeline_runs_exactly_one_step_ahead_and_two_runs_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for name in ["a", "b"] {
        let run = tmp.path().join(name);
        let cfg = golden_config(tmp.path(), &run, "max_staleness = 2");
        let out = cairn(&["train", cfg.to_str().unwrap()]);
        assert!(out.status.success(), "stderr: {}", stderr(&out));
        runs.push(jsonl(&run.join("metrics.jsonl")));
    }
    let rl: Vec<_> = runs[0].iter().filter(|m| m["phase"] == "rl").collect();
    assert_eq!(rl.len(), 3);
    for (s, m) in rl.iter().enumerate() {
        // Two mini-batches per step: k = 2 versions is one step of lead.
        let lag = if s == 0 { 0 } else { 2 };
        assert_eq!(m["staleness/max"], lag, "{m}");
        assert_eq!(m["staleness/mean"], lag as f64, "{m}");
        assert_eq!(m["staleness/rows_dropped"], 0, "{m}");
        assert!(m["loss"].as_f64().is_some_and(f64::is_finite), "{m}");
    }
    let untimed = |metrics: &[serde_json::Value]| -> Vec<serde_json::Value> {
        metrics
            .iter()
            .map(|m| {
                let mut m = m.clone();
                m.as_object_mut().unwrap().retain(|k, _| !timed(k));
                m
            })
            .collect()
    };
    assert_eq!(untimed(&runs[0]), untimed(&runs[1]));
}

/// The golden run's config (a warm-started model whose groups have mixed outcomes) with
/// `stack` under `[algorithm]`.
pub fn hint_stack(run: &Path, stack: &str) -> String {
    std::fs::read_to_string(fixture("config.toml"))
        .expect("fixture config")
        .replace("{dir}", &run.display().to_string())
        .replace(
            "[algorithm]\nplugin = \"grpo\"\n",
            &format!("[algorithm]\nplugin = \"grpo\"\n{stack}\n"),
        )
        // One update per batch: the step's loss report covers every row.
        .replace("updates_per_batch = 2", "updates_per_batch = 1")
}

/// Checks a finished run's data pool: every evaluation (after the
/// warm start and at the end) played every task with the plain context, its prompts hold the
/// observation and none of the `scaffolds` (compared as token ids under the run's tokenizer),
/// and the training batches did show the scaffolds, so the check can tell the two apart.
pub fn assert_evaluations_are_plain(run: &Path, scaffolds: &[&str]) {
    let tokenizer = cairn_kernel::text::Tokenizer::from_dir(&run.join("tokenizer")).unwrap();
    let encoded: Vec<Vec<u32>> = scaffolds
        .iter()
        .map(|s| tokenizer.encode(s).unwrap())
        .collect();
    let contains = |hay: &[u32], needle: &[u32]| hay.windows(needle.len()).any(|w| w == needle);
    let ids = |row: &serde_json::Value| -> Vec<u32> {
        row["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let mut evals = std::collections::BTreeSet::new();
    let mut scaffolded_training_prompts = 0;
    for (name, row) in crate::pool::rows(run, None) {
        if name.starts_with("eval:") {
            evals.insert(name.clone());
            assert_eq!(row["variant"]["label"], "plain", "{name}: {row}");
            assert_eq!(row["variant"]["inject"], "", "{name}");
            let prompt = ids(&row);
            let observation = tokenizer
                .encode(row["observation"].as_str().unwrap())
                .unwrap();
            assert!(contains(&prompt, &observation), "{name}: {row}");
            for (s, e) in scaffolds.iter().zip(&encoded) {
                assert!(
                    !contains(&prompt, e),
                    "{name}: `{s}` in an evaluation prompt"
                );
            }
        } else {
            scaffolded_training_prompts +=
                usize::from(encoded.iter().any(|e| contains(&ids(&row), e)));
        }
    }
    assert!(
        evals.len() >= 2,
        "the initial and the final evaluation are recorded"
    );
    assert!(
        scaffolded_training_prompts > 0,
        "no training prompt carried a scaffold"
    );
}

#[test]
fn a_scaffold_plugin_stacked_on_grpo_plans_hints_turn_by_turn_and_distills_them() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = hint_stack(
        &run,
        "\n[[algorithm.stack]]\nplugin = \"hint\"\nconfig = { hint = \"Use an admissible action.\" }",
    );
    let cfg = write_config(tmp.path(), "hint.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));

    let rl: Vec<_> = jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .filter(|m| m["phase"] == "rl")
        .collect();
    assert_eq!(rl.len(), 3);
    let mut distilled = 0.0;
    for m in &rl {
        let rows = m["hint/rows_distilled"].as_f64().unwrap();
        let term = &m["teacher"][0];
        assert_eq!(term["name"], "hint-distill", "{m}");
        let active = term["active_tokens"].as_f64().unwrap();
        // Every distilled row brings its sampled tokens; none without one.
        assert_eq!(rows == 0.0, active == 0.0, "{m}");
        assert!(term["loss"].as_f64().is_some_and(f64::is_finite), "{m}");
        distilled += rows;
        // The data pool's decisions of the step name the distilled rows (trajectory, turn):
        // as many as the plugin reported, each a row of that step with its tokens weighted.
        let step = m["rl_step"].as_u64().unwrap() - 1;
        let pool = cairn_stores::pool::PoolReader::open_run(&run).unwrap();
        let (_, decisions) = pool.step_record(step).unwrap().unwrap();
        let terms = decisions["teacher_terms"].as_array().unwrap();
        assert_eq!(terms.len(), 1, "{decisions}");
        assert_eq!(terms[0]["name"], "hint-distill");
        let targets = terms[0]["targets"].as_array().unwrap();
        assert_eq!(targets.len() as f64, rows, "{decisions}");
        let recorded: std::collections::BTreeSet<(u64, u64)> =
            crate::pool::rows(&run, Some("rollout"))
                .into_iter()
                .filter(|(name, _)| *name == format!("rollout step {step}"))
                .map(|(_, r)| {
                    (
                        r["trajectory_id"].as_u64().unwrap(),
                        r["turn"].as_u64().unwrap(),
                    )
                })
                .collect();
        for t in targets {
            let row = (t["row"][0].as_u64().unwrap(), t["row"][1].as_u64().unwrap());
            assert!(recorded.contains(&row), "{t} is not a row of step {step}");
            assert_eq!(t["teacher"], "context", "{t}");
            assert!(t["tokens"].as_u64().unwrap() > 0, "{t}");
        }
    }
    assert!(distilled > 0.0, "the hint helped some group in three steps");
    // Half of every group played with the hint; the per-turn hook changed some contexts.
    let rows: Vec<serde_json::Value> = crate::pool::rows(&run, Some("rollout"))
        .into_iter()
        .filter(|(step, _)| step == "rollout step 0")
        .map(|(_, row)| row)
        .collect();
    let first_turn: Vec<&serde_json::Value> = rows.iter().filter(|r| r["turn"] == 0).collect();
    let hinted = first_turn
        .iter()
        .filter(|r| r["variant"]["label"] == "hint")
        .count();
    assert_eq!(hinted * 2, first_turn.len(), "half the slots start hinted");
    assert!(first_turn
        .iter()
        .filter(|r| r["variant"]["label"] == "hint")
        .all(|r| r["variant"]["inject"] == "Use an admissible action."));
    // After a rejected action a hinted slot's next turn carries the correction.
    let corrected: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["variant"]["label"] == "hint+correction")
        .collect();
    assert!(
        !corrected.is_empty(),
        "no turn after a rejected hinted action"
    );
    assert!(corrected
        .iter()
        .all(|r| r["turn"].as_u64().unwrap() > 0 && r["variant"]["extra"]["hinted"] == true));
    // Each group the hint helped left an evidence card in the run's bank, with provenance;
    // later plans for a task saw its cards.
    let out = cairn(&["bank", "export", run.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let cards: Vec<serde_json::Value> = crate::stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let helped_groups: f64 = rl
        .iter()
        .map(|m| m["hint/groups_helped"].as_f64().unwrap())
        .sum();
    assert_eq!(
        cards.len() as f64,
        helped_groups,
        "one card per helped group"
    );
    for c in &cards {
        assert_eq!(c["kind"], "evidence_card", "{c}");
        assert_eq!(c["provenance"]["writer"], "grpo+hint", "{c}");
        assert!(!c["provenance"]["source_trajectories"]
            .as_array()
            .unwrap()
            .is_empty());
        assert!(c["text"]
            .as_str()
            .unwrap()
            .contains("the hint raised the mean reward"));
    }
    // The scaffold is training-time only: the recorded evaluation prompts carry none of it.
    assert_evaluations_are_plain(&run, &["Use an admissible action."]);

    // The plugin's state went into the checkpoint, keyed by stack position.
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let state = std::fs::read_to_string(
        run.join("checkpoints")
            .join(latest.trim())
            .join("algorithm.state"),
    )
    .unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let hint: serde_json::Value = serde_json::from_str(state["1:hint"].as_str().unwrap()).unwrap();
    assert_eq!(hint["steps"], 3, "{hint}");

    // Resuming the run with another stack would drop the hint's state: refused up front.
    let plain = hint_stack(&run, "").replace("steps = 3", "steps = 4");
    let plain = write_config(tmp.path(), "plain.toml", &plain);
    let out = cairn(&["train", plain.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("was trained with the algorithm stack `grpo+hint`, this config has `grpo`"),
        "{err}"
    );
}

#[test]
fn a_second_training_on_the_same_run_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "long.toml", &crate::tiny_config(&run, 200));
    let mut first = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["train", cfg.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first run holds the directory (its pid in the lock file).
    let lock = run.join(".lock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_to_string(&lock).map_or(true, |t| t.trim().is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first run never took the lock"
        );
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first run ended early"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    let _ = first.kill();
    let _ = first.wait();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "is in use by another process (pid {})",
            first.id()
        )),
        "{err}"
    );
}

#[test]
fn a_bad_stack_is_refused_with_its_key_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let check = |stack: &str, expected: &str| {
        let run = tmp.path().join("never");
        let cfg = write_config(tmp.path(), "bad.toml", &hint_stack(&run, stack));
        let out = cairn(&["train", cfg.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains(expected), "expected `{expected}` in: {err}");
        assert!(!run.exists(), "nothing is written for a bad stack");
    };
    // In the stacked golden config `[algorithm]` is on lines 11–12, so the first stack entry's
    // header is line 14 and its keys follow.
    check(
        "\n[[algorithm.stack]]\nplugin = \"gigpo\"",
        "key `algorithm.stack[0].plugin`, line 15",
    );
    check(
        "\n[[algorithm.stack]]\nplugin = \"hint\"\nconfig = { coef = -1 }",
        "key `algorithm.stack[0].config.coef`, line 16: plugin `hint` rejected its config: \
         `coef` = -1 must be a finite number >= 0",
    );
    check(
        "\n[[algorithm.stack]]\nplugin = \"hint\"\nconfig = { coeff = 1 }",
        "key `algorithm.stack[0].config.coeff`, line 16",
    );
    check(
        "\n[[algorithm.stack]]\nplugin = \"gigpo\"",
        "`gigpo` is an advantage estimator, and `grpo` already gives the advantages",
    );
    check(
        "\n[[algorithm.stack]]\nplugin = \"household\"",
        "key `algorithm.stack[0].plugin`, line 15: `household` is an environment plugin, not an \
         algorithm plugin",
    );
    check(
        "\n[[algorithm.stack]]\nplugin = \"hint\"\n[[algorithm.stack]]\nplugin = \"hint\"",
        "`hint` and `hint` both plan the rollout slots; a stack has at most one planner",
    );
    // Two scaffold algorithms would both split the group: a conflicting stack.
    check(
        "\n[[algorithm.stack]]\nplugin = \"edge\"\n[[algorithm.stack]]\nplugin = \"pats\"",
        "`edge` and `pats` both plan the rollout slots; a stack has at most one planner",
    );
    // A scaffold plugin's bad key names the plugin, the key and the line.
    check(
        "\n[[algorithm.stack]]\nplugin = \"reskill\"\nconfig = { p_new_min = 0.9 }",
        "key `algorithm.stack[0].config.p_new_min`, line 16: plugin `reskill` rejected its config",
    );
}
