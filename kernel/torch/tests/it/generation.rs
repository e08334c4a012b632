//! Batched sampling: greedy, seeded sampling, stop ids, length limits and reported log-probs.

use cairn_kernel::backend::{
    Admission, Generation, PolicyBackend, SamplingParams, Sequence, Weights,
};
use cairn_plugin_sdk::FinishReason;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Kind;

use cairn_torch::{BackendConfig, Dtype, TorchBackend};

use crate::common::{backend, direct_logprobs, max_abs_diff, random_ids, tiny_config, to_vec};

fn prompts(seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    [5, 2, 8, 1]
        .iter()
        .map(|&n| random_ids(&mut rng, n))
        .collect()
}

fn params(temperature: f32, max_new_tokens: u32, stop_ids: Vec<u32>, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p: 1.0,
        max_new_tokens,
        stop_ids,
        seed,
    }
}

#[test]
fn greedy_is_deterministic_and_equals_stepwise_argmax_of_full_forwards() {
    let mut backend = backend(11);
    let prompts = prompts(1);
    let p = params(0.0, 8, vec![], 0);
    let first = backend.generate(&prompts, &p).unwrap();
    let again = backend
        .generate(
            &prompts,
            &SamplingParams {
                seed: 99,
                ..p.clone()
            },
        )
        .unwrap();
    assert_eq!(
        first, again,
        "greedy must not depend on the seed or on anything else"
    );
    for (prompt, g) in prompts.iter().zip(&first) {
        let mut ids = prompt.clone();
        let mut logprobs = Vec::new();
        for _ in 0..8 {
            let logits = backend.policy().forward_ids(&ids).unwrap().squeeze_dim(0);
            let last = logits
                .get(ids.len() as i64 - 1)
                .log_softmax(-1, Kind::Float);
            let next = last.argmax(-1, false).int64_value(&[]);
            logprobs.push(last.double_value(&[next]) as f32);
            ids.push(next as u32);
        }
        assert_eq!(g.ids, ids[prompt.len()..].to_vec());
        assert!(max_abs_diff(&g.logprobs, &logprobs) <= 1e-5);
        assert_eq!(g.finish_reason, FinishReason::Length);
    }
}

/// A bf16 generation pass multiplies by weights packed for oneDNN (where libtorch has its bf16
/// kernels). Each id it picks greedily is an argmax of the plain forward on the same prefix,
/// up to ties within the bound, and its reported log-prob is the plain forward's, within the
/// same bound: packed weights that were stale, misordered or transposed would pick other ids.
#[test]
fn bf16_greedy_generation_follows_the_plain_forward() {
    let mut config = BackendConfig::random(tiny_config(), 13);
    config.dtype = Some(Dtype::Bf16);
    let mut backend = TorchBackend::new(&config).unwrap();
    // Three rows (the libtorch step), then one row alone (on an AVX2 CPU, the step written
    // out in Rust, `CausalLm::decode_row`).
    let mut prompts = prompts(3);
    let mut generated = backend
        .generate(&prompts, &params(0.0, 8, vec![], 0))
        .unwrap();
    let alone = vec![prompts[0][1..].to_vec()];
    generated.extend(
        backend
            .generate(&alone, &params(0.0, 8, vec![], 0))
            .unwrap(),
    );
    prompts.extend(alone);
    let bound = 5e-2;
    for (r, (prompt, g)) in prompts.iter().zip(&generated).enumerate() {
        let mut ids = prompt.clone();
        for (j, (&id, &logprob)) in g.ids.iter().zip(&g.logprobs).enumerate() {
            let logits = backend.policy().forward_ids(&ids).unwrap().squeeze_dim(0);
            let plain = logits
                .get(ids.len() as i64 - 1)
                .log_softmax(-1, Kind::Float);
            let best = plain.max().double_value(&[]);
            let chosen = plain.double_value(&[i64::from(id)]);
            assert!(
                best - chosen <= bound,
                "row {r} step {j}: id {id} is {} below the argmax",
                best - chosen
            );
            assert!(
                (f64::from(logprob) - chosen).abs() <= bound,
                "row {r} step {j}: reported {logprob}, plain {chosen}"
            );
            ids.push(id);
        }
        assert_eq!(g.ids.len(), 8);
    }
}

#[test]
fn same_seed_repeats_and_other_seeds_differ() {
    let mut backend = backend(12);
    let prompts = prompts(2);
    let a = backend
        .generate(&prompts, &params(1.0, 16, vec![], 7))
        .unwrap();
    let b = backend
        .generate(&prompts, &params(1.0, 16, vec![], 7))
        .unwrap();
    let c = backend
        .generate(&prompts, &params(1.0, 16, vec![], 8))
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(
        a.iter().map(|g| &g.ids).collect::<Vec<_>>(),
        c.iter().map(|g| &g.ids).collect::<Vec<_>>()
    );
}

/// Truncates `g` at its first id in `stops` (kept), as a stop-id run must.
fn expected_with_stops(g: &Generation, stops: &[u32]) -> Generation {
    match g.ids.iter().position(|id| stops.contains(id)) {
        Some(i) => Generation {
            ids: g.ids[..=i].to_vec(),
            logprobs: g.logprobs[..=i].to_vec(),
            finish_reason: FinishReason::Stop,
        },
        None => g.clone(),
    }
}

#[test]
fn two_stop_ids_end_their_rows_with_the_stop_id_included() {
    let mut backend = backend(13);
    let prompts = prompts(3);
    let free = backend
        .generate(&prompts, &params(1.0, 10, vec![], 5))
        .unwrap();
    // Pick a stop id from row 0 and a different one from row 1 that row 0 does not reach
    // first, so that each row ends on a different stop id.
    let a = free[0].ids[2];
    let first_a_in_0 = free[0].ids.iter().position(|&x| x == a).unwrap();
    let b = free[1]
        .ids
        .iter()
        .enumerate()
        .find(|&(k, &id)| {
            id != a && !free[0].ids[..=first_a_in_0].contains(&id) && !free[1].ids[..k].contains(&a)
        })
        .map(|(_, &id)| id)
        .expect("the fixture has a usable second stop id");
    let stops = vec![a, b];
    let stopped = backend
        .generate(&prompts, &params(1.0, 10, stops.clone(), 5))
        .unwrap();
    for (row, (s, f)) in stopped.iter().zip(&free).enumerate() {
        assert_eq!(s, &expected_with_stops(f, &stops), "row {row}");
    }
    assert_eq!(stopped[0].finish_reason, FinishReason::Stop);
    assert_eq!(stopped[1].finish_reason, FinishReason::Stop);
    assert_eq!(stopped[0].ids.last(), Some(&a));
    assert_eq!(stopped[1].ids.last(), Some(&b));
}

#[test]
fn max_new_tokens_gives_length_and_keeps_the_last_sampled_token() {
    let mut backend = backend(14);
    let prompts = prompts(4);
    // Stop id 0 is never sampled here (random_ids and a random model rarely pick it, and the
    // assertions below check the rows that did not stop).
    let long = backend
        .generate(&prompts, &params(1.0, 9, vec![0], 21))
        .unwrap();
    let short = backend
        .generate(&prompts, &params(1.0, 4, vec![0], 21))
        .unwrap();
    for (l, s) in long.iter().zip(&short) {
        if l.ids[..4].contains(&0) {
            continue;
        }
        assert_eq!(s.finish_reason, FinishReason::Length);
        assert_eq!(
            s.ids,
            l.ids[..4].to_vec(),
            "the last token is the sampled one, no EOS forced"
        );
        assert_eq!(s.logprobs, l.logprobs[..4].to_vec());
    }
    let none = backend
        .generate(&prompts, &params(1.0, 0, vec![], 0))
        .unwrap();
    assert!(none
        .iter()
        .all(|g| g.ids.is_empty() && g.finish_reason == FinishReason::Length));
}

#[test]
fn reported_logprobs_are_full_vocab_log_softmax_at_temperature() {
    let mut backend = backend(15);
    let prompts = prompts(5);
    for (temperature, top_p) in [(0.7f32, 1.0f32), (1.3, 1.0), (0.7, 0.8)] {
        let p = SamplingParams {
            temperature,
            top_p,
            max_new_tokens: 6,
            stop_ids: vec![],
            seed: 3,
        };
        let gens = backend.generate(&prompts, &p).unwrap();
        let seqs: Vec<Sequence> = prompts
            .iter()
            .zip(&gens)
            .map(|(prompt, g)| Sequence {
                prompt_ids: prompt.clone(),
                response_ids: g.ids.clone(),
            })
            .collect();
        let scored = backend.score(&seqs, temperature, Weights::Current).unwrap();
        for (i, (seq, g)) in seqs.iter().zip(&gens).enumerate() {
            let direct = to_vec(&direct_logprobs(
                backend.policy(),
                seq,
                f64::from(temperature),
            ));
            let d = max_abs_diff(&g.logprobs, &direct);
            assert!(
                d <= 1e-5,
                "T={temperature} top_p={top_p} row {i}: sampled vs log_softmax(logits/T): {d}"
            );
            let d = max_abs_diff(&g.logprobs, &scored[i]);
            assert!(
                d <= 1e-5,
                "T={temperature} top_p={top_p} row {i}: sampled vs score: {d}"
            );
        }
    }
}

#[test]
fn generate_rejects_empty_prompts_and_bad_top_p() {
    let mut backend = backend(16);
    let err = backend
        .generate(&[vec![]], &params(1.0, 4, vec![], 0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("prompt 0 is empty"), "{err}");
    let bad = SamplingParams {
        top_p: 0.0,
        ..params(1.0, 4, vec![], 0)
    };
    assert!(backend
        .generate(&[vec![5]], &bad)
        .unwrap_err()
        .to_string()
        .contains("top_p"));
}

/// Records every token a streaming generation hands over, and refuses row 1 after its third.
#[derive(Default)]
struct Recorder {
    seen: Vec<Vec<(u32, f32, Option<FinishReason>)>>,
}

impl cairn_kernel::backend::TokenSink for Recorder {
    fn begin(&mut self, _: u64) {}

    fn token(&mut self, row: usize, id: u32, logprob: f32, finish: Option<FinishReason>) -> bool {
        self.seen.resize(self.seen.len().max(row + 1), Vec::new());
        self.seen[row].push((id, logprob, finish));
        !(row == 1 && self.seen[row].len() == 3)
    }
}

/// `generate_streaming` hands each id over as it is sampled, with its log-prob and, on the
/// last, the finish reason; the ids are those `generate` samples. A row the sink refuses stops
/// there (finish `Aborted`) and leaves the batch; the other rows' ids do not change, and their
/// log-probs only by the rounding of a smaller batch.
#[test]
fn streaming_generation_hands_over_each_id_and_stops_refused_rows() {
    let mut backend = backend(11);
    let prompts = prompts(3);
    let p = params(1.0, 6, vec![], 42);
    let whole = backend.generate(&prompts, &p).unwrap();
    let mut sink = Recorder::default();
    let streamed = backend.generate_streaming(&prompts, &p, &mut sink).unwrap();
    for (row, (w, s)) in whole.iter().zip(&streamed).enumerate() {
        let seen = &sink.seen[row];
        assert_eq!(
            seen.iter().map(|t| t.0).collect::<Vec<_>>(),
            s.ids,
            "row {row}"
        );
        assert_eq!(seen.iter().map(|t| t.1).collect::<Vec<_>>(), s.logprobs);
        if row == 1 {
            assert_eq!(s.ids, w.ids[..3], "row 1 stops after its third id");
            assert_eq!(s.finish_reason, FinishReason::Aborted);
            assert_eq!(seen[2].2, None);
        } else {
            assert_eq!(s.ids, w.ids, "row {row} is sampled as without the sink");
            assert_eq!(s.finish_reason, w.finish_reason);
            assert!(max_abs_diff(&s.logprobs, &w.logprobs) < 1e-5, "row {row}");
            assert_eq!(seen.last().unwrap().2, Some(FinishReason::Length));
        }
    }
}

/// A sink that admits requests at chosen decode steps and records every row's tokens.
struct Joiner {
    /// (admit at the n-th `admit` call, the admission).
    plan: Vec<(usize, Admission)>,
    calls: usize,
    live_seen: Vec<usize>,
    seen: Vec<Vec<(u32, f32)>>,
    refused: Vec<(usize, String)>,
}

impl Joiner {
    fn new(plan: Vec<(usize, Admission)>) -> Joiner {
        Joiner {
            plan,
            calls: 0,
            live_seen: Vec::new(),
            seen: Vec::new(),
            refused: Vec::new(),
        }
    }
}

impl cairn_kernel::backend::TokenSink for Joiner {
    fn begin(&mut self, _: u64) {}

    fn token(&mut self, row: usize, id: u32, logprob: f32, _: Option<FinishReason>) -> bool {
        self.seen.resize(self.seen.len().max(row + 1), Vec::new());
        self.seen[row].push((id, logprob));
        true
    }

    fn admit(&mut self, live_rows: usize) -> Vec<Admission> {
        let call = self.calls;
        self.calls += 1;
        self.live_seen.push(live_rows);
        let (now, later) = std::mem::take(&mut self.plan)
            .into_iter()
            .partition(|(at, _)| *at == call);
        self.plan = later;
        now.into_iter().map(|(_, a)| a).collect()
    }

    fn refuse(&mut self, first_row: usize, message: String) {
        self.refused.push((first_row, message));
    }
}

fn admission(prompts: Vec<Vec<u32>>, max_new_tokens: u32, seed: u64) -> Admission {
    Admission {
        prompts,
        max_new_tokens,
        seed,
    }
}

/// Continuous batching: requests admitted at different decode steps, with prompts longer than
/// the running batch's columns and limits past its cache (so the cache is laid out anew and
/// grows rows), get the ids they get alone with the same seed, and log-probs equal up to the
/// rounding of another batch shape; rows that end leave the batch at once.
#[test]
fn admitted_rows_do_not_depend_on_what_they_are_batched_with() {
    let mut backend = backend(11);
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let short: Vec<Vec<u32>> = [2, 3].iter().map(|&n| random_ids(&mut rng, n)).collect();
    let long: Vec<Vec<u32>> = [14, 9].iter().map(|&n| random_ids(&mut rng, n)).collect();
    let single = vec![random_ids(&mut rng, 1)];
    let others: Vec<Vec<u32>> = [4, 6, 5].iter().map(|&n| random_ids(&mut rng, n)).collect();
    let p = params(1.0, 4, vec![], 42);
    let plan = vec![
        (0, admission(others.clone(), 3, 5)),
        (2, admission(long.clone(), 12, 77)),
        (2, admission(single.clone(), 2, 3)),
        (6, admission(others[..1].to_vec(), 20, 9)),
    ];
    let mut sink = Joiner::new(plan);
    let out = backend.generate_streaming(&short, &p, &mut sink).unwrap();
    assert_eq!(out.len(), 2 + 3 + 2 + 1 + 1);
    let alone = |prompts: &[Vec<u32>], limit: u32, seed: u64| {
        let mut b = crate::common::backend(11);
        b.generate(prompts, &params(1.0, limit, vec![], seed))
            .unwrap()
    };
    let expected: Vec<Generation> = [
        alone(&short, 4, 42),
        alone(&others, 3, 5),
        alone(&long, 12, 77),
        alone(&single, 2, 3),
        alone(&others[..1], 20, 9),
    ]
    .concat();
    for (row, (got, want)) in out.iter().zip(&expected).enumerate() {
        assert_eq!(got.ids, want.ids, "row {row}");
        assert_eq!(
            got.ids.len(),
            [4, 4, 3, 3, 3, 12, 12, 2, 20][row],
            "row {row}"
        );
        assert_eq!(got.finish_reason, FinishReason::Length, "row {row}");
        let diff = max_abs_diff(&got.logprobs, &want.logprobs);
        assert!(diff < 1e-5, "row {row}: log-probs differ by {diff}");
        let seen: Vec<u32> = sink.seen[row].iter().map(|t| t.0).collect();
        assert_eq!(seen, got.ids, "row {row} streamed");
    }
    // Asked before the first prefill, the call's 2 rows counting as live (a sink that saw 0
    // would end the pass to later arrivals), then after every step; the short rows (limit 4)
    // and the first admission (limit 3) end before the last one joins.
    assert_eq!(sink.live_seen[0], 2);
    assert_eq!(sink.live_seen[6], 2, "{:?}", sink.live_seen);
    assert_eq!(*sink.live_seen.last().unwrap(), 0);
    assert!(sink.refused.is_empty());
}

/// An admission that cannot be sampled is refused on its own, by its first row; the batch
/// goes on and later rows keep their numbers.
#[test]
fn a_bad_admission_is_refused_and_the_batch_goes_on() {
    let mut backend = backend(11);
    let vocab = backend.policy().config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let first = vec![random_ids(&mut rng, 3)];
    let good = vec![random_ids(&mut rng, 4)];
    let plan = vec![
        (1, admission(vec![vec![1], vec![vocab + 3]], 2, 1)),
        (1, admission(vec![vec![]], 2, 1)),
        (1, admission(good.clone(), 2, 1)),
    ];
    let mut sink = Joiner::new(plan);
    let out = backend
        .generate_streaming(&first, &params(1.0, 3, vec![], 0), &mut sink)
        .unwrap();
    assert_eq!(out.len(), 5);
    assert_eq!(sink.refused.len(), 2, "{:?}", sink.refused);
    assert_eq!(sink.refused[0].0, 1);
    assert!(
        sink.refused[0]
            .1
            .contains(&format!("prompt 1 holds token id {}", vocab + 3)),
        "{}",
        sink.refused[0].1
    );
    assert_eq!(sink.refused[1], (3, "prompt 0 is empty".to_string()));
    assert!(out[1].ids.is_empty() && out[2].ids.is_empty() && out[3].ids.is_empty());
    let want = backend.generate(&good, &params(1.0, 2, vec![], 1)).unwrap();
    assert_eq!(out[4].ids, want[0].ids);
    assert_eq!(out[0].ids.len(), 3);
}
