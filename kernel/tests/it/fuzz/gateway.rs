//! Gateway request bodies: valid `/v1/chat/completions` and `/v1/completions` bodies, mutated,
//! through the request checks that turn a body into a sampling job (`RequestSettings::chat` /
//! `completion`, with the real Qwen3 tokenizer and chat template). An error must be an
//! `ApiError` naming a parameter; a job must respect the settings it was checked against.

use std::sync::Arc;

use cairn_gateway::{ApiError, Job, RequestSettings};
use cairn_kernel::text::ChatFormat;
use proptest::prelude::*;
use serde_json::{json, Value as Json};

use super::{apply_text, bounded, mutate, mutation, run, CASE_LIMIT};
use crate::text::qwen3;

fn settings() -> RequestSettings {
    RequestSettings {
        model_name: "cairn".into(),
        context_window: 512,
        default_max_tokens: 64,
        max_n: 4,
        training_sampling: None,
    }
}

fn format() -> Arc<ChatFormat> {
    static FORMAT: std::sync::OnceLock<Arc<ChatFormat>> = std::sync::OnceLock::new();
    FORMAT
        .get_or_init(|| {
            Arc::new(ChatFormat::from_tokenizer(qwen3().clone()).expect("qwen3 has a template"))
        })
        .clone()
}

/// Valid bodies using every parameter the gateway reads.
fn chat_bodies() -> Vec<Json> {
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    vec![
        json!({"model": "cairn", "messages": [{"role": "user", "content": "hi"}]}),
        json!({
            "model": "cairn",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                    "type": "function", "function": {"name": "get_weather",
                    "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 20 C"}
            ],
            "tools": weather,
            "tool_choice": "auto",
            "temperature": 0.7,
            "top_p": 0.9,
            "max_tokens": 32,
            "n": 2,
            "seed": 7,
            "stop": ["\n\n", "END"],
            "logprobs": true,
            "top_logprobs": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
            "stop_token_ids": [151645],
            "ignore_eos": false,
            "cairn": {"anchor": "at:kitchen"},
            "user": "someone",
            "metadata": {"k": "v"}
        }),
    ]
}

fn completion_bodies() -> Vec<Json> {
    vec![
        json!({"model": "cairn", "prompt": "Once upon a time", "max_tokens": 8}),
        json!({
            "model": "cairn",
            "prompt": [[9707, 11, 1879], [40, 1079]],
            "max_completion_tokens": 16,
            "temperature": 0,
            "n": 1,
            "logprobs": 1,
            "echo": false,
            "best_of": 1,
            "return_tokens_as_token_ids": true,
            "stop": "\n",
            "frequency_penalty": 0,
            "presence_penalty": 0.0,
            "logit_bias": {}
        }),
        json!({"model": "cairn", "prompt": ["a", "b c"], "stream": false}),
    ]
}

/// What a job must satisfy whatever the body said.
fn check_job(job: &Job, s: &RequestSettings) -> Result<(), String> {
    if job.prompts.is_empty() || job.prompts.iter().any(Vec::is_empty) {
        return Err("a job without prompt tokens".into());
    }
    let longest = job.prompts.iter().map(Vec::len).max().unwrap_or(0);
    let max_new = job.params.max_new_tokens as usize;
    if max_new == 0 || longest + max_new > s.context_window {
        return Err(format!(
            "prompt {longest} + max_new_tokens {max_new} past the window {}",
            s.context_window
        ));
    }
    if !(1..=s.max_n).contains(&job.n) {
        return Err(format!("n = {}", job.n));
    }
    let (t, p) = (job.params.temperature, job.params.top_p);
    if !((0.0..=2.0).contains(&t) && p > 0.0 && p <= 1.0) {
        return Err(format!("temperature {t}, top_p {p}"));
    }
    Ok(())
}

fn check_error(e: &ApiError) -> Result<(), String> {
    match e.param.as_deref() {
        Some(p) if !p.is_empty() && !e.message.is_empty() => Ok(()),
        _ => Err(format!("an error naming no parameter: {e:?}")),
    }
}

/// A mutated chat or completions body gives a job within the settings, or an `ApiError`
/// naming the parameter.
#[test]
fn mutated_request_bodies_fail_naming_a_param() {
    let bodies: Vec<(bool, Json)> = chat_bodies()
        .into_iter()
        .map(|b| (true, b))
        .chain(completion_bodies().into_iter().map(|b| (false, b)))
        .collect();
    let format = format();
    let inputs = (
        prop::sample::select(bodies),
        prop::collection::vec(mutation(false), 1..4),
    );
    run(
        "gateway",
        file!(),
        1000,
        inputs,
        |((chat, body), mutations)| {
            let mut doc = body;
            let (touched, raws) = mutate(&mut doc, &mutations);
            let text = apply_text(doc.to_string(), &raws);
            let format = format.clone();
            let outcome = bounded("request", CASE_LIMIT, move || {
                let s = settings();
                let result = if chat {
                    s.chat(text.as_bytes(), &format, false)
                } else {
                    s.completion(text.as_bytes(), &format, false)
                };
                match result {
                    Ok(job) => check_job(&job, &s),
                    Err(e) => check_error(&e),
                }
            });
            prop_assert!(
                outcome.is_ok(),
                "{}; touched {touched:?}",
                outcome.unwrap_err()
            );
            Ok(())
        },
    );
}

/// Bytes that are barely JSON: the body check names `body` and never panics.
#[test]
fn random_bytes_fail_naming_the_body() {
    let format = format();
    let inputs = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        "\\PC{0,64}".prop_map(String::into_bytes),
        // Truncated valid bodies.
        (0usize..200).prop_map(|cut| {
            let body = chat_bodies()[1].to_string().into_bytes();
            body[..cut.min(body.len())].to_vec()
        }),
    ];
    run("gateway-bytes", file!(), 500, inputs, |bytes| {
        let format = format.clone();
        let outcome = bounded("request", CASE_LIMIT, move || {
            let s = settings();
            [
                s.chat(&bytes, &format, true),
                s.completion(&bytes, &format, true),
            ]
            .into_iter()
            .map(|r| match r {
                Ok(job) => check_job(&job, &s),
                Err(e) => check_error(&e),
            })
            .collect::<Result<Vec<()>, String>>()
        });
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
        Ok(())
    });
}
