//! The batched and cached forward paths reproduce a plain full forward.

use cairn_kernel::backend::{PolicyBackend, Sequence, Weights};
use cairn_torch::model::packed::onednn_bf16_supported;
use cairn_torch::model::{ModelType, PackedWeights, RopeScaling};
use cairn_torch::{CausalLm, Dtype, KvCache, ModelConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::common::{
    backend, direct_logprobs, max_abs_diff, random_ids, sequences, tiny_config, to_vec,
};

/// Teacher-forced decoding with a KV cache over left-padded prompts: prefill, then one
/// continuation token per step. Returns, per row, the next-token log-probs `[n + 1, V]` (f32).
pub fn cached_logprobs(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    continuations: &[Vec<u32>],
) -> Vec<Tensor> {
    tch::no_grad(|| cached_logprobs_in_grad_mode(model, prompts, continuations, None))
}

/// [`cached_logprobs`] in the caller's grad mode: with grad on, the model takes the training
/// path (`CausalLm::hidden_states` picks by grad mode). Without grad, the projections come
/// from `packed` when given.
fn cached_logprobs_in_grad_mode(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    continuations: &[Vec<u32>],
    packed: Option<&PackedWeights>,
) -> Vec<Tensor> {
    let b = prompts.len() as i64;
    let n = continuations[0].len() as i64;
    let width = prompts.iter().map(Vec::len).max().unwrap() as i64;
    let mut ids = vec![0i64; (b * width) as usize];
    let mut pos = vec![0i64; (b * width) as usize];
    let mut valid = vec![false; (b * (width + n)) as usize];
    for (r, p) in prompts.iter().enumerate() {
        let pad = width as usize - p.len();
        for (j, &id) in p.iter().enumerate() {
            ids[r * width as usize + pad + j] = i64::from(id);
            pos[r * width as usize + pad + j] = j as i64;
            valid[r * (width + n) as usize + pad + j] = true;
        }
        for j in 0..n as usize {
            valid[r * (width + n) as usize + width as usize + j] = true;
        }
    }
    let device = model.device();
    let valid = Tensor::from_slice(&valid)
        .view([b, width + n])
        .to_device(device);
    let mut cache = KvCache::new(
        model.config(),
        prompts.len(),
        (width + n) as usize,
        model.dtype().kind(),
        device,
    )
    .unwrap();
    let hidden = model
        .hidden_states_with(
            &Tensor::from_slice(&ids).view([b, width]).to_device(device),
            &Tensor::from_slice(&pos).view([b, width]).to_device(device),
            &valid.narrow(1, 0, width),
            Some(&mut cache),
            packed,
        )
        .unwrap();
    let mut steps = vec![model
        .logits_with(&hidden.narrow(1, width - 1, 1), packed)
        .log_softmax(-1, Kind::Float)];
    for s in 0..n {
        let input: Vec<i64> = continuations
            .iter()
            .map(|c| i64::from(c[s as usize]))
            .collect();
        let position: Vec<i64> = prompts.iter().map(|p| p.len() as i64 + s).collect();
        let hidden = model
            .hidden_states_with(
                &Tensor::from_slice(&input).view([b, 1]).to_device(device),
                &Tensor::from_slice(&position).view([b, 1]).to_device(device),
                &valid.narrow(1, 0, width + s + 1),
                Some(&mut cache),
                packed,
            )
            .unwrap();
        steps.push(
            model
                .logits_with(&hidden, packed)
                .log_softmax(-1, Kind::Float),
        );
    }
    assert_eq!(cache.len(), (width + n) as usize);
    let all = Tensor::cat(&steps, 1); // [B, n + 1, V]
    (0..b).map(|r| all.get(r)).collect()
}

/// The tiny config in each supported layout: Qwen3 (q/k norm), Qwen2 (q/k/v biases), Llama 3
/// (llama3 RoPE scaling, attention biases, tied embeddings).
fn all_layouts() -> Vec<ModelConfig> {
    let qwen3 = tiny_config();
    let qwen2 = ModelConfig {
        model_type: ModelType::Qwen2,
        ..tiny_config()
    };
    let llama = ModelConfig {
        model_type: ModelType::Llama,
        attention_bias: true,
        tie_word_embeddings: true,
        rope_scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8.0,
        },
        ..tiny_config()
    };
    vec![qwen3, qwen2, llama]
}

#[test]
fn kv_cache_decoding_matches_full_forward() {
    for config in all_layouts() {
        let model = CausalLm::random(&config, Device::Cpu, Dtype::F32, 1).unwrap();
        check_kv_cache(&model);
    }
}

fn check_kv_cache(model: &CausalLm) {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let prompts = vec![
        random_ids(&mut rng, 7),
        random_ids(&mut rng, 3),
        random_ids(&mut rng, 5),
    ];
    let continuations: Vec<Vec<u32>> = (0..3).map(|_| random_ids(&mut rng, 6)).collect();
    // Batched with left padding, and each prompt alone (no padding).
    let batched = cached_logprobs(model, &prompts, &continuations);
    for (r, (p, c)) in prompts.iter().zip(&continuations).enumerate() {
        let alone =
            cached_logprobs(model, std::slice::from_ref(p), std::slice::from_ref(c)).remove(0);
        let full = model
            .forward_ids(&[p.as_slice(), c.as_slice()].concat())
            .unwrap()
            .squeeze_dim(0);
        let full = full
            .narrow(0, p.len() as i64 - 1, c.len() as i64 + 1)
            .log_softmax(-1, Kind::Float);
        let d_batched = max_abs_diff(&to_vec(&batched[r]), &to_vec(&full));
        let d_alone = max_abs_diff(&to_vec(&alone), &to_vec(&full));
        assert!(
            d_batched <= 1e-5,
            "row {r}: batched cached vs full forward: {d_batched}"
        );
        assert!(
            d_alone <= 1e-5,
            "row {r}: cached vs full forward: {d_alone}"
        );
    }
}

/// Three prompts of 9, 2 and 6 random ids (left padding in a batch) and a continuation of 5
/// for each, from `seed`.
fn three_prompts_and_continuations(seed: u64) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let prompts = vec![
        random_ids(&mut rng, 9),
        random_ids(&mut rng, 2),
        random_ids(&mut rng, 6),
    ];
    let continuations = (0..3).map(|_| random_ids(&mut rng, 5)).collect();
    (prompts, continuations)
}

/// Sampling and scoring run without grad and take the lean inference path; training takes
/// the op-by-op path. Their values must agree to the last bit, or rollout log-probs would
/// drift from the ones the trainer recomputes, and the main job would stop reproducing. Every
/// layout, f32 and bf16, prefill over left padding and cached decode steps, under GQA.
#[test]
fn the_inference_forward_equals_the_training_forward_bit_for_bit() {
    let (prompts, continuations) = three_prompts_and_continuations(5);
    for dtype in [Dtype::F32, Dtype::Bf16] {
        for config in all_layouts() {
            assert!(config.num_attention_heads > config.num_key_value_heads);
            let model = CausalLm::random(&config, Device::Cpu, dtype, 3).unwrap();
            let lean = cached_logprobs(&model, &prompts, &continuations);
            let training = tch::with_grad(|| {
                cached_logprobs_in_grad_mode(&model, &prompts, &continuations, None)
            });
            for (r, (a, b)) in lean.iter().zip(&training).enumerate() {
                assert!(b.requires_grad(), "the training path ran with grad");
                let b = b.detach();
                let d = max_abs_diff(&to_vec(a), &to_vec(&b));
                assert!(
                    a.equal(&b),
                    "{dtype:?} {:?} row {r}: differs by {d}",
                    config.model_type
                );
            }
        }
    }
}

/// bf16 generation passes on the CPU multiply by weights packed for oneDNN
/// (`CausalLm::pack_for_inference`). The pack exists exactly where libtorch's oneDNN has bf16
/// kernels, never for f32, and its forward (prefill over left padding, then cached decode
/// steps) gives the plain forward's log-probs: the same kernel family accumulates in f32 and
/// rounds once to bf16, so the two agree to within the bound below (measured on an AMD EPYC,
/// generic-avx512: equal to the bit). Wrong, stale or transposed packed weights miss it by
/// whole nats.
#[test]
fn packed_projections_give_the_plain_forwards_logprobs() {
    let (prompts, continuations) = three_prompts_and_continuations(6);
    for config in all_layouts() {
        let f32_model = CausalLm::random(&config, Device::Cpu, Dtype::F32, 3).unwrap();
        assert!(
            f32_model.pack_for_inference().weights().is_none(),
            "f32 is never packed"
        );
        let model = CausalLm::random(&config, Device::Cpu, Dtype::Bf16, 3).unwrap();
        let guard = model.pack_for_inference();
        assert_eq!(
            guard.weights().is_some(),
            onednn_bf16_supported(),
            "{:?}",
            config.model_type
        );
        let Some(packed) = guard.weights() else {
            continue;
        };
        let plain = cached_logprobs(&model, &prompts, &continuations);
        let fast = tch::no_grad(|| {
            cached_logprobs_in_grad_mode(&model, &prompts, &continuations, Some(packed))
        });
        assert_close(&plain, &fast, &format!("{:?}", config.model_type));
    }
}

/// The model keeps its pack between passes, so an update must never leave it stale: after the
/// weights change in place (as an optimizer step or a weight load changes them), the next pack
/// gives the new weights' log-probs, not the old ones (which differ by whole nats here).
#[test]
fn a_kept_pack_follows_the_weights_after_they_change_in_place() {
    if !onednn_bf16_supported() {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let prompts = vec![random_ids(&mut rng, 6), random_ids(&mut rng, 3)];
    let continuations: Vec<Vec<u32>> = (0..2).map(|_| random_ids(&mut rng, 4)).collect();
    let model = CausalLm::random(&tiny_config(), Device::Cpu, Dtype::Bf16, 4).unwrap();
    let logprobs = |model: &CausalLm| {
        let guard = model.pack_for_inference();
        let packed = guard.weights().expect("bf16 on this CPU is packed");
        tch::no_grad(|| cached_logprobs_in_grad_mode(model, &prompts, &continuations, Some(packed)))
    };
    let before = logprobs(&model);
    assert_close(
        &cached_logprobs(&model, &prompts, &continuations),
        &before,
        "before",
    );
    for (name, mut w) in model.named_parameters() {
        if name.ends_with("mlp.up_proj.weight") || name.ends_with("self_attn.v_proj.weight") {
            tch::no_grad(|| {
                let _ = w.g_mul_scalar_(-3.0);
            });
        }
    }
    let after = logprobs(&model);
    assert_close(
        &cached_logprobs(&model, &prompts, &continuations),
        &after,
        "after",
    );
    let moved = max_abs_diff(&to_vec(&before[0]), &to_vec(&after[0]));
    assert!(
        moved > 0.5,
        "the change moved the log-probs by only {moved}"
    );
}

/// Packed and plain log-probs, row by row, within the packed path's bound.
fn assert_close(plain: &[Tensor], packed: &[Tensor], what: &str) {
    for (r, (a, b)) in plain.iter().zip(packed).enumerate() {
        let d = max_abs_diff(&to_vec(a), &to_vec(b));
        eprintln!("{what} row {r}: packed vs plain {d}");
        assert!(d <= 5e-2, "{what} row {r}: packed vs plain {d}");
    }
}

#[test]
fn kv_cache_overflow_is_an_error() {
    let backend = backend(1);
    let model = backend.policy();
    let mut cache = KvCache::new(model.config(), 1, 2, Kind::Float, Device::Cpu).unwrap();
    let ids = Tensor::from_slice(&[5i64, 6, 7]).view([1, 3]);
    let pos = Tensor::arange(3, (Kind::Int64, Device::Cpu)).view([1, 3]);
    let valid = Tensor::ones([1, 3], (Kind::Bool, Device::Cpu));
    let err = model
        .hidden_states(&ids, &pos, &valid, Some(&mut cache))
        .unwrap_err()
        .to_string();
    assert!(err.contains("capacity 2"), "{err}");
}

#[test]
fn batched_scoring_with_left_padding_equals_unbatched() {
    let mut backend = backend(3);
    let seqs = sequences(4, &[(3, 5), (9, 2), (1, 7), (6, 0), (4, 4)]);
    for temperature in [1.0f32, 0.6] {
        let batched = backend.score(&seqs, temperature, Weights::Current).unwrap();
        for (i, seq) in seqs.iter().enumerate() {
            let alone = backend
                .score(std::slice::from_ref(seq), temperature, Weights::Current)
                .unwrap();
            assert_eq!(batched[i].len(), seq.response_ids.len());
            let d = max_abs_diff(&batched[i], &alone[0]);
            assert!(d <= 1e-5, "T={temperature} seq {i}: batched vs alone {d}");
            if !seq.response_ids.is_empty() {
                let direct = to_vec(&direct_logprobs(
                    backend.policy(),
                    seq,
                    f64::from(temperature),
                ));
                let d = max_abs_diff(&batched[i], &direct);
                assert!(
                    d <= 1e-5,
                    "T={temperature} seq {i}: batched vs direct forward {d}"
                );
            }
        }
    }
}

#[test]
fn score_rejects_bad_input_with_specific_errors() {
    let mut backend = backend(3);
    let empty = vec![Sequence {
        prompt_ids: vec![],
        response_ids: vec![5],
    }];
    let err = backend
        .score(&empty, 1.0, Weights::Current)
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty prompt"), "{err}");
    let big = vec![Sequence {
        prompt_ids: vec![5],
        response_ids: vec![64],
    }];
    let err = backend
        .score(&big, 1.0, Weights::Current)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token id 64"), "{err}");
    let err = backend
        .score(&sequences(1, &[(2, 2)]), -1.0, Weights::Current)
        .unwrap_err()
        .to_string();
    assert!(err.contains("temperature"), "{err}");
}

/// The one-row step written out in Rust (`CausalLm::decode_row`) against the libtorch step
/// on the same cache contents, in bf16, for every layout (q/k norms, q/k/v and o biases,
/// llama3 RoPE, tied embeddings, GQA): log-probs within the bf16 bound, step after step (so
/// the keys and values it writes are read back right), with padding columns masked out.
#[test]
fn the_one_row_step_follows_the_libtorch_step() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return;
    }
    let _guard = tch::no_grad_guard();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let prompt = random_ids(&mut rng, 5);
    let continuation = random_ids(&mut rng, 6);
    for config in all_layouts() {
        let what = format!("{:?}", config.model_type);
        let model = CausalLm::random(&config, Device::Cpu, Dtype::Bf16, 5).unwrap();
        // Three padding columns, then the prompt at positions 0..5.
        let pad = 3i64;
        let width = pad + prompt.len() as i64;
        let steps = continuation.len() as i64;
        let mut ids = vec![0i64; pad as usize];
        ids.extend(prompt.iter().map(|&i| i64::from(i)));
        let mut pos = vec![0i64; pad as usize];
        pos.extend(0..prompt.len() as i64);
        let valid = Tensor::arange(width + steps, (Kind::Int64, Device::Cpu))
            .ge(pad)
            .unsqueeze(0);
        let prefill = |cache: &mut KvCache| {
            model
                .hidden_states(
                    &Tensor::from_slice(&ids).view([1, width]),
                    &Tensor::from_slice(&pos).view([1, width]),
                    &valid.narrow(1, 0, width),
                    Some(cache),
                )
                .unwrap()
        };
        let new_cache = || {
            KvCache::new(
                model.config(),
                1,
                (width + steps) as usize,
                Kind::BFloat16,
                Device::Cpu,
            )
            .unwrap()
        };
        let (mut torch_cache, mut row_cache) = (new_cache(), new_cache());
        let _ = prefill(&mut torch_cache);
        let _ = prefill(&mut row_cache);
        let mut worst = 0f32;
        for (s, &id) in continuation.iter().enumerate() {
            let s = s as i64;
            let position = prompt.len() as i64 + s;
            let valid = valid.narrow(1, 0, width + s + 1);
            let hidden = model
                .hidden_states(
                    &Tensor::from_slice(&[i64::from(id)]).view([1, 1]),
                    &Tensor::from_slice(&[position]).view([1, 1]),
                    &valid,
                    Some(&mut torch_cache),
                )
                .unwrap();
            let torch = model.logits(&hidden.squeeze_dim(1)).to_kind(Kind::Float);
            let row = model
                .decode_row(i64::from(id), position, &valid, &mut row_cache)
                .unwrap()
                .expect("a one-row bf16 cache on an AVX2 CPU takes the row step");
            assert_eq!(row.size(), torch.size());
            assert_eq!(
                row_cache.len(),
                torch_cache.len(),
                "{what}: the row step advances"
            );
            let d = max_abs_diff(
                &to_vec(&torch.log_softmax(-1, Kind::Float)),
                &to_vec(&row.log_softmax(-1, Kind::Float)),
            );
            worst = worst.max(d);
        }
        // The bound of bf16 against transformers (whose own sdpa and eager attention differ by
        // up to 9.3e-2); measured here up to 6.1e-2 (qwen2 layout, AMD EPYC with AVX2).
        eprintln!("{what}: row step vs libtorch step, max |Δ log-prob| {worst}");
        assert!(
            worst <= crate::reference::BF16_TOLERANCE,
            "{what}: row step vs libtorch step {worst}"
        );
    }
}

/// `decode_row` leaves what it does not cover to the libtorch step, untouched: caches of two
/// rows and f32 models give `None` and write nothing; a token outside the vocabulary or a
/// mask of the wrong width is an error.
#[test]
fn the_one_row_step_declines_what_it_does_not_cover() {
    let _guard = tch::no_grad_guard();
    let valid = Tensor::ones([1, 1], (Kind::Bool, Device::Cpu));
    let bf16 = CausalLm::random(&tiny_config(), Device::Cpu, Dtype::Bf16, 5).unwrap();
    let mut two_rows = KvCache::new(bf16.config(), 2, 4, Kind::BFloat16, Device::Cpu).unwrap();
    assert!(bf16
        .decode_row(5, 0, &valid, &mut two_rows)
        .unwrap()
        .is_none());
    assert_eq!(two_rows.len(), 0);
    let f32 = CausalLm::random(&tiny_config(), Device::Cpu, Dtype::F32, 5).unwrap();
    let mut cache = KvCache::new(f32.config(), 1, 4, Kind::Float, Device::Cpu).unwrap();
    assert!(f32.decode_row(5, 0, &valid, &mut cache).unwrap().is_none());
    assert_eq!(cache.len(), 0);
    let mut cache = KvCache::new(bf16.config(), 1, 4, Kind::BFloat16, Device::Cpu).unwrap();
    let err = bf16.decode_row(64, 0, &valid, &mut cache).unwrap_err();
    assert!(
        err.to_string().contains("outside the vocabulary of 64"),
        "{err}"
    );
    let wide = Tensor::ones([1, 2], (Kind::Bool, Device::Cpu));
    let err = bf16.decode_row(5, 0, &wide, &mut cache).unwrap_err();
    assert!(
        err.to_string().contains("key_valid covers 2 positions"),
        "{err}"
    );
    assert_eq!(cache.len(), 0);
}
