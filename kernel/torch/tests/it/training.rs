//! train_step: the gradient is the autograd gradient of the step's loss, independent of the
//! micro-batch split; SFT memorises; reference weights stay frozen.

use std::ops::Range;

use cairn_kernel::backend::{PolicyBackend, Sequence, Weights};
use cairn_kernel::loss::{SftLoss, TokenGrads, TokenLoss, TokenScores};
use cairn_torch::{CausalLm, ModelConfig, TorchBackend};
use tch::{Kind, Tensor};

use crate::common::{
    adam, assert_tensors_close, backend, backend_with, max_abs_diff, sequences, tiny_config,
};

/// A loss with fixed per-token weights on log-probs and entropies:
/// `L = Σ_r Σ_l (a_rl · ℓ_rl + b_rl · H_rl)` with `a_rl = 0.1·(r+1) − 0.05·l`, `b_rl = 0.02·(l+1)`.
struct ToyLoss;

fn toy_a(r: usize, l: usize) -> f32 {
    0.1 * (r + 1) as f32 - 0.05 * l as f32
}

fn toy_b(l: usize) -> f32 {
    0.02 * (l + 1) as f32
}

impl TokenLoss for ToyLoss {
    fn needs_entropy(&self) -> bool {
        true
    }

    fn grads(
        &mut self,
        rows: Range<usize>,
        scores: &TokenScores<'_>,
    ) -> cairn_kernel::Result<TokenGrads> {
        let logp = scores.logp;
        assert_eq!(logp.len(), scores.entropy.len());
        Ok(TokenGrads {
            logp: rows
                .clone()
                .zip(logp)
                .map(|(r, lp)| (0..lp.len()).map(|l| toy_a(r, l)).collect())
                .collect(),
            entropy: logp
                .iter()
                .map(|lp| (0..lp.len()).map(toy_b).collect())
                .collect(),
            teacher: Vec::new(),
        })
    }
}

/// The same losses computed directly with autograd, one unpadded sequence at a time.
fn direct_gradients(
    model: &CausalLm,
    seqs: &[Sequence],
    temperature: f64,
    toy: bool,
) -> Vec<(String, Tensor)> {
    let params = model.named_parameters();
    for (_, p) in &params {
        let mut p = p.shallow_clone();
        p.zero_grad();
    }
    let total_tokens: usize = seqs.iter().map(|s| s.response_ids.len()).sum();
    let mut loss = Tensor::zeros([], (Kind::Float, model.device()));
    for (r, s) in seqs.iter().enumerate() {
        let ids = [s.prompt_ids.as_slice(), s.response_ids.as_slice()].concat();
        let logits = model.forward_ids(&ids).unwrap().squeeze_dim(0);
        let (p, n) = (s.prompt_ids.len() as i64, s.response_ids.len() as i64);
        let logp_all = (logits.narrow(0, p - 1, n) / temperature).log_softmax(-1, Kind::Float);
        let targets = Tensor::from_slice(
            &s.response_ids
                .iter()
                .map(|&i| i64::from(i))
                .collect::<Vec<_>>(),
        );
        let logp = logp_all
            .gather(1, &targets.unsqueeze(1), false)
            .squeeze_dim(1);
        if toy {
            let entropy = -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, Kind::Float);
            let a = Tensor::from_slice(&(0..n as usize).map(|l| toy_a(r, l)).collect::<Vec<_>>());
            let b = Tensor::from_slice(&(0..n as usize).map(toy_b).collect::<Vec<_>>());
            loss = loss + (logp * a).sum(Kind::Float) + (entropy * b).sum(Kind::Float);
        } else {
            loss -= logp.sum(Kind::Float) / total_tokens as f64;
        }
    }
    loss.backward();
    params
        .into_iter()
        .map(|(name, p)| {
            let g = p.grad();
            (
                name,
                if g.defined() {
                    g.copy()
                } else {
                    p.zeros_like()
                },
            )
        })
        .collect()
}

fn ones_masks(seqs: &[Sequence]) -> Vec<Vec<u8>> {
    seqs.iter().map(|s| vec![1; s.response_ids.len()]).collect()
}

#[test]
fn gradient_equals_direct_autograd_and_is_split_invariant() {
    let seqs = sequences(21, &[(3, 4), (6, 2), (2, 5), (4, 3), (5, 1)]);
    let splits: [&[Range<usize>]; 3] = [
        &[0..5],
        &[0..1, 1..3, 3..5],
        &[0..1, 1..2, 2..3, 3..4, 4..5],
    ];
    for toy in [false, true] {
        let temperature = if toy { 0.7 } else { 1.0 };
        let mut backend = backend(20);
        let direct = {
            let reference = CausalLm::random(
                &tiny_config(),
                tch::Device::Cpu,
                cairn_torch::Dtype::F32,
                20,
            )
            .unwrap();
            direct_gradients(&reference, &seqs, temperature, toy)
        };
        for split in splits {
            let tokens = if toy {
                backend
                    .accumulate_gradients(&seqs, split, temperature as f32, &mut ToyLoss)
                    .unwrap()
            } else {
                let mut loss = SftLoss::new(ones_masks(&seqs));
                backend
                    .accumulate_gradients(&seqs, split, temperature as f32, &mut loss)
                    .unwrap()
            };
            assert_eq!(tokens, 15);
            let grads = backend.gradients();
            let biggest = grads
                .iter()
                .map(|(_, g)| g.abs().max().double_value(&[]))
                .fold(0.0, f64::max);
            assert!(
                biggest > 1e-3,
                "gradients are not trivially zero ({biggest})"
            );
            assert_tensors_close(&grads, &direct, 1e-5);
        }
    }
}

#[test]
fn train_step_reports_and_bumps_version_and_leaves_reference_frozen() {
    let mut backend = backend(22);
    let seqs = sequences(23, &[(3, 4), (5, 3)]);
    let before = backend.score(&seqs, 1.0, Weights::Current).unwrap();
    let mut loss = SftLoss::new(ones_masks(&seqs));
    let report = backend
        .train_step(&seqs, &[0..1, 1..2], 1.0, &mut loss)
        .unwrap();
    assert_eq!(
        (report.policy_version, report.tokens, report.lr),
        (1, 7, 1e-3)
    );
    assert!(report.grad_norm > 0.0);
    assert_eq!(backend.policy_version(), 1);
    let after = backend.score(&seqs, 1.0, Weights::Current).unwrap();
    let reference = backend.score(&seqs, 1.0, Weights::Reference).unwrap();
    assert!(
        max_abs_diff(&before[0], &after[0]) > 1e-4,
        "the step changed the policy"
    );
    assert_eq!(reference, before, "the reference is frozen");
    backend.snapshot_reference().unwrap();
    assert_eq!(
        backend.score(&seqs, 1.0, Weights::Reference).unwrap(),
        after
    );
    let err = backend
        .train_step(&seqs, &[0..1], 1.0, &mut loss)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sequence 1 is in no micro-batch"), "{err}");
}

#[test]
fn sft_memorises_a_few_sequences() {
    // The default init (std 0.02), as in the main job's from-scratch training.
    let config = ModelConfig::qwen3(64, 32, 64, 2, 4, 2);
    let mut backend: TorchBackend = backend_with(config, 30, adam(1e-2));
    let seqs = sequences(31, &[(2, 10), (2, 10), (2, 10), (2, 10)]);
    let mut losses = Vec::new();
    for _ in 0..60 {
        let mut loss = SftLoss::new(ones_masks(&seqs));
        backend
            .train_step(&seqs, &[0..2, 2..4], 1.0, &mut loss)
            .unwrap();
        losses.push(loss.mean_nll());
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(first > 3.5, "starts near ln(64): {first}");
    assert!(
        last < first / 20.0,
        "memorised: {first} -> {last} ({losses:?})"
    );
}

#[test]
fn bf16_weights_train_and_sample_with_f32_logprobs() {
    let mut cfg = cairn_torch::BackendConfig::random(tiny_config(), 32);
    cfg.dtype = Some(cairn_torch::Dtype::Bf16);
    cfg.optimizer = adam(1e-2);
    let mut backend = TorchBackend::new(&cfg).unwrap();
    let seqs = sequences(33, &[(3, 4), (5, 3)]);
    let before = backend.score(&seqs, 1.0, Weights::Current).unwrap();
    assert!(before.iter().flatten().all(|x| x.is_finite() && *x <= 0.0));
    let report = backend
        .train_step(&seqs, &[0..2], 1.0, &mut SftLoss::new(ones_masks(&seqs)))
        .unwrap();
    assert!(report.grad_norm.is_finite() && report.grad_norm > 0.0);
    let after = backend.score(&seqs, 1.0, Weights::Current).unwrap();
    let gain: f32 = after.iter().flatten().sum::<f32>() - before.iter().flatten().sum::<f32>();
    assert!(
        gain > 0.0,
        "one SFT step raises the log-likelihood ({gain})"
    );
    let prompts = vec![seqs[0].prompt_ids.clone(), seqs[1].prompt_ids.clone()];
    let params = cairn_kernel::backend::SamplingParams {
        temperature: 1.0,
        top_p: 0.9,
        max_new_tokens: 5,
        stop_ids: vec![],
        seed: 1,
    };
    let gens = backend.generate(&prompts, &params).unwrap();
    assert!(gens
        .iter()
        .all(|g| g.ids.len() == 5 && g.logprobs.iter().all(|x| x.is_finite())));
}
