//! Sampled ids → OpenAI response bodies and stream chunks, ids passed through verbatim.
//!
//! [`Output::new`] applies what the request asked after sampling: stop strings (the ids are
//! cut after the token that completes the first stop string, the text before it), the text
//! (decoded with special tokens kept, trailing stop id dropped: the form chat templates print
//! back, so the next call's prompt extends this one), and for chat requests with tools the
//! Qwen/Hermes `<tool_call>` blocks as `tool_calls`. The ids themselves are never re-derived
//! from text (agent-lightning #326): every body and every stream chunk carries the sampled
//! `token_ids`, and the chunks of a stream concatenate to exactly the sampled ids.
//!
//! Extra fields, beside the OpenAI ones: `prompt_token_ids` (top level), `token_ids` (per
//! choice, or per chunk), `policy_version` and `system_fingerprint = "cairn-v{version}"`, and
//! `cairn` (the episode receipt, added by the service).

use cairn_plugin_sdk::FinishReason;
use serde_json::{json, Value as Json};

use super::request::{Job, Route};
use crate::backend::Generation;
use crate::text::{parse_tool_calls, Tokenizer, ToolCall};

/// One choice, ready to return and record.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// Sampled ids kept (all, or up to the stop string), `[L]`.
    pub ids: Vec<u32>,
    /// Their log-probs at the sampling temperature, `[L]`, nats.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    /// The text the client sees (before tool-call extraction).
    pub text: String,
    /// Chat with tools: the calls found, and the prose before them.
    pub tool_calls: Vec<ToolCall>,
    pub content: Option<String>,
}

const TOOL_CALL_OPEN: &str = "<tool_call>";

impl Output {
    /// Applies stop strings, decodes and parses tool calls (module docs).
    pub fn new(
        job: &Job,
        generation: Generation,
        tokenizer: &Tokenizer,
        stop_ids: &[u32],
    ) -> crate::Result<Output> {
        let Generation {
            mut ids,
            mut logprobs,
            mut finish_reason,
        } = generation;
        let visible = |ids: &[u32]| -> crate::Result<String> {
            let end = match ids.last() {
                Some(id) if stop_ids.contains(id) => ids.len() - 1,
                _ => ids.len(),
            };
            tokenizer.decode(&ids[..end])
        };
        let mut text = visible(&ids)?;
        if let Some(cut) = first_stop(&text, &job.stop) {
            // The shortest prefix of ids whose text holds the stop string.
            let mut keep = ids.len();
            for k in 1..=ids.len() {
                if first_stop(&visible(&ids[..k])?, &job.stop).is_some() {
                    keep = k;
                    break;
                }
            }
            ids.truncate(keep);
            logprobs.truncate(keep);
            text.truncate(cut);
            finish_reason = FinishReason::Stop;
        }
        let (tool_calls, content) = if job.parse_tools {
            let parsed = parse_tool_calls(&text);
            if parsed.tool_calls.is_empty() {
                (Vec::new(), Some(text.clone()))
            } else {
                let prose = text
                    .find(TOOL_CALL_OPEN)
                    .map_or(text.as_str(), |i| &text[..i])
                    .trim_end();
                let content = (!prose.is_empty()).then(|| prose.to_owned());
                (parsed.tool_calls, content)
            }
        } else {
            (Vec::new(), Some(text.clone()))
        };
        Ok(Output {
            ids,
            logprobs,
            finish_reason,
            text,
            tool_calls,
            content,
        })
    }

    fn finish_reason(&self) -> &'static str {
        match self.finish_reason {
            _ if !self.tool_calls.is_empty() => "tool_calls",
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::Aborted => "length",
        }
    }

    fn tool_calls_json(&self, request_id: &str, choice: usize) -> Json {
        Json::Array(
            self.tool_calls
                .iter()
                .enumerate()
                .map(|(k, call)| call.to_openai(&format!("call_{request_id}_{choice}_{k}")))
                .collect(),
        )
    }
}

/// Byte offset of the earliest stop string in `text`.
fn first_stop(text: &str, stop: &[String]) -> Option<usize> {
    stop.iter().filter_map(|s| text.find(s.as_str())).min()
}

/// What a response body needs besides the outputs.
pub struct Meta<'a> {
    pub request_id: &'a str,
    pub model: &'a str,
    /// Unix seconds.
    pub created: u64,
    pub policy_version: u64,
}

impl Meta<'_> {
    fn base(&self, object: &str) -> serde_json::Map<String, Json> {
        let prefix = if object.starts_with("chat") {
            "chatcmpl"
        } else {
            "cmpl"
        };
        let mut m = serde_json::Map::new();
        m.insert("id".into(), json!(format!("{prefix}-{}", self.request_id)));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert(
            "system_fingerprint".into(),
            json!(format!("cairn-v{}", self.policy_version)),
        );
        m.insert("policy_version".into(), json!(self.policy_version));
        m
    }
}

fn usage(job: &Job, outputs: &[Output]) -> Json {
    let prompt: usize = job.prompts.iter().map(Vec::len).sum();
    let completion: usize = outputs.iter().map(|o| o.ids.len()).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
}

/// Per-token log-prob entries in the chat form (`{"content": [{token, logprob, bytes,
/// top_logprobs}]}`) or the completions form (`{tokens, token_logprobs, ...}`).
fn logprobs_json(route: Route, ids: &[u32], logprobs: &[f32], tokenizer: &Tokenizer) -> Json {
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| tokenizer.decode(&[id]).unwrap_or_default())
        .collect();
    match route {
        Route::Chat => json!({"content": tokens.iter().zip(logprobs).map(|(t, lp)| json!({
            "token": t, "logprob": lp, "bytes": t.as_bytes(), "top_logprobs": []
        })).collect::<Vec<_>>()}),
        Route::Completions => json!({
            "tokens": tokens, "token_logprobs": logprobs, "top_logprobs": null,
            "text_offset": null,
        }),
    }
}

/// The non-streaming body. `outputs` holds `n` outputs per prompt, prompt-major.
pub fn body(job: &Job, outputs: &[Output], meta: &Meta<'_>, tokenizer: &Tokenizer) -> Json {
    let chat = job.route == Route::Chat;
    let mut m = meta.base(if chat {
        "chat.completion"
    } else {
        "text_completion"
    });
    let choices: Vec<Json> = outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let logprobs = job
                .logprobs
                .then(|| logprobs_json(job.route, &o.ids, &o.logprobs, tokenizer));
            if chat {
                let mut message = json!({"role": "assistant", "content": o.content});
                if !o.tool_calls.is_empty() {
                    message["tool_calls"] = o.tool_calls_json(meta.request_id, i);
                }
                json!({"index": i, "message": message, "logprobs": logprobs,
                       "finish_reason": o.finish_reason(), "token_ids": o.ids})
            } else {
                json!({"index": i, "text": o.text, "logprobs": logprobs,
                       "finish_reason": o.finish_reason(), "token_ids": o.ids,
                       "prompt_token_ids": job.prompts[i / job.n]})
            }
        })
        .collect();
    m.insert("choices".into(), Json::Array(choices));
    m.insert("usage".into(), usage(job, outputs));
    if chat {
        m.insert("prompt_token_ids".into(), json!(job.prompts[0]));
    }
    Json::Object(m)
}

/// Splits sampled ids into stream pieces `(text delta, ids)`: a piece ends where the decoded
/// prefix is valid text (no dangling UTF-8), so deltas concatenate to the full text and ids
/// to the sampled ids.
pub fn stream_pieces(
    ids: &[u32],
    text: &str,
    tokenizer: &Tokenizer,
) -> crate::Result<Vec<(String, Vec<u32>)>> {
    let mut pieces = Vec::new();
    let (mut emitted, mut start) = (0usize, 0usize);
    for k in 1..=ids.len() {
        let prefix = tokenizer.decode(&ids[..k])?;
        let complete = !prefix.ends_with('\u{FFFD}') && prefix.len() >= emitted;
        if complete || k == ids.len() {
            // Never emit past the visible text (a stop string or the trailing stop id).
            let upto = prefix.len().min(text.len()).max(emitted);
            let delta = text.get(emitted..upto).unwrap_or_default().to_owned();
            emitted = upto;
            pieces.push((delta, ids[start..k].to_vec()));
            start = k;
        }
    }
    if emitted < text.len() {
        match pieces.last_mut() {
            Some(last) => last.0.push_str(&text[emitted..]),
            None => pieces.push((text[emitted..].to_owned(), Vec::new())),
        }
    }
    Ok(pieces)
}

/// The chunks of a stream, in order (without the final `[DONE]`). Chat: a role chunk per
/// choice with the prompt ids, then content deltas with their ids; the ids from the first
/// `<tool_call>` on travel in one chunk with the parsed `tool_calls`; then the finish chunk
/// and, when asked, the usage chunk.
pub fn chunks(
    job: &Job,
    outputs: &[Output],
    meta: &Meta<'_>,
    tokenizer: &Tokenizer,
) -> crate::Result<Vec<Json>> {
    let chat = job.route == Route::Chat;
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk = |choice: Json| {
        let mut m = meta.base(object);
        m.insert("choices".into(), json!([choice]));
        Json::Object(m)
    };
    let mut out = Vec::new();
    for (i, o) in outputs.iter().enumerate() {
        let prompt_ids = &job.prompts[i / job.n];
        if chat {
            let mut first = chunk(
                json!({"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": null, "finish_reason": null, "token_ids": []}),
            );
            first["prompt_token_ids"] = json!(prompt_ids);
            out.push(first);
        }
        // With tool calls, the prose streams as content and the rest goes in one chunk.
        let prose_len = match (&o.content, o.tool_calls.is_empty()) {
            (_, true) => o.text.len(),
            (Some(c), false) => c.len(),
            (None, false) => 0,
        };
        let mut offset = 0usize;
        let mut pos = 0usize;
        for (delta, ids) in stream_pieces(&o.ids, &o.text, tokenizer)? {
            let shown = delta.len().min(prose_len.saturating_sub(offset));
            offset += delta.len();
            let logprobs = job.logprobs.then(|| {
                logprobs_json(
                    job.route,
                    &ids,
                    &o.logprobs[pos..pos + ids.len()],
                    tokenizer,
                )
            });
            pos += ids.len();
            let mut c = if chat {
                let d = json!({"content": &delta[..shown]});
                chunk(json!({"index": i, "delta": d, "logprobs": logprobs,
                             "finish_reason": null, "token_ids": ids}))
            } else {
                chunk(json!({"index": i, "text": delta, "logprobs": logprobs,
                             "finish_reason": null, "token_ids": ids}))
            };
            if !chat
                && out
                    .iter()
                    .all(|c: &Json| c["choices"][0]["index"] != json!(i))
            {
                c["prompt_token_ids"] = json!(prompt_ids);
            }
            out.push(c);
        }
        let mut last = if chat {
            let mut delta = json!({});
            if !o.tool_calls.is_empty() {
                let calls = o.tool_calls_json(meta.request_id, i);
                let indexed: Vec<Json> = calls
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .enumerate()
                            .map(|(k, c)| {
                                let mut c = c.clone();
                                c["index"] = json!(k);
                                c
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                delta["tool_calls"] = Json::Array(indexed);
            }
            chunk(json!({"index": i, "delta": delta, "logprobs": null,
                         "finish_reason": o.finish_reason(), "token_ids": []}))
        } else {
            chunk(json!({"index": i, "text": "", "logprobs": null,
                         "finish_reason": o.finish_reason(), "token_ids": []}))
        };
        if out.is_empty() {
            last["prompt_token_ids"] = json!(prompt_ids);
        }
        out.push(last);
    }
    if job.include_usage {
        let mut m = meta.base(object);
        m.insert("choices".into(), json!([]));
        m.insert("usage".into(), usage(job, outputs));
        out.push(Json::Object(m));
    }
    Ok(out)
}
