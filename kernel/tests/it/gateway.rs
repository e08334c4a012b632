//! The gateway path on the token cases of docs/bug-cases.md, with the real Qwen3 tokenizer and a
//! scripted policy (the null backend answers every prompt with the case's sampled ids):
//! requests are rendered, sampled, returned, fed back by a "harness" and merged, and the
//! trained rows are checked id by id.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use cairn_gateway::{
    ApiError, EpisodeSettings, EpisodeStore, Gateway, MissingReward, RequestSettings, Route,
    RowMode, Sampler,
};
use cairn_kernel::actors::policy::PolicyActor;
use cairn_kernel::backend::NullBackend;
use cairn_kernel::text::{train_word_level, ChatFormat, Tokenizer, WordLevelConfig};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value as Json};

use crate::text::qwen3;

const PROMPT_IDS: [u32; 15] = [
    151644, 872, 198, 3838, 374, 279, 9104, 304, 12095, 30, 151645, 198, 151644, 77091, 198,
];
const GENERATED: [u32; 20] = [
    151657, 198, 4913, 606, 788, 330, 455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330,
    59604, 95642, 151658, 151645,
];
const OBSERVATION: [u32; 20] = [
    198, 151644, 872, 198, 151665, 198, 50, 27297, 11, 220, 17, 15, 34, 198, 151666, 151645, 198,
    151644, 77091, 198,
];

fn format() -> ChatFormat {
    ChatFormat::from_tokenizer(qwen3().clone()).expect("qwen3 has a chat template")
}

fn gateway(response: &[u32]) -> Gateway {
    let policy = SyncArbiter::start(1, {
        let response = response.to_vec();
        move || {
            PolicyActor::new(Box::new(NullBackend {
                version: 3,
                response: response.clone(),
                ..Default::default()
            }))
        }
    });
    let sampler = Sampler::new(policy.recipient(), Duration::from_millis(1), 16, 0);
    let sampling = sampler.stats();
    let sampler = sampler.start();
    let store = EpisodeStore::new(EpisodeSettings {
        timeout: Duration::from_secs(60),
        missing_reward: MissingReward::Drop,
        rows: RowMode::Merged,
        keep_finished: 16,
        max_ready: 16,
        max_open: 16,
    });
    let settings = RequestSettings {
        model_name: "cairn".into(),
        context_window: 4096,
        default_max_tokens: 64,
        max_n: 4,
        training_sampling: Some((0.6, 1.0)),
    };
    Gateway::new(
        format(),
        settings,
        Arc::new(Mutex::new(store)),
        sampler.recipient(),
        sampling,
    )
}

fn tools() -> Json {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}])
}

fn ids(v: &Json) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("a list of ids")
}

/// verl #6501 and agent-lightning #326 through the gateway: the returned ids are the sampled
/// ids (special tool-call ids included), the harness's next request (the returned message fed
/// back, then the tool result) renders to prompt + sampled + observation ids, and the merged
/// row's observation starts with the `\n` after `<|im_end|>`.
#[test]
fn a_fed_back_tool_call_merges_with_the_newline_kept() {
    System::new().block_on(async {
        for with_tools in [false, true] {
            let gw = gateway(&GENERATED);
            let opened = gw.open_episode(br#"{"task_id": "weather"}"#).unwrap();
            let ep = opened["episode_id"].as_str().unwrap().to_owned();
            let user = json!({"role": "user", "content": "What is the weather in Paris?"});
            let mut request = json!({"model": "cairn", "messages": [user], "temperature": 1.0});
            if with_tools {
                request["tools"] = tools();
            }
            let body = serde_json::to_vec(&request).unwrap();
            let done = gw
                .complete(Route::Chat, &body, Some(&ep), None)
                .await
                .unwrap();
            let reply = gw.body(&done);
            let receipt = gw.record(&done, &ep).unwrap();
            let choice = &reply["choices"][0];
            assert_eq!(ids(&choice["token_ids"]), GENERATED, "ids verbatim");
            if !with_tools {
                assert_eq!(ids(&reply["prompt_token_ids"]), PROMPT_IDS);
            }
            // trl #4159: an episode call is sampled at the training temperature.
            assert_eq!(receipt["temperature"], json!(0.6f32));
            assert_eq!(reply["system_fingerprint"], "cairn-v3");

            let message = &choice["message"];
            if with_tools {
                assert_eq!(choice["finish_reason"], "tool_calls");
                assert_eq!(message["content"], Json::Null);
                let call = &message["tool_calls"][0]["function"];
                assert_eq!(call["name"], "get_weather");
                assert_eq!(call["arguments"], r#"{"city": "Paris"}"#);
            }
            // The harness feeds the message back as it got it, then the tool result.
            let mut assistant = message.clone();
            assistant["role"] = json!("assistant");
            request["messages"] = json!([user, assistant,
                {"role": "tool", "content": "Sunny, 20C", "tool_call_id": "call_0"}]);
            let body = serde_json::to_vec(&request).unwrap();
            let next = gw
                .complete(Route::Chat, &body, Some(&ep), None)
                .await
                .unwrap();
            let receipt = gw.record(&next, &ep).unwrap();
            assert_eq!(receipt["calls"][0]["merged"], true, "tools: {with_tools}");
            let prompt = &next.job.prompts[0];
            let first = &done.job.prompts[0];
            let observation = &prompt[first.len() + GENERATED.len()..];
            assert_eq!(observation[0], 198, "the newline after <|im_end|> is kept");
            if !with_tools {
                assert_eq!(observation, OBSERVATION);
            }

            gw.reward(&ep, br#"{"reward": 1.0}"#).unwrap();
            let rows = gw
                .store()
                .lock()
                .take_groups(1, 1, 0, false)
                .expect("one finished episode")
                .episodes
                .remove(0)
                .rows;
            assert_eq!(rows.len(), 1);
            let row = &rows[0];
            assert_eq!(&row.prompt_ids, first);
            let expected: Vec<u32> = [&GENERATED[..], observation, &GENERATED[..]].concat();
            assert_eq!(row.response_ids, expected);
            let mask: Vec<u8> = [vec![1; 20], vec![0; observation.len()], vec![1; 20]].concat();
            assert_eq!(row.response_mask, mask);
            assert_eq!(row.policy_version, 3);
        }
    });
}

/// The SSE body of a streamed call, parsed: its chunks (without `[DONE]`).
async fn stream_chunks(gw: &Gateway, request: &Json, episode: Option<&str>) -> Vec<Json> {
    let body = serde_json::to_vec(request).unwrap();
    let call = gw.start(Route::Chat, &body, episode, None).await.unwrap();
    let pieces: Vec<String> = gw.stream(call, episode.map(str::to_owned)).collect().await;
    let text = pieces.concat();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

/// agent-lightning #326 in a stream: the chunks' ids concatenate to the sampled ids (the
/// `<tool_call>` ids 151657/151658 are never re-derived from text), and the text deltas to the
/// text; with tools, the call arrives parsed in the finish chunk with the ids from
/// `<tool_call>` on. The streamed call records what the non-streamed one returns.
#[test]
fn stream_chunks_pass_special_token_ids_through() {
    let case_ids = vec![151657, 198, 4913, 606, 788, 330, 69, 16707, 151658];
    let buggy = [
        27, 14172, 13429, 397, 4913, 606, 788, 330, 69, 16707, 522, 14172, 13429, 29,
    ];
    System::new().block_on(async {
        for with_tools in [false, true] {
            let gw = gateway(&case_ids);
            let mut request = json!({"model": "cairn", "stream": true, "logprobs": true,
                                     "max_tokens": case_ids.len(), "seed": 1,
                                     "messages": [{"role": "user", "content": "call f"}]});
            if with_tools {
                request["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
            }
            let opened = gw.open_episode(b"{}").unwrap();
            let ep = opened["episode_id"].as_str().unwrap().to_owned();
            let chunks = stream_chunks(&gw, &request, Some(&ep)).await;
            let streamed: Vec<u32> = chunks
                .iter()
                .flat_map(|c| ids(&c["choices"][0]["token_ids"]))
                .collect();
            assert_eq!(streamed, case_ids);
            assert_ne!(streamed[..], buggy[..]);
            let text: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            let logprobs: usize = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
                .map(Vec::len)
                .sum();
            assert_eq!(logprobs, case_ids.len());
            let last = &chunks[chunks.len() - 1]["choices"][0];
            if with_tools {
                assert_eq!(text, "", "the tool call is not content");
                assert_eq!(last["finish_reason"], "tool_calls");
                assert_eq!(last["delta"]["tool_calls"][0]["function"]["name"], "f");
                assert_eq!(ids(&last["token_ids"]), case_ids);
            } else {
                assert_eq!(text, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
                assert_eq!(last["finish_reason"], "length");
            }
            // Recorded once the last chunk was taken: the ids the stream carried.
            let view = gw.view(&ep).unwrap();
            assert_eq!(
                ids(&view["calls"][0]["choices"][0]["token_ids"]),
                case_ids,
                "{view}"
            );
            // The same request without `stream` returns the same choice.
            request["stream"] = json!(false);
            let body = serde_json::to_vec(&request).unwrap();
            let whole = gw.complete(Route::Chat, &body, None, None).await.unwrap();
            assert_eq!(whole.outputs[0].ids, case_ids);
            let expected = whole.outputs[0].content.clone().unwrap_or_default();
            assert_eq!(text, if with_tools { String::new() } else { expected });
        }
    });
}

/// Stop strings in a stream: no chunk carries text from the stop string on, and the chunks
/// concatenate to the non-streamed text and ids (cut after the id that completes the stop
/// string), whether the stop string is a whole token's text or spans two.
#[test]
fn streamed_stop_strings_match_the_whole_answer() {
    // " Paris is sunny\n\nNext" in Qwen3 ids, then <|im_end|>.
    let tokenizer = qwen3();
    let case_ids = tokenizer.encode(" Paris is sunny\n\nNext").unwrap();
    let mut generated = case_ids.clone();
    generated.push(151645);
    System::new().block_on(async {
        for stop in ["sunny", "ny\n", "is s", "\n\n", "Next", "zzz"] {
            let gw = gateway(&generated);
            let mut request = json!({"model": "cairn", "stream": true, "seed": 2,
                                     "max_tokens": 32, "stop": [stop],
                                     "messages": [{"role": "user", "content": "weather?"}]});
            let chunks = stream_chunks(&gw, &request, None).await;
            let text: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            let streamed: Vec<u32> = chunks
                .iter()
                .flat_map(|c| ids(&c["choices"][0]["token_ids"]))
                .collect();
            request["stream"] = json!(false);
            let body = serde_json::to_vec(&request).unwrap();
            let whole = gw.complete(Route::Chat, &body, None, None).await.unwrap();
            let o = &whole.outputs[0];
            assert_eq!(text, o.text, "stop {stop:?}");
            assert_eq!(streamed, o.ids, "stop {stop:?}");
            let full = " Paris is sunny\n\nNext";
            assert_eq!(o.text, &full[..full.find(stop).unwrap_or(full.len())]);
            let finish = &chunks[chunks.len() - 1]["choices"][0]["finish_reason"];
            assert_eq!(finish, "stop", "stop {stop:?}");
        }
    });
}

/// trl #4159: only episode calls under training are pinned to the training temperature;
/// a plain call keeps the one it asked for.
#[test]
fn training_temperature_applies_to_episode_calls_only() {
    let format = format();
    let settings = RequestSettings {
        model_name: "cairn".into(),
        context_window: 4096,
        default_max_tokens: 8,
        max_n: 4,
        training_sampling: Some((0.6, 0.9)),
    };
    let body = br#"{"model": "cairn", "prompt": "a b c", "temperature": 1.3, "top_p": 0.5}"#;
    let plain = settings.completion(body, &format, false).unwrap();
    assert_eq!((plain.params.temperature, plain.params.top_p), (1.3, 0.5));
    let episode = settings.completion(body, &format, true).unwrap();
    assert_eq!(
        (episode.params.temperature, episode.params.top_p),
        (0.6, 0.9)
    );
    let long = format!(
        r#"{{"model": "cairn", "prompt": "a b", "max_tokens": {}}}"#,
        5000
    );
    let e = settings
        .completion(long.as_bytes(), &format, false)
        .unwrap_err();
    assert_eq!(
        (e.status(), e.code.as_deref(), e.param.as_deref()),
        (400, Some("context_length_exceeded"), Some("prompt"))
    );
    assert_eq!(
        e.message,
        "this model's maximum context length is 4096 tokens, but the request needs 5002: 2 \
         prompt tokens + max_tokens 5000; shorten the prompt or lower max_tokens"
    );
    // A prompt that alone fills the window, max_tokens not given.
    let ids: Vec<u32> = vec![11; 4096];
    let alone = json!({"model": "cairn", "prompt": ids}).to_string();
    let e = settings
        .completion(alone.as_bytes(), &format, false)
        .unwrap_err();
    assert_eq!(
        e.message,
        "this model's maximum context length is 4096 tokens, but the prompt has 4096 tokens, \
         which leaves no room for a completion; shorten the prompt"
    );
}

/// What a rollout engine's client sends (docs/engine.md): `ignore_eos` drops the model's own
/// stop ids, `stop_token_ids` adds others (kept in the output), `return_tokens_as_token_ids`
/// gives `logprobs.tokens` as `token_id:N`; `/tokenize` gives the ids of a text; and weights
/// go in only through a loader, with their version.
#[test]
fn engine_extensions_reach_the_sampler() {
    System::new().block_on(async {
        let gw = gateway(&GENERATED);
        let finish = |body: Json| {
            let gw = gw.clone();
            async move {
                let done = gw
                    .complete(Route::Completions, body.to_string().as_bytes(), None, None)
                    .await
                    .unwrap();
                gw.body(&done)["choices"][0].clone()
            }
        };
        let base = json!({"model": "cairn", "prompt": PROMPT_IDS, "max_tokens": 32, "logprobs": 1});
        // The last sampled id is <|im_end|>, the model's own stop id.
        let plain = finish(base.clone()).await;
        assert_eq!(plain["finish_reason"], "stop");
        let mut body = base.clone();
        body["ignore_eos"] = json!(true);
        assert_eq!(finish(body.clone()).await["finish_reason"], "length");
        body["stop_token_ids"] = json!([151645]);
        body["return_tokens_as_token_ids"] = json!(true);
        let choice = finish(body).await;
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(ids(&choice["token_ids"]), GENERATED.to_vec());
        let tokens: Vec<String> = GENERATED
            .iter()
            .map(|id| format!("token_id:{id}"))
            .collect();
        assert_eq!(choice["logprobs"]["tokens"], json!(tokens));
        let mut bad = base.clone();
        bad["stop_token_ids"] = json!([999_999_999]);
        let e = gw
            .complete(Route::Completions, bad.to_string().as_bytes(), None, None)
            .await
            .unwrap_err();
        assert_eq!(
            (e.status(), e.param.as_deref()),
            (400, Some("stop_token_ids"))
        );

        let t = gw
            .tokenize(br#"{"prompt": "What is the capital"}"#)
            .unwrap();
        assert_eq!(
            ids(&t["tokens"]),
            qwen3().encode("What is the capital").unwrap()
        );
        assert_eq!(t["max_model_len"], 4096);
    });
}

fn limited(context_window: usize) -> RequestSettings {
    RequestSettings {
        model_name: "cairn".into(),
        context_window,
        default_max_tokens: 8,
        max_n: 4,
        training_sampling: None,
    }
}

/// `(status, param, code)` of a refused request.
fn refusal(e: &ApiError) -> (u16, Option<&str>, Option<&str>) {
    (e.status(), e.param.as_deref(), e.code.as_deref())
}

/// Issue 32 finding 8: a prompt is refused by its size in bytes before it is encoded. The
/// bound is the context window times the most bytes one token stands for (Qwen3: its longest
/// token, 128 spaces, times 4 for its NFC normaliser), so it never refuses a prompt that fits.
#[test]
fn an_oversized_prompt_is_refused_by_its_bytes_before_encoding() {
    let format = format();
    assert_eq!(format.tokenizer().max_token_bytes(), Some(512));
    let settings = limited(64);
    assert_eq!(
        settings.prompt_byte_limit(format.tokenizer()),
        Some(64 * 512)
    );
    let over = "a".repeat(64 * 512 + 1);
    let bodies = [
        (
            Route::Completions,
            json!({"model": "cairn", "prompt": over}),
            "prompt",
        ),
        (
            Route::Completions,
            json!({"model": "cairn", "prompt": ["a b", over]}),
            "prompt",
        ),
        (
            Route::Chat,
            json!({"model": "cairn", "messages": [{"role": "user", "content": over}]}),
            "messages",
        ),
    ];
    for (route, body, param) in bodies {
        let body = body.to_string();
        let e = match route {
            Route::Chat => settings.chat(body.as_bytes(), &format, false),
            Route::Completions => settings.completion(body.as_bytes(), &format, false),
        }
        .unwrap_err();
        assert_eq!(
            refusal(&e),
            (400, Some(param), Some("context_length_exceeded"))
        );
        assert!(
            e.message.contains("no prompt over 32768 bytes fits"),
            "refused by bytes, not after encoding: {}",
            e.message
        );
    }
    // Many copies of the longest token: 8064 bytes in 63 tokens, which fit a 64-token window
    // (a bound of 64 bytes per token would have refused them).
    let spaces = " ".repeat(128 * 63);
    assert_eq!(format.tokenizer().encode(&spaces).unwrap().len(), 63);
    let fits = json!({"model": "cairn", "prompt": spaces, "max_tokens": 1}).to_string();
    let job = settings
        .completion(fits.as_bytes(), &format, false)
        .unwrap();
    assert_eq!(job.prompts[0].len(), 63);
    // Llama 3 (byte-level BPE, no normaliser) is bounded by its longest token alone; a
    // word-level tokenizer maps an unknown word of any length to one `[UNK]`, so no byte
    // bound holds and its prompts are checked by their token count only.
    let llama3 = Tokenizer::from_dir(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/torch/tests/fixtures/fidelity/models/llama3"
    )))
    .unwrap();
    assert_eq!(llama3.max_token_bytes(), Some(19), "<|start_header_id|>");
    let words = train_word_level(["go to the kitchen"], &WordLevelConfig::default()).unwrap();
    assert_eq!(words.max_token_bytes(), None);
    assert_eq!(settings.prompt_byte_limit(&words), None);
    // A list of ids longer than the window is refused before its ids are read.
    let ids = json!({"model": "cairn", "prompt": vec![-1; 64], "max_tokens": 2}).to_string();
    let e = settings
        .completion(ids.as_bytes(), &format, false)
        .unwrap_err();
    assert_eq!(
        refusal(&e),
        (400, Some("prompt"), Some("context_length_exceeded"))
    );
    assert!(
        e.message
            .contains("the request needs 66: 64 prompt tokens + max_tokens 2"),
        "{}",
        e.message
    );
    // `/tokenize` takes no text that could not be a prompt either (window 4096: 2 MiB).
    System::new().block_on(async {
        let gw = gateway(&GENERATED);
        let body = json!({"prompt": "a".repeat(4096 * 512 + 1)}).to_string();
        let e = gw.tokenize(body.as_bytes()).unwrap_err();
        assert_eq!(
            refusal(&e),
            (400, Some("prompt"), Some("context_length_exceeded"))
        );
    });
}

/// Issue 32 finding 9: every string a client sends that the gateway keeps or compares has a
/// length limit, and the refusal names the field without echoing it.
#[test]
fn long_string_fields_are_refused_by_name() {
    use cairn_gateway::request::MAX_FIELD_BYTES;
    let format = format();
    let settings = limited(4096);
    let long = "x".repeat(MAX_FIELD_BYTES + 1);
    let bodies = [
        ("model", json!({"model": long, "prompt": "a"})),
        (
            "stop",
            json!({"model": "cairn", "prompt": "a", "stop": ["s", long]}),
        ),
        (
            "cairn.anchor",
            json!({"model": "cairn", "prompt": "a", "cairn": {"anchor": long}}),
        ),
    ];
    for (param, body) in bodies {
        let e = settings
            .completion(body.to_string().as_bytes(), &format, false)
            .unwrap_err();
        assert_eq!(
            refusal(&e),
            (400, Some(param), Some("string_above_max_length"))
        );
        assert!(e.message.len() < 200, "not echoed: {}", e.message);
    }
    let at_limit = "x".repeat(MAX_FIELD_BYTES);
    let body = json!({"model": "cairn", "prompt": "a", "stop": [at_limit],
                      "cairn": {"anchor": at_limit}});
    settings
        .completion(body.to_string().as_bytes(), &format, false)
        .unwrap();
    System::new().block_on(async {
        let gw = gateway(&GENERATED);
        let ep = gw.open_episode(b"{}").unwrap()["episode_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let body = json!({"model": "cairn", "prompt": "a", "max_tokens": 1}).to_string();
        let e = gw
            .start(
                Route::Completions,
                body.as_bytes(),
                Some(&ep),
                Some(long.clone()),
            )
            .await
            .err()
            .expect("an over-long X-Cairn-Anchor is refused");
        assert_eq!(
            refusal(&e),
            (400, Some("X-Cairn-Anchor"), Some("string_above_max_length"))
        );
        let task = json!({"task_id": "t".repeat(5000)}).to_string();
        let e = gw.open_episode(task.as_bytes()).unwrap_err();
        assert_eq!(
            refusal(&e),
            (400, Some("task_id"), Some("string_above_max_length"))
        );
        let e = gw.view(&"e".repeat(100_000)).unwrap_err();
        assert!(e.message.len() < 300, "not echoed: {}", e.message);
    });
}

/// Issue 32 finding 11: a positive temperature so small that the logits divided by it are no
/// longer finite is refused (they came back as id 0 with NaN log-probs); 0 (greedy) and
/// temperatures from 1e-6 up are served.
#[test]
fn a_temperature_that_overflows_the_logits_is_refused() {
    let format = format();
    let settings = limited(4096);
    let body = |t: &str| format!(r#"{{"model": "cairn", "prompt": "a", "temperature": {t}}}"#);
    for t in ["1e-39", "1.1e-38", "1e-20", "9.9e-7"] {
        let e = settings
            .completion(body(t).as_bytes(), &format, false)
            .unwrap_err();
        assert_eq!(refusal(&e), (400, Some("temperature"), None), "{t}");
        assert!(e.message.contains("send 0 for greedy"), "{}", e.message);
    }
    for (t, want) in [("0", 0.0), ("1e-6", 1e-6), ("0.7", 0.7)] {
        let job = settings
            .completion(body(t).as_bytes(), &format, false)
            .unwrap();
        assert_eq!(job.params.temperature, want);
    }
}

/// Issue 32 finding 11, recording side: a sampled answer whose log-probs are not finite is
/// not recorded (a 500 naming it), `/health` counts it, and its episode never becomes rows.
#[test]
fn non_finite_log_probs_never_reach_a_row() {
    System::new().block_on(async {
        let gw = gateway(&GENERATED);
        let ep = gw.open_episode(b"{}").unwrap()["episode_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let body = json!({"model": "cairn", "prompt": PROMPT_IDS, "max_tokens": 4}).to_string();
        let mut done = gw
            .complete(Route::Completions, body.as_bytes(), Some(&ep), None)
            .await
            .unwrap();
        done.outputs[0].logprobs[2] = f32::NAN;
        let e = gw.record(&done, &ep).unwrap_err();
        assert_eq!(refusal(&e), (500, None, Some("nonfinite_logprobs")));
        assert_eq!(gw.health()["stats"]["calls_nonfinite"], 1);
        gw.reward(&ep, br#"{"reward": 1.0}"#).unwrap();
        assert!(gw.store().lock().drain_ready().is_empty());
        assert_eq!(gw.health()["stats"]["episodes_dropped"], 1);
    });
}
