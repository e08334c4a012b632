//! The offline tools on the documented example files: `cairn signals` and `cairn loss`, as
//! docs/algorithms/loss-tool.md shows them.

use std::path::PathBuf;

use crate::{cairn, stderr, stdout};

fn docs(file: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/algorithms")
        .join(file);
    root.to_str().unwrap().to_string()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = cairn(args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON on stdout")
}

#[test]
fn signals_runs_a_plugin_on_the_example_rows() {
    let report = json(&[
        "signals",
        "--plugin",
        "grpo",
        "--config",
        "norm_adv_by_std=false",
        "--batch",
        &docs("example-rows.json"),
    ]);
    let first: Vec<f64> = report["signals"]["advantages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[0].as_f64().unwrap())
        .collect();
    // Dr.GRPO: R − group mean, with the rows' group ids and episode rewards.
    let expected = [1.0 / 3.0, 1.0 / 3.0, -2.0 / 3.0, 1.0];
    for (a, e) in first.iter().zip(expected) {
        assert!((a - e).abs() < 1e-6, "{first:?}");
    }
    let out = cairn(&[
        "signals",
        "--plugin",
        "grpo",
        "--config",
        "norm_adv=1",
        "--batch",
        &docs("example-rows.json"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("norm_adv"), "{}", stderr(&out));
}

/// The offline host has no model and no bank: a plugin that declares it needs them is refused
/// before it runs, naming the plugin, the flag and what to do.
#[test]
fn signals_refuses_a_plugin_that_needs_a_model() {
    for (requires, need) in [
        (
            r#"{"teacher_scores": true}"#,
            "`requirements.teacher_scores` (it calls `Host::score` to re-score responses)",
        ),
        (
            r#"{"generation": true}"#,
            "`requirements.generation` (it calls `Host::generate`)",
        ),
        (
            r#"{"bank": ["skill"]}"#,
            "`requirements.bank` (it calls the experience bank)",
        ),
    ] {
        let out = cairn(&[
            "signals",
            "--plugin",
            "faulty",
            "--config",
            &format!("requires={requires}"),
            "--batch",
            &docs("example-rows.json"),
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let expected = format!(
            "algorithm `faulty` sets {need}, but `cairn signals` (offline, no model) offers no \
             such service; run it in a training pipeline (`cairn train`) with a policy model, or \
             turn that part of the plugin off"
        );
        assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
        assert!(stdout(&out).is_empty(), "nothing ran: {}", stdout(&out));
    }
}

#[test]
fn loss_is_the_same_for_every_micro_batch_split() {
    let args = |n: &'static str| {
        json(&[
            "loss",
            "--batch",
            &docs("example-batch.json"),
            "--kl",
            "k3",
            "--kl-coef",
            "0.01",
            "--micro-batches",
            n,
        ])
    };
    let one = args("1");
    let three = args("3");
    let loss = one["report"]["loss"].as_f64().unwrap();
    // The value docs/algorithms/loss-tool.md gives for this input.
    assert!((loss - 0.049392221).abs() < 1e-7, "{loss}");
    assert!((three["report"]["loss"].as_f64().unwrap() - loss).abs() < 1e-9);
    let g1: Vec<f64> = one["grad_logp"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    let g3: Vec<f64> = three["grad_logp"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    assert_eq!(g1.len(), g3.len());
    for (a, b) in g1.iter().zip(&g3) {
        assert!((a - b).abs() < 1e-7, "{g1:?} vs {g3:?}");
    }
    let out = cairn(&[
        "loss",
        "--batch",
        &docs("example-batch.json"),
        "--aggregation",
        "tokens-mean",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("tokens-mean"), "{}", stderr(&out));
}
