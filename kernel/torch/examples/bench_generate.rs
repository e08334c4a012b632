//! Cairn's side of `scripts/fidelity/bench_generate.sh`: batched greedy generation with the KV
//! cache on a HF model directory, timed, for comparison with transformers' `generate()` on the
//! same model, prompts and lengths.
//!
//! ```text
//! bench_generate MODEL_DIR PROMPTS.json NEW_TOKENS THREADS REPS OUT_IDS.json [cpu|cuda]
//! ```
//!
//! `PROMPTS.json` is a list of id lists (one batch). Greedy, no stop ids, so every row gets
//! exactly `NEW_TOKENS` tokens, as transformers does with EOS disabled. One untimed warm-up
//! call, then `REPS` timed calls. Prints one JSON line (`engine`, `seconds_per_call`,
//! `tokens_per_s` = batch × new tokens / seconds per call, prefill included) and writes the
//! generated ids to `OUT_IDS.json`, so the driver can check both engines did the same work.

use std::path::PathBuf;
use std::time::Instant;

use cairn_kernel::backend::{OptimizerSettings, PolicyBackend, SamplingParams};
use cairn_torch::{BackendConfig, DeviceOption, ModelSource, TorchBackend};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model_dir, prompts, new_tokens, threads, reps, out, device) = match args.as_slice() {
        [m, p, n, t, r, o] => (m, p, n, t, r, o, DeviceOption::Cpu),
        [m, p, n, t, r, o, d] if d == "cpu" => (m, p, n, t, r, o, DeviceOption::Cpu),
        [m, p, n, t, r, o, d] if d == "cuda" => (m, p, n, t, r, o, DeviceOption::Cuda),
        _ => {
            return Err(
                "usage: bench_generate MODEL_DIR PROMPTS.json NEW_TOKENS THREADS REPS \
                        OUT_IDS.json [cpu|cuda]"
                    .into(),
            )
        }
    };
    let prompts: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(prompts)?)?;
    let new_tokens: u32 = new_tokens.parse()?;
    let threads: usize = threads.parse()?;
    let reps: u32 = reps.parse()?;

    let config = BackendConfig {
        model: ModelSource::Pretrained {
            dir: PathBuf::from(model_dir),
        },
        device,
        dtype: None,
        seed: 0,
        threads: Some(threads),
        optimizer: OptimizerSettings::default(),
        warmup_steps: 0,
        score_batch_size: 32,
    };
    let mut backend = TorchBackend::new(&config)?;
    let params = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: new_tokens,
        stop_ids: vec![],
        seed: 0,
    };
    let mut generations = backend.generate(&prompts, &params)?; // warm-up
    let start = Instant::now();
    for _ in 0..reps {
        generations = backend.generate(&prompts, &params)?;
    }
    let seconds = start.elapsed().as_secs_f64() / f64::from(reps);
    let tokens: usize = generations.iter().map(|g| g.ids.len()).sum();
    let ids: Vec<&Vec<u32>> = generations.iter().map(|g| &g.ids).collect();
    std::fs::write(out, serde_json::to_string(&ids)?)?;
    println!(
        "{}",
        serde_json::json!({
            "engine": "cairn",
            "batch": prompts.len(),
            "new_tokens": new_tokens,
            "threads": threads,
            "device": format!("{:?}", backend.device()),
            "seconds_per_call": seconds,
            "tokens_per_s": tokens as f64 / seconds,
        })
    );
    Ok(())
}
