//! Time of one decode step (and of the prefill) on a HF model directory, with the projections
//! plain (`F.linear`), packed for oneDNN ([`cairn_torch::model::packed`]) and, at one row, the
//! step written out in Rust ([`CausalLm::decode_row`]), alternated in one process so all see
//! the same machine.
//!
//! ```text
//! decode_step MODEL_DIR DTYPE BATCH [STEPS [ROUNDS [THREADS]]]
//! ```
//!
//! `DTYPE` is `bf16` or `f32` (f32 has no packed path: the packed rows are then skipped; the
//! `row` variant runs at `BATCH` 1 in bf16 on a CPU with AVX2 and FMA). Each round prefills
//! `BATCH` prompts of 38 seeded random ids into a fresh KV cache (packed where there is a
//! pack), then runs `STEPS` decode steps (hidden states and the LM head; the next ids are the
//! argmax) for each variant, in an order rotated per round. Prints one line per round and
//! variant and, last, the median step time of each and its ratio to `packed` (to `plain`
//! where nothing is packed; above 1, the variant is slower).

use std::path::PathBuf;
use std::time::Instant;

use cairn_torch::model::{CausalLm, Dtype, KvCache, PackedWeights};
use cairn_torch::tch::{self, Device, Kind, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: decode_step MODEL_DIR bf16|f32 BATCH [STEPS [ROUNDS [THREADS]]]";
    let (dir, dtype, batch) = match args.as_slice() {
        [d, t, b, ..] => (PathBuf::from(d), t.as_str(), b.parse::<i64>()?),
        _ => return Err(usage.into()),
    };
    let dtype = match dtype {
        "bf16" => Dtype::Bf16,
        "f32" => Dtype::F32,
        other => return Err(format!("dtype `{other}`: {usage}").into()),
    };
    let steps: i64 = args.get(3).map_or(Ok(16), |s| s.parse())?;
    let rounds: usize = args.get(4).map_or(Ok(3), |s| s.parse())?;
    let threads: i32 = args.get(5).map_or(Ok(2), |s| s.parse())?;
    tch::set_num_threads(threads);
    let _guard = tch::no_grad_guard();
    let model = CausalLm::from_pretrained(&dir, Device::Cpu, dtype)?;
    let start = Instant::now();
    let guard = model.pack_for_inference();
    let pack_s = start.elapsed().as_secs_f64();
    let packed = guard.weights();
    match packed {
        Some(_) => println!("packed every projection in {:.1} ms", pack_s * 1e3),
        None => println!("no packed path for this dtype or CPU"),
    }
    let vocab = model.config().vocab_size as i64;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let prompt: Vec<i64> = (0..batch * 38)
        .map(|_| rng.gen_range(0..vocab.min(32_000)))
        .collect();
    let prompt = Tensor::from_slice(&prompt).view([batch, 38]);
    let mut times: Vec<(&str, f64, f64)> = Vec::new();
    let mut names = vec!["plain"];
    if packed.is_some() {
        names.push("packed");
    }
    if batch == 1 && dtype == Dtype::Bf16 {
        names.push("row");
    }
    for round in 0..rounds {
        let mut order = names.clone();
        order.rotate_left(round % names.len());
        for name in order {
            let p = if name == "plain" { None } else { packed };
            let (prefill_s, step_s) = run(&model, &prompt, steps, p, name == "row")?;
            if step_s.is_nan() {
                println!("round {round} {name:>6}: the one-row step does not apply here");
                continue;
            }
            println!(
                "round {round} {name:>6}: prefill {:.1} ms, decode step {:.2} ms",
                prefill_s * 1e3,
                step_s * 1e3
            );
            times.push((name, prefill_s, step_s));
        }
    }
    let median = |name: &str, pick: fn(&(&str, f64, f64)) -> f64| {
        let mut v: Vec<f64> = times.iter().filter(|t| t.0 == name).map(pick).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let reference_name = if packed.is_some() { "packed" } else { "plain" };
    let reference = median(reference_name, |t| t.2);
    for name in &names {
        let (Some(step), Some(prefill)) = (median(name, |t| t.2), median(name, |t| t.1)) else {
            continue;
        };
        let ratio = reference.map_or(String::new(), |r| {
            format!(", {:.2}x {reference_name}", step / r)
        });
        println!(
            "median {name:>6}: decode step {:.2} ms{ratio}, prefill {:.1} ms",
            step * 1e3,
            prefill * 1e3
        );
    }
    Ok(())
}

/// Prefills `prompt` `[B, 38]` and runs `steps` greedy decode steps (through
/// [`CausalLm::decode_row`] when `row`); returns the prefill time and the mean decode step
/// time, in seconds (NaN when the one-row step does not apply).
fn run(
    model: &CausalLm,
    prompt: &Tensor,
    steps: i64,
    packed: Option<&PackedWeights>,
    row: bool,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (b, t) = (prompt.size()[0], prompt.size()[1]);
    let mut cache = KvCache::new(
        model.config(),
        b as usize,
        (t + steps) as usize,
        model.dtype().kind(),
        Device::Cpu,
    )?;
    let start = Instant::now();
    let pos = Tensor::arange(t, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .expand([b, t], true);
    let valid = Tensor::ones([b, t], (Kind::Bool, Device::Cpu));
    let hidden = model.hidden_states_with(prompt, &pos, &valid, Some(&mut cache), packed)?;
    let mut next = model
        .logits_with(&hidden.narrow(1, t - 1, 1), packed)
        .argmax(-1, false);
    let prefill = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for s in 0..steps {
        let pos = Tensor::full([b, 1], t + s, (Kind::Int64, Device::Cpu));
        let valid = Tensor::ones([b, t + s + 1], (Kind::Bool, Device::Cpu));
        if row {
            let Some(logits) =
                model.decode_row(next.int64_value(&[0, 0]), t + s, &valid, &mut cache)?
            else {
                return Ok((prefill, f64::NAN));
            };
            next = logits.argmax(-1, true);
            continue;
        }
        let hidden = model.hidden_states_with(&next, &pos, &valid, Some(&mut cache), packed)?;
        next = model.logits_with(&hidden, packed).argmax(-1, false);
    }
    Ok((prefill, start.elapsed().as_secs_f64() / steps as f64))
}
