//! Bad input gets an error that names the thing and says what to do, before any compute, and
//! never a crash.

use std::path::Path;

use crate::{cairn, stderr, tiny_config, write_config};

/// Runs `cairn train` on `text` and returns stderr, asserting a clean failure (exit 1, not a
/// signal or abort).
fn train_error(dir: &Path, text: &str) -> String {
    let cfg = write_config(dir, "bad.toml", text);
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean error; stderr: {}",
        stderr(&out)
    );
    stderr(&out)
}

#[test]
fn config_keys_are_named_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);

    let e = train_error(
        tmp.path(),
        &base.replace("group_size = 4", "group_size = 4\ngroup_sise = 4"),
    );
    assert!(
        e.contains("bad.toml") && e.contains("group_sise") && e.contains("line 28"),
        "{e}"
    );

    let out = cairn(&["train", tmp.path().join("absent.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("absent.toml") && e.contains("cairn config"),
        "{e}"
    );

    let e = train_error(tmp.path(), &base.replace("seed = 3\n", ""));
    assert!(e.contains("missing field `seed`"), "{e}");

    let e = train_error(
        tmp.path(),
        &base.replace("config = { max_turns = 14 }", "config = { max_turn = 14 }"),
    );
    assert!(
        e.contains("environment.config.max_turn") && e.contains("line 9"),
        "{e}"
    );

    let e = train_error(
        tmp.path(),
        &base.replace("[optimizer]", "[objective]\nclip_low = -0.1\n\n[optimizer]"),
    );
    let line = base.lines().position(|l| l == "[optimizer]").unwrap() + 2;
    assert!(
        e.contains(&format!("`objective.clip_low`, line {line}")),
        "{e}"
    );

    let e = train_error(
        tmp.path(),
        &base.replace(
            "[optimizer]",
            "[objective]\naggregation = \"token-sum\"\n\n[optimizer]",
        ),
    );
    assert!(e.contains("token-sum") && e.contains("token-mean"), "{e}");
}

#[test]
fn missing_plugins_and_unmet_needs_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);

    let e = train_error(
        tmp.path(),
        &base.replace("plugin = \"grpo\"", "plugin = \"nope\""),
    );
    assert!(
        e.contains("no algorithm plugin named `nope`")
            && e.contains("grpo")
            && e.contains("`algorithm.plugin`, line 12"),
        "{e}"
    );
    // Nothing is written before the plugins are found.
    assert!(!tmp.path().join("run").exists());

    // eapo disables tools for some slots; the household has no tools.
    let e = train_error(
        tmp.path(),
        &base.replace("plugin = \"grpo\"", "plugin = \"eapo\""),
    );
    assert!(
        e.contains("algorithm `eapo` sets `requirements.tool_free_slots`")
            && e.contains("environment `household` does not provide it")
            && e.contains("algorithm.plugin"),
        "{e}"
    );

    // A plugin option that does not exist.
    let e = train_error(
        tmp.path(),
        &base.replace(
            "plugin = \"grpo\"",
            "plugin = \"grpo\"\nconfig = { norm_adv = true }",
        ),
    );
    assert!(
        e.contains("algorithm.config.norm_adv") && e.contains("line 13"),
        "{e}"
    );
}

#[test]
fn a_plugin_that_panics_mid_run_is_an_error_not_an_abort() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);
    let e = train_error(
        tmp.path(),
        &base.replace(
            "plugin = \"grpo\"",
            "plugin = \"faulty\"\nconfig = { panic_in = \"signals\" }",
        ),
    );
    assert!(
        e.contains("plugin `faulty`") && e.contains("injected panic"),
        "{e}"
    );
}

/// Rewrites a safetensors file with `edit` applied to its JSON header (offsets untouched).
fn edit_safetensors(
    path: &Path,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

#[test]
fn checkpoints_with_missing_or_misshapen_tensors_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = write_config(tmp.path(), "tiny.toml", &tiny_config(&run, 0));
    let out = cairn(&["train", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let good = run.join("checkpoints").join(latest.trim());

    let missing = run.join("checkpoints/step-900001");
    copy_dir(&good, &missing);
    let tensor = "model.layers.0.mlp.down_proj.weight";
    edit_safetensors(&missing.join("policy/model.safetensors"), |h| {
        h.remove(tensor).expect("tensor present");
    });
    let out = cairn(&["eval", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(e.contains(tensor) && e.contains("model.safetensors"), "{e}");

    let misshapen = run.join("checkpoints/step-900002");
    copy_dir(&good, &misshapen);
    edit_safetensors(&misshapen.join("policy/model.safetensors"), |h| {
        let shape = h[tensor]["shape"].as_array().unwrap().clone();
        h[tensor]["shape"] = serde_json::json!([shape[1], shape[0]]);
    });
    let out = cairn(&["eval", misshapen.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(e.contains(tensor) && e.contains("shape"), "{e}");

    let out = cairn(&["eval", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("checkpoint"), "{}", stderr(&out));

    // Wrong arguments around a good checkpoint fail before any evaluation, by name.
    let good = good.to_str().unwrap();
    let gone = run.join("checkpoints/step-999999");
    let no_dir = tmp.path().join("no/such/dir/x.json");
    let cases: [(Vec<&str>, &str); 5] = [
        (vec!["eval", gone.to_str().unwrap()], "does not exist"),
        (vec!["eval", good, "--tasks", "0"], "at least one"),
        (vec!["eval", good, "--tasks", "100000"], "ask for 1 to"),
        (
            vec!["eval", good, "--temperature", "-1"],
            "--temperature -1: must be",
        ),
        (
            vec!["eval", good, "--record", no_dir.to_str().unwrap()],
            "--record",
        ),
    ];
    for (args, expected) in cases {
        let out = cairn(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }

    // Resuming this run with another model names the difference and the way out.
    let other = tiny_config(&run, 1).replace("hidden_size = 32", "hidden_size = 64");
    let e = train_error(tmp.path(), &other);
    assert!(
        e.contains("model.scratch.hidden_size: 32 → 64") && e.contains("--no-resume"),
        "{e}"
    );

    // Run-directory tools on directories that are not runs.
    for args in [
        vec!["plot", tmp.path().to_str().unwrap()],
        vec!["compare", "a=/nonexistent-run"],
    ] {
        let out = cairn(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let e = stderr(&out);
        assert!(
            e.contains("not a run directory") || e.contains("no such directory"),
            "{args:?}: {e}"
        );
    }
    assert!(!tmp.path().join("curves.png").exists());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn offline_tools_reject_malformed_files_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"step": 0, "rows": [{"response_ids": [1, 2], "response_mask": [1]}]}"#,
    )
    .unwrap();
    let out = cairn(&[
        "signals",
        "--plugin",
        "grpo",
        "--batch",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("bad.json") && e.contains("row 0"), "{e}");

    std::fs::write(&bad, "{ not json").unwrap();
    let out = cairn(&["loss", "--batch", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("bad.json"), "{}", stderr(&out));
}

#[test]
fn a_cuda_device_that_is_not_there_fails_check_and_train_before_the_run_directory_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let text = tiny_config(&run, 1).replace("device = \"cpu\"", "device = \"cuda\"");
    let line = text.lines().position(|l| l == "device = \"cuda\"").unwrap() + 1;
    let cfg = write_config(tmp.path(), "gpu.toml", &text);
    let check = cairn(&["check", cfg.to_str().unwrap()]);
    if cairn_torch::DeviceOption::Cuda.resolve().is_ok() {
        // A machine with a GPU: the config is good.
        assert!(check.status.success(), "{}", stderr(&check));
        return;
    }
    for (command, out) in [
        ("check", check),
        ("train", cairn(&["train", cfg.to_str().unwrap()])),
    ] {
        assert_eq!(out.status.code(), Some(1), "{command}: {}", stderr(&out));
        let e = stderr(&out);
        assert!(
            e.contains(cfg.to_str().unwrap())
                && e.contains(&format!("model.device`, line {line}"))
                && e.contains("no CUDA device")
                && e.contains("device = \"cpu\"")
                && e.contains("\"auto\""),
            "{command}: {e}"
        );
        assert!(!run.exists(), "{command} wrote the run directory");
    }
}

/// `cairn plot` on a run whose `metrics.jsonl` ends in a line cut off mid-write (what a
/// `kill -9` of the trainer leaves) draws the complete lines and notes the cut one; a bad line
/// in the middle is refused by file and line, with what to do.
#[test]
fn plot_leaves_out_a_cut_off_last_line_and_names_a_bad_one() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let metrics = run.join("metrics.jsonl");
    let complete: String = (0..3)
        .map(|s| format!("{{\"phase\":\"rl\",\"step\":{s},\"success_rate\":0.{s}}}\n"))
        .collect();
    std::fs::write(
        &metrics,
        format!("{complete}{{\"phase\":\"rl\",\"step\":3,\"lo"),
    )
    .unwrap();
    let out = cairn(&["plot", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("metrics.jsonl line 4 is cut off"),
        "{}",
        stderr(&out)
    );
    assert!(run.join("curves.png").is_file());

    std::fs::remove_file(run.join("curves.png")).unwrap();
    std::fs::write(&metrics, format!("{{\"phase\":\"rl\",\"st\n{complete}")).unwrap();
    let out = cairn(&["plot", run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("metrics.jsonl line 1: EOF while parsing") && e.contains("fix or delete"),
        "{e}"
    );
    assert!(!run.join("curves.png").exists());
}

/// A `[source]` without `kind` (the key lines of docs/gateway.md pasted alone) names
/// `source.kind` and its two values, not serde's bare "missing field `kind`".
#[test]
fn a_source_without_kind_names_source_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);
    let e = train_error(
        tmp.path(),
        &format!("{base}\n[source]\napi_key_env = \"CAIRN_API_KEY\"\n"),
    );
    assert!(
        e.contains("`source.kind`: missing")
            && e.contains("kind = \"environment\"")
            && e.contains("kind = \"gateway\""),
        "{e}"
    );
}
