//! The gateway path on the token cases of docs/bug-cases.md, with the real Qwen3 tokenizer and a
//! scripted policy (the null backend answers every prompt with the case's sampled ids):
//! requests are rendered, sampled, returned, fed back by a "harness" and merged, and the
//! trained rows are checked id by id.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use cairn_kernel::actors::policy::PolicyActor;
use cairn_kernel::backend::{Generation, NullBackend};
use cairn_kernel::gateway::response::{self, Meta};
use cairn_kernel::gateway::{
    EpisodeSettings, EpisodeStore, Gateway, MissingReward, RequestSettings, Route, RowMode, Sampler,
};
use cairn_kernel::text::ChatFormat;
use cairn_plugin_sdk::FinishReason;
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
    let sampler = Sampler::new(policy.recipient(), Duration::from_millis(1), 16, 0).start();
    let store = EpisodeStore::new(EpisodeSettings {
        timeout: Duration::from_secs(60),
        missing_reward: MissingReward::Drop,
        rows: RowMode::Merged,
        keep_finished: 16,
        max_ready: 16,
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

/// agent-lightning #326 in a stream: the chunks' ids concatenate to the sampled ids (the
/// `<tool_call>` ids 151657/151658 are never re-derived from text), and the text deltas to the
/// text.
#[test]
fn stream_chunks_pass_special_token_ids_through() {
    let case_ids = vec![151657, 198, 4913, 606, 788, 330, 69, 16707, 151658];
    let buggy = [
        27, 14172, 13429, 397, 4913, 606, 788, 330, 69, 16707, 522, 14172, 13429, 29,
    ];
    let format = format();
    let settings = RequestSettings {
        model_name: "cairn".into(),
        context_window: 4096,
        default_max_tokens: 64,
        max_n: 4,
        training_sampling: None,
    };
    for with_tools in [false, true] {
        let mut request = json!({"model": "cairn", "stream": true, "logprobs": true,
                                 "messages": [{"role": "user", "content": "call f"}]});
        if with_tools {
            request["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        }
        let job = settings
            .chat(&serde_json::to_vec(&request).unwrap(), &format, false)
            .unwrap();
        let generation = Generation {
            ids: case_ids.clone(),
            logprobs: vec![-0.25; case_ids.len()],
            finish_reason: FinishReason::Length,
        };
        let out =
            response::Output::new(&job, generation, format.tokenizer(), format.stop_ids()).unwrap();
        assert_eq!(out.text, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
        assert_eq!(out.tool_calls.len(), usize::from(with_tools));
        let meta = Meta {
            request_id: "r",
            model: "cairn",
            created: 0,
            policy_version: 0,
        };
        let chunks = response::chunks(&job, &[out], &meta, format.tokenizer()).unwrap();
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
        if with_tools {
            assert_eq!(text, "", "the tool call is not content");
            let last = &chunks[chunks.len() - 1]["choices"][0];
            assert_eq!(last["finish_reason"], "tool_calls");
            assert_eq!(last["delta"]["tool_calls"][0]["function"]["name"], "f");
        } else {
            assert_eq!(text, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
        }
    }
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
        (e.status(), e.code.as_deref()),
        (400, Some("context_length_exceeded"))
    );
}
