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
//! Streams are made while sampling ([`ChoiceStream`]): each choice's chunks go out as its ids
//! are sampled, and its last chunks come from the same [`Output`] the non-streaming body is
//! made from.
//!
//! Extra fields, beside the OpenAI ones: `prompt_token_ids` (chat: top level, on each role
//! chunk of a stream; completions: per choice, on its first chunk), `token_ids` (per choice,
//! or per chunk), `policy_version` and `system_fingerprint = "cairn-v{version}"`, and
//! `cairn` (the episode receipt, added by the service).

use cairn_plugin_sdk::FinishReason;
use serde_json::{json, Value as Json};

use super::request::{Job, Route};
use cairn_kernel::backend::Generation;
use cairn_kernel::text::{parse_tool_calls, Tokenizer, ToolCall};

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
    ) -> cairn_kernel::Result<Output> {
        let Generation {
            mut ids,
            mut logprobs,
            mut finish_reason,
        } = generation;
        let visible = |ids: &[u32]| -> cairn_kernel::Result<String> {
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

/// The completions form of `logprobs` with each token as `token_id:N`
/// (`return_tokens_as_token_ids`, vLLM's extension).
fn token_id_logprobs_json(ids: &[u32], logprobs: &[f32]) -> Json {
    let tokens: Vec<String> = ids.iter().map(|id| format!("token_id:{id}")).collect();
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": null})
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
            let logprobs = job.logprobs.then(|| {
                if job.tokens_as_ids {
                    token_id_logprobs_json(&o.ids, &o.logprobs)
                } else {
                    logprobs_json(job.route, &o.ids, &o.logprobs, tokenizer)
                }
            });
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

fn stream_object(job: &Job) -> &'static str {
    match job.route {
        Route::Chat => "chat.completion.chunk",
        Route::Completions => "text_completion",
    }
}

/// A stream chunk holding one choice.
fn chunk(job: &Job, meta: &Meta<'_>, choice: Json) -> Json {
    let mut m = meta.base(stream_object(job));
    m.insert("choices".into(), json!([choice]));
    Json::Object(m)
}

/// Chat streams open each choice with `{"role": "assistant", "content": ""}` and no ids; this
/// chunk carries the prompt ids at the top level.
pub fn role_chunk(job: &Job, meta: &Meta<'_>, index: usize) -> Json {
    let mut c = chunk(
        job,
        meta,
        json!({"index": index, "delta": {"role": "assistant", "content": ""},
               "logprobs": null, "finish_reason": null, "token_ids": []}),
    );
    c["prompt_token_ids"] = json!(job.prompts[index / job.n]);
    c
}

/// The usage chunk that ends a stream with `stream_options.include_usage`.
pub fn usage_chunk(job: &Job, outputs: &[Output], meta: &Meta<'_>) -> Json {
    let mut m = meta.base(stream_object(job));
    m.insert("choices".into(), json!([]));
    m.insert("usage".into(), usage(job, outputs));
    Json::Object(m)
}

/// The earliest char boundary `p` where `text[p..]` is a non-empty proper prefix of `marker`:
/// text from there on may still become `marker`.
fn partial_suffix(text: &str, marker: &str) -> Option<usize> {
    let from = text.len().saturating_sub(marker.len().saturating_sub(1));
    (from..text.len()).find(|&p| text.is_char_boundary(p) && marker.starts_with(&text[p..]))
}

/// One choice of a stream in progress: what its chunks have carried so far.
///
/// While the choice samples, [`ChoiceStream::progress`] sends what is already certain: the
/// decoded text up to where it is complete UTF-8, short of any stop string (found, or
/// possibly starting at the end of the text), short of `<tool_call>` and the whitespace before
/// it when the request has tools; and the ids up to the last one, unless a stop string or
/// `<tool_call>` has appeared (the ids past it are decided when the choice ends). When the
/// choice ends, [`ChoiceStream::finish`] sends the rest from its [`Output`], the same one a
/// non-streaming request returns: the chunks' text concatenates to the output's content
/// (chat) or text (completions), and their ids to its ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoiceStream {
    /// Text the chunks carried.
    sent_text: String,
    /// Ids the chunks carried.
    sent_ids: usize,
    /// Completions: the prompt ids went out (in the choice's first chunk).
    announced: bool,
}

impl ChoiceStream {
    /// A content chunk for choice `index`, whose sampled prefix is `ids`/`logprobs` (`[L]`,
    /// the row not ended), when something new is certain; see the type's docs.
    pub fn progress(
        &mut self,
        job: &Job,
        meta: &Meta<'_>,
        index: usize,
        ids: &[u32],
        logprobs: &[f32],
        tokenizer: &Tokenizer,
    ) -> cairn_kernel::Result<Option<Json>> {
        let text = tokenizer.decode(ids)?;
        if text.ends_with('\u{FFFD}') || !text.starts_with(&self.sent_text) {
            return Ok(None); // a character is incomplete (or the decoder rewrote earlier text)
        }
        let mut bound = text.len();
        let mut hold_ids = false;
        if let Some(p) = first_stop(&text, &job.stop) {
            bound = p;
            hold_ids = true;
        }
        for s in &job.stop {
            if let Some(p) = partial_suffix(&text, s) {
                bound = bound.min(p);
            }
        }
        if job.parse_tools {
            let tool = text
                .find(TOOL_CALL_OPEN)
                .or_else(|| partial_suffix(&text, TOOL_CALL_OPEN));
            if let Some(p) = tool {
                bound = bound.min(p);
                hold_ids = true;
            }
            // Prose before a tool call is returned without its trailing whitespace.
            bound = text[..bound].trim_end().len();
        }
        let bound = bound.max(self.sent_text.len());
        let delta = &text[self.sent_text.len()..bound];
        let new_ids = if hold_ids {
            &ids[..0]
        } else {
            &ids[self.sent_ids.min(ids.len())..]
        };
        if delta.is_empty() && new_ids.is_empty() {
            return Ok(None);
        }
        let from = self.sent_ids;
        let c = self.content_chunk(
            job,
            meta,
            index,
            delta,
            new_ids,
            &logprobs[from..from + new_ids.len()],
            tokenizer,
        );
        self.sent_text.push_str(delta);
        self.sent_ids += new_ids.len();
        Ok(Some(c))
    }

    /// The last chunks of choice `index`, which ended with `output`: the rest of its text and
    /// ids, then the chunk with its finish reason (and, chat with tools, the parsed
    /// `tool_calls` with the ids not sent yet: those from the first `<tool_call>` on).
    pub fn finish(
        &mut self,
        job: &Job,
        meta: &Meta<'_>,
        index: usize,
        output: &Output,
        tokenizer: &Tokenizer,
    ) -> Vec<Json> {
        let chat = job.route == Route::Chat;
        let with_tools = chat && !output.tool_calls.is_empty();
        let content = match (chat, with_tools) {
            (true, true) => output.content.as_deref().unwrap_or(""),
            _ => output.text.as_str(),
        };
        let rest_text = match content.strip_prefix(self.sent_text.as_str()) {
            Some(rest) => rest,
            None => {
                tracing::warn!(
                    sent = %self.sent_text,
                    content,
                    "a streamed choice's text is not a prefix of its final text"
                );
                content.get(self.sent_text.len()..).unwrap_or("")
            }
        };
        let from = self.sent_ids.min(output.ids.len());
        let (rest_ids, rest_logprobs) = (&output.ids[from..], &output.logprobs[from..]);
        let mut out = Vec::new();
        let content_ids: &[u32] = if with_tools { &[] } else { rest_ids };
        if !rest_text.is_empty() || !content_ids.is_empty() {
            let lps = &rest_logprobs[..content_ids.len()];
            out.push(self.content_chunk(job, meta, index, rest_text, content_ids, lps, tokenizer));
        }
        let (last_ids, last_logprobs) = if with_tools {
            (rest_ids, rest_logprobs)
        } else {
            (&[][..], &[][..])
        };
        let logprobs = (job.logprobs && !last_ids.is_empty())
            .then(|| logprobs_json(job.route, last_ids, last_logprobs, tokenizer));
        let mut last = if chat {
            let mut delta = json!({});
            if with_tools {
                let calls = output.tool_calls_json(meta.request_id, index);
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
            chunk(
                job,
                meta,
                json!({"index": index, "delta": delta, "logprobs": logprobs,
                       "finish_reason": output.finish_reason(), "token_ids": last_ids}),
            )
        } else {
            chunk(
                job,
                meta,
                json!({"index": index, "text": "", "logprobs": logprobs,
                       "finish_reason": output.finish_reason(), "token_ids": last_ids}),
            )
        };
        self.announce(job, index, &mut last);
        self.sent_ids += last_ids.len();
        out.push(last);
        out
    }

    /// Completions: the choice's first chunk carries its prompt ids (in the choice, as in
    /// the non-streaming body).
    fn announce(&mut self, job: &Job, index: usize, c: &mut Json) {
        if job.route == Route::Completions && !std::mem::replace(&mut self.announced, true) {
            c["choices"][0]["prompt_token_ids"] = json!(job.prompts[index / job.n]);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn content_chunk(
        &mut self,
        job: &Job,
        meta: &Meta<'_>,
        index: usize,
        delta: &str,
        ids: &[u32],
        logprobs: &[f32],
        tokenizer: &Tokenizer,
    ) -> Json {
        let logprobs = job
            .logprobs
            .then(|| logprobs_json(job.route, ids, logprobs, tokenizer));
        let mut c = match job.route {
            Route::Chat => chunk(
                job,
                meta,
                json!({"index": index, "delta": {"content": delta}, "logprobs": logprobs,
                       "finish_reason": null, "token_ids": ids}),
            ),
            Route::Completions => chunk(
                job,
                meta,
                json!({"index": index, "text": delta, "logprobs": logprobs,
                       "finish_reason": null, "token_ids": ids}),
            ),
        };
        self.announce(job, index, &mut c);
        c
    }
}
