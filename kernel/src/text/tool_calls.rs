//! Tool calls in Qwen/Hermes format: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
//! blocks in assistant text, parsed into OpenAI-style calls (name plus arguments as a JSON
//! string), and the Qwen3 `<think>` split.
//!
//! Parsing is for the environment and the gateway's response; it never feeds training ids
//! (those stay as sampled, see [`super::trace`]). Rendering calls back into a prompt is the
//! chat template's job: [`ToolCall::to_template`] and [`arguments_to_objects`] give templates the
//! object-valued `arguments` that Qwen2.5 and Llama 3.1 expect (they `tojson` them).

use serde_json::{json, Value as Json};

use super::template_fns::{py_json_dumps, JsonDumps};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One function call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text, written as Python's `json.dumps(ensure_ascii=False)` does
    /// (what vLLM's Hermes parser returns); `"{}"` when the call has none.
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI chat-completions form: `{"id", "type": "function", "function": {...}}`.
    pub fn to_openai(&self, id: &str) -> Json {
        let function = json!({"name": self.name, "arguments": self.arguments});
        json!({"id": id, "type": "function", "function": function})
    }

    /// The form chat templates expect in `message.tool_calls`: arguments as a JSON object
    /// (kept as a string when they do not parse).
    pub fn to_template(&self) -> Json {
        let arguments = serde_json::from_str::<Json>(&self.arguments)
            .unwrap_or_else(|_| Json::String(self.arguments.clone()));
        json!({"type": "function", "function": {"name": self.name, "arguments": arguments}})
    }
}

/// A `<tool_call>` block that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedToolCall {
    /// The block's text between the tags (or to the end of the text when unterminated).
    pub raw: String,
    pub reason: String,
}

/// An assistant turn split into prose and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedTurn {
    /// The text outside the `<tool_call>` blocks, trimmed.
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub malformed: Vec<MalformedToolCall>,
}

/// Extracts every `<tool_call>...</tool_call>` block of `text`. A block must hold a JSON
/// object with a string `name` and optional `arguments` (object, or a string kept verbatim;
/// `parameters` is accepted as an alias). Bad or unterminated blocks land in `malformed`.
pub fn parse_tool_calls(text: &str) -> ParsedTurn {
    let mut parsed = ParsedTurn::default();
    let mut content = String::new();
    let mut rest = text;
    while let Some(open) = rest.find(OPEN) {
        content.push_str(&rest[..open]);
        let body_and_rest = &rest[open + OPEN.len()..];
        let Some(close) = body_and_rest.find(CLOSE) else {
            parsed.malformed.push(MalformedToolCall {
                raw: body_and_rest.to_owned(),
                reason: format!("unterminated {OPEN} (no {CLOSE})"),
            });
            rest = "";
            break;
        };
        let body = &body_and_rest[..close];
        match parse_call(body.trim()) {
            Ok(call) => parsed.tool_calls.push(call),
            Err(reason) => parsed.malformed.push(MalformedToolCall {
                raw: body.to_owned(),
                reason,
            }),
        }
        rest = &body_and_rest[close + CLOSE.len()..];
    }
    content.push_str(rest);
    parsed.content = content.trim().to_owned();
    parsed
}

fn parse_call(body: &str) -> Result<ToolCall, String> {
    let value: Json = serde_json::from_str(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let Json::Object(call) = value else {
        return Err("expected a JSON object".into());
    };
    let name = call
        .get("name")
        .and_then(Json::as_str)
        .ok_or("missing string `name`")?
        .to_owned();
    let arguments = match call.get("arguments").or_else(|| call.get("parameters")) {
        None | Some(Json::Null) => "{}".to_owned(),
        Some(Json::String(text)) => text.clone(),
        Some(arguments) => py_json_dumps(arguments, &JsonDumps::default()),
    };
    Ok(ToolCall { name, arguments })
}

/// Splits a Qwen3 turn into `(reasoning, content)` exactly as the Qwen3 chat template does:
/// given a `</think>`, content is the text after the last `</think>` without leading newlines,
/// and reasoning the text before the first `</think>`, after the last `<think>` in it, with
/// newlines trimmed at both ends.
pub fn split_reasoning(text: &str) -> (Option<String>, String) {
    if !text.contains("</think>") {
        return (None, text.to_owned());
    }
    let before = text.split("</think>").next().unwrap_or_default();
    let after = text.rsplit("</think>").next().unwrap_or_default();
    let reasoning = before
        .trim_end_matches('\n')
        .rsplit("<think>")
        .next()
        .unwrap_or_default()
        .trim_start_matches('\n');
    (
        Some(reasoning.to_owned()),
        after.trim_start_matches('\n').to_owned(),
    )
}

/// Rewrites every `tool_calls[*].function.arguments` (and `tool_calls[*].arguments`) that is a
/// JSON string holding an object into that object, in place: OpenAI clients send strings,
/// while templates such as Qwen2.5's apply `tojson` to them.
pub fn arguments_to_objects(messages: &mut [Json]) {
    for message in messages {
        let Some(Json::Array(calls)) = message.get_mut("tool_calls") else {
            continue;
        };
        for call in calls {
            let holder = match call.get("function") {
                Some(Json::Object(_)) => call.get_mut("function"),
                _ => Some(call),
            };
            let Some(Json::Object(holder)) = holder else {
                continue;
            };
            if let Some(Json::String(text)) = holder.get("arguments") {
                if let Ok(object @ Json::Object(_)) = serde_json::from_str::<Json>(text) {
                    holder.insert("arguments".into(), object);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_reasoning_like_the_qwen3_template() {
        assert_eq!(
            split_reasoning("<think>\nplan\n</think>\n\n42"),
            (Some("plan".into()), "42".into())
        );
        assert_eq!(split_reasoning("no think"), (None, "no think".into()));
        assert_eq!(
            split_reasoning("a</think>b</think>\nc"),
            (Some("a".into()), "c".into())
        );
    }

    #[test]
    fn arguments_become_objects() {
        let mut messages = vec![json!({"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"function": {"name": "g", "arguments": "not json"}}
        ]})];
        arguments_to_objects(&mut messages);
        assert_eq!(
            messages[0]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        assert_eq!(
            messages[0]["tool_calls"][1]["function"]["arguments"],
            json!("not json")
        );
    }
}
