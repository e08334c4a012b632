//! Shared fixtures: tiny configs, backends and comparison helpers.

use cairn_kernel::backend::{OptimizerSettings, Sequence};
use cairn_torch::{BackendConfig, CausalLm, ModelConfig, TorchBackend};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

pub const VOCAB: usize = 64;

/// Qwen3 layout, hidden 32, 2 layers, 4 heads over 2 kv heads (GQA), head_dim 8. The init
/// std is raised from 0.02 so that next-token distributions are far from uniform and the
/// comparisons below have something to compare.
pub fn tiny_config() -> ModelConfig {
    let mut c = ModelConfig::qwen3(VOCAB, 32, 64, 2, 4, 2);
    c.initializer_range = 0.3;
    c
}

pub fn backend_with(config: ModelConfig, seed: u64, optimizer: OptimizerSettings) -> TorchBackend {
    let mut cfg = BackendConfig::random(config, seed);
    cfg.optimizer = optimizer;
    TorchBackend::new(&cfg).expect("tiny backend builds")
}

pub fn backend(seed: u64) -> TorchBackend {
    backend_with(tiny_config(), seed, adam(1e-3))
}

pub fn adam(lr: f64) -> OptimizerSettings {
    OptimizerSettings {
        lr,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.0,
        max_grad_norm: 1.0,
    }
}

/// Random ids in `[4, VOCAB)` (0..4 are left free for stop-id tests).
pub fn random_ids(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(4..VOCAB as u32)).collect()
}

/// Sequences with prompt and response lengths as given.
pub fn sequences(seed: u64, lens: &[(usize, usize)]) -> Vec<Sequence> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    lens.iter()
        .map(|&(p, r)| Sequence {
            prompt_ids: random_ids(&mut rng, p),
            response_ids: random_ids(&mut rng, r),
        })
        .collect()
}

/// Log-probs of the response tokens of `seq` at `temperature` from one unpadded full forward
/// (the reference computation the batched paths must reproduce).
pub fn direct_logprobs(model: &CausalLm, seq: &Sequence, temperature: f64) -> Tensor {
    let ids = [seq.prompt_ids.as_slice(), seq.response_ids.as_slice()].concat();
    let logits = model.forward_ids(&ids).unwrap().squeeze_dim(0);
    let (p, r) = (seq.prompt_ids.len() as i64, seq.response_ids.len() as i64);
    let logp = (logits.narrow(0, p - 1, r) / temperature).log_softmax(-1, Kind::Float);
    let targets = Tensor::from_slice(
        &seq.response_ids
            .iter()
            .map(|&i| i64::from(i))
            .collect::<Vec<_>>(),
    );
    logp.gather(1, &targets.unsqueeze(1), false).squeeze_dim(1)
}

/// Largest `|a − b|`; a NaN anywhere makes the result NaN, so `diff <= tol` fails.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| {
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
}

pub fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::try_from(t.to_kind(Kind::Float).contiguous().view([-1])).unwrap()
}

/// Asserts two lists of named tensors agree to `tol` (max abs diff), naming the worst one.
pub fn assert_tensors_close(a: &[(String, Tensor)], b: &[(String, Tensor)], tol: f64) {
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let d = (ta - tb).abs().max().double_value(&[]);
        assert!(d <= tol, "{na}: max abs diff {d} > {tol}");
    }
}
