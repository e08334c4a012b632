//! Batched sampling: greedy, seeded sampling, stop ids, length limits and reported log-probs.

use cairn_kernel::backend::{Generation, PolicyBackend, SamplingParams, Sequence, Weights};
use cairn_plugin_sdk::FinishReason;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Kind;

use crate::common::{backend, direct_logprobs, max_abs_diff, random_ids, to_vec};

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
/// there (finish `Aborted`) and the other rows' samples do not change.
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
            assert_eq!(s, w, "row {row} is sampled as without the sink");
            assert_eq!(seen.last().unwrap().2, Some(FinishReason::Length));
        }
    }
}
