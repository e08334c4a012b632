//! `cairn logprobs MODEL_DIR --input FILE`: on the transformers fixtures of cairn-torch
//! (`kernel/torch/tests/fixtures/fidelity/`, made by `scripts/fidelity/make_fixtures.py`), the
//! printed log-probs are transformers' to 1e-4 (f32); bad input is a clean error (exit 1) that
//! names what is wrong.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::{cairn, stderr, stdout};

/// Fixture models and their log-prob tolerance against transformers: 1e-4 in f32; in bf16,
/// transformers' own spread between its attention backends (see the fixtures' README).
const MODELS: [(&str, f32); 5] = [
    ("qwen2", 1e-4),
    ("qwen2.5-sharded", 1e-4),
    ("qwen3", 1e-4),
    ("qwen3-bf16", 0.1),
    ("llama3", 1e-4),
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernel/torch/tests/fixtures/fidelity")
}

fn reference(model: &str) -> Value {
    let path = fixtures().join("reference").join(format!("{model}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture reference"))
        .expect("reference JSON")
}

fn model_dir(model: &str) -> String {
    fixtures().join("models").join(model).display().to_string()
}

/// Runs `cairn logprobs` on `input` (written to a file) with extra `args`.
fn logprobs(dir: &str, input: &str, args: &[&str]) -> std::process::Output {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("input.json");
    std::fs::write(&file, input).unwrap();
    let file = file.display().to_string();
    let mut all = vec!["logprobs", dir, "--input", file.as_str()];
    all.extend_from_slice(args);
    cairn(&all)
}

/// The printed `[[f32]]`, asserting a successful run.
fn printed(out: &std::process::Output) -> Vec<Vec<f32>> {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    serde_json::from_str(stdout(out).trim()).expect("a JSON list of lists")
}

fn max_abs_diff(ours: &[Vec<f32>], theirs: &Value) -> f32 {
    let theirs: Vec<Vec<f32>> = serde_json::from_value(theirs.clone()).unwrap();
    assert_eq!(ours.len(), theirs.len(), "row count");
    ours.iter()
        .zip(&theirs)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len(), "row length");
            a.iter().zip(b).map(|(x, y)| (x - y).abs())
        })
        // Not `f32::max`, which would drop a NaN: a NaN log-prob must fail.
        .fold(0.0, |worst: f32, d: f32| {
            if worst.is_nan() || d.is_nan() {
                f32::NAN
            } else {
                worst.max(d)
            }
        })
}

#[test]
fn printed_logprobs_match_transformers_on_every_fixture() {
    for (model, tolerance) in MODELS {
        let reference = reference(model);
        // The left-padded batch: the JSON the command reads is the fixture's own form.
        let batch = &reference["batch"];
        let out = logprobs(&model_dir(model), &batch["sequences"].to_string(), &[]);
        let diff = max_abs_diff(&printed(&out), &batch["logprobs"]);
        assert!(
            diff <= tolerance,
            "{model}: max abs diff {diff:e} > {tolerance:e}"
        );
    }
}

#[test]
fn temperature_divides_the_logits_as_transformers_scores_do() {
    let reference = reference("llama3");
    let case = reference["single"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["temperature"] == json!(0.7))
        .expect("a case at temperature 0.7");
    let input = json!([{"prompt_ids": case["prompt_ids"], "response_ids": case["response_ids"]}]);
    let out = logprobs(
        &model_dir("llama3"),
        &input.to_string(),
        &["--temperature", "0.7"],
    );
    let diff = max_abs_diff(&printed(&out), &json!([case["logprobs"]]));
    assert!(diff <= 1e-4, "max abs diff {diff:e}");
}

/// Runs a failing `cairn logprobs` and returns stderr, asserting exit code 1 (a clean error,
/// not a panic or a signal) and nothing on stdout.
fn error(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(out));
    assert_eq!(stdout(out), "");
    stderr(out).trim_end().to_string()
}

#[test]
fn bad_input_is_a_clean_error_naming_what_is_wrong() {
    let dir = model_dir("qwen3");
    let tmp = tempfile::tempdir().unwrap();

    // Malformed JSON: the file and the expected form are named.
    let file = tmp.path().join("broken.json");
    std::fs::write(&file, r#"[{"prompt_ids": [1, 2], "response_ids": [3]"#).unwrap();
    let out = cairn(&["logprobs", &dir, "--input", file.to_str().unwrap()]);
    assert_eq!(
        error(&out),
        format!(
            "error: {}: expected a JSON list of {{\"prompt_ids\": [...], \"response_ids\": [...]}}: \
             EOF while parsing an object at line 1 column 43",
            file.display()
        )
    );

    // An unknown key (a typo) is not ignored.
    std::fs::write(&file, r#"[{"prompt_ids": [1], "respons_ids": [3]}]"#).unwrap();
    let e = error(&cairn(&[
        "logprobs",
        &dir,
        "--input",
        file.to_str().unwrap(),
    ]));
    assert!(
        e.starts_with(&format!("error: {}: ", file.display())) && e.contains("`respons_ids`"),
        "{e}"
    );

    // An id outside the vocabulary: which sequence, which field, which id, the vocabulary size.
    let input = json!([
        {"prompt_ids": [1, 2], "response_ids": [3]},
        {"prompt_ids": [5], "response_ids": [7, 512]}
    ]);
    let e = error(&logprobs(&dir, &input.to_string(), &[]));
    assert!(
        e.starts_with("error: /") && e.contains("input.json: "),
        "the input file is named: {e}"
    );
    assert!(
        e.ends_with(
            "input: sequence 1: response_ids holds token id 512, outside the vocabulary (size 512)"
        ),
        "{e}"
    );

    // An empty prompt: the first response token would have no context.
    let input = json!([{"prompt_ids": [], "response_ids": [3]}]);
    let e = error(&logprobs(&dir, &input.to_string(), &[]));
    assert!(
        e.contains("input.json: ")
            && e.ends_with(
                "input: sequence 0: empty prompt_ids; the first response token needs at least one \
                 context token"
            ),
        "{e}"
    );

    // A missing model directory: the file that could not be read.
    let missing = tmp.path().join("no-such-model");
    let input = json!([{"prompt_ids": [1], "response_ids": [2]}]).to_string();
    assert_eq!(
        error(&logprobs(missing.to_str().unwrap(), &input, &[])),
        format!(
            "error: {}: No such file or directory (os error 2)",
            missing.join("config.json").display()
        )
    );

    // A missing input file.
    let absent = tmp.path().join("absent.json");
    assert_eq!(
        error(&cairn(&[
            "logprobs",
            &dir,
            "--input",
            absent.to_str().unwrap()
        ])),
        format!(
            "error: reading {}: No such file or directory (os error 2)",
            absent.display()
        )
    );
}
