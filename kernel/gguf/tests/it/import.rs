use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cairn_gguf::{import_gguf, GgufError, ImportOptions, OutDtype};
use serde_json::{json, Value};

use crate::writer::{tiny_llama, Expected, GgufWriter, Meta};

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Writes `gguf` to `dir/tiny.gguf` and returns the path.
fn write_file(dir: &Path, gguf: &GgufWriter) -> PathBuf {
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, gguf.to_bytes().0).unwrap();
    path
}

/// The tensors of `dir/model.safetensors` as f32, with their dtype.
fn read_tensors(dir: &Path) -> BTreeMap<String, (safetensors::Dtype, Expected)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = match view.dtype() {
                safetensors::Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                safetensors::Dtype::BF16 => view
                    .data()
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes(b.try_into().unwrap()).to_f32())
                    .collect(),
                other => panic!("{name}: dtype {other:?}"),
            };
            let shape = view.shape().to_vec();
            (name, (view.dtype(), Expected { shape, values }))
        })
        .collect()
}

fn check_round_trip(untied: bool, dtype: OutDtype) {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, expected) = tiny_llama(untied);
    let file = write_file(tmp.path(), &gguf);
    let out = tmp.path().join("out");
    let report = import_gguf(&file, &out, &ImportOptions { dtype }).unwrap();

    let got = read_tensors(&out);
    let st_dtype = match dtype {
        OutDtype::F32 => safetensors::Dtype::F32,
        OutDtype::Bf16 => safetensors::Dtype::BF16,
    };
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (name, want) in &expected {
        let (got_dtype, got) = &got[name];
        assert_eq!(*got_dtype, st_dtype, "{name}");
        // Every value is exact in bf16 too (see the writer), so both dtypes compare exactly.
        assert_eq!(got, want, "{name}");
    }
    assert_eq!(report.tensors, expected.len());
    assert_eq!(report.tied_embeddings, !untied);
    let parameters: usize = expected.values().map(|e| e.values.len()).sum();
    assert_eq!(report.parameters, parameters as u64);

    let mut config = read_json(&out.join("config.json"));
    assert_eq!(
        config.as_object_mut().unwrap().remove("torch_dtype"),
        Some(json!(dtype.torch_name()))
    );
    assert_eq!(
        config,
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 13,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0,
            "rope_scaling": null,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
            "max_position_embeddings": 256,
            "tie_word_embeddings": !untied,
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2
        })
    );
    let provenance = read_json(&out.join("cairn-import.json"));
    let types = if untied {
        json!({"BF16": 4, "F16": 4, "F32": 3, "Q4_0": 3, "Q4_1": 4, "Q8_0": 3})
    } else {
        json!({"BF16": 4, "F16": 4, "F32": 3, "Q4_0": 2, "Q4_1": 4, "Q8_0": 3})
    };
    assert_eq!(provenance["source"], json!("tiny.gguf"));
    assert_eq!(provenance["source_tensor_types"], types);
    assert_eq!(provenance["dtype"], json!(dtype.name()));
    assert_eq!(provenance["source_sha256"], json!(report.sha256));
    assert_eq!(report.sha256.len(), 64);
    assert_eq!(provenance["general.name"], json!("tiny"));

    // The tokenizer files load, and the digits are split.
    let tokenizer = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let ids = tokenizer.encode("<|im_start|>abc 123", false).unwrap();
    assert_eq!(ids.get_ids(), [1, 7, 8, 9, 10, 11]);
    let tokenizer_config = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tokenizer_config["eos_token"], json!("<|im_end|>"));
    assert!(tokenizer_config["chat_template"]
        .as_str()
        .unwrap()
        .starts_with("{% for m in messages %}"));
    assert_eq!(
        read_json(&out.join("generation_config.json")),
        json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    );
    assert!(!tmp.path().join("out.partial").exists());
}

#[test]
fn tied_model_round_trips_exactly_in_f32() {
    check_round_trip(false, OutDtype::F32);
}

#[test]
fn untied_model_round_trips_exactly_in_bf16() {
    check_round_trip(true, OutDtype::Bf16);
}

#[test]
fn an_existing_empty_out_dir_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_file(tmp.path(), &tiny_llama(false).0);
    let out = tmp.path().join("empty");
    std::fs::create_dir(&out).unwrap();
    import_gguf(&file, &out, &ImportOptions::default()).unwrap();
    assert!(out.join("model.safetensors").is_file());
}

#[test]
fn linear_rope_scaling_is_carried_to_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut gguf, _) = tiny_llama(false);
    gguf.set("llama.rope.scaling.type", Meta::Str("linear".into()));
    gguf.set("llama.rope.scaling.factor", Meta::F32(4.0));
    let file = write_file(tmp.path(), &gguf);
    let out = tmp.path().join("out");
    import_gguf(&file, &out, &ImportOptions::default()).unwrap();
    let config = read_json(&out.join("config.json"));
    assert_eq!(
        config["rope_scaling"],
        json!({"rope_type": "linear", "factor": 4.0})
    );
    assert_eq!(
        config["rope_parameters"],
        json!({"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0})
    );
}

/// Imports `bytes` (as `tiny.gguf`) into a new directory and returns the error message with
/// the temporary directory replaced by `DIR`, checking that nothing was written.
fn import_error(bytes: &[u8]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("tiny.gguf");
    std::fs::write(&file, bytes).unwrap();
    let out = tmp.path().join("out");
    let e = import_gguf(&file, &out, &ImportOptions::default()).unwrap_err();
    assert!(!out.exists() && !tmp.path().join("out.partial").exists());
    e.to_string()
        .replace(&tmp.path().display().to_string(), "DIR")
}

fn modified(change: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
    let (mut gguf, _) = tiny_llama(false);
    change(&mut gguf);
    gguf.to_bytes().0
}

#[test]
fn a_truncated_file_names_the_tensor_or_key_it_cuts() {
    let (gguf, _) = tiny_llama(false);
    let (bytes, layout) = gguf.to_bytes();
    let (start, end) = layout.ranges["output_norm.weight"];
    let cut = end as usize - 10;
    assert_eq!(
        import_error(&bytes[..cut]),
        format!(
            "tensor `output_norm.weight` needs bytes {start}..{end} but DIR/tiny.gguf has {cut} \
             bytes; the file is truncated, re-download it"
        )
    );
    // Inside the first metadata value: 24 header bytes, the key (8 + 20 bytes), its type (4),
    // then the string "llama" (8 + 5 bytes) at 56..69.
    assert_eq!(
        import_error(&bytes[..66]),
        "metadata key `general.architecture` needs bytes 64..69 but DIR/tiny.gguf has 66 bytes; \
         the file is truncated, re-download it"
    );
    assert_eq!(
        import_error(&bytes[..10]),
        "the header needs bytes 8..16 but DIR/tiny.gguf has 10 bytes; the file is truncated, \
         re-download it"
    );
    // In the tensor infos, which start after the metadata; the data starts at a multiple of 32.
    let info_cut = layout.data_offset as usize - 40;
    let e = import_error(&bytes[..info_cut]);
    assert!(
        e.starts_with(&format!(
            "tensor info {} needs bytes ",
            gguf.tensors.len() - 1
        )) && e.ends_with(&format!(
            "but DIR/tiny.gguf has {info_cut} bytes; the file is truncated, re-download it"
        )),
        "{e}"
    );
}

#[test]
fn bad_files_are_refused_naming_the_key_or_tensor() {
    let cases: Vec<(Vec<u8>, &str)> =
        vec![
        (
            modified(|g| g.tensor_mut("blk.1.attn_q.weight").type_id = 13),
            "DIR/tiny.gguf: tensor `blk.1.attn_q.weight` has type Q5_K, supported: F32, F16, \
             BF16, Q8_0, Q4_0, Q4_1",
        ),
        (
            modified(|g| g.set("general.architecture", Meta::Str("foo".into()))),
            "DIR/tiny.gguf: key `general.architecture` = 'foo', supported: llama",
        ),
        (
            modified(|g| g.remove("llama.block_count")),
            "DIR/tiny.gguf: required key `llama.block_count` is missing",
        ),
        (
            modified(|g| g.set("llama.block_count", Meta::Str("2".into()))),
            "DIR/tiny.gguf: key `llama.block_count` holds string, expected a non-negative integer",
        ),
        (
            modified(|g| g.set("llama.rope.scaling.type", Meta::Str("yarn".into()))),
            "DIR/tiny.gguf: key `llama.rope.scaling.type` = 'yarn'; supported: none, linear",
        ),
        (
            modified(|g| {
                g.set("llama.rope.scaling.original_context_length", Meta::U32(2048));
            }),
            "DIR/tiny.gguf: key `llama.rope.scaling.original_context_length` is not supported: \
             the importer handles RoPE scaling types none and linear only",
        ),
        (
            modified(|g| g.set("llama.attention.head_count_kv", Meta::U32(3))),
            "DIR/tiny.gguf: key `llama.attention.head_count_kv` = 3; supported: a divisor of \
             llama.attention.head_count (4)",
        ),
        (
            modified(|g| g.set("tokenizer.ggml.pre", Meta::Str("llama-bpe".into()))),
            "DIR/tiny.gguf: key `tokenizer.ggml.pre` = 'llama-bpe'; supported: smollm, gpt2",
        ),
        (
            modified(|g| g.tensors.retain(|t| t.name != "blk.1.ffn_up.weight")),
            "DIR/tiny.gguf: tensor `blk.1.ffn_up.weight` is missing",
        ),
        (
            modified(|g| g.tensor_mut("blk.0.ffn_norm.weight").name = "rope_freqs.weight".into()),
            "DIR/tiny.gguf: tensor `rope_freqs.weight` has no Hugging Face name in the llama \
             mapping",
        ),
        (
            modified(|g| g.tensor_mut("blk.0.attn_k.weight").dims = vec![32, 8, 2]),
            "DIR/tiny.gguf: tensor `blk.0.attn_k.weight` has dims [32, 8, 2] (ggml order), \
             expected [32, 16] from the metadata",
        ),
        (
            modified(|g| g.set("llama.vocab_size", Meta::U32(12))),
            "DIR/tiny.gguf: tensor `token_embd.weight` has dims [32, 13] (ggml order), expected \
             [32, 12] from the metadata",
        ),
        (
            modified(|g| g.set("general.alignment", Meta::U32(24))),
            "DIR/tiny.gguf: metadata key `general.alignment`: u32 U32(24) is not a power of two",
        ),
        (
            modified(|g| g.set("general.weird", Meta::Raw(13, vec![]))),
            "DIR/tiny.gguf: metadata key `general.weird`: unknown value type 13; GGUF defines \
             0..=12",
        ),
        (
            b"GGML\x03\x00\x00\x00".to_vec(),
            "DIR/tiny.gguf: not a GGUF file: it starts with [71, 71, 77, 76], not the magic \
             \"GGUF\"",
        ),
        (
            b"GGUF\x01\x00\x00\x00".to_vec(),
            "DIR/tiny.gguf: GGUF version 1; supported: 2, 3",
        ),
        (
            b"GGUF\x00\x00\x00\x03".to_vec(),
            "DIR/tiny.gguf: a big-endian GGUF (version 3 byte-swapped); only little-endian files \
             are supported",
        ),
    ];
    for (bytes, expected) in cases {
        assert_eq!(import_error(&bytes), expected);
    }
}

#[test]
fn a_non_empty_out_dir_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_file(tmp.path(), &tiny_llama(false).0);
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let e = import_gguf(&file, &out, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, GgufError::OutDirNotEmpty { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "{} exists and is not empty; pass an empty or new directory",
            out.display()
        )
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["notes.txt"]);

    // A leftover `.partial` from an interrupted import is not overwritten either.
    let fresh = tmp.path().join("fresh");
    std::fs::create_dir(tmp.path().join("fresh.partial")).unwrap();
    let e = import_gguf(&file, &fresh, &ImportOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{} exists, left by an interrupted import; delete it and run again",
            tmp.path().join("fresh.partial").display()
        )
    );
    assert!(!fresh.exists());
}
