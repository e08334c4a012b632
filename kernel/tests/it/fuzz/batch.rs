//! The batch files of `cairn signals` and `cairn loss`: the documented examples
//! (docs/algorithms/example-batch.json, example-rows.json), mutated, through the functions the
//! commands call: `parse_batch` then `run_signals` with each algorithm plugin, and
//! `LossToolInput::from_json`, `ObjectiveConfig::from_json` and `run_loss`.

use std::sync::OnceLock;

use cairn_kernel::objective::tools::{parse_batch, run_loss, run_signals, LossToolInput};
use cairn_kernel::objective::ObjectiveConfig;
use cairn_kernel::plugins::PluginRegistry;
use cairn_plugin_sdk::host::foreign::PluginKind;
use proptest::prelude::*;
use serde_json::{json, Value as Json};

use super::{apply_text, bounded, mutate, mutation, names_a_touched_key, run, Touched, CASE_LIMIT};
use crate::plugins::plugin_dir;

const EXAMPLE_INPUT: &str = include_str!("../../../../docs/algorithms/example-batch.json");
const EXAMPLE_ROWS: &str = include_str!("../../../../docs/algorithms/example-rows.json");

/// Every algorithm plugin of the workspace, loaded once.
const ALGORITHMS: &[&str] = &[
    "cairn_grpo",
    "cairn_gigpo",
    "cairn_efca",
    "cairn_eapo",
    "cairn_hint",
    "cairn_edge",
    "cairn_reskill",
    "cairn_pats",
    "cairn_sdar",
    "cairn_icsd",
    "cairn_opid",
    "cairn_ucob",
    "cairn_echo",
];

fn registry() -> &'static PluginRegistry {
    static REGISTRY: OnceLock<(tempfile::TempDir, PluginRegistry)> = OnceLock::new();
    &REGISTRY
        .get_or_init(|| {
            let dir = plugin_dir(ALGORITHMS);
            let registry = PluginRegistry::scan(&[dir.path().to_path_buf()]).expect("scan");
            assert!(registry.failures().is_empty(), "{:?}", registry.failures());
            (dir, registry)
        })
        .1
}

fn algorithm_names() -> Vec<String> {
    registry()
        .plugins()
        .iter()
        .filter(|p| p.info.kind == PluginKind::Algorithm)
        .map(|p| p.info.name.clone())
        .collect()
}

fn batches() -> Vec<Json> {
    let input: Json = serde_json::from_str(EXAMPLE_INPUT).expect("example input");
    vec![
        input["batch"].clone(),
        serde_json::from_str(EXAMPLE_ROWS).expect("example rows"),
    ]
}

/// Words an error about the batch may name besides the touched key: the row it is in, or the
/// per-token arrays whose lengths must agree.
fn names_the_place(message: &str, touched: &[Touched]) -> bool {
    names_a_touched_key(message, touched)
        || ["row ", "rows", "group", "response_", "logprobs", "mask"]
            .iter()
            .any(|w| message.contains(w))
}

/// `cairn signals`: a mutated batch is read and run through every algorithm plugin; the
/// result is a report with one entry per row, or an error naming the field or the row.
#[test]
fn mutated_batches_through_every_algorithm() {
    let names = algorithm_names();
    assert!(names.len() >= 10, "{names:?}");
    let inputs = (
        prop::sample::select(batches()),
        prop::collection::vec(mutation(false), 1..4),
        prop::sample::select(names),
    );
    run(
        "signals",
        file!(),
        1000,
        inputs,
        |(batch, mutations, plugin)| {
            let mut doc = batch;
            let (touched, raws) = mutate(&mut doc, &mutations);
            let text = apply_text(doc.to_string(), &raws);
            let outcome = bounded(&plugin, CASE_LIMIT, {
                let plugin = plugin.clone();
                move || -> Result<Option<usize>, String> {
                    let batch = parse_batch(&text, "fuzz batch").map_err(|e| e.to_string())?;
                    let mut algorithm = registry()
                        .algorithm(&plugin)
                        .expect("a loaded plugin")
                        .create_algorithm("{}")
                        .expect("every algorithm plugin takes an empty config");
                    let report = run_signals(&mut algorithm, &batch).map_err(|e| e.to_string())?;
                    if report.rows.len() != batch.rows.len() {
                        return Ok(Some(report.rows.len()));
                    }
                    Ok(None)
                }
            });
            match outcome {
                Ok(None) => {}
                Ok(Some(rows)) => prop_assert!(false, "{plugin}: {rows} report rows"),
                Err(message) => prop_assert!(
                    names_the_place(&message, &touched),
                    "{plugin}: the error names no field: {message}\ntouched: {touched:?}"
                ),
            }
            Ok(())
        },
    );
}

/// Objective settings the loss tool is given (`--aggregation`, `--kl`, `--set KEY=VALUE`).
fn settings() -> Json {
    json!({
        "aggregation": "token-mean",
        "kl_estimator": "k3",
        "kl_coef": 0.01,
        "clip_high": 0.28,
        "entropy_coef": 0.0
    })
}

/// `cairn loss`: a mutated loss input and mutated settings give a report whose loss and
/// gradients are finite (unless a value above 1e6 was written), or an error naming the key,
/// the row or the micro-batch count.
#[test]
fn mutated_loss_inputs() {
    let input: Json = serde_json::from_str(EXAMPLE_INPUT).expect("example input");
    let inputs = (
        prop::collection::vec(mutation(false), 0..4),
        prop::collection::vec(mutation(false), 0..2),
        0usize..6,
    );
    run(
        "loss",
        file!(),
        1000,
        inputs,
        |(on_input, on_settings, micro_batches)| {
            let mut doc = input.clone();
            let (mut touched, raws) = mutate(&mut doc, &on_input);
            let text = apply_text(doc.to_string(), &raws);
            let mut objective = settings();
            let (touched_settings, raws) = mutate(&mut objective, &on_settings);
            let objective = apply_text(objective.to_string(), &raws);
            touched.extend(touched_settings);
            // A huge coefficient or log-prob may overflow the f32 gradients, as asked.
            let huge = touched.iter().any(|t| t.huge);
            let outcome = bounded("loss", CASE_LIMIT, move || -> Result<(), String> {
                let input = LossToolInput::from_json(&text).map_err(|e| e.to_string())?;
                let config = ObjectiveConfig::from_json(&objective).map_err(|e| e.to_string())?;
                let report = run_loss(&input, &config, micro_batches).map_err(|e| e.to_string())?;
                let finite = report.report.loss.is_finite()
                    && report.grad_logp.iter().flatten().all(|g| g.is_finite());
                if !finite && !huge {
                    return Err(format!("non-finite loss or gradient: {:?}", report.report));
                }
                Ok(())
            });
            if let Err(message) = outcome {
                prop_assert!(
                    !message.starts_with("non-finite")
                        && (names_the_place(&message, &touched)
                            || (micro_batches == 0 && message.contains("micro-batch"))),
                    "the error names no field: {message}\ntouched: {touched:?}"
                );
            }
            Ok(())
        },
    );
}
