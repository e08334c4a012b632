//! A timing harness for the decode loop (a benchmark program, not a test).
//!
//! ```sh
//! CAIRN_DECODE_BENCH_MODEL=DIR OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
//!   cargo run -p cairn-torch --release --example decode_bench
//! ```
//!
//! `DIR` is a Hugging Face directory (e.g. SmolLM2-135M-Instruct imported by
//! `scripts/smollm2.sh`). For every dtype in `CAIRN_DECODE_BENCH_DTYPES` (default `f32,bf16`)
//! and batch size in `CAIRN_DECODE_BENCH_BATCHES` (default `1,8,64`) it runs greedy
//! [`cairn_torch::sampling::generate_with`] on left-padded prompts of 37–39 seeded random ids
//! (the SmolLM2 benchmark's shape) for `CAIRN_DECODE_BENCH_NEW` new tokens (default `32`),
//! one warm-up call then `CAIRN_DECODE_BENCH_REPS` timed calls (default 1), at one libtorch
//! thread. A token sink stamps the time of each decode step, so the prefill (up to the first
//! sampled id) and the decode steps are timed apart, in wall time and in this thread's CPU
//! time (`/proc/thread-self/schedstat`; at one libtorch thread the work runs on the calling
//! thread, and CPU time is what other tenants of a shared machine disturb least). One JSON
//! line per case on stdout, with a checksum of the generated ids (the same ids on two builds =
//! the same work).

use std::path::PathBuf;
use std::time::Instant;

use cairn_kernel::backend::{SamplingParams, TokenSink};
use cairn_plugin_sdk::FinishReason;
use cairn_torch::{sampling, CausalLm, Dtype};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::Device;

/// Nanoseconds this thread has run on a CPU (Linux).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Records when row 0 got each id (wall, thread CPU): the first stamp ends the prefill.
struct Stamps(Vec<(Instant, u64)>);

impl TokenSink for Stamps {
    fn begin(&mut self, _policy_version: u64) {}

    fn token(&mut self, row: usize, _id: u32, _logp: f32, _finish: Option<FinishReason>) -> bool {
        if row == 0 {
            self.0.push((Instant::now(), thread_cpu_ns()));
        }
        true
    }
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |s| s.parse().expect(name))
}

fn main() {
    let dir = PathBuf::from(
        std::env::var("CAIRN_DECODE_BENCH_MODEL").expect("CAIRN_DECODE_BENCH_MODEL=DIR"),
    );
    tch::set_num_threads(1);
    let new = env_usize("CAIRN_DECODE_BENCH_NEW", 32);
    let reps = env_usize("CAIRN_DECODE_BENCH_REPS", 1);
    for dtype in env_list("CAIRN_DECODE_BENCH_DTYPES", "f32,bf16") {
        let dt = match dtype.as_str() {
            "f32" => Dtype::F32,
            "bf16" => Dtype::Bf16,
            other => panic!("dtype {other}"),
        };
        let model = CausalLm::from_pretrained(&dir, Device::Cpu, dt).expect("model loads");
        let vocab = model.config().vocab_size as u32;
        for batch in env_list("CAIRN_DECODE_BENCH_BATCHES", "1,8,64") {
            let b: usize = batch.parse().expect("batch");
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|i| {
                    (0..37 + i % 3)
                        .map(|_| rng.gen_range(3..vocab.min(20_000)))
                        .collect()
                })
                .collect();
            let params = SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                max_new_tokens: new as u32,
                stop_ids: Vec::new(),
                seed: 0,
            };
            let mut prefill = Vec::new();
            let mut decode = Vec::new();
            let mut decode_cpu = Vec::new();
            let mut checksum = 0u64;
            for rep in 0..=reps {
                let mut stamps = Stamps(Vec::with_capacity(new));
                let start = Instant::now();
                let out = sampling::generate_with(&model, &prompts, &params, Some(&mut stamps))
                    .expect("generate");
                let (end, end_cpu) = (Instant::now(), thread_cpu_ns());
                checksum = out
                    .iter()
                    .flat_map(|g| g.ids.iter())
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, &id| {
                        (h ^ u64::from(id)).wrapping_mul(0x100_0000_01b3)
                    });
                if rep > 0 {
                    let (first, first_cpu) = stamps.0[0];
                    prefill.push((first - start).as_secs_f64());
                    decode.push((end - first).as_secs_f64());
                    decode_cpu.push((end_cpu - first_cpu) as f64 * 1e-9);
                }
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let (p, d) = (median(&mut prefill), median(&mut decode));
            let c = median(&mut decode_cpu);
            let (steps, decode_tokens) = ((new - 1) as f64, (b * (new - 1)) as f64);
            println!(
                "{{\"dtype\":\"{dtype}\",\"batch\":{b},\"new\":{new},\"prefill_s\":{p:.4},\
                 \"decode_s\":{d:.4},\"decode_cpu_s\":{c:.4},\"decode_tok_s\":{:.2},\
                 \"decode_tok_cpu_s\":{:.2},\"ms_per_step\":{:.3},\"cpu_ms_per_step\":{:.3},\
                 \"ids_fnv\":\"{checksum:016x}\"}}",
                decode_tokens / d,
                decode_tokens / c,
                d * 1e3 / steps,
                c * 1e3 / steps,
            );
        }
    }
}
