//! The data pool end to end: a tiny run writes `<run>/pool.sqlite`; `cairn pool query`,
//! `cairn inspect`, `cairn pool export` read it, and `cairn pool exclude` makes the next steps
//! skip the excluded task. Also [`rows`], the other tests' way to read a run's trajectories.

use std::path::Path;

use cairn_kernel::pool::{Filter, PoolReader};

/// Every turn row of the run's pool (as the batch JSON form writes a row), with
/// `"<source> step <step>"` naming its episode's source and step; `source` narrows as
/// `cairn pool query --source` does (`train`, `eval`, `rollout`, `gateway`, `eval:<label>`).
pub fn rows(run: &Path, source: Option<&str>) -> Vec<(String, serde_json::Value)> {
    let pool = PoolReader::open_run(run).expect("the run's data pool");
    let filter = Filter {
        source: source.map(str::to_owned),
        ..Filter::default()
    };
    let mut out = Vec::new();
    for e in pool.episodes(&filter).unwrap() {
        let name = format!("{} step {}", e.source, e.step);
        for t in pool.turns(e.id).unwrap() {
            out.push((name.clone(), serde_json::to_value(&t.row).unwrap()));
        }
    }
    out
}

use crate::{cairn, jsonl, stderr, stdout, tiny_config, write_config};

/// The tiny pipeline on two recurring training tasks (every step draws both), 2 RL steps.
fn train_two_tasks(dir: &Path, run: &Path, steps: u64) -> std::path::PathBuf {
    let text = tiny_config(run, steps).replace(
        "config = { max_turns = 14 }",
        "config = { max_turns = 14, train_tasks = 2 }",
    );
    let cfg = write_config(dir, "pool.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    cfg
}

fn query(run: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["pool", "query", run.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let out = cairn(&all);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One run checks the whole surface: what each step wrote (every episode, its turns with
/// advantages on the trained tokens), `inspect`, both exports (the batch form read back by
/// `cairn signals`), and an exclusion made between two invocations that the continued run
/// honours from its first step on.
#[test]
fn the_pool_records_every_step_and_the_cli_queries_inspects_exports_and_excludes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = train_two_tasks(tmp.path(), &run, 2);
    let r = run.to_str().unwrap();

    // 2 steps × 2 groups × 4 rollouts, each with its seed, trained, with turns.
    let train = query(&run, &["--source", "train"]);
    assert_eq!(train.len(), 16, "{train:?}");
    let steps: std::collections::BTreeSet<u64> =
        train.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [0, 1].into());
    assert!(train
        .iter()
        .all(|e| e["seed"].is_u64() && e["trained"] == true));
    let pool = PoolReader::open_run(&run).unwrap();
    for e in pool.episodes(&Filter::default()).unwrap() {
        let turns = pool.turns(e.id).unwrap();
        assert_eq!(turns.len() as u32, e.turns, "{e:?}");
        for t in &turns {
            if cairn_kernel::pool::Source::is_training(&e.source) {
                let adv = t.advantages.as_ref().expect("advantages on a trained row");
                assert_eq!(adv.len(), t.row.response_ids.len());
                assert!(t.row.old_logprobs.len() == t.row.response_ids.len());
            } else {
                assert!(
                    !t.trained && t.advantages.is_none(),
                    "evaluations never train"
                );
            }
        }
    }
    // Evaluations are recorded too (the warm start's and the final one).
    let evals = query(&run, &["--source", "eval"]);
    let labels: std::collections::BTreeSet<&str> = evals
        .iter()
        .map(|e| e["source"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["eval:after_rl", "eval:after_warm_start"].into());
    // Filters narrow.
    let task = train[0]["task_id"].as_str().unwrap().to_string();
    let of_task = query(&run, &["--task", &task, "--step-max", "0"]);
    assert!(
        !of_task.is_empty()
            && of_task
                .iter()
                .all(|e| e["task_id"] == task.as_str() && e["step"] == 0)
    );
    let winners = query(&run, &["--source", "train", "--success", "true"]);
    assert!(winners.iter().all(|e| e["success"] == true));

    // inspect: the step table, then one episode turn by turn with decoded text.
    let out = cairn(&["inspect", r]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("training steps (2):") && text.contains("eval:after_rl"),
        "{text}"
    );
    let traj = train[0]["trajectory_id"].as_u64().unwrap().to_string();
    let out = cairn(&["inspect", r, "--episode", &traj]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("── turn 0") && text.contains("advantage") && text.contains("prompt ("),
        "{text}"
    );
    assert!(
        !text.contains("\x1b["),
        "plain text when stdout is not a terminal"
    );

    // Export: the batch form round-trips through `cairn signals`; JSONL carries the text.
    let batch_file = tmp.path().join("step0.json");
    let out = cairn(&[
        "pool",
        "export",
        r,
        "--format",
        "batch",
        "--source",
        "train",
        "--step-max",
        "0",
        "-o",
        batch_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let batch: cairn_plugin_sdk::Batch =
        serde_json::from_str(&std::fs::read_to_string(&batch_file).unwrap()).unwrap();
    let first_step: Vec<TurnRecordRow> = pool
        .episodes(&Filter {
            source: Some("train".into()),
            step_max: Some(0),
            ..Filter::default()
        })
        .unwrap()
        .into_iter()
        .flat_map(|e| pool.turns(e.id).unwrap())
        .map(|t| t.row)
        .collect();
    assert_eq!(batch.rows, first_step, "every field of every row, exactly");
    let out = cairn(&[
        "signals",
        "--plugin",
        "grpo",
        "--batch",
        batch_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("advantages"), "{}", stdout(&out));
    let out = cairn(&["pool", "export", r, "--format", "jsonl", "--limit", "1"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let line: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert!(
        line["prompt"].as_str().is_some_and(|p| !p.is_empty()),
        "{line}"
    );
    assert!(
        line["response_ids"].is_array() && line["response"].is_string(),
        "{line}"
    );

    // Exclude one task, then continue the run for two more steps: its rows of the new steps
    // are recorded untrained with the reason, counted in the metrics; the other task trains.
    let out = cairn(&[
        "pool",
        "exclude",
        r,
        "--task",
        &task,
        "--reason",
        "bad labels",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let out = cairn(&["train", cfg.to_str().unwrap(), "--steps", "4"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let later = query(&run, &["--source", "train", "--step-min", "2"]);
    assert_eq!(later.len(), 16, "{later:?}");
    for e in &later {
        let excluded = e["task_id"] == task.as_str();
        assert_eq!(e["trained"], !excluded, "{e}");
        if excluded {
            let why = e["skip_reason"].as_str().unwrap();
            assert!(why.contains("bad labels") && why.contains(&task), "{e}");
        }
    }
    let rl: Vec<_> = jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .filter(|m| m["phase"] == "rl")
        .collect();
    assert_eq!(rl.len(), 4);
    assert_eq!(rl[1]["pool/excluded_rows"], 0);
    assert!(
        rl[3]["pool/excluded_rows"].as_u64().unwrap() > 0,
        "{}",
        rl[3]
    );
    // The resumed run's pool holds each step once (the truncation on resume).
    assert_eq!(query(&run, &["--source", "train"]).len(), 32);
    // Un-marking works, and an unknown exclusion is an error naming the run directory.
    let out = cairn(&["pool", "include", r, "--task", &task]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let out = cairn(&["pool", "include", r, "--task", &task]);
    assert!(
        !out.status.success() && stderr(&out).contains(r),
        "{}",
        stderr(&out)
    );
}

type TurnRecordRow = cairn_plugin_sdk::TurnRow;

#[test]
fn a_run_directory_without_a_pool_is_an_error_that_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().to_str().unwrap();
    for args in [
        vec!["inspect", r],
        vec!["pool", "query", r],
        vec!["pool", "exclude", r, "--task", "t", "--reason", "x"],
    ] {
        let out = cairn(&args);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains("no data pool in") && err.contains(r) && err.contains("cairn train"),
            "{args:?}: {err}"
        );
    }
    let out = cairn(&["pool", "exclude", r, "--turn", "4", "--reason", "x"]);
    assert!(stderr(&out).contains("--turn 4"), "{}", stderr(&out));
}
