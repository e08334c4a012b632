//! Rough throughput of the tch backend on this machine, for sizing the main job's model:
//! batched generation (B = 32, prompt 64, 32 new tokens) and one train step on 32 sequences
//! of 80 tokens, for a Qwen3-layout model with hidden 128, 4 layers, 4 heads (2 kv heads),
//! intermediate 384, vocab 512.
//!
//! ```text
//! source scripts/env.sh && cargo run --release -p cairn-torch --example speed \
//!     [-- THREADS [DEVICE [HIDDEN LAYERS]]]
//! ```
//!
//! `DEVICE` is cpu (default), cuda or auto. Other sizes keep the proportions: heads =
//! hidden / 32, kv heads = heads / 2, intermediate = 3 · hidden.

use std::time::Instant;

use cairn_kernel::backend::{OptimizerSettings, PolicyBackend, SamplingParams, Sequence, Weights};
use cairn_kernel::loss::SftLoss;
use cairn_torch::{BackendConfig, DeviceOption, ModelConfig, TorchBackend};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map(|t| t.parse()).transpose()?.unwrap_or(2);
    let device = match args.next().as_deref() {
        Some("cuda") => DeviceOption::Cuda,
        Some("auto") => DeviceOption::Auto,
        _ => DeviceOption::Cpu,
    };
    let hidden: usize = args.next().map(|t| t.parse()).transpose()?.unwrap_or(128);
    let layers: usize = args.next().map(|t| t.parse()).transpose()?.unwrap_or(4);
    let heads = (hidden / 32).max(1);
    let model = ModelConfig::qwen3(512, hidden, 3 * hidden, layers, heads, (heads / 2).max(1));
    let mut config = BackendConfig::random(model, 0);
    config.threads = Some(threads);
    config.device = device;
    config.optimizer = OptimizerSettings {
        lr: 1e-3,
        ..OptimizerSettings::default()
    };
    let mut backend = TorchBackend::new(&config)?;
    let params: usize = backend
        .policy()
        .named_parameters()
        .iter()
        .map(|(_, t)| t.numel())
        .sum();
    println!(
        "model: hidden {hidden}, {layers} layers, {heads} heads: {params} parameters, device {:?}, {threads} threads",
        backend.device()
    );

    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut ids = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..512)).collect() };
    let prompts: Vec<Vec<u32>> = (0..32).map(|_| ids(64)).collect();
    let sampling = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 32,
        stop_ids: vec![],
        seed: 0,
    };
    backend.generate(&prompts[..4], &sampling)?; // warm-up
    let reps = 3;
    let start = Instant::now();
    let mut generated = 0;
    for _ in 0..reps {
        generated += backend
            .generate(&prompts, &sampling)?
            .iter()
            .map(|g| g.ids.len())
            .sum::<usize>();
    }
    let secs = start.elapsed().as_secs_f64() / reps as f64;
    println!(
        "generate B=32 prompt=64 new=32: {:.3} s/call, {:.0} new tokens/s",
        secs,
        generated as f64 / reps as f64 / secs
    );

    let seqs: Vec<Sequence> = (0..32)
        .map(|_| Sequence {
            prompt_ids: ids(48),
            response_ids: ids(32),
        })
        .collect();
    let start = Instant::now();
    backend.score(&seqs, 1.0, Weights::Current)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "score 32 x 80 tokens: {secs:.3} s, {:.0} tokens/s (all positions)",
        32.0 * 80.0 / secs
    );

    for split in [1usize, 4] {
        let per = 32 / split;
        let micro: Vec<_> = (0..split).map(|i| i * per..(i + 1) * per).collect();
        let mut loss = SftLoss::new(seqs.iter().map(|s| vec![1; s.response_ids.len()]).collect());
        backend.train_step(&seqs, &micro, 1.0, &mut loss)?; // warm-up
        let start = Instant::now();
        for _ in 0..reps {
            let mut loss =
                SftLoss::new(seqs.iter().map(|s| vec![1; s.response_ids.len()]).collect());
            backend.train_step(&seqs, &micro, 1.0, &mut loss)?;
        }
        let secs = start.elapsed().as_secs_f64() / reps as f64;
        println!(
            "train_step 32 x 80 tokens ({split} micro-batches): {secs:.3} s/step, {:.0} tokens/s (all positions)",
            32.0 * 80.0 / secs
        );
    }
    Ok(())
}
