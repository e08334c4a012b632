//! Chat templates: Hugging Face `chat_template` Jinja rendered with minijinja so that the output
//! is byte-identical to `tokenizer.apply_chat_template(..., tokenize=False)`.
//!
//! [`ChatTemplate`] compiles one template in an environment set up like transformers'
//! `_cached_compile_jinja_template`: `trim_blocks` and `lstrip_blocks` on, a single trailing
//! newline of the source dropped (jinja2's `keep_trailing_newline=False`), no auto-escaping,
//! loop controls, Python string/dict methods through minijinja-contrib's pycompat callback, and
//! the helpers of [`super::template_fns`] (`tojson`, `raise_exception`, `strftime_now`). Maps
//! keep insertion order (minijinja's `preserve_order`), as Python dicts do.
//!
//! [`ChatTemplate::render`] mirrors `apply_chat_template`'s inputs: messages with `None`-valued
//! keys dropped and `reasoning`/`thinking` aliased to `reasoning_content`, `tools` (or `None`),
//! `documents=None`, `add_generation_prompt`, the tokenizer's named special tokens
//! (`bos_token`, `eos_token`, ...), then extra variables that override them. Callers:
//! [`super::trace`], the gateway and the rollout actor (through [`super::Tokenizer`]).

use std::fmt;
use std::sync::Arc;

use minijinja::{AutoEscape, Environment, Value};
use serde_json::{Map, Value as Json};

use super::template_fns::{self, CivilTime};
use crate::error::{Error, Result};

/// Everything a render takes besides the messages.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderOptions {
    /// Append the header that opens a new assistant turn (`<|im_start|>assistant\n`).
    pub add_generation_prompt: bool,
    /// Tool (function) schemas in OpenAI form; `None` reaches the template as `none`, as
    /// transformers passes `tools=None`.
    pub tools: Option<Vec<Json>>,
    /// Extra template variables (`enable_thinking`, `date_string`, `tools_in_user_message`...).
    /// They override the special tokens of the same name, as `apply_chat_template`'s kwargs do.
    pub extra: Map<String, Json>,
    /// The clock `strftime_now` reads; `None` reads the system clock (UTC). Pin it for
    /// reproducible renders.
    pub now: Option<CivilTime>,
}

/// A compiled chat template. Cheap to clone (the environment is shared).
#[derive(Clone)]
pub struct ChatTemplate {
    name: Arc<str>,
    env: Arc<Environment<'static>>,
    /// Named special tokens passed to every render (`bos_token`, `eos_token`, ...).
    special_tokens: Map<String, Json>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `name` identifies the template in errors (a file name, or
    /// `MODEL_DIR/tokenizer_config.json:chat_template`). A syntax error is
    /// [`Error::Template`] with the line.
    pub fn new(name: &str, source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", template_fns::tojson_filter);
        env.add_function("raise_exception", template_fns::raise_exception);
        env.add_function("strftime_now", template_fns::strftime_now);
        env.add_template_owned(name.to_owned(), source.to_owned())
            .map_err(|e| template_error(name, &e))?;
        Ok(ChatTemplate {
            name: name.into(),
            env: Arc::new(env),
            special_tokens: Map::new(),
        })
    }

    /// This template with the tokenizer's named special tokens (`bos_token`, `eos_token`,
    /// `pad_token`, ...) made available to every render, as transformers does.
    pub fn with_special_tokens(mut self, special_tokens: Map<String, Json>) -> ChatTemplate {
        self.special_tokens = special_tokens;
        self
    }

    /// The name errors use.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The special tokens every render sees.
    pub fn special_tokens(&self) -> &Map<String, Json> {
        &self.special_tokens
    }

    /// Renders `messages` (each a JSON object with at least `role`). Errors name the template,
    /// the line and the Jinja error (including a template's own `raise_exception` message).
    pub fn render(&self, messages: &[Json], options: &RenderOptions) -> Result<String> {
        let messages = normalize_messages(messages).map_err(|detail| Error::Template {
            name: self.name.to_string(),
            line: None,
            detail,
        })?;
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Json::Array(messages));
        ctx.insert(
            "tools".into(),
            options.tools.clone().map_or(Json::Null, Json::Array),
        );
        ctx.insert("documents".into(), Json::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(options.add_generation_prompt),
        );
        for (key, value) in self.special_tokens.iter().chain(&options.extra) {
            ctx.insert(key.clone(), value.clone());
        }
        if let Some(now) = options.now {
            ctx.insert(
                template_fns::NOW_VAR.into(),
                Json::from(now.to_unix_seconds()),
            );
        }
        let template = self
            .env
            .get_template(&self.name)
            .map_err(|e| template_error(&self.name, &e))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| template_error(&self.name, &e))
    }
}

/// What `apply_chat_template` does to messages before rendering: drop keys whose value is
/// `None`, and alias a message's reasoning under `thinking` (first) and `reasoning_content`.
fn normalize_messages(messages: &[Json]) -> std::result::Result<Vec<Json>, String> {
    const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
    messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let Json::Object(message) = message else {
                return Err(format!("message {i} is not a JSON object: {message}"));
            };
            let message: Map<String, Json> = message
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let reasoning = REASONING_FIELDS
                .iter()
                .find_map(|field| message.get(*field))
                .cloned();
            let Some(reasoning) = reasoning else {
                return Ok(Json::Object(message));
            };
            let mut aliased = Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            aliased.extend(message);
            aliased.insert("reasoning_content".into(), reasoning);
            Ok(Json::Object(aliased))
        })
        .collect()
}

fn template_error(name: &str, err: &minijinja::Error) -> Error {
    let detail = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    };
    Error::Template {
        name: name.to_owned(),
        line: err.line(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn render(source: &str, messages: Json, options: &RenderOptions) -> Result<String> {
        let messages = messages.as_array().cloned().unwrap_or_default();
        ChatTemplate::new("test.jinja", source)?.render(&messages, options)
    }

    #[test]
    fn trims_blocks_and_the_trailing_newline_like_jinja2() {
        let source = "{% for m in messages %}\n  {% if m.content %}\n[{{ m.role }}]\n  {% endif %}\n{% endfor %}\n";
        let out = render(
            source,
            json!([{"role": "user", "content": "hi"}, {"role": "x", "content": null}]),
            &RenderOptions::default(),
        );
        assert_eq!(out.ok().as_deref(), Some("[user]\n"));
    }

    #[test]
    fn reasoning_is_aliased_and_nulls_dropped() {
        let source = "{{ messages[0] | tojson }}";
        let out = render(
            source,
            json!([{"role": "assistant", "content": "4", "reasoning": "r", "tool_calls": null}]),
            &RenderOptions::default(),
        );
        assert_eq!(
            out.ok().as_deref(),
            Some(
                r#"{"thinking": "r", "role": "assistant", "content": "4", "reasoning": "r", "reasoning_content": "r"}"#
            )
        );
    }

    #[test]
    fn errors_name_template_and_line() {
        let err = ChatTemplate::new("broken.jinja", "line one\n{% if x %}\nno end")
            .map(|_| ())
            .err();
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.starts_with("chat template `broken.jinja`, line "),
            "{message}"
        );

        let source = "a\n{{ raise_exception('no tools here') }}";
        let err = render(source, json!([]), &RenderOptions::default())
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("chat template `test.jinja`, line 2: invalid operation: no tools here")
        );
    }
}
