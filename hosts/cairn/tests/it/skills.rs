//! The skill creator's `endpoint` reflector over real HTTP: `cairn serve` on loopback answers
//! the reflection prompt, a good reply is stored, a cut-off reply is counted and dropped, and a
//! loopback socket that never answers (timeout) and a closed loopback port (refused) are
//! counted and dropped.
//!
//! The served model is built here so that greedy decoding spells a known reply: its one
//! decoder layer is zeroed (the residual stream is the token embedding), embeddings are one-hot
//! and an untied `lm_head` row for `next(t)` equals the embedding of `t`, so the greedy next
//! token depends only on the last one and follows the chain
//! `assistant → <entry> → always → open → the → drawer → first → </entry> → <|im_end|>`. The
//! chat prompt ends with `<|im_start|>assistant\n`, whose last token (whitespace pre-tokenizer,
//! word-level vocabulary) is `assistant`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use actix::prelude::*;
use cairn_kernel::actors::bank::PutEntries;
use cairn_kernel::actors::skills::{Finished, Reflect, SkillCreatorActor, TakeFinished};
use cairn_kernel::skills::endpoint::EndpointReflector;
use cairn_kernel::skills::{EndpointConfig, ReflectorKind, SkillsConfig};
use cairn_kernel::text::Tokenizer;
use cairn_plugin_sdk::{EntryKind, ReflectionRequest, TurnRow};
use parking_lot::Mutex;
use serde_json::json;

use crate::write_config;

/// The vocabulary: ChatML specials, the role names, the reply's words.
const VOCAB: [&str; 16] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<pad>",
    "[UNK]",
    "system",
    "user",
    "assistant",
    "tool",
    "<entry>",
    "always",
    "open",
    "the",
    "drawer",
    "first",
    "</entry>",
];
const SPECIALS: usize = 5;
/// The greedy chain, as vocabulary indices.
const CHAIN: [usize; 9] = [7, 9, 10, 11, 12, 13, 14, 15, 2];
const HIDDEN: usize = 32;

/// A Qwen3-layout model directory (config, safetensors, word-level tokenizer with a ChatML
/// template) whose greedy continuation of any prompt ending in `assistant` is [`CHAIN`].
fn write_chain_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let v = VOCAB.len();
    let config = json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
        "vocab_size": v, "hidden_size": HIDDEN, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 2048, "tie_word_embeddings": false,
        "attention_bias": false, "torch_dtype": "float32",
        "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": 2}).to_string(),
    )
    .unwrap();

    let zeros = |rows: usize, cols: usize| vec![0f32; rows * cols];
    let ones = |n: usize| vec![1f32; n];
    let mut embed = zeros(v, HIDDEN);
    for t in 0..v {
        embed[t * HIDDEN + t] = 1.0;
    }
    let mut lm_head = zeros(v, HIDDEN);
    for pair in CHAIN.windows(2) {
        let (t, next) = (pair[0], pair[1]);
        lm_head[next * HIDDEN + t] = 10.0;
    }
    let p = "model.layers.0.";
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, HIDDEN], embed),
        ("lm_head.weight".into(), vec![v, HIDDEN], lm_head),
        ("model.norm.weight".into(), vec![HIDDEN], ones(HIDDEN)),
        (
            format!("{p}input_layernorm.weight"),
            vec![HIDDEN],
            ones(HIDDEN),
        ),
        (
            format!("{p}post_attention_layernorm.weight"),
            vec![HIDDEN],
            ones(HIDDEN),
        ),
        (
            format!("{p}self_attn.q_proj.weight"),
            vec![32, HIDDEN],
            zeros(32, HIDDEN),
        ),
        (
            format!("{p}self_attn.k_proj.weight"),
            vec![16, HIDDEN],
            zeros(16, HIDDEN),
        ),
        (
            format!("{p}self_attn.v_proj.weight"),
            vec![16, HIDDEN],
            zeros(16, HIDDEN),
        ),
        (
            format!("{p}self_attn.o_proj.weight"),
            vec![HIDDEN, 32],
            zeros(HIDDEN, 32),
        ),
        (format!("{p}self_attn.q_norm.weight"), vec![16], ones(16)),
        (format!("{p}self_attn.k_norm.weight"), vec![16], ones(16)),
        (
            format!("{p}mlp.gate_proj.weight"),
            vec![32, HIDDEN],
            zeros(32, HIDDEN),
        ),
        (
            format!("{p}mlp.up_proj.weight"),
            vec![32, HIDDEN],
            zeros(32, HIDDEN),
        ),
        (
            format!("{p}mlp.down_proj.weight"),
            vec![HIDDEN, 32],
            zeros(HIDDEN, 32),
        ),
    ];
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, shape, data)| {
            let raw = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name, shape, raw)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(name, shape, raw)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), raw)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, &None, &dir.join("model.safetensors")).unwrap();

    let vocab: serde_json::Map<String, serde_json::Value> = VOCAB
        .iter()
        .enumerate()
        .map(|(id, w)| (w.to_string(), json!(id)))
        .collect();
    let added: Vec<serde_json::Value> = VOCAB[..SPECIALS]
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let decoder: HashMap<String, serde_json::Value> = VOCAB[..SPECIALS]
        .iter()
        .enumerate()
        .map(|(id, content)| {
            (
                id.to_string(),
                json!({"content": content, "lstrip": false, "normalized": false,
                       "rstrip": false, "single_word": false, "special": true}),
            )
        })
        .collect();
    let tokenizer_config = json!({
        "added_tokens_decoder": decoder, "bos_token": null,
        "chat_template": cairn_kernel::text::CHATML_TEMPLATE,
        "eos_token": "<|im_end|>", "pad_token": "<pad>", "unk_token": "[UNK]",
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
}

fn serve_config(run: &Path, model: &Path) -> String {
    format!(
        r#"[run]
dir = "{run}"
seed = 1
steps = 1

[source]
kind = "gateway"
bind = "127.0.0.1:0"

[algorithm]
plugin = "grpo"

[model]
path = "{model}"
device = "cpu"
threads = 1

[rollout]
tasks_per_step = 1
group_size = 1
temperature = 1.0
max_new_tokens = 16
max_turns = 1

[optimizer]
lr = 1e-3
"#,
        run = run.display(),
        model = model.display()
    )
}

/// A `cairn serve` child, killed on drop.
struct Served {
    child: Child,
    url: String,
}

impl Served {
    fn start(config: &Path) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["serve", config.to_str().unwrap()])
            .env("CAIRN_LOG", "warn")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start cairn serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => match line.strip_prefix("gateway: listening on ") {
                    Some(url) => {
                        return Served {
                            child,
                            url: url.trim().to_string(),
                        }
                    }
                    None => seen.push(line),
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("cairn serve did not start; stderr:\n{}", seen.join("\n"));
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bank that keeps every `PutEntries` and answers ids from 100.
#[derive(Default)]
struct BankStub {
    puts: Arc<Mutex<Vec<PutEntries>>>,
}

impl Actor for BankStub {
    type Context = Context<Self>;
}

impl Handler<PutEntries> for BankStub {
    type Result = cairn_kernel::Result<Vec<u64>>;
    fn handle(&mut self, msg: PutEntries, _: &mut Self::Context) -> Self::Result {
        let mut puts = self.puts.lock();
        let first = 100 + puts.iter().map(|p| p.entries.len() as u64).sum::<u64>();
        let ids = (first..first + msg.entries.len() as u64).collect();
        puts.push(msg);
        Ok(ids)
    }
}

fn endpoint(base_url: &str, max_tokens: u32, timeout_ms: u64) -> EndpointConfig {
    EndpointConfig {
        base_url: base_url.to_string(),
        model: "cairn".into(),
        // The key is handed to the reflector directly (`reflect_once`); the host would read
        // the variable this names.
        api_key_env: None,
        timeout_ms,
        max_retries: 1,
        retry_backoff_ms: 10,
        max_tokens,
        temperature: 0.0,
    }
}

/// One reflection through a skill creator with the endpoint reflector; what it finished and
/// what it put in the bank.
fn reflect_once(config: EndpointConfig, codec: Arc<Tokenizer>) -> (Finished, Vec<PutEntries>) {
    System::new().block_on(async move {
        let skills_config = SkillsConfig {
            reflector: ReflectorKind::Endpoint,
            endpoint: Some(config.clone()),
            ..Default::default()
        };
        let reflector = EndpointReflector::new(&config, Some("sk-test".into()), codec);
        let puts = Arc::new(Mutex::new(Vec::new()));
        let bank = BankStub { puts: puts.clone() }.start();
        let skills =
            SkillCreatorActor::new(&skills_config, bank.recipient(), Box::new(reflector)).start();
        let mut info = serde_json::Map::new();
        info.insert("action".into(), json!("open drawer 1"));
        let row = TurnRow {
            trajectory_id: 11,
            task_id: "mug-1".into(),
            observation: "You see a closed drawer.".into(),
            success: true,
            episode_reward: 1.0,
            last_turn: true,
            info,
            ..Default::default()
        };
        let started = Instant::now();
        let tickets = skills
            .send(Reflect {
                requests: vec![ReflectionRequest {
                    kind: EntryKind::Skill,
                    prompt: "What should the agent remember?".into(),
                    trajectories: vec![11],
                    task_id: Some("mug-1".into()),
                    ..Default::default()
                }],
                rows: vec![row],
                step: 4,
                policy_version: 2,
                writer: "test".into(),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tickets, [1]);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "reflect returns at once"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut finished = Finished::default();
        loop {
            let f = skills.send(TakeFinished).await.unwrap().unwrap();
            finished.new_entries.extend(f.new_entries);
            finished.failed.extend(f.failed);
            for (k, v) in f.metrics {
                match finished.metrics.iter_mut().find(|(name, _)| *name == k) {
                    Some(slot) if k != "skills/pending" => slot.1 += v,
                    Some(slot) => slot.1 = v,
                    None => finished.metrics.push((k, v)),
                }
            }
            if finished.new_entries.len() + finished.failed.len() == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "no answer: {finished:?}");
            actix::clock::sleep(Duration::from_millis(20)).await;
        }
        let puts = std::mem::take(&mut *puts.lock());
        (finished, puts)
    })
}

fn metrics(f: &Finished) -> Vec<(&str, f64)> {
    let order = [
        "skills/written",
        "skills/unparseable",
        "skills/timeouts",
        "skills/errors",
    ];
    order
        .iter()
        .map(|name| {
            let v = f
                .metrics
                .iter()
                .find(|(k, _)| k == name)
                .map_or(f64::NAN, |(_, v)| *v);
            (*name, v)
        })
        .collect()
}

#[test]
fn the_endpoint_reflector_over_http_stores_good_replies_and_counts_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    write_chain_model(&model);
    let codec = Arc::new(Tokenizer::from_dir(&model).unwrap());
    let cfg = write_config(
        tmp.path(),
        "serve.toml",
        &serve_config(&tmp.path().join("run"), &model),
    );
    let served = Served::start(&cfg);
    let base_url = format!("{}/v1", served.url);

    // A good reply: the greedy chain, parsed and stored with its provenance.
    let (finished, puts) = reflect_once(endpoint(&base_url, 16, 30_000), codec.clone());
    assert_eq!(finished.failed, [], "{finished:?}");
    assert_eq!(finished.new_entries, [100]);
    assert_eq!(
        metrics(&finished),
        [
            ("skills/written", 1.0),
            ("skills/unparseable", 0.0),
            ("skills/timeouts", 0.0),
            ("skills/errors", 0.0)
        ]
    );
    assert_eq!(puts.len(), 1);
    let entry = &puts[0].entries[0];
    assert_eq!(entry.text, "always open the drawer first");
    assert_eq!(entry.trigger, None);
    assert_eq!(entry.kind, EntryKind::Skill);
    assert_eq!(entry.task_id.as_deref(), Some("mug-1"));
    assert_eq!(
        (
            entry.provenance.step,
            entry.provenance.policy_version,
            entry.provenance.source_trajectories.clone(),
            entry.provenance.writer.as_str()
        ),
        (4, 2, vec![11], "skill-creator:endpoint")
    );
    assert_eq!(entry.extra["requested_by"], json!("test"));

    // Garbage: the same server cut off after three tokens ("<entry> always open").
    let (finished, puts) = reflect_once(endpoint(&base_url, 3, 30_000), codec.clone());
    assert_eq!(puts.len(), 0, "nothing stored");
    assert_eq!(
        metrics(&finished),
        [
            ("skills/written", 0.0),
            ("skills/unparseable", 1.0),
            ("skills/timeouts", 0.0),
            ("skills/errors", 0.0)
        ]
    );
    assert_eq!(finished.failed.len(), 1);
    assert!(
        finished.failed[0].1.contains("\"<entry> always open\""),
        "{:?}",
        finished.failed
    );
    drop(served);

    // A timeout: a loopback socket that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}/v1", silent.local_addr().unwrap());
    let (stop, stopped) = mpsc::channel::<()>();
    // Takes connections and never answers (the timeout under test) until `stop`; the accept
    // is non-blocking so the thread sees `stop`.
    let holder = std::thread::spawn(move || {
        silent.set_nonblocking(true).unwrap();
        let mut held = Vec::new();
        while stopped.try_recv().is_err() {
            if let Ok((conn, _)) = silent.accept() {
                held.push(conn);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        held.len()
    });
    let t = Instant::now();
    let (finished, puts) = reflect_once(endpoint(&silent_url, 16, 300), codec.clone());
    let waited = t.elapsed();
    stop.send(()).unwrap();
    let connections = holder.join().unwrap();
    assert!(puts.is_empty());
    assert_eq!(
        metrics(&finished),
        [
            ("skills/written", 0.0),
            ("skills/unparseable", 0.0),
            ("skills/timeouts", 1.0),
            ("skills/errors", 0.0)
        ]
    );
    assert_eq!(connections, 2, "one attempt and one retry");
    assert!(waited >= Duration::from_millis(600), "{waited:?}");
    let reason = &finished.failed[0].1;
    assert!(
        reason.contains("timeout_ms = 300") && reason.contains("after 2 attempts"),
        "{reason}"
    );

    // A refused connection: a loopback port nobody listens on any more.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let (finished, puts) = reflect_once(endpoint(&closed_url, 16, 5_000), codec);
    assert!(puts.is_empty());
    assert_eq!(
        metrics(&finished),
        [
            ("skills/written", 0.0),
            ("skills/unparseable", 0.0),
            ("skills/timeouts", 0.0),
            ("skills/errors", 1.0)
        ]
    );
    let reason = &finished.failed[0].1;
    assert!(
        reason.contains(&closed_url) && reason.contains("connection refused"),
        "{reason}"
    );
}
