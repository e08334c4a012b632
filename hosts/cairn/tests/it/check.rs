//! `cairn check` refuses what `cairn train` cannot run: non-finite numbers, and model or batch
//! sizes the machine cannot hold (refused with the memory estimate, before anything is
//! allocated, never a panic or an abort); and it passes every example config.

use std::path::Path;

use crate::{cairn, stderr, stdout, tiny_config, write_config};

/// Runs `cairn check` and `cairn train` on `text`; both must fail cleanly (exit 1, not a
/// panic's 101 or an abort's 134) with the same first error line, which is returned, and
/// train must not have created the run directory.
fn refused(dir: &Path, text: &str) -> String {
    let cfg = write_config(dir, "bad.toml", text);
    let check = cairn(&["check", cfg.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(1), "check: {}", stderr(&check));
    let train = cairn(&["train", cfg.to_str().unwrap()]);
    assert_eq!(train.status.code(), Some(1), "train: {}", stderr(&train));
    let first = |s: String| s.lines().next().unwrap_or_default().to_string();
    assert_eq!(first(stderr(&check)), first(stderr(&train)));
    assert!(!dir.join("run").exists(), "train wrote the run directory");
    stderr(&check)
}

#[test]
fn non_finite_numbers_are_refused_by_check_and_train() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);
    for (from, to, key) in [
        ("lr = 1e-3\nmicro", "lr = inf\nmicro", "optimizer.lr"),
        (
            "[eval]",
            "[reward]\ninvalid_action_penalty = nan\n\n[eval]",
            "reward.invalid_action_penalty",
        ),
        (
            "[eval]\ntasks = 4",
            "[eval]\ntasks = 4\ntemperature = inf",
            "eval.temperature",
        ),
    ] {
        let text = base.replace(from, to);
        assert_ne!(text, base);
        let e = refused(tmp.path(), &text);
        assert!(
            e.contains(&format!("key `{key}`")) && e.contains("finite"),
            "{e}"
        );
    }
}

#[test]
fn sizes_the_machine_cannot_hold_are_refused_with_the_estimate() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);
    for (from, to, key) in [
        (
            "hidden_size = 32",
            "hidden_size = 1000000000000",
            "model.scratch",
        ),
        (
            "num_hidden_layers = 1",
            "num_hidden_layers = 100000000",
            "model.scratch",
        ),
        (
            "tasks_per_step = 2",
            "tasks_per_step = 1000000000000",
            "rollout.tasks_per_step",
        ),
        (
            "group_size = 4",
            "group_size = 1000000000000",
            "rollout.tasks_per_step",
        ),
    ] {
        let e = refused(tmp.path(), &base.replace(from, to));
        assert!(
            e.contains(&format!("key `{key}`"))
                && e.contains("the model and batch need ~")
                && e.contains("gradients and AdamW state")
                && e.contains("this machine has"),
            "{to}: {e}"
        );
    }
    // A budget below what the tiny model needs is refused too, naming the budget.
    let e = refused(
        tmp.path(),
        &base.replace("device = \"cpu\"", "device = \"cpu\"\nmemory_gib = 0.0001"),
    );
    assert!(e.contains("`model.memory_gib` allows 1.00e-4 GiB"), "{e}");
}

#[test]
fn a_scratch_table_the_model_cannot_take_is_refused_by_check() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_config(&tmp.path().join("run"), 1);
    let e = refused(
        tmp.path(),
        &base.replace("num_key_value_heads = 1", "num_key_value_heads = 0"),
    );
    assert!(e.contains("key `model.scratch.num_key_value_heads`"), "{e}");
}

/// Every example config passes `cairn check`, except for what this machine lacks (a model
/// directory not downloaded, a GPU), and none is refused for memory.
#[test]
fn every_example_passes_check() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files: Vec<_> = ["", "gateway"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(examples.join(sub)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    let mut passed = 0;
    for file in &files {
        let out = cairn(&["check", file.to_str().unwrap()]);
        let e = stderr(&out);
        assert!(
            !e.contains("the model and batch need"),
            "{}: {e}",
            file.display()
        );
        if out.status.success() {
            assert!(stdout(&out).contains(": ok"), "{}", file.display());
            passed += 1;
        } else {
            assert_eq!(out.status.code(), Some(1), "{}: {e}", file.display());
            assert!(
                e.contains("model.path") || e.contains("model.device") || e.contains("tokenizer"),
                "{}: {e}",
                file.display()
            );
        }
    }
    // The household and search-qa examples need nothing this machine lacks.
    assert!(passed >= 4, "{passed} of {files:?} passed");
}
