//! The data pool end to end: a tiny run writes `<run>/pool.sqlite`; `cairn pool query`,
//! `cairn inspect`, `cairn pool export` read it, and `cairn pool exclude` makes the next steps
//! skip the excluded task. Also [`rows`], the other tests' way to read a run's trajectories.

use std::path::Path;

use cairn_stores::pool::{Filter, PoolReader};

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

/// Runs cairn with its stdout a pipe whose reader is already gone (`cairn … | head -0`), and
/// its stderr captured, or the same closed pipe too (`2>&1 | head -0`): `(status, stderr)`.
pub fn with_closed_stdout(args: &[&str], stderr_too: bool) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    command
        .args(args)
        .env("CAIRN_LOG", "error")
        .stdout(writer.try_clone().unwrap());
    if stderr_too {
        command.stderr(writer);
    } else {
        drop(writer);
        command.stderr(std::process::Stdio::piped());
    }
    let out = command.output().expect("run cairn");
    (out.status.code(), stderr(&out))
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
            if cairn_stores::pool::Source::is_training(&e.source) {
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
    export_refuses_to_overwrite_the_pool_or_another_file(&run, tmp.path());
    closed_stdout_ends_printing_commands_quietly(&run);
    impossible_filters_are_errors_naming_the_flags(&run);
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
    exclusions_of_nothing_yet_warn_and_say_what_matches(&run, &task);
}

/// `-o` never overwrites the pool (nor its -wal/-shm, nor any SQLite file), refuses another
/// existing file unless --force, and a refused or failed export leaves the path as it was.
fn export_refuses_to_overwrite_the_pool_or_another_file(run: &Path, tmp: &Path) {
    let r = run.to_str().unwrap();
    let pool_file = run.join("pool.sqlite");
    let before = std::fs::read(&pool_file).unwrap();
    let export = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "pool", "export", r, "--format", "jsonl", "--limit", "1", "-o",
        ];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        cairn(&args)
    };
    // The pool itself, also spelled another way, and its WAL files, even with --force.
    let dotted = run.join(".").join("pool.sqlite");
    for (out, extra) in [
        (pool_file.clone(), &[][..]),
        (pool_file.clone(), &["--force"][..]),
        (dotted, &["--force"][..]),
        (run.join("pool.sqlite-wal"), &["--force"][..]),
        (run.join("pool.sqlite-shm"), &[][..]),
    ] {
        let o = export(&out, extra);
        assert!(
            !o.status.success() && stderr(&o).contains("another output path"),
            "{out:?} {extra:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(
        std::fs::read(&pool_file).unwrap(),
        before,
        "the pool untouched"
    );
    // A copy of the pool elsewhere: a SQLite file, never overwritten.
    let copy = tmp.join("copy.sqlite");
    std::fs::write(&copy, &before).unwrap();
    let o = export(&copy, &["--force"]);
    assert!(
        !o.status.success() && stderr(&o).contains("SQLite"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    // Another file: refused, named, until --force.
    let notes = tmp.join("notes.txt");
    std::fs::write(&notes, "mine\n").unwrap();
    let o = export(&notes, &[]);
    let err = stderr(&o);
    assert!(
        !o.status.success()
            && err.contains(notes.to_str().unwrap())
            && err.contains("--force")
            && err.contains("another"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
    let o = export(&notes, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&notes).unwrap();
    assert!(
        text.starts_with("{\"") && text.lines().count() >= 1,
        "{text}"
    );
    // The export leaves no temporary file behind.
    let names: Vec<String> = std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

/// `cairn pool query RUN | head -1`: a closed stdout ends the printing commands with status
/// 0 and nothing on stderr (no "Broken pipe" error, no panic when stderr is the pipe too).
fn closed_stdout_ends_printing_commands_quietly(run: &Path) {
    let r = run.to_str().unwrap();
    for args in [
        vec!["pool", "query", r],
        vec!["pool", "query", r, "--json"],
        vec!["pool", "export", r, "--format", "jsonl"],
        vec!["pool", "export", r, "--format", "batch"],
        vec!["inspect", r],
        vec!["inspect", r, "--id", "1"],
    ] {
        for stderr_too in [false, true] {
            let (code, err) = with_closed_stdout(&args, stderr_too);
            assert_eq!(code, Some(0), "{args:?} (2>&1: {stderr_too}): {err}");
            assert_eq!(err, "", "{args:?}");
        }
    }
}

/// Filters that cannot match are errors naming the flags, for query and export.
fn impossible_filters_are_errors_naming_the_flags(run: &Path) {
    let r = run.to_str().unwrap();
    for (filter, says) in [
        (
            &["--reward-min", "1", "--reward-max", "0"][..],
            "--reward-max",
        ),
        (&["--step-min", "5", "--step-max", "2"][..], "--step-max"),
        (
            &["--version-min", "3", "--version-max", "1"][..],
            "--version-max",
        ),
        (&["--reward-min", "NaN"][..], "--reward-min NaN"),
        (&["--reward-max", "nan"][..], "--reward-max NaN"),
        (&["--limit", "0"][..], "--limit 0"),
    ] {
        for command in [
            vec!["pool", "query", r],
            vec!["pool", "export", r, "--format", "batch"],
        ] {
            let mut args = command.clone();
            args.extend_from_slice(filter);
            let o = cairn(&args);
            let err = stderr(&o);
            assert!(
                !o.status.success() && err.contains(says) && err.contains("give"),
                "{args:?}: {err}"
            );
            assert_eq!(stdout(&o), "", "{args:?}");
        }
    }
    // Equal bounds are fine: 0.9 and 0.9 is a range of one value.
    let o = cairn(&[
        "pool",
        "query",
        r,
        "--reward-min",
        "0.9",
        "--reward-max",
        "0.9",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// An exclusion that matches nothing yet is kept with a warning (naming it, saying when it
/// applies, pointing to `cairn pool query`); every success message says what it matches now.
fn exclusions_of_nothing_yet_warn_and_say_what_matches(run: &Path, task: &str) {
    let r = run.to_str().unwrap();
    for target in [
        &["--task", "no/such/task"][..],
        &["--episode", "999999"][..],
        &["--turn", "2:99"][..],
    ] {
        let mut args = vec!["pool", "exclude", r];
        args.extend_from_slice(target);
        args.extend_from_slice(&["--reason", "x"]);
        let o = cairn(&args);
        let err = stderr(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        let named = target[1];
        assert!(
            err.contains("warning")
                && err.contains(named)
                && err.contains("applies when such rows appear")
                && err.contains("cairn pool query"),
            "{args:?}: {err}"
        );
        assert!(stdout(&o).contains("0 episodes, 0 turns"), "{}", stdout(&o));
        let mut back = vec!["pool", "include", r];
        back.extend_from_slice(target);
        assert!(cairn(&back).status.success());
    }
    // A real target: no warning, and the counts of what it matches.
    let expected = query(run, &["--task", task]).len();
    let o = cairn(&["pool", "exclude", r, "--task", task, "--reason", "x"]);
    assert!(
        o.status.success() && stderr(&o).is_empty(),
        "{}",
        stderr(&o)
    );
    assert!(
        stdout(&o).contains(&format!("{expected} episodes")),
        "{expected}: {}",
        stdout(&o)
    );
    assert!(cairn(&["pool", "include", r, "--task", task])
        .status
        .success());
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

/// A path that is no run directory (missing, or a file) says exactly that, not "train it".
#[test]
fn a_missing_path_or_a_file_is_not_taken_for_an_untrained_run() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let file = tmp.path().join("config.toml");
    std::fs::write(&file, "").unwrap();
    for (path, says) in [(&missing, "no such directory"), (&file, "not a directory")] {
        let p = path.to_str().unwrap();
        for args in [
            vec!["inspect", p],
            vec!["pool", "query", p],
            vec!["pool", "export", p, "--format", "jsonl"],
            vec!["pool", "exclude", p, "--task", "t", "--reason", "x"],
            vec!["pool", "include", p, "--task", "t"],
        ] {
            let out = cairn(&args);
            let err = stderr(&out);
            assert!(
                !out.status.success()
                    && err.contains(p)
                    && err.contains(says)
                    && !err.contains("cairn train"),
                "{args:?}: {err}"
            );
        }
    }
    assert!(!missing.exists(), "nothing created");
}
