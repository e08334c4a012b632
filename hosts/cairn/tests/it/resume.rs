//! Exact resume and the run directory's safety: a run killed with SIGKILL at pseudo-random
//! points (in the warm start, right after a checkpoint, in the middle of an RL step) or stopped
//! by a full disk, and resumed by the same command, ends with the uninterrupted run's metrics,
//! evaluations, weights, optimizer moments, plugin state, bank and data pool (episode ids
//! included); a damaged checkpoint is refused and the one before it used; a full disk while a
//! checkpoint is written leaves `latest` on the previous one; SIGINT/SIGTERM stop at a step
//! boundary with a checkpoint; a stale lock is taken over; `cairn check` names file and line.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{cairn, jsonl, stderr, stdout, tiny_config, write_config};

/// Keys of `metrics.jsonl` that measure wall-clock time (`step_time_s`, `rollout_time_s`,
/// `train_time_s`) or throughput (`tokens_per_s`,
/// `train_tokens_per_s`): they differ from run to run. Every other value must be equal.
fn timed(key: &str) -> bool {
    key.ends_with("_time_s") || key.ends_with("tokens_per_s")
}

fn untimed(metrics: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    metrics
        .into_iter()
        .map(|mut m| {
            m.as_object_mut().unwrap().retain(|k, _| !timed(k));
            m
        })
        .collect()
}

/// The tiny pipeline with a 2-epoch warm start of several batches, `steps` RL steps, a
/// checkpoint every `every` steps and an evaluation every 2.
fn resume_config(run: &Path, steps: u64, every: u64) -> String {
    tiny_config(run, steps)
        .replace(
            "checkpoint_every = 1",
            &format!("checkpoint_every = {every}"),
        )
        .replace(
            "epochs = 1\nlr = 1e-3\nbatch_rows = 16",
            "epochs = 2\nlr = 1e-3\nbatch_rows = 2",
        )
        .replace("[eval]\ntasks = 4\n", "[eval]\ntasks = 4\nevery = 2\n")
}

fn spawn_train(cfg: &Path, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(["train", cfg.to_str().unwrap()])
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.matches('\n').count())
}

/// `trainer.json` of the checkpoint `checkpoints/latest` names.
fn latest_state(run: &Path) -> Option<serde_json::Value> {
    let name = std::fs::read_to_string(run.join("checkpoints/latest")).ok()?;
    let text = std::fs::read_to_string(
        run.join("checkpoints")
            .join(name.trim())
            .join("trainer.json"),
    )
    .ok()?;
    serde_json::from_str(&text).ok()
}

/// Polls every millisecond until `ready`, then SIGKILLs the child; panics if it ended first.
fn kill_when(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the run ended ({status}) before the kill point ({what}): {err}");
        }
        assert!(Instant::now() < deadline, "no kill point ({what}) in 120 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The golden run's config (a tiny model that, warm-started for 16 epochs, plays groups with
/// mixed rewards) with a checkpoint every `every` steps, an evaluation every 2 and `pats`
/// stacked on `grpo`, on two training tasks: every RL step writes an evidence card per task
/// into the bank, and the plugin's state (each task's window of card counts, and the removal
/// of a scaffold without effect once the window is full) decides which slots later steps
/// inject the scaffold into. `delta = 0.99` makes a revision
/// (`gain < −δ` with `p₀ < τ_solve ≤ 1`) impossible and `max_new_scaffolds = 0` turns creation
/// off, so Pats never asks the skill creator, whose pending reflections are not checkpointed.
fn pats_config(run: &Path, steps: u64, every: u64) -> String {
    crate::pipeline::hint_stack(
        run,
        "\n[[algorithm.stack]]\nplugin = \"pats\"\nconfig = { scaffold = \"open the receptacles \
         first\", delta = 0.99, window = 3, max_new_scaffolds = 0, coef = 0.5 }",
    )
    .replace("steps = 3", &format!("steps = {steps}"))
    .replace(
        "checkpoint_every = 0",
        &format!("checkpoint_every = {every}"),
    )
    .replace(
        "config = { max_turns = 14 }",
        "config = { max_turns = 14, train_tasks = 2 }",
    )
    .replace("[eval]\ntasks = 4", "[eval]\ntasks = 4\nevery = 2")
    .replace("epochs = 8", "epochs = 16")
}

/// What must match between two runs.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// `metrics.jsonl` without the wall-clock keys.
    metrics: Vec<serde_json::Value>,
    evals: String,
    /// The exported weights; the final checkpoint's weights, optimizer moments, reference and
    /// plugin state (`algorithm.state`).
    files: Vec<(String, Vec<u8>)>,
    /// `cairn bank export`.
    bank: Vec<serde_json::Value>,
    /// `cairn pool query --json` and `pool export --format jsonl`, pool ids included.
    pool: Vec<serde_json::Value>,
}

fn outcome(run: &Path) -> Outcome {
    let metrics = untimed(jsonl(&run.join("metrics.jsonl")));
    let evals = std::fs::read_to_string(run.join("eval.jsonl")).unwrap();
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let checkpoint = run.join("checkpoints").join(latest.trim());
    let files = [
        run.join("model/model.safetensors"),
        checkpoint.join("policy/model.safetensors"),
        checkpoint.join("policy/optimizer.safetensors"),
        checkpoint.join("policy/reference.safetensors"),
        checkpoint.join("algorithm.state"),
    ]
    .iter()
    .map(|p| {
        let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        (p.strip_prefix(run).unwrap().display().to_string(), bytes)
    })
    .map(|(name, bytes)| (name.replace(latest.trim(), "LATEST"), bytes))
    .collect();
    let export = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut args = args.to_vec();
        args.push(run.to_str().unwrap());
        let out = cairn(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let bank = export(&["bank", "export"]);
    let mut pool = export(&["pool", "query", "--json"]);
    pool.extend(export(&[
        "pool",
        "export",
        "--format",
        "jsonl",
        "--with-excluded",
    ]));
    Outcome {
        metrics,
        evals,
        files,
        bank,
        pool,
    }
}

/// The Pats member's state in a stack's `algorithm.state` (`{"0:grpo": …, "1:pats": …}`).
fn pats_state(outcome: &Outcome) -> serde_json::Value {
    let (_, bytes) = outcome
        .files
        .iter()
        .find(|(name, _)| name.ends_with("algorithm.state"))
        .unwrap();
    let stack: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    serde_json::from_str(stack["1:pats"].as_str().expect("a pats member")).unwrap()
}

/// A small deterministic generator for the kill points (splitmix64).
struct Points(u64);

impl Points {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

#[test]
fn a_run_killed_at_random_points_resumes_to_the_uninterrupted_runs_metrics_weights_and_bank() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 7;
    let reference = tmp.path().join("reference");
    let cfg = write_config(tmp.path(), "a.toml", &pats_config(&reference, steps, 1));
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = outcome(&reference);
    let warm_lines = expected
        .metrics
        .iter()
        .filter(|m| m["phase"] == "warm_start")
        .count() as u64;
    assert!(
        warm_lines >= 4,
        "the warm start should span several batches"
    );
    // Something to restore, so that each comparison below can fail. RL steps that move the
    // weights and the moments:
    let rl: Vec<_> = expected
        .metrics
        .iter()
        .filter(|m| m["phase"] == "rl")
        .collect();
    assert!(
        rl.iter().all(|m| m["grad_norm"].as_f64() > Some(0.0)),
        "{rl:?}"
    );
    // evidence cards in the bank, one per task and step until the task's scaffold is removed;
    let cards = expected
        .bank
        .iter()
        .filter(|e| e["kind"] == "evidence_card")
        .count();
    assert!(cards >= 4, "evidence cards: {:?}", expected.bank);
    // and a plugin state that counted every step and removed both tasks' scaffold, which
    // later steps obey (they play every slot plain).
    let state = pats_state(&expected);
    assert_eq!(state["steps"], steps, "{state}");
    assert_eq!(state["totals"]["cards"], cards, "{state}");
    let tasks = state["tasks"].as_object().unwrap();
    assert!(
        tasks.len() == 2 && tasks.values().all(|t| t["removed"].is_object()),
        "{state}"
    );
    assert_eq!(rl[0]["pats/scaffolds_active"], 2.0);
    assert_eq!(rl[rl.len() - 1]["pats/scaffolds_active"], 0.0);

    let run = tmp.path().join("killed");
    let cfg = write_config(tmp.path(), "b.toml", &pats_config(&run, steps, 1));
    let metrics = run.join("metrics.jsonl");
    let mut points = Points(0xC0FFEE);
    // 1. In the warm start, after a pseudo-random batch (mid epoch or at its end).
    let at = 1 + points.below(warm_lines - 1);
    let mut child = spawn_train(&cfg, &[]);
    kill_when(&mut child, "warm start", || lines(&metrics) as u64 >= at);
    // 2. Right after a checkpoint of RL step k (before, at or after the step that removes the
    // scaffolds: the third).
    let k = 1 + points.below(3);
    let mut child = spawn_train(&cfg, &[]);
    kill_when(&mut child, "checkpoint", || {
        latest_state(&run).is_some_and(|s| s["rl_steps"].as_u64() >= Some(k))
    });
    let done = latest_state(&run).unwrap()["rl_steps"].as_u64().unwrap();
    // 3. A full disk at the next step's checkpoint: the step is in the pool (written before
    // its metrics line) but not in `latest`, so the resume below deletes its episodes and
    // writes them again; their pool ids must be the uninterrupted run's.
    let out = spawn_train(&cfg, &[("CAIRN_FAULT_WRITE_FAIL_AFTER", "0")])
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("No space left on device"),
        "{err}"
    );
    assert_eq!(latest_state(&run).unwrap()["rl_steps"], done);
    let pool = cairn(&["pool", "query", "--json", run.to_str().unwrap()]);
    assert!(
        stdout(&pool).lines().any(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["source"] == "rollout" && e["step"] == done
        }),
        "the pool holds the step after the checkpoint: {}",
        stdout(&pool)
    );
    // 4. In the middle of a later RL step (its metrics line not written yet).
    let mid = (done + 2 + points.below(steps.saturating_sub(done + 2))).min(steps - 1);
    let mut child = spawn_train(&cfg, &[]);
    kill_when(&mut child, "mid RL step", || {
        lines(&metrics) as u64 >= warm_lines + mid
    });
    // Resumed by the same command until it finishes.
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("resumed from"), "{err}");
    // The killed run left its pid in `.lock`; the next run takes the stale lock over.
    assert!(
        err.contains("took over the run directory's lock from pid"),
        "{err}"
    );
    // A run that ended cleanly leaves no pid behind.
    let again = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!stderr(&again).contains("took over"), "{}", stderr(&again));

    let got = outcome(&run);
    assert_eq!(got.metrics.len(), expected.metrics.len(), "metrics lines");
    for (i, (a, b)) in got.metrics.iter().zip(&expected.metrics).enumerate() {
        assert_eq!(a, b, "metrics line {}", i + 1);
    }
    assert_eq!(got.evals, expected.evals, "eval.jsonl");
    for ((name, a), (_, b)) in got.files.iter().zip(&expected.files) {
        assert!(a == b, "{name} differs from the uninterrupted run's");
    }
    assert_eq!(pats_state(&got), state, "the pats state");
    for (what, a, b) in [
        ("bank entry", &got.bank, &expected.bank),
        ("pool episode or turn", &got.pool, &expected.pool),
    ] {
        assert_eq!(a.len(), b.len(), "{what}s");
        for (i, (a, b)) in a.iter().zip(b).enumerate() {
            assert!(a == b, "{what} {i}:\n{a}\n{b}");
        }
    }
    assert!(got == expected);
}

/// The checkpoint directories of a run, oldest first.
fn checkpoints(run: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn rl_steps(run: &Path) -> Vec<u64> {
    jsonl(&run.join("metrics.jsonl"))
        .iter()
        .filter_map(|m| m["rl_step"].as_u64())
        .collect()
}

#[test]
fn a_truncated_checkpoint_is_refused_and_the_previous_one_used_and_with_none_left_it_says_what_to_do(
) {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "t.toml", &tiny_config(&run, 3));
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let tensor = run
        .join("checkpoints")
        .join(latest.trim())
        .join("policy/model.safetensors");
    let len = std::fs::metadata(&tensor).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&tensor)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let out = cairn(&["train", cfg.to_str().unwrap(), "--steps", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("checkpoint {} refused", latest.trim()))
            && err.contains("model.safetensors")
            && err.contains("truncated")
            && err.contains("resuming from the earlier checkpoint"),
        "{err}"
    );
    // The earlier checkpoint is after RL step 2: step 3 is trained again, once.
    assert_eq!(rl_steps(&run), [1, 2, 3, 4]);

    // Every checkpoint damaged: a clear error, and nothing is overwritten.
    for dir in checkpoints(&run) {
        let file = dir.join("algorithm.state");
        let mut bytes = std::fs::read(dir.join("policy/model.safetensors")).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xFF;
        std::fs::write(dir.join("policy/model.safetensors"), bytes).unwrap();
        assert!(file.exists());
    }
    let before = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let out = cairn(&["train", cfg.to_str().unwrap(), "--steps", "5"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no checkpoint of this run verifies")
            && err.contains("CRC-32")
            && err.contains("--no-resume"),
        "{err}"
    );
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), before);
}

#[test]
fn a_full_disk_while_checkpointing_stops_the_run_and_leaves_latest_on_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "d.toml", &resume_config(&run, 3, 1));
    // The test hook: the 13th file written into a checkpoint fails like a full disk, in the
    // second checkpoint (the end of the warm start).
    let out = spawn_train(&cfg, &[("CAIRN_FAULT_WRITE_FAIL_AFTER", "12")])
        .wait_with_output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No space left on device") && err.contains("checkpoints/tmp-step-"),
        "{err}"
    );
    // `latest` names a whole checkpoint (it verifies), not the one that failed.
    let state = latest_state(&run).expect("the first checkpoint stays the resume point");
    assert_eq!(state["phase"], "warm_start", "{state}");
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("resumed from"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("refused"),
        "the previous checkpoint verifies: {}",
        stderr(&out)
    );
    assert_eq!(rl_steps(&run), [1, 2, 3]);
    // No unfinished checkpoint is left behind.
    assert!(checkpoints(&run)
        .iter()
        .all(|d| d.join("MANIFEST.json").is_file()));
}

#[test]
fn sigint_and_sigterm_stop_at_a_step_boundary_with_a_checkpoint_and_the_run_resumes() {
    for signal in ["INT", "TERM"] {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        // Checkpoints every 50 steps: the one after the signal is the stop's own.
        let cfg = write_config(tmp.path(), "s.toml", &resume_config(&run, 200, 50));
        let mut child = spawn_train(&cfg, &[]);
        let metrics = run.join("metrics.jsonl");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !jsonl_has_rl(&metrics) {
            assert!(child.try_wait().unwrap().is_none(), "the run ended early");
            assert!(Instant::now() < deadline, "no RL step in 120 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let out: Output = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "SIG{signal}: exit status");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("finishing the step in flight")
                && err.contains("run the same command to resume"),
            "SIG{signal}: {err}"
        );
        // Nothing half-written: the checkpoint covers every metrics line.
        let state = latest_state(&run).unwrap();
        let trained = rl_steps(&run);
        assert_eq!(
            state["rl_steps"].as_u64(),
            trained.last().copied(),
            "{state}"
        );
        assert_eq!(
            state["metrics_lines"].as_u64(),
            Some(lines(&metrics) as u64)
        );
        let target = trained.len() as u64 + 1;
        let out = cairn(&[
            "train",
            cfg.to_str().unwrap(),
            "--steps",
            &target.to_string(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(rl_steps(&run), (1..=target).collect::<Vec<_>>());
    }
}

fn jsonl_has_rl(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains("\"phase\":\"rl\""))
}

#[test]
fn check_passes_a_good_config_and_names_file_and_line_of_each_error() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let good = tiny_config(&run, 2);
    let cfg = write_config(tmp.path(), "good.toml", &good);
    let out = cairn(&["check", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("ok") && text.contains("household") && text.contains("grpo"),
        "{text}"
    );
    assert!(!run.exists(), "check writes nothing");

    let cases = [
        // A key no section has.
        (
            "key",
            good.replace("max_turns = 6\n", "max_turns = 6\nmax_turnz = 6\n"),
            "max_turnz",
        ),
        // A plugin rejecting its config.
        (
            "plugin",
            good.replace("config = { max_turns = 14 }", "config = { max_turns = 0 }"),
            "max_turns",
        ),
        // A need the config does not meet: GRPO's dynamic sampling needs groups of 2 or more.
        (
            "need",
            good.replace(
                "plugin = \"grpo\"\n",
                "plugin = \"grpo\"\nconfig = { dynamic_sampling = true }\n",
            )
            .replace("group_size = 4", "group_size = 1"),
            "min_group_size",
        ),
        // A plugin directory that does not exist.
        (
            "dirs",
            format!("[plugins]\ndirs = [\"/nonexistent/cairn-plugins\"]\n\n{good}"),
            "/nonexistent/cairn-plugins",
        ),
    ];
    for (name, text, named) in cases {
        let cfg = write_config(tmp.path(), &format!("{name}.toml"), &text);
        let out = cairn(&["check", cfg.to_str().unwrap()]);
        assert!(!out.status.success(), "{name}: should fail");
        let err = stderr(&out);
        assert!(
            err.contains(cfg.to_str().unwrap()) && err.contains("line ") && err.contains(named),
            "{name}: {err}"
        );
    }
}

/// Sends `signal` to the process `pid`.
fn send(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) takes plain integers; the child is not yet waited on, so its pid is ours.
    let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

#[test]
fn a_second_sigint_exits_at_once_with_status_130_without_a_crash_and_the_run_resumes() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    // The first signal lets the step in flight finish and checkpoint; when that finished
    // before the second signal arrived, the attempt proves nothing and is made again.
    for attempt in 1..=5 {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        // Longer generations than the tiny config's, so that a step is in flight (libtorch
        // computing on the actor threads) when the second signal arrives.
        let cfg = write_config(
            tmp.path(),
            "s.toml",
            &resume_config(&run, 200, 1).replace("max_new_tokens = 8", "max_new_tokens = 48"),
        );
        let mut child = spawn_train(&cfg, &[]);
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let metrics = run.join("metrics.jsonl");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !jsonl_has_rl(&metrics) {
            assert!(child.try_wait().unwrap().is_none(), "the run ended early");
            assert!(Instant::now() < deadline, "no RL step in 120 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        send(child.id(), libc::SIGINT);
        let mut err = String::new();
        // The second signal once the first is being handled (signals sent together could
        // merge into one).
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("no answer to the first SIGINT: {err}"));
            err.push_str(&line);
            err.push('\n');
            if line.contains("finishing the step in flight") {
                break;
            }
        }
        send(child.id(), libc::SIGINT);
        let status = child.wait().unwrap();
        reader.join().unwrap();
        err.extend(rx.try_iter().map(|l| l + "\n"));
        if status.code() == Some(1) && !err.contains("again: stopping now") {
            assert!(err.contains("run the same command to resume"), "{err}");
            eprintln!("attempt {attempt}: the first stop finished before the second signal");
            continue;
        }
        assert_eq!(
            (status.code(), status.signal()),
            (Some(130), None),
            "exit status {status}; stderr: {err}"
        );
        assert!(
            err.contains("again: stopping now")
                && err.contains("the step in flight is lost")
                && err.contains("resumes the run from its last checkpoint"),
            "{err}"
        );
        for crash in [
            "panicked",
            "backtrace",
            "Invalid (backend, op)",
            "Segmentation",
        ] {
            assert!(!err.contains(crash), "{crash}: {err}");
        }
        // The same command resumes from the last checkpoint.
        let target = rl_steps(&run).len() as u64 + 1;
        let out = cairn(&[
            "train",
            cfg.to_str().unwrap(),
            "--steps",
            &target.to_string(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stderr(&out).contains("resumed from"), "{}", stderr(&out));
        assert_eq!(rl_steps(&run), (1..=target).collect::<Vec<_>>());
        return;
    }
    panic!("in 5 attempts the second signal never arrived while a step was in flight");
}

#[test]
fn resume_refuses_another_seed_warns_once_about_other_changes_and_names_a_bad_latest() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = tiny_config(&run, 2);
    let cfg = write_config(tmp.path(), "r.toml", &text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(run.join("metrics.jsonl")).unwrap();

    // Another seed: refused before anything is written, with the key and the fix.
    let seeded = write_config(
        tmp.path(),
        "seed.toml",
        &text.replace("seed = 3", "seed = 4"),
    );
    let out = cairn(&["train", seeded.to_str().unwrap(), "--steps", "3"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("run.seed: 3 → 4") && err.contains("--no-resume"),
        "{err}"
    );
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), before);

    // Garbage in `latest` and a changed group size: each said once (warnings are not also
    // logged), the newest checkpoint used, the config recorded.
    std::fs::write(run.join("checkpoints/latest"), "garbage../../../etc").unwrap();
    let changed_text = text.replace("group_size = 4", "group_size = 2");
    let changed = write_config(tmp.path(), "changed.toml", &changed_text);
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["train", changed.to_str().unwrap(), "--steps", "3"])
        .env("CAIRN_LOG", "warn")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let garbage = "checkpoints/latest holds `garbage../../../etc`, which is not a checkpoint name";
    assert_eq!(err.matches(garbage).count(), 1, "{err}");
    assert_eq!(err.matches("rollout.group_size: 4 → 2").count(), 1, "{err}");
    assert!(
        err.contains("no longer the uninterrupted run") && !err.contains("refused"),
        "{err}"
    );
    assert_eq!(rl_steps(&run), [1, 2, 3]);
    assert_eq!(
        std::fs::read_to_string(run.join("config.toml")).unwrap(),
        changed_text
    );
    // "resumed from DIR (step N, ...)": N is the checkpoint's global step.
    let step: u64 = err
        .split_once("resumed from ")
        .and_then(|(_, rest)| rest.split_once("(step "))
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resume step: {err}"));
    let kept: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("config.before-step-"))
        .collect();
    // The config of the steps before the resume, named by the step it resumed from.
    assert_eq!(kept, [format!("config.before-step-{step:06}.toml")]);
    assert_eq!(std::fs::read_to_string(run.join(&kept[0])).unwrap(), text);

    // `latest` a directory, or `checkpoints` a file: an error naming the path and the fix.
    std::fs::remove_file(run.join("checkpoints/latest")).unwrap();
    std::fs::create_dir(run.join("checkpoints/latest")).unwrap();
    let out = cairn(&["train", changed.to_str().unwrap(), "--steps", "4"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("checkpoints/latest")
            && err.contains("is a directory")
            && err.contains("--no-resume")
            && !err.contains("os error"),
        "{err}"
    );
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("checkpoints"), "").unwrap();
    let out = cairn(&[
        "train",
        changed.to_str().unwrap(),
        "--run-dir",
        other.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("other/checkpoints") && err.contains("is a file") && !err.contains("os error"),
        "{err}"
    );
}
