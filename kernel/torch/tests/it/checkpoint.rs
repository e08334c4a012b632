//! Full checkpoints: exact round trip, and specific errors for damaged files.

use std::path::Path;

use cairn_kernel::backend::{PolicyBackend, Weights};
use cairn_kernel::loss::SftLoss;
use cairn_torch::weights::write_safetensors;
use tch::{Kind, Tensor};

use crate::common::{backend, sequences};

fn sft(seqs: &[cairn_kernel::backend::Sequence]) -> SftLoss {
    SftLoss::new(seqs.iter().map(|s| vec![1; s.response_ids.len()]).collect())
}

#[test]
fn save_load_round_trip_is_exact_and_resumes_identically() {
    let dir = tempfile::tempdir().unwrap();
    let seqs = sequences(40, &[(3, 5), (6, 4), (2, 6)]);
    let mut a = backend(41);
    for _ in 0..2 {
        a.train_step(&seqs, &[0..3], 1.0, &mut sft(&seqs)).unwrap();
    }
    a.save(dir.path()).unwrap();
    for file in [
        "model.safetensors",
        "config.json",
        "reference.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(dir.path().join(file).is_file(), "{file} written");
    }

    let mut b = backend(99); // different init, overwritten by load
    b.load(dir.path()).unwrap();
    assert_eq!(b.policy_version(), 2);
    for w in [Weights::Current, Weights::Reference] {
        assert_eq!(
            a.score(&seqs, 1.0, w).unwrap(),
            b.score(&seqs, 1.0, w).unwrap(),
            "{w:?}"
        );
    }
    // The same next step on both: a checkpoint round trip is exact, so the step after it is
    // bit-identical (split invariance is tested on its own, in training.rs).
    let ra = a.train_step(&seqs, &[0..3], 1.0, &mut sft(&seqs)).unwrap();
    let rb = b.train_step(&seqs, &[0..3], 1.0, &mut sft(&seqs)).unwrap();
    assert_eq!(ra, rb);
    assert_eq!(
        a.score(&seqs, 1.0, Weights::Current).unwrap(),
        b.score(&seqs, 1.0, Weights::Current).unwrap(),
        "next step identical"
    );
}

/// Rewrites `file` in `dir` through `edit` on its named tensors.
fn edit_file(path: &Path, edit: impl FnOnce(&mut Vec<(String, Tensor)>)) {
    let mut tensors = Tensor::read_safetensors(path).unwrap();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut tensors);
    write_safetensors(path, &tensors).unwrap();
}

#[test]
fn missing_and_misshapen_tensors_name_the_tensor_shapes_and_file() {
    let seqs = sequences(42, &[(3, 5)]);
    let a = backend(43);
    let mut b = backend(44);
    let before = b.score(&seqs, 1.0, Weights::Current).unwrap();

    let dir = tempfile::tempdir().unwrap();
    a.save(dir.path()).unwrap();
    let name = "model.layers.1.self_attn.k_proj.weight";
    edit_file(&dir.path().join("model.safetensors"), |ts| {
        ts.retain(|(n, _)| n != name)
    });
    let err = b.load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains(name) && err.contains("model.safetensors") && err.contains("missing"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    a.save(dir.path()).unwrap();
    let name = "exp_avg_sq.model.layers.0.mlp.up_proj.weight";
    edit_file(&dir.path().join("optimizer.safetensors"), |ts| {
        let t = ts.iter_mut().find(|(n, _)| n == name).unwrap();
        t.1 = Tensor::zeros([64, 31], (Kind::Float, tch::Device::Cpu));
    });
    let err = b.load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains(name)
            && err.contains("[64, 32]")
            && err.contains("[64, 31]")
            && err.contains("optimizer.safetensors"),
        "{err}"
    );
    assert!(err.contains("different config"), "says what to do: {err}");

    // Neither failed load changed anything.
    assert_eq!(b.score(&seqs, 1.0, Weights::Current).unwrap(), before);
    assert_eq!(b.policy_version(), 0);

    let empty = tempfile::tempdir().unwrap();
    let err = b.load(empty.path()).unwrap_err().to_string();
    assert!(err.contains("trainer_state.json"), "{err}");
}
