//! Export round trip: Cairn trains a step and exports (weights, config, tokenizer files,
//! generation_config.json), then transformers loads the directory and must compute the same
//! log-probs, tokenize and render chats the same, and stop on the same ids.
//!
//! This is the one test that runs Python: `.venv/bin/python scripts/fidelity/check_export.py`,
//! from the venv `scripts/setup.sh` creates (scripts/test.sh runs it first). Without that venv,
//! or without transformers in it, the test fails and says to run scripts/setup.sh.

use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_kernel::backend::{OptimizerSettings, PolicyBackend, Sequence, Weights};
use cairn_kernel::loss::SftLoss;
use cairn_kernel::text::{train_word_level, RenderOptions, Tokenizer, WordLevelConfig};
use cairn_torch::{CausalLm, Dtype, ModelConfig, TorchBackend};
use serde_json::{json, Value as Json};
use tch::Device;

use crate::reference::{max_abs_diff, within, worst, Fixture, BF16_TOLERANCE, F32_TOLERANCE};

const TEXT: &str = "Put the apple in the fridge, then open the drawer 12 times.";

/// One exported directory and what Cairn computes on it.
struct Exported {
    name: String,
    dir: PathBuf,
    dtype: Dtype,
    architecture: &'static str,
    sequences: Vec<Sequence>,
    /// Cairn's log-probs of `sequences` after the export, one unpadded score each.
    logprobs: Vec<Vec<f32>>,
}

impl Exported {
    /// Exports `backend`'s policy with the tokenizer of `tokenizer_dir` into `root/name` and
    /// scores `sequences` with it.
    fn new(
        name: &str,
        mut backend: TorchBackend,
        tokenizer_dir: &Path,
        root: &Path,
        sequences: Vec<Sequence>,
    ) -> Exported {
        let dir = root.join(name);
        let files = backend.export(tokenizer_dir, &dir).unwrap();
        for file in [
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "generation_config.json",
        ] {
            assert!(
                files.iter().any(|f| f == file),
                "{name}: {file} not in {files:?}"
            );
            assert!(dir.join(file).is_file(), "{name}: {file} not written");
        }
        let logprobs = sequences
            .iter()
            .map(|s| {
                backend
                    .score(std::slice::from_ref(s), 1.0, Weights::Current)
                    .unwrap()
                    .remove(0)
            })
            .collect();
        let architecture = match backend.policy().config().model_type {
            cairn_torch::model::ModelType::Qwen3 => "Qwen3ForCausalLM",
            cairn_torch::model::ModelType::Qwen2 => "Qwen2ForCausalLM",
            cairn_torch::model::ModelType::Llama => "LlamaForCausalLM",
        };
        Exported {
            name: name.to_string(),
            dir,
            dtype: backend.policy().dtype(),
            architecture,
            sequences,
            logprobs,
        }
    }

    fn probe(&self) -> Json {
        let sequences: Vec<Json> = self
            .sequences
            .iter()
            .map(|s| json!({"prompt_ids": s.prompt_ids, "response_ids": s.response_ids}))
            .collect();
        json!({
            "dir": self.dir,
            "sequences": sequences,
            "text": TEXT,
            "messages": messages(),
        })
    }

    /// Compares transformers' report on this directory with Cairn; returns the failures.
    fn compare(&self, report: &Json) -> Vec<String> {
        let mut failures = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                failures.push(format!("{}: {what}", self.name));
            }
        };
        check(
            report["architecture"] == self.architecture,
            format!(
                "transformers built {}, expected {}",
                report["architecture"], self.architecture
            ),
        );
        let dtype = match self.dtype {
            Dtype::F32 => "float32",
            Dtype::Bf16 => "bfloat16",
        };
        check(
            report["dtype"] == dtype,
            format!(
                "transformers loaded {}, Cairn saved {dtype}",
                report["dtype"]
            ),
        );
        let theirs: Vec<Vec<f32>> = serde_json::from_value(report["logprobs"].clone()).unwrap();
        let tolerance = match self.dtype {
            Dtype::F32 => F32_TOLERANCE,
            Dtype::Bf16 => BF16_TOLERANCE,
        };
        let diff = self
            .logprobs
            .iter()
            .zip(&theirs)
            .map(|(a, b)| max_abs_diff(a, b))
            .fold(0.0, worst);
        eprintln!(
            "export round trip: {}: max abs log-prob diff {diff:.3e}",
            self.name
        );
        check(
            theirs.len() == self.logprobs.len() && within(diff, tolerance),
            format!("log-probs differ by {diff:e} > {tolerance:e}"),
        );

        let tokenizer = Tokenizer::from_dir(&self.dir).unwrap();
        let ids: Vec<u32> = serde_json::from_value(report["text_ids"].clone()).unwrap();
        check(
            ids == tokenizer.encode(TEXT).unwrap(),
            format!(
                "AutoTokenizer gives {ids:?}, Cairn {:?}",
                tokenizer.encode(TEXT).unwrap()
            ),
        );
        let options = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let ours = tokenizer
            .chat_template()
            .expect("exported directory has a chat template")
            .render(&messages(), &options)
            .unwrap();
        check(
            report["chat_text"] == ours.as_str(),
            format!(
                "apply_chat_template gives {}, Cairn {ours:?}",
                report["chat_text"]
            ),
        );
        let mut eos: Vec<u32> = serde_json::from_value(report["eos_token_id"].clone()).unwrap();
        let mut ours = tokenizer.eos_ids().to_vec();
        eos.sort_unstable();
        ours.sort_unstable();
        check(
            !eos.is_empty() && eos == ours,
            format!("generation_config stop ids {eos:?}, Cairn's {ours:?}"),
        );
        failures
    }
}

fn messages() -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "You are in a kitchen."}),
        json!({"role": "user", "content": TEXT}),
    ]
}

/// One optimizer step of SFT on `sequences` at a large learning rate, so the exported weights
/// are not the ones that were loaded.
fn train_a_step(backend: &mut TorchBackend, sequences: &[Sequence]) {
    backend
        .configure_optimizer(&OptimizerSettings {
            lr: 1e-2,
            ..OptimizerSettings::default()
        })
        .unwrap();
    let masks = sequences
        .iter()
        .map(|s| vec![1; s.response_ids.len()])
        .collect();
    backend
        .train_step(
            sequences,
            &[0..sequences.len()],
            1.0,
            &mut SftLoss::new(masks),
        )
        .unwrap();
}

/// Runs check_export.py on `probes` with the project venv's Python.
fn transformers_reports(probes: &[Json], scratch: &Path) -> Vec<Json> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} not found: run scripts/setup.sh first (it creates .venv with torch and transformers, \
         which this test compares Cairn's export with)",
        python.display()
    );
    let probe_file = scratch.join("probes.json");
    std::fs::write(&probe_file, serde_json::to_string(probes).unwrap()).unwrap();
    let out = Command::new(&python)
        .arg(root.join("scripts/fidelity/check_export.py"))
        .arg(&probe_file)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/setup.sh", python.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(3),
        "transformers is missing from {}: run scripts/setup.sh\n{stderr}",
        python.display()
    );
    assert!(
        out.status.success(),
        "check_export.py failed ({}):\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check_export.py printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn trained_and_exported_models_load_in_transformers_with_the_same_logprobs() {
    let root = tempfile::tempdir().unwrap();
    let mut exported = Vec::new();

    // Every fixture architecture, trained one step, exported with the fixture's tokenizer.
    for fixture in Fixture::all() {
        let mut backend = fixture.backend(Device::Cpu);
        let sequences = fixture.reference.batch.sequences();
        let before = backend.score(&sequences, 1.0, Weights::Current).unwrap();
        train_a_step(&mut backend, &sequences);
        let after = backend.score(&sequences, 1.0, Weights::Current).unwrap();
        assert_ne!(
            before, after,
            "{}: the training step changed nothing",
            fixture.name
        );
        exported.push(Exported::new(
            fixture.name,
            backend,
            &fixture.dir,
            root.path(),
            sequences,
        ));
    }

    // The main job's path: a scratch Qwen3 model and a word-level tokenizer trained for the
    // run (no generation_config.json of its own: the export writes one).
    let tokenizer_dir = root.path().join("scratch-tokenizer");
    let tokenizer = train_word_level(
        [TEXT, "You are in a kitchen.", "go to the fridge"],
        &WordLevelConfig::default(),
    )
    .unwrap();
    tokenizer.save(&tokenizer_dir).unwrap();
    let mut config = ModelConfig::qwen3(tokenizer.vocab_size() + 3, 32, 64, 2, 4, 2);
    config.tie_word_embeddings = true;
    config.initializer_range = 0.3;
    let model = CausalLm::random(&config, Device::Cpu, Dtype::F32, 7).unwrap();
    let backend = TorchBackend::from_model(model, OptimizerSettings::default(), 0, 32).unwrap();
    let ids = tokenizer.encode(TEXT).unwrap();
    let sequences = vec![Sequence {
        prompt_ids: ids[..4].to_vec(),
        response_ids: ids[4..].to_vec(),
    }];
    exported.push(Exported::new(
        "scratch-word-level",
        backend,
        &tokenizer_dir,
        root.path(),
        sequences,
    ));

    let probes: Vec<Json> = exported.iter().map(Exported::probe).collect();
    let reports = transformers_reports(&probes, root.path());
    assert_eq!(reports.len(), exported.len());
    let failures: Vec<String> = exported
        .iter()
        .zip(&reports)
        .flat_map(|(e, r)| e.compare(r))
        .collect();
    assert!(
        failures.is_empty(),
        "transformers disagrees with Cairn's export:\n{}",
        failures.join("\n")
    );
}
