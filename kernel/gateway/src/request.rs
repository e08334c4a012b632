//! OpenAI request bodies → a [`Job`]: prompt ids rendered by the model's chat template, and
//! the sampling parameters, checked.
//!
//! `/v1/chat/completions` renders `messages` (and `tools`) with the model's own template,
//! generation prompt appended; `/v1/completions` takes a string (tokenised as is, special
//! tokens matched) or token ids. Every check fails with an [`ApiError`] naming the parameter:
//! malformed JSON, an unknown model, `max_tokens < 1`, a prompt that does not fit the context
//! window, unsupported options (`top_logprobs`, completions' `logprobs` above 1, penalties,
//! `logit_bias`, `best_of`, `echo`).
//! Unknown keys that change nothing (`user`, `metadata`, ...) are ignored, as vLLM does.
//!
//! The work a request costs is bounded before it is done: a prompt text longer in bytes than
//! any prompt that fits ([`RequestSettings::prompt_byte_limit`]) is refused before it is
//! encoded, strings the gateway keeps or compares have [`MAX_FIELD_BYTES`], and a temperature
//! below [`MIN_TEMPERATURE`], which would make the divided logits infinite, is refused.
//!
//! vLLM's extensions that a rollout engine's client sends (docs/engine.md): `stop_token_ids`
//! (more stop ids, kept in the output), `ignore_eos` (not the model's own stop ids) and, for
//! completions, `return_tokens_as_token_ids`.
//!
//! Cairn's extensions: a `cairn` object in the body (`{"anchor": "..."}`: the GiGPO anchor
//! state of this turn) and, for episode calls under training, the sampling override of
//! [`RequestSettings::training_sampling`] (trl #4159: the trainer scores at the training
//! temperature, so episode calls are sampled at it whatever the request says).

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use super::api_error::ApiError;
use cairn_kernel::backend::SamplingParams;
pub use cairn_kernel::backend::MIN_TEMPERATURE;
use cairn_kernel::text::{arguments_to_objects, ChatFormat, Tokenizer};

/// Longest `model`, stop string or anchor key (`cairn.anchor`, `X-Cairn-Anchor`), bytes. An
/// anchor is kept on every row of its call; a harness with longer anchor states sends a hash.
pub const MAX_FIELD_BYTES: usize = 4096;

/// Up to 200 characters of a JSON value, for error messages (bodies may be megabytes).
fn shown(value: &Json) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text,
    }
}

/// Errors unless an anchor key fits [`MAX_FIELD_BYTES`] (`param`: where it came from).
pub fn check_anchor(param: &str, anchor: &str) -> Result<(), ApiError> {
    if anchor.len() > MAX_FIELD_BYTES {
        return Err(ApiError::string_too_long(
            param,
            anchor.len(),
            MAX_FIELD_BYTES,
        ));
    }
    Ok(())
}

/// What the request checks need to know about the served model.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSettings {
    /// The model id clients name (`/v1/models` lists it).
    pub model_name: String,
    /// Prompt + completion tokens the model takes at most.
    pub context_window: usize,
    /// `max_tokens` when a request gives none (capped by the context left).
    pub default_max_tokens: u32,
    /// Largest `n`.
    pub max_n: usize,
    /// `(temperature, top_p)` forced on episode calls while a trainer consumes the episodes.
    pub training_sampling: Option<(f32, f32)>,
}

/// Which route a job came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
}

/// A checked request, ready to sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub route: Route,
    /// Prompt ids, one per prompt (chat: one), `[P_i]`.
    pub prompts: Vec<Vec<u32>>,
    /// Choices per prompt.
    pub n: usize,
    /// Sampling for every choice; `seed` is meaningful when `seeded`.
    pub params: SamplingParams,
    /// The request fixed the seed: its choices are sampled in a batch of their own, so the
    /// same request gives the same ids.
    pub seeded: bool,
    /// Stop strings: the text is cut before the first one.
    pub stop: Vec<String>,
    /// Report per-token log-probs.
    pub logprobs: bool,
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Parse `<tool_call>` blocks of the output into `tool_calls` (chat with tools).
    pub parse_tools: bool,
    /// GiGPO anchor key of this turn.
    pub anchor: Option<String>,
    /// Stop ids beside the model's own (`stop_token_ids`); the stop id stays in the output.
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the model's own end-of-turn ids (`ignore_eos`).
    pub ignore_eos: bool,
    /// Completions' `logprobs.tokens` as `token_id:N` (`return_tokens_as_token_ids`).
    pub tokens_as_ids: bool,
    /// Text of the last message (what the policy acts on), for rows.
    pub observation: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

/// The parameters both routes share (unknown keys ignored).
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    stop: Option<Stop>,
    n: Option<i64>,
    seed: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<Json>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    logit_bias: Option<Map<String, Json>>,
    /// vLLM's extensions: more stop ids (kept in the output), and no stop at the model's own
    /// end-of-turn ids.
    stop_token_ids: Option<Vec<i64>>,
    ignore_eos: Option<bool>,
    cairn: Option<Extension>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Extension {
    anchor: Option<String>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Option<Vec<Json>>,
    tools: Option<Vec<Json>>,
    tool_choice: Option<Json>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
struct CompletionBody {
    /// Read as JSON first, so that a prompt of the wrong shape gets an error naming `prompt`.
    prompt: Option<Json>,
    logprobs: Option<i64>,
    echo: Option<bool>,
    best_of: Option<i64>,
    suffix: Option<String>,
    return_tokens_as_token_ids: Option<bool>,
    #[serde(flatten)]
    common: Common,
}

/// Parses a request body as `T`. A value of the wrong type is a 400 `invalid_type` whose
/// `param` is the value's path (`temperature`, `messages`, `messages[0].content`) and whose
/// message names it; a body that is not JSON, or not an object, is a 400 `invalid_json` on
/// `body`. The gateway's other JSON routes (episodes, rewards, `/tokenize`, weight loading)
/// parse their bodies here too.
pub(crate) fn parse_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(value) => de.end().map(|()| value).map_err(|e| body_error(&e)),
        // A field's path starts with its key; a path from an index is a body sent as an array.
        Err(e)
            if matches!(
                e.path().iter().next(),
                Some(serde_path_to_error::Segment::Map { .. })
            ) && e.inner().is_data() =>
        {
            Err(type_error(&e.path().to_string(), e.inner()))
        }
        Err(e) => Err(body_error(e.inner())),
    }
}

/// A wrong type at `path`: a 400 naming it.
fn type_error(path: &str, e: &serde_json::Error) -> ApiError {
    ApiError::invalid(
        path,
        format!("could not parse the request: `{path}` has the wrong type: {e}"),
    )
    .with_code("invalid_type")
}

/// A body that does not parse as a whole: a 400 on `body`.
fn body_error(e: &serde_json::Error) -> ApiError {
    let what = if e.is_data() {
        "the body does not match the route's parameters"
    } else {
        "the body is not valid JSON"
    };
    ApiError::invalid("body", format!("could not parse the request: {what}: {e}"))
        .with_code("invalid_json")
}

/// [`parse_body`] for the completion routes, whose shared parameters ([`Common`]) are
/// flattened into each body: serde reads a flattened struct from a buffer, which loses the
/// path of an error in it, so such an error is located by reading [`Common`] alone (it
/// ignores the other keys). Only a failed parse pays for the second read.
fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    parse_body::<T>(body).map_err(|e| {
        if e.code.as_deref() == Some("invalid_json") {
            if let Err(located) = parse_body::<Common>(body) {
                if located.code.as_deref() == Some("invalid_type") {
                    return located;
                }
            }
        }
        e
    })
}

/// The text of a message's `content`: a string, `null`, or a list of `{"type": "text"}` parts.
fn content_text(content: Option<&Json>, index: usize) -> Result<Option<String>, ApiError> {
    match content {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(text)) => Ok(Some(text.clone())),
        Some(Json::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Json::as_str), part.get("text")) {
                    (Some("text"), Some(Json::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("messages[{index}].content"),
                            "only text content parts are supported",
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
        Some(other) => Err(ApiError::invalid(
            &format!("messages[{index}].content"),
            format!(
                "content must be a string or a list of text parts, got {}",
                shown(other)
            ),
        )),
    }
}

/// Checks the messages and puts them in the form chat templates read: string content
/// (`""` for an assistant turn that only calls tools), tool-call arguments as objects.
fn template_messages(messages: Vec<Json>) -> Result<(Vec<Json>, String), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    let mut last_text = String::new();
    for (i, message) in messages.into_iter().enumerate() {
        let Json::Object(mut message) = message else {
            return Err(ApiError::invalid(
                &format!("messages[{i}]"),
                "each message must be a JSON object",
            ));
        };
        match message.get("role").and_then(Json::as_str) {
            Some("system" | "user" | "assistant" | "tool" | "developer") => {}
            _ => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    "role must be one of system, developer, user, assistant, tool",
                ))
            }
        }
        let text = content_text(message.get("content"), i)?;
        last_text = text.clone().unwrap_or_default();
        message.insert("content".into(), Json::String(text.unwrap_or_default()));
        out.push(Json::Object(message));
    }
    arguments_to_objects(&mut out);
    Ok((out, last_text))
}

impl RequestSettings {
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m.len() > MAX_FIELD_BYTES => {
                Err(ApiError::string_too_long("model", m.len(), MAX_FIELD_BYTES))
            }
            Some(m) if m == self.model_name => Ok(()),
            Some(m) => Err(ApiError::not_found(format!(
                "the model `{m}` does not exist; this gateway serves `{}`",
                self.model_name
            ))
            .with_param("model")
            .with_code("model_not_found")),
            None => Err(ApiError::invalid("model", "`model` is required")),
        }
    }

    /// Sampling parameters, `n`, stop strings and stream flags shared by both routes.
    fn common(
        &self,
        c: &Common,
        in_episode: bool,
        prompt_param: &str,
        prompt_len: usize,
    ) -> Result<(SamplingParams, usize, bool, Vec<String>), ApiError> {
        self.check_model(c.model.as_deref())?;
        for (name, value) in [
            ("frequency_penalty", c.frequency_penalty),
            ("presence_penalty", c.presence_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(name, format!("{name} is not supported")));
            }
        }
        if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias is not supported",
            ));
        }
        let mut temperature = c.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("temperature must be in [0, 2], got {temperature}"),
            ));
        }
        if temperature > 0.0 && temperature < MIN_TEMPERATURE {
            return Err(ApiError::invalid(
                "temperature",
                format!(
                    "temperature {temperature:e} is below {MIN_TEMPERATURE:e}: the logits \
                     divided by it are not finite numbers; send 0 for greedy sampling"
                ),
            ));
        }
        let mut top_p = c.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        if let (true, Some((t, p))) = (in_episode, self.training_sampling) {
            temperature = t;
            top_p = p;
        }
        let n = c.n.unwrap_or(1);
        if n < 1 || n as usize > self.max_n {
            return Err(ApiError::invalid(
                "n",
                format!("n must be in [1, {}], got {n}", self.max_n),
            ));
        }
        let asked = c.max_tokens.or(c.max_completion_tokens);
        if prompt_len >= self.context_window {
            let asked = asked.filter(|&m| m >= 1).map(|m| m as u64);
            return Err(self.too_long(prompt_param, prompt_len, asked));
        }
        let room = self.context_window - prompt_len;
        let max_tokens = match asked {
            Some(m) if m < 1 => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("max_tokens must be at least 1, got {m}"),
                )
                .with_code("integer_below_min_value"))
            }
            Some(m) if m as u64 > room as u64 => {
                return Err(self.too_long(prompt_param, prompt_len, Some(m as u64)));
            }
            Some(m) => m as u32,
            None => self.default_max_tokens.min(room as u32),
        };
        let stop = match &c.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "stop takes at most 4 non-empty strings",
            ));
        }
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_FIELD_BYTES) {
            return Err(ApiError::string_too_long(
                "stop",
                long.len(),
                MAX_FIELD_BYTES,
            ));
        }
        if let Some(anchor) = c.cairn.as_ref().and_then(|c| c.anchor.as_deref()) {
            check_anchor("cairn.anchor", anchor)?;
        }
        let params = SamplingParams {
            temperature,
            top_p,
            max_new_tokens: max_tokens,
            stop_ids: Vec::new(),
            seed: c.seed.map_or(0, |s| s as u64),
        };
        Ok((params, n as usize, c.seed.is_some(), stop))
    }

    /// The 400 of a request past the context window: names the window, the prompt's tokens
    /// and `max_tokens` (when the request gave one).
    fn too_long(&self, param: &str, prompt: usize, max_tokens: Option<u64>) -> ApiError {
        let window = self.context_window;
        let message = match max_tokens {
            Some(m) => format!(
                "this model's maximum context length is {window} tokens, but the request needs \
                 {}: {prompt} prompt tokens + max_tokens {m}; shorten the prompt or lower \
                 max_tokens",
                prompt as u64 + m
            ),
            None => format!(
                "this model's maximum context length is {window} tokens, but the prompt has \
                 {prompt} tokens, which leaves no room for a completion; shorten the prompt"
            ),
        };
        ApiError::invalid(param, message).with_code("context_length_exceeded")
    }

    /// The most bytes a prompt text may have, `None` when the tokenizer bounds no bytes per
    /// token ([`Tokenizer::max_token_bytes`]). Every token stands for at most that many bytes,
    /// so a longer text has more tokens than the context window takes: refusing it never
    /// refuses a prompt that would fit.
    pub fn prompt_byte_limit(&self, tokenizer: &Tokenizer) -> Option<usize> {
        tokenizer
            .max_token_bytes()
            .map(|per_token| self.context_window.saturating_mul(per_token))
    }

    /// Errors (400 `context_length_exceeded` on `param`) when a text of `bytes` bytes cannot
    /// fit the context window ([`RequestSettings::prompt_byte_limit`]): checked before the
    /// text is encoded, so an oversized prompt costs no tokenizer time or memory.
    pub fn check_prompt_bytes(
        &self,
        param: &str,
        bytes: usize,
        tokenizer: &Tokenizer,
    ) -> Result<(), ApiError> {
        match self.prompt_byte_limit(tokenizer) {
            Some(limit) if bytes > limit => Err(ApiError::invalid(
                param,
                format!(
                    "this model's maximum context length is {} tokens, and a token of its \
                     tokenizer stands for at most {} bytes of text, so no prompt over {limit} \
                     bytes fits; this one has {bytes}; shorten the prompt",
                    self.context_window,
                    limit / self.context_window.max(1),
                ),
            )
            .with_code("context_length_exceeded")),
            _ => Ok(()),
        }
    }

    /// Parses a `/v1/chat/completions` body.
    pub fn chat(
        &self,
        body: &[u8],
        format: &ChatFormat,
        in_episode: bool,
    ) -> Result<Job, ApiError> {
        let body: ChatBody = parse_json(body)?;
        self.check_model(body.common.model.as_deref())?;
        if body.top_logprobs.is_some_and(|k| k > 0) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs is not supported: the gateway reports the log-prob of each \
                 sampled token (logprobs: true)",
            ));
        }
        let tools_off = match &body.tool_choice {
            None => false,
            Some(Json::String(s)) if s == "auto" => false,
            Some(Json::String(s)) if s == "none" => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice {} is not supported (use \"auto\" or \"none\")",
                        shown(other)
                    ),
                ))
            }
        };
        let (messages, observation) = template_messages(
            body.messages
                .ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?,
        )?;
        let tools = body.tools.filter(|t| !t.is_empty() && !tools_off);
        // Rendering is a copy of the messages; encoding is what a huge prompt makes costly.
        let text = format.prompt_text(&messages, tools.as_deref())?;
        self.check_prompt_bytes("messages", text.len(), format.tokenizer())?;
        let prompt = format.tokenizer().encode(&text)?;
        let (params, n, seeded, stop) =
            self.common(&body.common, in_episode, "messages", prompt.len())?;
        Ok(Job {
            route: Route::Chat,
            prompts: vec![prompt],
            n,
            params,
            seeded,
            stop,
            logprobs: body.logprobs.unwrap_or(false),
            stream: body.common.stream.unwrap_or(false),
            include_usage: include_usage(&body.common),
            parse_tools: tools.is_some(),
            stop_token_ids: stop_token_ids(&body.common, format.tokenizer().vocab_size())?,
            ignore_eos: body.common.ignore_eos.unwrap_or(false),
            tokens_as_ids: false,
            anchor: body.common.cairn.and_then(|c| c.anchor),
            observation,
        })
    }

    /// Parses a `/v1/completions` body.
    pub fn completion(
        &self,
        body: &[u8],
        format: &ChatFormat,
        in_episode: bool,
    ) -> Result<Job, ApiError> {
        let body: CompletionBody = parse_json(body)?;
        self.check_model(body.common.model.as_deref())?;
        if let Some(k) = body.logprobs.filter(|k| !(0..=1).contains(k)) {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "logprobs {k} is not supported: the gateway reports the log-prob of each \
                     sampled token only (send logprobs: 0 or 1)"
                ),
            ));
        }
        if body.echo == Some(true) || body.best_of.is_some_and(|b| b > 1) || body.suffix.is_some() {
            return Err(ApiError::invalid(
                "echo",
                "echo, best_of and suffix are not supported",
            ));
        }
        let vocab = format.tokenizer().vocab_size();
        let ids = |list: Vec<i64>| -> Result<Vec<u32>, ApiError> {
            list.into_iter()
                .map(|id| match u32::try_from(id) {
                    Ok(id) if (id as usize) < vocab => Ok(id),
                    _ => Err(ApiError::invalid(
                        "prompt",
                        format!("token id {id} is outside the vocabulary (0..{vocab})"),
                    )),
                })
                .collect()
        };
        let encode = |text: &str| format.tokenizer().encode(text).map_err(ApiError::from);
        let prompt = match body.prompt {
            None | Some(Json::Null) => {
                return Err(ApiError::invalid("prompt", "`prompt` is required"))
            }
            Some(json) => serde_json::from_value::<Prompt>(json).map_err(|_| {
                ApiError::invalid(
                    "prompt",
                    "`prompt` must be a string, a list of strings, a list of token ids \
                     (integers) or a list of such lists",
                )
            })?,
        };
        // Bounded before anything is encoded: the number of prompts (`n` >= 1), a text's
        // bytes, a list's ids.
        let count = match &prompt {
            Prompt::Texts(ts) => ts.len(),
            Prompt::IdLists(lists) => lists.len(),
            Prompt::Text(_) | Prompt::Ids(_) => 1,
        };
        if count > self.max_n * 4 {
            return Err(ApiError::invalid(
                "prompt",
                format!("at most {} prompts × n per request", self.max_n * 4),
            ));
        }
        let tokenizer = format.tokenizer();
        let asked = (body.common.max_tokens)
            .or(body.common.max_completion_tokens)
            .filter(|&m| m >= 1)
            .map(|m| m as u64);
        match &prompt {
            Prompt::Text(t) => self.check_prompt_bytes("prompt", t.len(), tokenizer)?,
            Prompt::Texts(ts) => {
                for t in ts {
                    self.check_prompt_bytes("prompt", t.len(), tokenizer)?;
                }
            }
            Prompt::Ids(list) if list.len() >= self.context_window => {
                return Err(self.too_long("prompt", list.len(), asked))
            }
            Prompt::IdLists(lists) => {
                if let Some(list) = lists.iter().find(|l| l.len() >= self.context_window) {
                    return Err(self.too_long("prompt", list.len(), asked));
                }
            }
            Prompt::Ids(_) => {}
        }
        let (prompts, observation) = match prompt {
            Prompt::Text(t) => (vec![encode(&t)?], t),
            Prompt::Texts(ts) => (
                ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
                ts.last().cloned().unwrap_or_default(),
            ),
            Prompt::Ids(list) => (vec![ids(list)?], String::new()),
            Prompt::IdLists(lists) => (
                lists.into_iter().map(ids).collect::<Result<_, _>>()?,
                String::new(),
            ),
        };
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(ApiError::invalid(
                "prompt",
                "every prompt needs at least one token",
            ));
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let (params, n, seeded, stop) = self.common(&body.common, in_episode, "prompt", longest)?;
        if prompts.len() * n > self.max_n * 4 {
            return Err(ApiError::invalid(
                "prompt",
                format!("at most {} prompts × n per request", self.max_n * 4),
            ));
        }
        Ok(Job {
            route: Route::Completions,
            prompts,
            n,
            params,
            seeded,
            stop,
            logprobs: body.logprobs.is_some(),
            stream: body.common.stream.unwrap_or(false),
            include_usage: include_usage(&body.common),
            parse_tools: false,
            stop_token_ids: stop_token_ids(&body.common, vocab)?,
            ignore_eos: body.common.ignore_eos.unwrap_or(false),
            tokens_as_ids: body.return_tokens_as_token_ids.unwrap_or(false),
            anchor: body.common.cairn.and_then(|c| c.anchor),
            observation,
        })
    }
}

/// `stop_token_ids`, each checked against the vocabulary.
fn stop_token_ids(c: &Common, vocab: usize) -> Result<Vec<u32>, ApiError> {
    c.stop_token_ids
        .iter()
        .flatten()
        .map(|&id| match u32::try_from(id) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => Err(ApiError::invalid(
                "stop_token_ids",
                format!("token id {id} is outside the vocabulary (0..{vocab})"),
            )),
        })
        .collect()
}

fn include_usage(c: &Common) -> bool {
    c.stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Json::as_bool)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `(param, code)` of parsing `body` as `T`, and its message.
    fn refusal<'a, T: Deserialize<'a>>(
        parse: fn(&'a [u8]) -> Result<T, ApiError>,
        body: &'a str,
    ) -> (String, String, String) {
        let Err(e) = parse(body.as_bytes()) else {
            panic!("{body}: parsed")
        };
        (
            e.param.unwrap_or_default(),
            e.code.unwrap_or_default(),
            e.message,
        )
    }

    /// A value of the wrong type is named by its field, also the shared parameters that serde
    /// reads from a flattened buffer (`temperature`, `max_tokens`); bad JSON is the body's.
    #[test]
    fn a_wrong_type_is_named_by_its_field() {
        for (body, param) in [
            (
                r#"{"model": "cairn", "messages": [], "temperature": "hot"}"#,
                "temperature",
            ),
            (r#"{"model": "cairn", "messages": "hi"}"#, "messages"),
            (
                r#"{"model": "cairn", "messages": [], "max_tokens": 1e23}"#,
                "max_tokens",
            ),
            (
                r#"{"model": "cairn", "messages": [], "cairn": {"anchor": 5}}"#,
                "cairn.anchor",
            ),
        ] {
            let (got, code, message) = refusal(parse_json::<ChatBody>, body);
            assert_eq!(
                (got.as_str(), code.as_str()),
                (param, "invalid_type"),
                "{body}"
            );
            assert!(
                message.contains(&format!("`{param}` has the wrong type")),
                "{message}"
            );
        }
        let (param, code, message) = refusal(
            parse_json::<CompletionBody>,
            r#"{"model": "cairn", "prompt": "x", "temperature": "hot"}"#,
        );
        assert_eq!(
            (param.as_str(), code.as_str()),
            ("temperature", "invalid_type")
        );
        assert!(message.contains("expected f32"), "{message}");
        for body in [
            r#"{"model": "cairn", "messages": ["#,
            "[1]",
            r#"{"a": 1} x"#,
        ] {
            let (param, code, _) = refusal(parse_json::<ChatBody>, body);
            assert_eq!(
                (param.as_str(), code.as_str()),
                ("body", "invalid_json"),
                "{body}"
            );
        }
    }

    /// The episode routes' bodies (parsed by [`parse_body`] too): a reward of the wrong type
    /// is named; a missing one is the body's.
    #[test]
    fn episode_bodies_name_the_field() {
        use super::super::RewardBody;
        let (param, code, _) = refusal(parse_body::<RewardBody>, r#"{"reward": "high"}"#);
        assert_eq!((param.as_str(), code.as_str()), ("reward", "invalid_type"));
        let (param, code, message) = refusal(parse_body::<RewardBody>, "{}");
        assert_eq!((param.as_str(), code.as_str()), ("body", "invalid_json"));
        assert!(message.contains("missing field `reward`"), "{message}");
    }
}
