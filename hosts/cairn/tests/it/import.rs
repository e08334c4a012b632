//! `cairn import gguf` on the real model: SmolLM2-135M-Instruct as a Q4_1 GGUF
//! (`.cache/models/`, fetched by `scripts/setup.sh`). The imported directory has the files,
//! hyper-parameters and tensors of the model, and `cairn logprobs` scores on it; bad input is a
//! clean error naming the file or tensor.

use std::io::Read;
use std::path::{Path, PathBuf};

use cairn_gguf::dequant::TensorType;
use cairn_gguf::gguf::GgufFile;
use serde_json::{json, Value};

use crate::{cairn, stderr, stdout};

/// The set-up GGUF (`.cache/models/`); a test fails, naming the fix, when it is missing.
pub(crate) fn gguf() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh (it fetches SmolLM2-135M-Instruct)",
        path.display()
    );
    path
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The header of a safetensors file: tensor name to `{dtype, shape, data_offsets}`.
fn safetensors_header(path: &Path) -> serde_json::Map<String, Value> {
    let mut file = std::fs::File::open(path).unwrap();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).unwrap();
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    file.read_exact(&mut header).unwrap();
    let Value::Object(mut map) = serde_json::from_slice(&header).unwrap() else {
        panic!("a safetensors header is an object");
    };
    map.remove("__metadata__");
    map
}

/// Imports the real GGUF with `args` into `out`, asserting success.
pub(crate) fn import(out: &Path, args: &[&str]) -> String {
    let gguf = gguf();
    let mut all = vec![
        "import",
        "gguf",
        gguf.to_str().unwrap(),
        out.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let o = cairn(&all);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    stdout(&o)
}

/// `cairn logprobs` of `response` after `prompt` (token ids) under the model in `dir`.
fn logprobs(dir: &Path, prompt: &[u32], responses: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input.json");
    let sequences: Vec<Value> = responses
        .iter()
        .map(|r| json!({"prompt_ids": prompt, "response_ids": r}))
        .collect();
    std::fs::write(&input, Value::Array(sequences).to_string()).unwrap();
    let o = cairn(&[
        "logprobs",
        dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    serde_json::from_str(stdout(&o).trim()).expect("a JSON list of lists")
}

#[test]
fn smollm2_imports_and_scores() {
    let tmp = tempfile::tempdir().unwrap();
    for (dtype, torch_dtype, st_dtype) in [("f32", "float32", "F32"), ("bf16", "bfloat16", "BF16")]
    {
        let out = tmp.path().join(dtype);
        let summary = import(&out, &["--dtype", dtype]);
        assert_eq!(
            summary.trim_end().split(" in ").next().unwrap(),
            format!(
                "imported 272 tensors (134515008 parameters; GGUF types F32 61, Q4_1 210, Q8_0 1) \
                 as {dtype}, head tied to the embedding into {}",
                out.display()
            )
        );
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "cairn-import.json",
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        let config = read_json(&out.join("config.json"));
        for (key, value) in [
            ("num_hidden_layers", json!(30)),
            ("hidden_size", json!(576)),
            ("intermediate_size", json!(1536)),
            ("num_attention_heads", json!(9)),
            ("num_key_value_heads", json!(3)),
            ("head_dim", json!(64)),
            ("vocab_size", json!(49152)),
            ("rope_theta", json!(100000.0)),
            ("rms_norm_eps", json!(1e-5)),
            ("max_position_embeddings", json!(8192)),
            ("tie_word_embeddings", json!(true)),
            ("torch_dtype", json!(torch_dtype)),
            ("bos_token_id", json!(1)),
            ("eos_token_id", json!(2)),
        ] {
            assert_eq!(config[key], value, "{dtype}: config.json {key}");
        }
        let header = safetensors_header(&out.join("model.safetensors"));
        assert_eq!(header.len(), 272);
        assert!(!header.contains_key("lm_head.weight"));
        assert_eq!(
            header["model.embed_tokens.weight"]["shape"],
            json!([49152, 576])
        );
        assert_eq!(
            header["model.layers.29.self_attn.k_proj.weight"]["shape"],
            json!([192, 576])
        );
        assert!(header.values().all(|t| t["dtype"] == st_dtype));
        let provenance = read_json(&out.join("cairn-import.json"));
        assert_eq!(
            provenance["source_sha256"],
            json!("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
        );
        let tokenizer_config = read_json(&out.join("tokenizer_config.json"));
        assert_eq!(tokenizer_config["eos_token"], json!("<|im_end|>"));
        assert!(tokenizer_config["chat_template"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>"));
    }

    // The model scores: finite log-probs, and Paris is the likeliest of three capitals.
    let dir = tmp.path().join("f32");
    let tokenizer = cairn_kernel::text::Tokenizer::from_dir(&dir).unwrap();
    let prompt = tokenizer.encode("The capital of France is").unwrap();
    let cities: Vec<Vec<u32>> = [" Paris", " London", " Berlin"]
        .iter()
        .map(|c| tokenizer.encode(c).unwrap())
        .collect();
    assert!(cities.iter().all(|c| c.len() == 1), "{cities:?}");
    let scores = logprobs(&dir, &prompt, &cities);
    assert!(
        scores.iter().flatten().all(|x| x.is_finite() && *x < 0.0),
        "{scores:?}"
    );
    assert!(
        scores[0][0] > scores[1][0] && scores[0][0] > scores[2][0],
        "{scores:?}"
    );
}

/// Runs a failing `cairn import gguf`, returning stderr; asserts exit code 1 and that no output
/// directory (or `.partial`) was left.
fn import_error(file: &Path, out: &Path, args: &[&str]) -> String {
    let mut all = vec![
        "import",
        "gguf",
        file.to_str().unwrap(),
        out.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let o = cairn(&all);
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), "");
    let partial = format!("{}.partial", out.display());
    assert!(!out.exists() && !Path::new(&partial).exists());
    stderr(&o).trim_end().to_string()
}

#[test]
fn bad_input_is_a_clean_error_naming_the_file_or_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");

    // A truncated download: the tensor it cuts is named, with its byte range.
    let bytes = std::fs::read(gguf()).unwrap();
    let cut = 50_000_000;
    let truncated = tmp.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..cut]).unwrap();
    // The importer checks tensors in file order: the first that ends past the cut is named.
    let parsed = GgufFile::parse(&bytes, &gguf()).unwrap();
    let (name, start, end) = parsed
        .tensors
        .iter()
        .map(|t| {
            let ty = TensorType::from_id(t.type_id).unwrap();
            let start = parsed.data_offset + t.offset;
            (
                &t.name,
                start,
                start + ty.bytes_for(t.elements().unwrap()).unwrap(),
            )
        })
        .find(|&(_, _, end)| end > cut as u64)
        .unwrap();
    assert_eq!(
        import_error(&truncated, &out, &[]),
        format!(
            "error: tensor `{name}` needs bytes {start}..{end} but {} has {cut} bytes; the file \
             is truncated, re-download it",
            truncated.display()
        )
    );

    let missing = tmp.path().join("missing.gguf");
    assert_eq!(
        import_error(&missing, &out, &[]),
        format!(
            "error: {}: No such file or directory (os error 2)",
            missing.display()
        )
    );

    // Not a GGUF at all.
    let text = tmp.path().join("model.txt");
    std::fs::write(&text, "hello world").unwrap();
    assert_eq!(
        import_error(&text, &out, &[]),
        format!(
            "error: {}: not a GGUF file: it starts with [104, 101, 108, 108], not the magic \
             \"GGUF\"",
            text.display()
        )
    );

    // A dtype the importer does not write.
    let o = cairn(&[
        "import",
        "gguf",
        gguf().to_str().unwrap(),
        out.to_str().unwrap(),
        "--dtype",
        "f16",
    ]);
    assert_eq!(o.status.code(), Some(2), "clap's usage error");
    assert!(
        stderr(&o).contains("unknown dtype `f16`; expected f32 or bf16"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}
