//! Bad model directories and bad exports: each error lists exactly what is missing or wrong,
//! and nothing is loaded or written half-way. Messages are compared in full.

use std::path::{Path, PathBuf};

use cairn_torch::weights::write_safetensors;
use cairn_torch::{CausalLm, Dtype};
use tch::{Device, Tensor};

use crate::reference::Fixture;

/// A copy of fixture `name`'s directory, to break.
fn copy_fixture(name: &'static str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(Fixture::load(name).dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

fn load_error(dir: &Path) -> String {
    CausalLm::from_pretrained(dir, Device::Cpu, Dtype::F32)
        .unwrap_err()
        .to_string()
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn missing_shard_is_named_with_its_tensor_count() {
    let (_tmp, dir) = copy_fixture("qwen2.5-sharded");
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    assert_eq!(
        load_error(&dir),
        format!(
            "{}: shard file(s) model-00002-of-00002.safetensors (holding 17 tensors) missing from \
             the directory; the download is incomplete: fetch them again",
            dir.join("model.safetensors.index.json").display()
        )
    );
    std::fs::remove_file(dir.join("model-00001-of-00002.safetensors")).unwrap();
    assert_eq!(
        load_error(&dir),
        format!(
            "{}: shard file(s) model-00001-of-00002.safetensors, model-00002-of-00002.safetensors \
             (holding 26 tensors) missing from the directory; the download is incomplete: fetch \
             them again",
            dir.join("model.safetensors.index.json").display()
        )
    );
}

#[test]
fn tensor_listed_in_the_index_but_absent_from_its_shard_is_named() {
    let (_tmp, dir) = copy_fixture("qwen2.5-sharded");
    let shard = dir.join("model-00001-of-00002.safetensors");
    let mut tensors = Tensor::read_safetensors(&shard).unwrap();
    tensors.retain(|(n, _)| n != "model.embed_tokens.weight");
    write_safetensors(&shard, &tensors).unwrap();
    assert_eq!(
        load_error(&dir),
        format!(
            "1 tensor(s) missing from {}: model.embed_tokens.weight (listed in \
             model-00001-of-00002.safetensors); the files are incomplete or belong to a different \
             model (check config.json against the weights)",
            dir.join("model.safetensors.index.json").display()
        )
    );
}

#[test]
fn missing_tensors_are_all_listed_never_left_random() {
    let (_tmp, dir) = copy_fixture("qwen2");
    let file = dir.join("model.safetensors");
    let mut tensors = Tensor::read_safetensors(&file).unwrap();
    tensors.retain(|(n, _)| {
        n != "model.norm.weight"
            && n != "lm_head.weight"
            && n != "model.layers.1.self_attn.k_proj.bias"
    });
    write_safetensors(&file, &tensors).unwrap();
    assert_eq!(
        load_error(&dir),
        format!(
            "3 tensor(s) missing from {}: lm_head.weight, model.layers.1.self_attn.k_proj.bias, \
             model.norm.weight; the files are incomplete or belong to a different model (check \
             config.json against the weights)",
            file.display()
        )
    );
}

/// Issue 32 finding 7: a `model.safetensors` that is not one (here a symlink to a copy of
/// `/etc/passwd`, as a client of `POST /update_weights_from_disk` could name) is refused
/// without its first 8 bytes in the message: they used to be printed as the "header length".
#[test]
fn a_file_that_is_not_safetensors_is_refused_without_showing_its_bytes() {
    let (tmp, dir) = copy_fixture("qwen3");
    let secret = tmp.path().join("passwd");
    std::fs::write(&secret, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    let file = dir.join("model.safetensors");
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&secret, &file).unwrap();
    let err = load_error(&dir);
    assert_eq!(
        err,
        format!(
            "{}: its first 8 bytes do not give a plausible header length (over 100 MB); not a \
             safetensors file",
            file.display()
        )
    );
    let leaked = u64::from_le_bytes(*b"root:x:0").to_string();
    assert!(!err.contains(&leaked) && !err.contains("root:x"), "{err}");
}

#[test]
fn wrong_shapes_are_all_listed_with_expected_and_found() {
    let (_tmp, dir) = copy_fixture("qwen3");
    // A config for a wider vocabulary and more kv heads than the weights were written for.
    edit_config(&dir, |c| {
        c["vocab_size"] = 520.into();
        c["num_key_value_heads"] = 4.into();
    });
    let file = dir.join("model.safetensors");
    let f = file.display();
    let layer = |i: usize, proj: &str| {
        format!(
            "`model.layers.{i}.self_attn.{proj}.weight` in {f}: expected shape [64, 32], found [32, 32]"
        )
    };
    assert_eq!(
        load_error(&dir),
        format!(
            "5 tensor(s) with the wrong shape: `model.embed_tokens.weight` in {f}: expected shape \
             [520, 32], found [512, 32]; {}; {}; {}; {}; the weights were written for a different \
             config (hidden size, heads, vocab?): load them with their own config.json",
            layer(0, "k_proj"),
            layer(0, "v_proj"),
            layer(1, "k_proj"),
            layer(1, "v_proj"),
        )
    );
}

#[test]
fn unknown_model_type_is_named_with_the_supported_ones() {
    let (_tmp, dir) = copy_fixture("llama3");
    edit_config(&dir, |c| c["model_type"] = "mistral".into());
    assert_eq!(
        load_error(&dir),
        format!(
            "{}: unsupported model_type `mistral`; supported: qwen3, qwen2, llama",
            dir.join("config.json").display()
        )
    );
}

#[test]
fn export_without_a_tokenizer_names_the_file_and_writes_nothing() {
    let fixture = Fixture::load("qwen3");
    let backend = fixture.backend(Device::Cpu);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("export");
    let err = backend.export(tmp.path(), &out).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{} not found: No such file or directory (os error 2)",
            tmp.path().join("tokenizer.json").display()
        )
    );
    assert!(!out.exists());
}

#[test]
fn export_refuses_a_tokenizer_the_model_has_no_rows_for() {
    // The Llama fixture's tokenizer has 487 ids; a model with 300 rows cannot serve it.
    let fixture = Fixture::load("llama3");
    let mut config = cairn_torch::ModelConfig::qwen3(300, 32, 64, 1, 4, 2);
    config.tie_word_embeddings = true;
    let model = CausalLm::random(&config, Device::Cpu, Dtype::F32, 0).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("export");
    let err = cairn_torch::export::export_model_dir(&model, &fixture.dir, &out)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "{}: the tokenizer has 487 ids but the model has 300 embedding rows; export the model \
             with the tokenizer it was trained with",
            fixture.dir.display()
        )
    );
    assert!(!out.exists());
}

#[test]
fn export_refuses_a_chat_template_that_does_not_compile() {
    let (_tmp, dir) = copy_fixture("qwen3");
    let path = dir.join("tokenizer_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["chat_template"] = "{% for message in messages %}\n{{ message.content }\n".into();
    std::fs::write(&path, config.to_string()).unwrap();
    let backend = Fixture::load("qwen3").backend(Device::Cpu);
    let out = dir.join("export");
    let err = backend.export(&dir, &out).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "chat template `{}:chat_template`, line 2: syntax error: unexpected `}}`, expected end \
             of variable block",
            path.display()
        )
    );
    assert!(!out.exists());
}

fn tokenizer_error(dir: &Path, max_id: u32, ids: usize, rows: usize) -> String {
    format!(
        "{}: the tokenizer's ids go up to {max_id} ({ids} ids), but {} gives the model {rows} \
         embedding rows (`vocab_size`); the tokenizer belongs to a different model: put the \
         model's own tokenizer files in the directory",
        dir.join("tokenizer.json").display(),
        dir.join("config.json").display()
    )
}

#[test]
fn a_tokenizer_with_more_ids_than_embedding_rows_is_refused_before_the_weights_are_read() {
    // The qwen3 fixture's tokenizer has ids 0..=505 (480 BPE ids and 26 added tokens).
    let (_tmp, dir) = copy_fixture("qwen3");
    edit_config(&dir, |c| c["vocab_size"] = 500.into());
    // The weights have 512 rows, so a load that got as far as them would report a shape
    // mismatch instead: the tokenizer is checked first.
    assert_eq!(load_error(&dir), tokenizer_error(&dir, 505, 506, 500));
    // The same through the backend, as `cairn logprobs`, train, eval and serve load a model.
    let config = cairn_torch::BackendConfig {
        model: cairn_torch::ModelSource::Pretrained { dir: dir.clone() },
        device: cairn_torch::DeviceOption::Cpu,
        dtype: None,
        seed: 0,
        threads: None,
        optimizer: Default::default(),
        warmup_steps: 0,
        score_batch_size: 32,
    };
    let err = match cairn_torch::TorchBackend::new(&config) {
        Ok(_) => panic!("loaded a model whose tokenizer does not fit"),
        Err(e) => cairn_kernel::Error::from(e).to_string(),
    };
    assert_eq!(
        err,
        format!("model: {}", tokenizer_error(&dir, 505, 506, 500))
    );
}

#[test]
fn a_tokenizer_id_equal_to_the_row_count_is_refused_and_one_below_passes_the_check() {
    let (_tmp, dir) = copy_fixture("qwen3");
    edit_config(&dir, |c| c["vocab_size"] = 505.into());
    assert_eq!(load_error(&dir), tokenizer_error(&dir, 505, 506, 505));
    // With a row for id 505 the tokenizer fits, and loading goes on to the weights (whose 512
    // rows then do not match this config).
    edit_config(&dir, |c| c["vocab_size"] = 506.into());
    let err = load_error(&dir);
    assert!(
        err.starts_with("1 tensor(s) with the wrong shape: `model.embed_tokens.weight`"),
        "{err}"
    );
}

/// A model larger than any machine is an error from the constructor (tch's `f_` functions),
/// not a panic inside tch: `cairn train` reports it instead of exiting with a backtrace.
#[test]
fn a_model_too_large_to_allocate_is_an_error_not_a_panic() {
    // 8 × 2⁴⁰ f32 values: 32 TiB for the embedding alone.
    let config = cairn_torch::ModelConfig::qwen3(8, 1 << 40, 2, 1, 2, 1);
    let e = CausalLm::random(&config, Device::Cpu, Dtype::F32, 1).unwrap_err();
    assert!(e.to_string().contains("allocate"), "{e}");
    let kv = cairn_torch::ModelConfig::qwen3(8, 16, 32, 1, 2, 1);
    let e = cairn_torch::KvCache::new(&kv, 1 << 30, 1 << 10, tch::Kind::Float, Device::Cpu)
        .unwrap_err();
    assert!(e.to_string().contains("allocate"), "{e}");
}
