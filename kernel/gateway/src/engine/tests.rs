//! The engine client and the weight sync against scripted HTTP engines on loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use cairn_plugin_sdk::FinishReason;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::client::parse_completion;
use super::*;
use cairn_kernel::backend::Generation;

type Script = dyn Fn(&str, &str, &Value) -> (u16, Value) + Send + Sync;

/// An HTTP/1.1 server on a free loopback port answering each request with `script(method,
/// path, body)`; every request is kept in `seen`.
struct MockEngine {
    url: String,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
}

impl MockEngine {
    fn start(script: Arc<Script>) -> MockEngine {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (script, log) = (script.clone(), log.clone());
                std::thread::spawn(move || serve(stream, &*script, &log));
            }
        });
        MockEngine { url, seen }
    }

    /// The bodies of the `/v1/completions` requests, in order.
    fn completions(&self) -> Vec<Value> {
        self.seen
            .lock()
            .iter()
            .filter(|(p, _)| p == "/v1/completions")
            .map(|(_, b)| b.clone())
            .collect()
    }

    fn paths(&self) -> Vec<String> {
        self.seen.lock().iter().map(|(p, _)| p.clone()).collect()
    }
}

fn serve(stream: TcpStream, script: &Script, seen: &Mutex<Vec<(String, Value)>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_owned(),
            parts.next().unwrap_or("").to_owned(),
        );
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        seen.lock().push((path.clone(), body.clone()));
        let (status, answer) = script(&method, &path, &body);
        let text = answer.to_string();
        let reply = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn config(kind: EngineKind) -> EngineConfig {
    EngineConfig {
        kind,
        base_urls: Vec::new(),
        model: None,
        timeout_s: 10.0,
        max_prompts_per_request: 64,
        retries: 1,
        probe_tolerance: 0.02,
        weights_dir: None,
        launch: None,
    }
}

fn models() -> (u16, Value) {
    (200, json!({"data": [{"id": "m", "max_model_len": 4096}]}))
}

/// A completion answering each prompt `p` with the ids `p[0] + 1, p[0] + 2, ...` (up to
/// `max_tokens`), log-prob `-(k + 1) / 10` for the k-th.
fn echo_completion(body: &Value) -> Value {
    let max = body["max_tokens"].as_u64().unwrap() as u32;
    let choices: Vec<Value> = body["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let first = p[0].as_u64().unwrap() as u32;
            let ids: Vec<u32> = (1..=max).map(|k| first + k).collect();
            let lps: Vec<f32> = (0..max).map(|k| -((k + 1) as f32) / 10.0).collect();
            let tokens: Vec<String> = ids.iter().map(|i| format!("token_id:{i}")).collect();
            json!({"index": i, "text": "", "finish_reason": "length",
                   "logprobs": {"tokens": tokens, "token_logprobs": lps}})
        })
        .collect();
    json!({"choices": choices})
}

fn params(max: u32) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: max,
        stop_ids: vec![2],
        seed: 5,
    }
}

#[test]
fn rows_carry_the_engines_ids_and_logprobs_verbatim_in_prompt_order() {
    let script: Arc<Script> = Arc::new(|_, path, body| match path {
        "/v1/models" => models(),
        "/v1/completions" => (200, echo_completion(body)),
        _ => (404, json!({})),
    });
    let (a, b) = (MockEngine::start(script.clone()), MockEngine::start(script));
    let client = EngineClient::connect(
        &config(EngineKind::Vllm),
        &[a.url.clone(), b.url.clone()],
        100,
    )
    .unwrap();
    assert_eq!(client.model(), "m");
    let prompts: Vec<Vec<u32>> = vec![vec![10, 1], vec![20], vec![30, 3, 3]];
    let out = client.generate(&prompts, &params(3)).unwrap();
    let want = |first: u32| Generation {
        ids: vec![first + 1, first + 2, first + 3],
        logprobs: vec![-0.1, -0.2, -0.3],
        finish_reason: FinishReason::Length,
    };
    assert_eq!(out.generations, vec![want(10), want(20), want(30)]);
    assert_eq!(out.policy_version, None);
    // Token ids went out as ids, split in order: two prompts to the first URL, one to the
    // second; with the stop ids, no stop at the model's EOS, and the token-id switches.
    let (sent_a, sent_b) = (a.completions(), b.completions());
    assert_eq!(sent_a[0]["prompt"], json!([[10, 1], [20]]));
    assert_eq!(sent_b[0]["prompt"], json!([[30, 3, 3]]));
    for body in [&sent_a[0], &sent_b[0]] {
        assert_eq!(body["stop_token_ids"], json!([2]));
        assert_eq!(body["ignore_eos"], json!(true));
        assert_eq!(body["return_token_ids"], json!(true));
        assert_eq!(body["logprobs"], json!(1));
        assert_eq!(body["max_tokens"], json!(3));
    }
    // Each share has its own seed.
    assert_ne!(sent_a[0]["seed"], sent_b[0]["seed"]);
    // A turn over the per-request limit goes as several requests, in order.
    let mut small = config(EngineKind::Vllm);
    small.max_prompts_per_request = 2;
    let one = EngineClient::connect(&small, std::slice::from_ref(&a.url), 100).unwrap();
    let before = a.seen.lock().len();
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| vec![10 * i]).collect();
    let out = one.generate(&prompts, &params(1)).unwrap();
    let firsts: Vec<u32> = out.generations.iter().map(|g| g.ids[0]).collect();
    assert_eq!(firsts, vec![1, 11, 21, 31, 41]);
    let sizes: Vec<usize> = a.seen.lock()[before..]
        .iter()
        .map(|(_, b)| b["prompt"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 5);
    assert!(sizes.iter().all(|&n| n <= 2), "{sizes:?}");
}

#[test]
fn a_failing_engine_is_retried_on_the_next_and_a_dead_one_leaves_the_run() {
    let failing: Arc<Script> = Arc::new(|_, path, _| match path {
        "/v1/models" => models(),
        _ => (503, json!({"error": {"message": "overloaded"}})),
    });
    let good: Arc<Script> = Arc::new(|_, path, body| match path {
        "/v1/models" => models(),
        "/v1/completions" => (200, echo_completion(body)),
        _ => (404, json!({})),
    });
    let (bad, ok) = (MockEngine::start(failing), MockEngine::start(good));
    let client = EngineClient::connect(
        &config(EngineKind::Openai),
        &[bad.url.clone(), ok.url.clone()],
        100,
    )
    .unwrap();
    // Both shares end on the good engine: the first after one retry.
    let out = client.generate(&[vec![1], vec![2]], &params(2)).unwrap();
    assert_eq!(out.generations[0].ids, vec![2, 3]);
    assert_eq!(out.generations[1].ids, vec![3, 4]);
    assert_eq!(
        bad.paths()
            .iter()
            .filter(|p| *p == "/v1/completions")
            .count(),
        1
    );
    // Only the failing one: every attempt fails and the error names it and the attempts.
    let alone = EngineClient::connect(
        &config(EngineKind::Openai),
        std::slice::from_ref(&bad.url),
        100,
    )
    .unwrap();
    let e = alone.generate(&[vec![1]], &params(2)).unwrap_err();
    match &e {
        Error::Engine { url, message } => {
            assert_eq!(url, &bad.url);
            assert!(
                message.contains("HTTP 503") && message.contains("after 2 attempts"),
                "{message}"
            );
        }
        other => panic!("{other}"),
    }
    // A refused connection takes the URL out of the run; the other goes on alone.
    let gone = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut two = EngineClient::connect(
        &config(EngineKind::Openai),
        std::slice::from_ref(&ok.url),
        100,
    )
    .unwrap();
    two.urls.insert(0, gone.clone());
    two.down = Arc::new(vec![AtomicBool::new(false), AtomicBool::new(false)]);
    let out = two.generate(&[vec![5], vec![6]], &params(1)).unwrap();
    assert_eq!(out.generations.len(), 2);
    assert_eq!(two.urls(), vec![ok.url.clone()]);
    // With none left, generation stops the run.
    two.mark_down(&ok.url, "test");
    let e = two.generate(&[vec![5]], &params(1)).unwrap_err();
    assert!(
        matches!(e, Error::Other(ref m) if m.contains("every rollout engine is down")),
        "{e}"
    );
}

#[test]
fn malformed_answers_are_refused_with_what_is_wrong() {
    let p = params(3);
    let one = |choice: Value| json!({"choices": [choice]});
    let bad = [
        (json!({}), "no `choices`"),
        (json!({"choices": []}), "0 choices answered 1"),
        (
            one(json!({"finish_reason": "length", "logprobs": {"token_logprobs": [-1.0]}})),
            "carries no token ids",
        ),
        (
            one(json!({"token_ids": [4, 5], "finish_reason": "length",
                       "logprobs": {"token_logprobs": [-1.0]}})),
            "2 token ids but 1 log-probs",
        ),
        (
            one(json!({"token_ids": [4, 500], "finish_reason": "length",
                       "logprobs": {"token_logprobs": [-1.0, -1.0]}})),
            "outside the trainer's vocabulary",
        ),
        (
            one(json!({"token_ids": [4, 5], "finish_reason": "stop",
                       "logprobs": {"token_logprobs": [-1.0, -1.0]}})),
            "without ending on one of the stop ids",
        ),
        (
            one(json!({"token_ids": [4, 5, 6, 7], "finish_reason": "length",
                       "logprobs": {"token_logprobs": [-1.0, -1.0, -1.0, -1.0]}})),
            "outside 1..=3",
        ),
    ];
    for (answer, expected) in bad {
        let e = parse_completion(&answer, 1, &p, 100).unwrap_err();
        assert!(e.contains(expected), "{answer}: {e}");
    }
    // A stop on a stop id keeps it as the last token; `token_ids` wins over the strings.
    let ok = one(
        json!({"token_ids": [4, 2], "finish_reason": "stop", "policy_version": 3,
                        "logprobs": {"tokens": ["x", "y"], "token_logprobs": [-0.5, -0.25]}}),
    );
    let c = parse_completion(&ok, 1, &p, 100).unwrap();
    assert_eq!(c.generations[0].ids, vec![4, 2]);
    assert_eq!(c.generations[0].finish_reason, FinishReason::Stop);
    assert_eq!(c.generations[0].logprobs, vec![-0.5, -0.25]);
}

/// A trainer whose log-probs are `-1 - version / 10` for every token, and whose export
/// writes an empty directory.
struct FakePolicy {
    version: Arc<AtomicU64>,
}

impl Actor for FakePolicy {
    type Context = Context<Self>;
}

impl Handler<PolicyVersion> for FakePolicy {
    type Result = u64;
    fn handle(&mut self, _: PolicyVersion, _: &mut Self::Context) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
}

impl Handler<ExportForEngine> for FakePolicy {
    type Result = Result<u64>;
    fn handle(&mut self, msg: ExportForEngine, _: &mut Self::Context) -> Self::Result {
        std::fs::create_dir_all(&msg.dir).map_err(|e| Error::io(&msg.dir, e))?;
        Ok(self.version.load(Ordering::SeqCst))
    }
}

impl Handler<Score> for FakePolicy {
    type Result = Result<Vec<Vec<f32>>>;
    fn handle(&mut self, msg: Score, _: &mut Self::Context) -> Self::Result {
        let Weights::Version(v) = msg.weights else {
            panic!("the probe scores a version");
        };
        Ok(msg
            .sequences
            .iter()
            .map(|s| vec![-1.0 - v as f32 / 10.0; s.response_ids.len()])
            .collect())
    }
}

/// An engine taking weights the SGLang way, whose log-probs are those of the version it last
/// loaded plus `offset`; with `skip` set it answers a load but keeps its weights.
fn sglang_like(offset: f32, skip: Arc<AtomicBool>) -> MockEngine {
    let served = Arc::new(AtomicU64::new(0));
    MockEngine::start(Arc::new(move |_, path, body| match path {
        "/v1/models" => models(),
        "/update_weights_from_disk" => {
            if !skip.load(Ordering::SeqCst) {
                let v: u64 = body["weight_version"].as_str().unwrap().parse().unwrap();
                served.store(v, Ordering::SeqCst);
            }
            (200, json!({"success": true}))
        }
        "/v1/completions" => {
            let n = body["max_tokens"].as_u64().unwrap() as usize;
            let lp = -1.0 - served.load(Ordering::SeqCst) as f32 / 10.0 + offset;
            (
                200,
                json!({"choices": [{"index": 0, "finish_reason": "length",
                    "token_ids": vec![7; n], "logprobs": {"token_logprobs": vec![lp; n]}}]}),
            )
        }
        _ => (404, json!({})),
    }))
}

fn engine_actor(url: &str, dir: &std::path::Path, policy: &Addr<FakePolicy>) -> Addr<EngineActor> {
    engines_actor(&[url.to_owned()], dir, policy)
}

fn engines_actor(
    urls: &[String],
    dir: &std::path::Path,
    policy: &Addr<FakePolicy>,
) -> Addr<EngineActor> {
    let client = EngineClient::connect(&config(EngineKind::Sglang), urls, 100).unwrap();
    let settings = EngineSettings {
        temperature: 1.0,
        top_p: 1.0,
        probe_tolerance: 0.02,
        weights_dir: dir.to_path_buf(),
        tokenizer_dir: dir.to_path_buf(),
        probe_prompt: probe_prompt(100, 16),
        seed: 1,
    };
    let links = PolicyLinks {
        version: policy.clone().recipient(),
        export: policy.clone().recipient(),
        score: policy.clone().recipient(),
    };
    EngineActor::new(client, settings, links).start()
}

fn generate() -> Generate {
    Generate {
        prompts: vec![vec![3, 4]],
        params: params(2),
    }
}

#[test]
fn the_probe_catches_a_sync_that_did_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let skip = Arc::new(AtomicBool::new(false));
    let mock = sglang_like(0.0, skip.clone());
    let version = Arc::new(AtomicU64::new(0));
    System::new().block_on(async {
        let policy = FakePolicy {
            version: version.clone(),
        }
        .start();
        let engine = engine_actor(&mock.url, dir.path(), &policy);
        // The first generation syncs version 0; the probe agrees.
        let out = engine.send(generate()).await.unwrap().unwrap();
        assert_eq!(out.policy_version, 0);
        let stats = engine.send(ReadEngineStats).await.unwrap();
        assert_eq!((stats.syncs, stats.served_version), (1, Some(0)));
        assert!(stats.probe_mismatch < 1e-6);
        // An update: the next generation syncs version 1 first.
        version.store(1, Ordering::SeqCst);
        let out = engine.send(generate()).await.unwrap().unwrap();
        assert_eq!(out.policy_version, 1);
        assert!(dir.path().join("v000001").is_dir());
        // Version 2, but the engine keeps version 1's weights: the probe sees it.
        version.store(2, Ordering::SeqCst);
        skip.store(true, Ordering::SeqCst);
        let e = engine.send(generate()).await.unwrap().unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("did not take the new weights") && text.contains("0.1000 nats"),
            "{text}"
        );
        let stats = engine.send(ReadEngineStats).await.unwrap();
        assert_eq!(stats.served_version, Some(1));
    });
    let loads = mock
        .paths()
        .iter()
        .filter(|p| *p == "/update_weights_from_disk")
        .count();
    assert_eq!(loads, 3);
}

/// An engine that dies between taking the weights and its probe (it answers the load, then
/// neither the probe nor `/health`) is taken out of the run like one dead before the sync:
/// the sync goes on with the others and the rollouts are served by them.
#[test]
fn an_engine_that_dies_during_the_sync_leaves_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let alive = sglang_like(0.0, Arc::new(AtomicBool::new(false)));
    let dying = MockEngine::start(Arc::new(|_, path, _| match path {
        "/v1/models" => models(),
        "/update_weights_from_disk" => (200, json!({"success": true})),
        _ => (503, json!({"error": {"message": "gone"}})),
    }));
    System::new().block_on(async {
        let policy = FakePolicy {
            version: Arc::new(AtomicU64::new(0)),
        }
        .start();
        let urls = [dying.url.clone(), alive.url.clone()];
        let engine = engines_actor(&urls, dir.path(), &policy);
        let out = engine.send(generate()).await.unwrap().unwrap();
        assert_eq!(out.policy_version, 0);
        let stats = engine.send(ReadEngineStats).await.unwrap();
        assert_eq!((stats.syncs, stats.served_version), (1, Some(0)));
    });
    assert!(dying
        .paths()
        .contains(&"/update_weights_from_disk".to_string()));
    assert_eq!(dying.completions().len(), 1, "the probe only");
    assert_eq!(alive.completions().len(), 2, "the probe and the rollout");
}

#[test]
fn an_engine_whose_logprobs_mean_something_else_is_refused_at_the_first_sync() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sglang_like(0.3, Arc::new(AtomicBool::new(false)));
    System::new().block_on(async {
        let policy = FakePolicy {
            version: Arc::new(AtomicU64::new(0)),
        }
        .start();
        let engine = engine_actor(&mock.url, dir.path(), &policy);
        let e = engine.send(generate()).await.unwrap().unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("0.3000 nats") && text.contains("trl #4159") && text.contains(&mock.url),
            "{text}"
        );
    });
}

#[test]
fn probe_prompts_are_valid_ids() {
    for v in [2usize, 3, 100, 151_936] {
        let p = probe_prompt(v, 16);
        assert_eq!(p.len(), 16);
        assert!(
            p.iter().all(|&id| (id as usize) < v && id > 0),
            "{v}: {p:?}"
        );
    }
    assert_eq!(mean_abs_diff(&[1.0, -1.0], &[0.5, -2.0]), 0.75);
}
