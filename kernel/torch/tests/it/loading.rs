//! HF model directories: export, single-file and sharded loading, strict errors.

use std::path::Path;

use cairn_kernel::backend::{PolicyBackend, Weights};
use cairn_torch::weights::write_safetensors;
use cairn_torch::{BackendConfig, CausalLm, DeviceOption, Dtype, ModelSource, TorchBackend};
use tch::{Device, Tensor};

use crate::common::{backend, sequences};

fn load(dir: &Path) -> cairn_torch::Result<CausalLm> {
    CausalLm::from_pretrained(dir, Device::Cpu, Dtype::F32)
}

fn pretrained(dir: &Path) -> TorchBackend {
    let mut cfg = BackendConfig::random(crate::common::tiny_config(), 0);
    cfg.model = ModelSource::Pretrained {
        dir: dir.to_path_buf(),
    };
    cfg.device = DeviceOption::Cpu;
    cfg.dtype = None;
    TorchBackend::new(&cfg).unwrap()
}

#[test]
fn exported_model_loads_single_file_and_sharded() {
    let seqs = sequences(50, &[(4, 4), (2, 6)]);
    let mut original = backend(51);
    let want = original.score(&seqs, 1.0, Weights::Current).unwrap();

    let single = tempfile::tempdir().unwrap();
    original.save_pretrained(single.path()).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(single.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(config["torch_dtype"], "float32");
    assert_eq!(
        pretrained(single.path())
            .score(&seqs, 1.0, Weights::Current)
            .unwrap(),
        want
    );

    // Shard it: layer 0 in one file, everything else in another.
    let sharded = tempfile::tempdir().unwrap();
    std::fs::copy(
        single.path().join("config.json"),
        sharded.path().join("config.json"),
    )
    .unwrap();
    let tensors = Tensor::read_safetensors(single.path().join("model.safetensors")).unwrap();
    let (first, second): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .partition(|(n, _)| n.starts_with("model.layers.0."));
    let shard = |i| format!("model-0000{i}-of-00002.safetensors");
    write_safetensors(&sharded.path().join(shard(1)), &first).unwrap();
    write_safetensors(&sharded.path().join(shard(2)), &second).unwrap();
    let weight_map: serde_json::Map<String, serde_json::Value> = first
        .iter()
        .map(|(n, _)| (n.clone(), shard(1).into()))
        .chain(second.iter().map(|(n, _)| (n.clone(), shard(2).into())))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_eq!(
        pretrained(sharded.path())
            .score(&seqs, 1.0, Weights::Current)
            .unwrap(),
        want
    );

    std::fs::remove_file(sharded.path().join(shard(2))).unwrap();
    let err = load(sharded.path()).unwrap_err().to_string();
    assert!(err.contains(&shard(2)) && err.contains("missing"), "{err}");
}

#[test]
fn model_dir_errors_are_specific() {
    let original = backend(52);
    let dir = tempfile::tempdir().unwrap();
    original.save_pretrained(dir.path()).unwrap();
    let file = dir.path().join("model.safetensors");

    // A missing tensor is an error naming it, never a silently random parameter.
    let mut tensors = Tensor::read_safetensors(&file).unwrap();
    tensors.retain(|(n, _)| n != "model.norm.weight" && n != "lm_head.weight");
    write_safetensors(&file, &tensors).unwrap();
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("2 tensor(s) missing")
            && err.contains("model.norm.weight")
            && err.contains("lm_head.weight"),
        "{err}"
    );

    // A config that does not match the weights: every misshapen tensor is listed.
    original.save_pretrained(dir.path()).unwrap();
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["vocab_size"] = 80.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.embed_tokens.weight")
            && err.contains("expected shape [80, 32], found [64, 32]"),
        "{err}"
    );
    assert!(err.contains("lm_head.weight"), "{err}");

    config["model_type"] = "gpt_neox".into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("`gpt_neox`") && err.contains("config.json"),
        "{err}"
    );

    let empty = tempfile::tempdir().unwrap();
    original.save_pretrained(dir.path()).unwrap();
    std::fs::copy(
        dir.path().join("config.json"),
        empty.path().join("config.json"),
    )
    .unwrap();
    let err = CausalLm::from_pretrained(empty.path(), Device::Cpu, Dtype::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no model.safetensors"), "{err}");
}

#[test]
fn tied_embeddings_have_no_lm_head_tensor_and_bf16_round_trips() {
    let mut config = crate::common::tiny_config();
    config.tie_word_embeddings = true;
    let model = CausalLm::random(&config, Device::Cpu, Dtype::Bf16, 3).unwrap();
    assert!(model
        .named_parameters()
        .iter()
        .all(|(n, _)| n != "lm_head.weight"));
    let dir = tempfile::tempdir().unwrap();
    cairn_torch::weights::save_model_dir(&model, dir.path()).unwrap();
    let loaded = load(dir.path()).unwrap(); // bf16 file into an f32 model
    let ids = [5u32, 9, 13, 2];
    let a = model.forward_ids(&ids).unwrap();
    let b = loaded.forward_ids(&ids).unwrap();
    // Same weights, different compute dtype: close, not equal.
    let d = (a - b).abs().max().double_value(&[]);
    assert!(d < 0.1, "{d}");
}
