//! Batched generation with a preallocated KV cache: temperature, top-p, stop ids, per-row
//! finish.
//!
//! Prompts of different lengths are left-padded into one batch (`batch::LeftPadded`), prefilled
//! in one forward, then decoded one token per step for every row. A row finishes when it
//! samples one of the stop ids ([`FinishReason::Stop`], stop id kept as its last token) or
//! reaches its length limit ([`FinishReason::Length`], last sampled token kept as is, never
//! replaced by an EOS). In [`generate`], finished rows keep riding along in the batch until
//! every row is done (their extra outputs are dropped), so a fixed batch samples bit for bit
//! the same whatever ends when.
//!
//! **Continuous batching** ([`generate_with`] with a sink): finished rows leave the batch at
//! once, and the sink's admissions join it between two decode steps. A joining prompt but its
//! last token is prefilled on its own and its keys and values are copied into a free row of
//! the KV cache, ending at the current column; its last token is then fed at the next decode
//! step, with every other row's (see [`crate::model::KvCache`] for the layout).
//!
//! **Reported log-probs.** Each sampled id is reported with `log_softmax(logits / T)` over
//! the full vocabulary, in f32, *before* top-p truncation; for `T = 0` (greedy, argmax) with
//! `log_softmax(logits)`. This is exactly what [`crate::backend::TorchBackend`]'s `score` and
//! `train_step` compute at the same temperature, so rollout and trainer log-probs are
//! comparable (importance ratios start at 1 on the first step). The nucleus only decides which
//! ids may be drawn.
//!
//! **Randomness.** Each row draws one uniform per step from its own ChaCha8 stream (seed =
//! `SamplingParams::seed`, stream = row index; an admitted row: its admission's seed, stream =
//! its index in the admission); the draw picks an id by inverse CDF (on the CPU without a
//! nucleus, one pass over each row's masses in Rust; elsewhere by tensor ops on the device;
//! the two pick the same ids to the bit). Same seed, same prompts → same samples; libtorch's
//! global RNG is never used.
//!
//! **Speed.** A pass of a bf16 model on the CPU multiplies by weights packed for oneDNN,
//! kept by the model while its weights stay the same ([`crate::model::packed`]); while one
//! row is left, its decode steps run in Rust over the weights in place
//! ([`CausalLm::decode_row`]).

use std::cmp::Ordering;

use cairn_kernel::backend::{Generation, SamplingParams, TokenSink};
use cairn_plugin_sdk::FinishReason;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::batch::LeftPadded;
use crate::error::{Error, Result};
use crate::logprobs::logit_temperature;
use crate::model::{CausalLm, KvCache, Packed};

/// Samples one response per prompt; see the module docs.
pub fn generate(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
) -> Result<Vec<Generation>> {
    generate_with(model, prompts, params, None)
}

/// [`generate`], each sampled id handed to `sink` right after its decode step, with
/// continuous batching: the sink's admissions ([`TokenSink::admit`]) join the running batch
/// at the next decode step, and rows that end leave it at once.
///
/// A row the sink refuses samples no more (finish reason [`FinishReason::Aborted`]). Finished
/// rows do not ride along: the batch is kept dense by moving its last row into the place of
/// one that ended (a copy in the KV cache, no allocation), or an admitted row takes it. So a
/// row's samples depend on its neighbours only through the rounding of a different batch
/// shape (libtorch's f32 matrix multiplies take another kernel below 8 rows, and attention
/// over more masked keys sums in another order): same ids, log-probs equal to ~1e-6. Plain
/// [`generate`] keeps finished rows riding along, so its samples are bit for bit those of a
/// fixed batch.
///
/// The result holds every row (the prompts', then each admission's), in row order; an
/// admission the backend refuses (see [`TokenSink::refuse`]) holds empty generations.
///
/// # Errors
/// The call's own prompts or parameters are invalid ([`Error::Input`]), or libtorch fails.
pub fn generate_with(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    sink: Option<&mut dyn TokenSink>,
) -> Result<Vec<Generation>> {
    let _guard = tch::no_grad_guard();
    let vocab_size = model.config().vocab_size;
    for (i, p) in prompts.iter().enumerate() {
        check_prompt(p, vocab_size)
            .map_err(|e| Error::input("generate", format!("prompt {i} {e}")))?;
    }
    logit_temperature(params.temperature)?;
    if !(params.top_p > 0.0 && params.top_p <= 1.0) {
        return Err(Error::input(
            "top_p",
            format!("{} is not in (0, 1]", params.top_p),
        ));
    }
    let mut session = Session::new(model, params, sink);
    let mut initial: Vec<NewRow> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| NewRow::new(i, p.clone(), params.seed, i, params.max_new_tokens))
        .collect();
    session.out = prompts.iter().map(|_| unsampled()).collect();
    if params.max_new_tokens == 0 && session.sink.is_none() {
        return Ok(session.finish());
    }
    let pending = initial.len();
    initial.extend(session.ask(pending));
    session.start(initial)?;
    session.run()?;
    Ok(session.finish())
}

/// A row's output before its first id: ends at its limit unless a stop id comes.
fn unsampled() -> Generation {
    Generation {
        finish_reason: FinishReason::Length,
        ..Generation::default()
    }
}

/// Why a prompt cannot be sampled, for an error message (`"is empty"`, ...).
fn check_prompt(prompt: &[u32], vocab_size: usize) -> std::result::Result<(), String> {
    if prompt.is_empty() {
        return Err("is empty".into());
    }
    match prompt.iter().find(|&&id| id as usize >= vocab_size) {
        Some(id) => Err(format!(
            "holds token id {id}, outside the vocabulary (size {vocab_size})"
        )),
        None => Ok(()),
    }
}

/// A sequence about to enter the batch.
struct NewRow {
    index: usize,
    prompt: Vec<u32>,
    rng: ChaCha8Rng,
    limit: usize,
}

impl NewRow {
    fn new(index: usize, prompt: Vec<u32>, seed: u64, stream: usize, limit: u32) -> NewRow {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream as u64);
        NewRow {
            index,
            prompt,
            rng,
            limit: limit as usize,
        }
    }
}

/// A sequence in the batch (one row of the KV cache).
struct Row {
    /// Index into the output.
    index: usize,
    rng: ChaCha8Rng,
    limit: usize,
    /// RoPE position of the next input token.
    pos: i64,
    /// First cache column it attends (its prompt's first token).
    start: i64,
    /// Id fed at the next decode step.
    next: i64,
    live: bool,
}

/// One batched generation: the rows, their KV cache and the logits of their next token.
struct Session<'a, 's> {
    model: &'a CausalLm,
    params: &'a SamplingParams,
    sink: Option<&'s mut (dyn TokenSink + 's)>,
    sampler: Sampler,
    out: Vec<Generation>,
    rows: Vec<Row>,
    cache: Option<KvCache>,
    /// `[capacity, T_max]` bool: column `j` of row `r` is a real key once `j >= start_r`.
    key_valid: Option<Tensor>,
    /// `[rows, V]` f32.
    logits: Option<Tensor>,
    /// The model's pack, held for the pass (weights only for bf16 on the CPU).
    packed: Packed<'a>,
}

impl<'a, 's> Session<'a, 's> {
    fn new(
        model: &'a CausalLm,
        params: &'a SamplingParams,
        sink: Option<&'s mut (dyn TokenSink + 's)>,
    ) -> Session<'a, 's> {
        Session {
            model,
            params,
            sink,
            sampler: Sampler::new(params, model.device()),
            out: Vec::new(),
            rows: Vec::new(),
            cache: None,
            key_valid: None,
            logits: None,
            packed: model.pack_for_inference(),
        }
    }

    fn finish(self) -> Vec<Generation> {
        self.out
    }

    fn live(&self) -> usize {
        self.rows.iter().filter(|r| r.live).count()
    }

    /// The sink's admissions, numbered after the rows so far; refused ones are reported and
    /// keep their (empty) place in the output. `pending` rows are about to be prefilled: they
    /// count as live (before the first prefill, the call's own prompts).
    fn ask(&mut self, pending: usize) -> Vec<NewRow> {
        let live = self.live() + pending;
        let Some(sink) = self.sink.as_deref_mut() else {
            return Vec::new();
        };
        let vocab_size = self.model.config().vocab_size;
        let mut joining = Vec::new();
        for admission in sink.admit(live) {
            let first = self.out.len();
            self.out
                .extend(admission.prompts.iter().map(|_| unsampled()));
            let bad = admission
                .prompts
                .iter()
                .enumerate()
                .find_map(|(k, p)| check_prompt(p, vocab_size).err().map(|e| (k, e)));
            if let Some((k, e)) = bad {
                sink.refuse(first, format!("prompt {k} {e}"));
                continue;
            }
            joining.extend(admission.prompts.into_iter().enumerate().map(|(k, p)| {
                NewRow::new(first + k, p, admission.seed, k, admission.max_new_tokens)
            }));
        }
        joining
    }

    /// Prefills the first rows in one left-padded forward.
    fn start(&mut self, rows: Vec<NewRow>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let device = self.model.device();
        let prompts: Vec<Vec<u32>> = rows.iter().map(|r| r.prompt.clone()).collect();
        let batch = LeftPadded::new(&prompts, device);
        let longest = rows.iter().map(|r| r.limit).max().unwrap_or(0);
        let mut cache = KvCache::new(
            self.model.config(),
            rows.len(),
            batch.width + longest,
            self.model.dtype().kind(),
            device,
        )?;
        let width = batch.width as i64;
        let hidden = self.model.hidden_states_with(
            &batch.input_ids,
            &batch.position_ids,
            &batch.valid,
            Some(&mut cache),
            self.packed.weights(),
        )?;
        self.logits = Some(
            self.model
                .logits_with(
                    &hidden.narrow(1, width - 1, 1).squeeze_dim(1),
                    self.packed.weights(),
                )
                .to_kind(Kind::Float),
        );
        self.rows = rows
            .into_iter()
            .map(|r| Row {
                index: r.index,
                rng: r.rng,
                limit: r.limit,
                pos: r.prompt.len() as i64,
                start: width - r.prompt.len() as i64,
                next: 0,
                live: r.limit > 0,
            })
            .collect();
        self.cache = Some(cache);
        self.refresh_key_valid();
        Ok(())
    }

    /// Rebuilds `key_valid` from the rows' start columns.
    fn refresh_key_valid(&mut self) {
        let Some(cache) = &self.cache else { return };
        let device = self.model.device();
        let mut starts: Vec<i64> = self.rows.iter().map(|r| r.start).collect();
        starts.resize(cache.capacity(), i64::MAX);
        let columns = Tensor::arange(cache.max_len() as i64, (Kind::Int64, device)).unsqueeze(0);
        let starts = Tensor::from_slice(&starts).to_device(device).unsqueeze(1);
        self.key_valid = Some(columns.ge_tensor(&starts));
    }

    /// Samples every row once, reports the live rows' ids, then admits; returns `false` when
    /// no row is left.
    fn step(&mut self) -> Result<bool> {
        let Some(logits) = &self.logits else {
            return Ok(false);
        };
        // Every row draws every step, live or not, so a row's k-th id uses its k-th draw.
        let uniforms: Vec<f64> = self.rows.iter_mut().map(|r| r.rng.gen::<f64>()).collect();
        let (ids, logp) = self.sampler.sample(logits, &uniforms)?;
        let ids: Vec<i64> = Vec::try_from(&ids)?;
        let logp: Vec<f32> = Vec::try_from(&logp)?;
        for (slot, row) in self.rows.iter_mut().enumerate() {
            row.next = ids[slot];
            if !row.live {
                continue;
            }
            let g = &mut self.out[row.index];
            let id = ids[slot] as u32;
            g.ids.push(id);
            g.logprobs.push(logp[slot]);
            let finish = if self.params.stop_ids.contains(&id) {
                Some(FinishReason::Stop)
            } else {
                (g.ids.len() >= row.limit).then_some(FinishReason::Length)
            };
            let wanted = match self.sink.as_deref_mut() {
                Some(sink) => sink.token(row.index, id, logp[slot], finish),
                None => true,
            };
            if let Some(reason) = finish {
                g.finish_reason = reason;
                row.live = false;
            } else if !wanted {
                g.finish_reason = FinishReason::Aborted;
                row.live = false;
            }
        }
        if self.sink.is_none() {
            return Ok(self.live() > 0);
        }
        let joining = self.ask(0);
        self.retire_and_admit(joining)?;
        Ok(!self.rows.is_empty())
    }

    /// Continuous batching: drops the rows that ended, packs the batch and prefills the
    /// joining rows into it, so they feed their prompt's last token at the next decode step.
    fn retire_and_admit(&mut self, joining: Vec<NewRow>) -> Result<()> {
        let Some(mut cache) = self.cache.take() else {
            // Nothing was running (the call had no prompt): the joining rows start it.
            return self.start(joining);
        };
        // Pack: move the last live row into each hole.
        let mut slot = 0;
        while slot < self.rows.len() {
            if self.rows[slot].live {
                slot += 1;
                continue;
            }
            let last = self.rows.len() - 1;
            if slot != last {
                cache.move_row(last, slot);
            }
            self.rows.swap_remove(slot);
        }
        let live = self.rows.len();
        let c = cache.len() as i64;
        // Columns the prefixes (prompt but its last token) take before the current column,
        // and forwards the rows still need.
        let prefix = joining
            .iter()
            .map(|r| r.prompt.len() as i64 - 1)
            .max()
            .unwrap_or(0);
        let need = self
            .rows
            .iter()
            .map(|r| (r.limit - self.out[r.index].ids.len()) as i64)
            .chain(joining.iter().map(|r| r.limit as i64))
            .max()
            .unwrap_or(0);
        let rows = live + joining.len();
        if prefix > c || c + need > cache.max_len() as i64 || rows > cache.capacity() {
            // Drop the columns no row attends, make room for the prefixes in front and for
            // twice the longest need behind, and double the rows when they do not fit.
            let drop = self.rows.iter().map(|r| r.start).min().unwrap_or(c).min(c);
            let kept = c - drop;
            let front = (prefix - kept).max(0);
            let capacity = if rows > cache.capacity() {
                rows.max(2 * cache.capacity())
            } else {
                cache.capacity()
            };
            let max_len = front + kept + 2 * need.max(1);
            cache.relayout(capacity, max_len as usize, drop as usize, front as usize)?;
            for r in &mut self.rows {
                r.start += front - drop;
            }
        }
        let c = cache.len() as i64;
        if !joining.is_empty() {
            let device = self.model.device();
            let prefixes: Vec<Vec<u32>> = joining
                .iter()
                .map(|r| r.prompt[..r.prompt.len() - 1].to_vec())
                .collect();
            let slots: Vec<usize> = (live..rows).collect();
            if prefix > 0 {
                let batch = LeftPadded::new(&prefixes, device);
                let mut scratch = KvCache::new(
                    self.model.config(),
                    joining.len(),
                    batch.width,
                    self.model.dtype().kind(),
                    device,
                )?;
                // Only the keys and values are kept: the logits come at the next decode step.
                let _ = self.model.hidden_states_with(
                    &batch.input_ids,
                    &batch.position_ids,
                    &batch.valid,
                    Some(&mut scratch),
                    self.packed.weights(),
                )?;
                cache.write_rows(&slots, &scratch)?;
            }
            for r in joining {
                let n = r.prompt.len() as i64;
                self.rows.push(Row {
                    index: r.index,
                    rng: r.rng,
                    limit: r.limit,
                    pos: n - 1,
                    start: c - (n - 1),
                    next: i64::from(r.prompt[r.prompt.len() - 1]),
                    live: r.limit > 0,
                });
            }
        }
        cache.set_rows(self.rows.len())?;
        self.cache = Some(cache);
        self.refresh_key_valid();
        Ok(())
    }

    /// One decode step for every row: feeds each row's next id, keeps the next logits.
    fn decode(&mut self) -> Result<()> {
        let (Some(cache), Some(key_valid)) = (self.cache.as_mut(), self.key_valid.as_ref()) else {
            return Ok(());
        };
        let device = self.model.device();
        let n = self.rows.len() as i64;
        let valid = key_valid
            .narrow(0, 0, n)
            .narrow(1, 0, cache.len() as i64 + 1);
        let packed = self.packed.weights();
        let mut logits = None;
        if n == 1 {
            // One row left: the step written out in Rust where it applies (bf16 on an AVX2
            // CPU; `CausalLm::decode_row` declines anything else).
            logits = self
                .model
                .decode_row(self.rows[0].next, self.rows[0].pos, &valid, cache)?;
        }
        let logits = match logits {
            Some(logits) => logits,
            None => {
                let input =
                    Tensor::from_slice(&self.rows.iter().map(|r| r.next).collect::<Vec<_>>())
                        .to_device(device)
                        .view([n, 1]);
                let position =
                    Tensor::from_slice(&self.rows.iter().map(|r| r.pos).collect::<Vec<_>>())
                        .to_device(device)
                        .view([n, 1]);
                let hidden = self.model.hidden_states_with(
                    &input,
                    &position,
                    &valid,
                    Some(cache),
                    packed,
                )?;
                self.model
                    .logits_with(&hidden.squeeze_dim(1), packed)
                    .to_kind(Kind::Float)
            }
        };
        self.logits = Some(logits);
        for r in &mut self.rows {
            r.pos += 1;
        }
        Ok(())
    }

    fn run(&mut self) -> Result<()> {
        loop {
            if self.logits.is_none() {
                // The call had no prompt: wait for none, the sink admits before every step.
                let joining = self.ask(0);
                if joining.is_empty() {
                    return Ok(());
                }
                self.start(joining)?;
                continue;
            }
            if !self.step()? {
                return Ok(());
            }
            if self.rows.iter().all(|r| !r.live) {
                return Ok(());
            }
            self.decode()?;
        }
    }
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
    fn sample(&self, logits: &Tensor, uniforms: &[f64]) -> Result<(Tensor, Tensor)> {
        let Some(t) = self.temperature else {
            let ids = logits.argmax(-1, false);
            let logp = logits
                .log_softmax(-1, Kind::Float)
                .gather(1, &ids.unsqueeze(1), false)
                .squeeze_dim(1);
            return Ok((ids, logp));
        };
        let logp_all = (logits / t).log_softmax(-1, Kind::Float);
        if self.top_p >= 1.0 && self.device == Device::Cpu {
            return sample_full_vocab_on_cpu(&logp_all, uniforms);
        }
        Ok(self.sample_with_tensor_ops(&logp_all, uniforms))
    }

    /// The draw from `logp_all` `[B, V]` f32 (the tempered log-softmax) by tensor ops on the
    /// sampler's device: the nucleus when `top_p < 1`, and the full-vocabulary draw off the CPU.
    fn sample_with_tensor_ops(&self, logp_all: &Tensor, uniforms: &[f64]) -> (Tensor, Tensor) {
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

/// [`Sampler::sample`] without a nucleus, on the CPU: the same ids and log-probs as the
/// device path (`inverse_cdf` over `exp(logp_all)` widened to f64), bit for bit, in one read
/// of each row's masses instead of five full-width tensor ops and a `[B, V]` f64 copy.
///
/// `logp_all` `[B, V]` f32; returns `(ids [B] int64, logp [B] f32)`. The masses are
/// libtorch's `exp` (they round as the device path's do), widened to f64 and summed in order,
/// as libtorch's CPU `cumsum` sums in f64; the id is the number of running sums `<= u · total`
/// (the first that exceeds it), clamped to the last id, exactly as `inverse_cdf` counts.
fn sample_full_vocab_on_cpu(logp_all: &Tensor, uniforms: &[f64]) -> Result<(Tensor, Tensor)> {
    let masses = logp_all.exp().contiguous();
    let (rows, vocab) = (masses.size()[0] as usize, masses.size()[1] as usize);
    if masses.kind() != Kind::Float || masses.device() != Device::Cpu || uniforms.len() != rows {
        return Err(Error::input(
            "sample",
            format!("{rows} rows of f32 CPU logits, {} draws", uniforms.len()),
        ));
    }
    // SAFETY: `masses` is a contiguous f32 CPU tensor of `rows * vocab` elements, alive and
    // unaliased by any writer until the end of this function.
    let masses_flat: &[f32] =
        unsafe { std::slice::from_raw_parts(masses.data_ptr() as *const f32, rows * vocab) };
    let ids: Vec<i64> = masses_flat
        .chunks_exact(vocab.max(1))
        .zip(uniforms)
        .map(|(row, &u)| {
            let total = row.iter().fold(0.0f64, |acc, &m| acc + f64::from(m));
            let target = u * total;
            let mut cum = 0.0f64;
            let count = row
                .iter()
                .position(|&m| {
                    cum += f64::from(m);
                    // Not `cum <= target`: a NaN stops the search at once, as `inverse_cdf`
                    // counts no entry `<=` a NaN target.
                    matches!(cum.partial_cmp(&target), Some(Ordering::Greater) | None)
                })
                .unwrap_or(vocab);
            count.min(vocab - 1) as i64
        })
        .collect();
    let ids = Tensor::from_slice(&ids);
    let logp = logp_all.gather(1, &ids.unsqueeze(1), false).squeeze_dim(1);
    Ok((ids, logp))
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
        let (ids, _) = s.sample(&logits, &[u]).unwrap();
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
        let (ids, logp) = sampler(1.0, 0.5)
            .sample(&Tensor::from_slice(&logits).view([1, 3]), &[0.9])
            .unwrap();
        assert_eq!(ids.int64_value(&[0]), 2);
        assert!((logp.double_value(&[0]) - 0.7f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_argmax_with_t1_logprob() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0]).view([1, 3]);
        let (ids, logp) = sampler(0.0, 1.0).sample(&logits, &[0.5]).unwrap();
        assert_eq!(ids.int64_value(&[0]), 1);
        let want = logits.log_softmax(-1, Kind::Float).double_value(&[0, 1]);
        assert!((logp.double_value(&[0]) - want).abs() < 1e-7);
    }

    /// The CPU's one-pass draw and the tensor-op draw pick the same ids and report the same
    /// log-probs, to the bit: over wide random rows (a vocabulary of SmolLM2's size), masked
    /// entries, a one-hot row, and draws at 0, just below 1 and at every boundary of a small
    /// row's CDF, which pin the comparison (a running sum equal to `u · total` does not stop
    /// the search) and the clamp.
    #[test]
    fn the_cpu_draw_equals_the_tensor_draw_bit_for_bit() {
        let s = sampler(1.0, 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let (rows, vocab) = (16i64, 49_152i64);
        let logits = Tensor::randn([rows, vocab], (Kind::Float, Device::Cpu)) * 4.0;
        let _ = logits.narrow(0, 1, 1).fill_(f64::NEG_INFINITY);
        let _ = logits.narrow(0, 1, 1).narrow(1, 7, 1).fill_(0.0);
        let _ = logits
            .narrow(0, 2, 1)
            .narrow(1, 0, 30_000)
            .fill_(f64::NEG_INFINITY);
        for trial in 0..20 {
            let mut uniforms: Vec<f64> = (0..rows).map(|_| rng.gen::<f64>()).collect();
            if trial == 0 {
                uniforms[0] = 0.0;
                uniforms[3] = 1.0 - f64::EPSILON;
            }
            let logp_all = logits.log_softmax(-1, Kind::Float);
            let (ids, logp) = sample_full_vocab_on_cpu(&logp_all, &uniforms).unwrap();
            let (want_ids, want_logp) = s.sample_with_tensor_ops(&logp_all, &uniforms);
            assert!(ids.equal(&want_ids), "trial {trial}: ids differ");
            assert!(logp.equal(&want_logp), "trial {trial}: log-probs differ");
            assert_eq!(ids.int64_value(&[1]), 7, "the one-hot row");
            assert!(ids.int64_value(&[2]) >= 30_000, "a masked id was drawn");
        }
        // Every boundary of a 3-entry CDF, and either side of it.
        let small = Tensor::from_slice(&[0.1f32.ln(), 0.2f32.ln(), 0.7f32.ln()]).view([1, 3]);
        let logp_all = small.log_softmax(-1, Kind::Float);
        let masses: Vec<f64> = Vec::<f32>::try_from(logp_all.exp().view([-1]))
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        let total: f64 = masses.iter().sum();
        let mut edges = vec![0.0, masses[0] / total, (masses[0] + masses[1]) / total];
        edges.extend(
            edges
                .clone()
                .iter()
                .flat_map(|e| [e.next_down(), e.next_up()]),
        );
        for u in edges.into_iter().filter(|u| (0.0..1.0).contains(u)) {
            let (ids, _) = sample_full_vocab_on_cpu(&logp_all, &[u]).unwrap();
            let (want, _) = s.sample_with_tensor_ops(&logp_all, &[u]);
            assert!(ids.equal(&want), "u = {u}");
        }
    }
}
