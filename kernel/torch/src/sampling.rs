//! Batched generation with a preallocated KV cache: temperature, top-p, stop ids, per-row
//! finish.
//!
//! Prompts of different lengths are left-padded into one batch (`batch::LeftPadded`), prefilled
//! in one forward, then decoded one token per step for every row. A row finishes when it
//! samples one of the stop ids ([`FinishReason::Stop`], stop id kept as its last token) or
//! reaches `max_new_tokens` ([`FinishReason::Length`], last sampled token kept as is, never
//! replaced by an EOS). Finished rows keep riding along in the batch until every row is done;
//! their extra outputs are dropped.
//!
//! **Reported log-probs.** Each sampled id is reported with `log_softmax(logits / T)` over
//! the full vocabulary, in f32, *before* top-p truncation; for `T = 0` (greedy, argmax) with
//! `log_softmax(logits)`. This is exactly what [`crate::backend::TorchBackend`]'s `score` and
//! `train_step` compute at the same temperature, so rollout and trainer log-probs are
//! comparable (importance ratios start at 1 on the first step). The nucleus only decides which
//! ids may be drawn.
//!
//! **Randomness.** Each row draws one uniform per step from its own ChaCha8 stream (seed =
//! `SamplingParams::seed`, stream = row index); the draw picks an id by inverse CDF on the
//! device. Same seed, same prompts → same samples; libtorch's global RNG is never used.

use cairn_kernel::backend::{Generation, SamplingParams, TokenSink};
use cairn_plugin_sdk::FinishReason;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::batch::{check_ids, LeftPadded};
use crate::error::{Error, Result};
use crate::logprobs::logit_temperature;
use crate::model::{CausalLm, KvCache};

/// Samples one response per prompt; see the module docs.
pub fn generate(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
) -> Result<Vec<Generation>> {
    generate_with(model, prompts, params, None)
}

/// [`generate`], each sampled id handed to `sink` right after its decode step; a row the sink
/// refuses samples no more (finish reason [`FinishReason::Aborted`]) but keeps riding along
/// in the batch like a finished row, so the other rows' samples are those [`generate`] gives.
/// The loop ends once no row is live.
pub fn generate_with(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    mut sink: Option<&mut dyn TokenSink>,
) -> Result<Vec<Generation>> {
    let _guard = tch::no_grad_guard();
    let vocab_size = model.config().vocab_size;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::input("generate", format!("prompt {i} is empty")));
        }
        check_ids(p, vocab_size, "generate prompt")?;
    }
    logit_temperature(params.temperature)?;
    if !(params.top_p > 0.0 && params.top_p <= 1.0) {
        return Err(Error::input(
            "top_p",
            format!("{} is not in (0, 1]", params.top_p),
        ));
    }
    let max_new = params.max_new_tokens as usize;
    let mut out: Vec<Generation> = prompts
        .iter()
        .map(|_| Generation {
            finish_reason: FinishReason::Length,
            ..Generation::default()
        })
        .collect();
    if prompts.is_empty() || max_new == 0 {
        return Ok(out);
    }
    let device = model.device();
    let batch = LeftPadded::new(prompts, device);
    let b = prompts.len() as i64;
    let width = batch.width as i64;
    let mut cache = KvCache::new(
        model.config(),
        prompts.len(),
        batch.width + max_new,
        model.dtype().kind(),
        device,
    );
    // Key validity over the whole cache: prompt padding false, every generated slot true.
    let key_valid = Tensor::cat(
        &[
            &batch.valid,
            &Tensor::ones([b, max_new as i64], (Kind::Bool, device)),
        ],
        1,
    );
    let prompt_lens = Tensor::from_slice(&batch.lens.iter().map(|&l| l as i64).collect::<Vec<_>>())
        .to_device(device);
    let mut rngs: Vec<ChaCha8Rng> = (0..prompts.len())
        .map(|i| {
            let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
            rng.set_stream(i as u64);
            rng
        })
        .collect();
    let sampler = Sampler::new(params, device);

    let hidden = model.hidden_states(
        &batch.input_ids,
        &batch.position_ids,
        &batch.valid,
        Some(&mut cache),
    )?;
    let mut logits = model
        .logits(&hidden.narrow(1, width - 1, 1).squeeze_dim(1))
        .to_kind(Kind::Float);
    let mut live = prompts.len();
    for step in 0..max_new {
        let uniforms: Vec<f64> = rngs.iter_mut().map(|r| r.gen::<f64>()).collect();
        let (ids, logp) = sampler.sample(&logits, &uniforms);
        let ids_host: Vec<i64> = Vec::try_from(&ids)?;
        let logp_host: Vec<f32> = Vec::try_from(&logp)?;
        for (row, g) in out.iter_mut().enumerate() {
            // Live rows are those still at the initial `Length` below the limit.
            if g.finish_reason != FinishReason::Length || g.ids.len() == max_new {
                continue;
            }
            let id = ids_host[row] as u32;
            g.ids.push(id);
            g.logprobs.push(logp_host[row]);
            let finish = if params.stop_ids.contains(&id) {
                g.finish_reason = FinishReason::Stop;
                Some(FinishReason::Stop)
            } else {
                (g.ids.len() == max_new).then_some(FinishReason::Length)
            };
            let wanted = match sink.as_deref_mut() {
                Some(sink) => sink.token(row, id, logp_host[row], finish),
                None => true,
            };
            if finish.is_some() {
                live -= 1;
            } else if !wanted {
                g.finish_reason = FinishReason::Aborted;
                live -= 1;
            }
        }
        if live == 0 {
            break;
        }
        let input = ids.view([b, 1]);
        let position = (&prompt_lens + step as i64).view([b, 1]);
        let valid = key_valid.narrow(1, 0, cache.len() as i64 + 1);
        let hidden = model.hidden_states(&input, &position, &valid, Some(&mut cache))?;
        logits = model.logits(&hidden.squeeze_dim(1)).to_kind(Kind::Float);
    }
    Ok(out)
}

/// Picks the next id of every row from f32 logits `[B, V]`.
struct Sampler {
    /// `None`: greedy.
    temperature: Option<f64>,
    top_p: f64,
    device: Device,
}

impl Sampler {
    fn new(params: &SamplingParams, device: Device) -> Sampler {
        let temperature = (params.temperature > 0.0).then(|| f64::from(params.temperature));
        Sampler {
            temperature,
            top_p: f64::from(params.top_p),
            device,
        }
    }

    /// `(ids [B] int64, logp [B] f32)`; `uniforms` holds one draw in `[0, 1)` per row.
    fn sample(&self, logits: &Tensor, uniforms: &[f64]) -> (Tensor, Tensor) {
        let Some(t) = self.temperature else {
            let ids = logits.argmax(-1, false);
            let logp = logits
                .log_softmax(-1, Kind::Float)
                .gather(1, &ids.unsqueeze(1), false)
                .squeeze_dim(1);
            return (ids, logp);
        };
        let logp_all = (logits / t).log_softmax(-1, Kind::Float);
        let probs = logp_all.exp().to_kind(Kind::Double);
        let vocab = probs.size()[1];
        let target = Tensor::from_slice(uniforms)
            .to_device(self.device)
            .unsqueeze(1);
        let ids = if self.top_p < 1.0 {
            // Nucleus: the smallest prefix of the descending order whose mass reaches top_p
            // (a token is kept when the mass before it is below top_p; the first always is).
            let (sorted, order) = probs.sort_stable(true, -1, true);
            let cum = sorted.cumsum(-1, Kind::Double);
            let keep = (&cum - &sorted).lt(self.top_p);
            let kept = sorted * keep.to_kind(Kind::Double);
            let n_kept = keep.sum_dim_intlist(-1, true, Kind::Int64);
            let pos = inverse_cdf(&kept, &target).minimum(&(n_kept - 1));
            order.gather(1, &pos, false).squeeze_dim(1)
        } else {
            inverse_cdf(&probs, &target)
                .clamp_max(vocab - 1)
                .squeeze_dim(1)
        };
        let logp = logp_all.gather(1, &ids.unsqueeze(1), false).squeeze_dim(1);
        (ids, logp)
    }
}

/// Index `[B, 1]` of the first entry whose running mass exceeds `u · total` (`u` `[B, 1]`),
/// over unnormalised masses `[B, V]` (f64).
fn inverse_cdf(masses: &Tensor, u: &Tensor) -> Tensor {
    let cdf = masses.cumsum(-1, Kind::Double);
    let total = cdf.narrow(1, cdf.size()[1] - 1, 1);
    let target = u * total;
    cdf.le_tensor(&target)
        .sum_dim_intlist(-1, true, Kind::Int64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_p: f32) -> Sampler {
        let params = SamplingParams {
            temperature,
            top_p,
            max_new_tokens: 1,
            stop_ids: vec![],
            seed: 0,
        };
        Sampler::new(&params, Device::Cpu)
    }

    fn ids(s: &Sampler, logits: &[f32], u: f64) -> i64 {
        let logits = Tensor::from_slice(logits).view([1, -1]);
        let (ids, _) = s.sample(&logits, &[u]);
        ids.int64_value(&[0])
    }

    #[test]
    fn inverse_cdf_picks_by_mass() {
        // probs 0.1, 0.2, 0.7 at T = 1
        let logits = [0.1f32.ln(), 0.2f32.ln(), 0.7f32.ln()];
        let s = sampler(1.0, 1.0);
        assert_eq!(ids(&s, &logits, 0.0), 0);
        assert_eq!(ids(&s, &logits, 0.05), 0);
        assert_eq!(ids(&s, &logits, 0.15), 1);
        assert_eq!(ids(&s, &logits, 0.5), 2);
        assert_eq!(ids(&s, &logits, 0.999_999), 2);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus_and_reports_full_vocab_logprob() {
        let logits = [0.1f32.ln(), 0.2f32.ln(), 0.7f32.ln()];
        let s = sampler(1.0, 0.75);
        // nucleus = {2, 1}: mass before 2 is 0 < .75, before 1 is .7 < .75, before 0 is .9
        for u in [0.0, 0.3, 0.8, 0.95, 0.999] {
            assert_ne!(ids(&s, &logits, u), 0, "u = {u}");
        }
        let (ids, logp) =
            sampler(1.0, 0.5).sample(&Tensor::from_slice(&logits).view([1, 3]), &[0.9]);
        assert_eq!(ids.int64_value(&[0]), 2);
        assert!((logp.double_value(&[0]) - 0.7f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_argmax_with_t1_logprob() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0]).view([1, 3]);
        let (ids, logp) = sampler(0.0, 1.0).sample(&logits, &[0.5]);
        assert_eq!(ids.int64_value(&[0]), 1);
        let want = logits.log_softmax(-1, Kind::Float).double_value(&[0, 1]);
        assert!((logp.double_value(&[0]) - want).abs() < 1e-7);
    }
}
