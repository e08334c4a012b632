//! JSON replies: a requester can say "the reply must be a JSON object with these keys", and
//! the model-backed reflectors re-ask when a reply is not (docs/skills.md, "JSON replies").
//!
//! The request carries the format in its `extra` under [`REPLY_FORMAT_KEY`], so it crosses the
//! plugin ABI as JSON with no new field:
//!
//! ```json
//! {"reply_format": {"json_keys": {"episode_skill": "string", "step_skills": "object"},
//!                   "retries": 2, "text_key": "episode_skill"}}
//! ```
//!
//! - `json_keys` (required): the keys the object must have, as an object `key → type` (types:
//!   `string` — a string that is not blank, `object`, `array`, `number`, `boolean`, `any`) or
//!   as a list of names (each `any`). Other keys in the reply are allowed and kept.
//! - `retries` (default [`DEFAULT_RETRIES`], at most [`MAX_RETRIES`]): how many times an
//!   invalid reply is re-asked; the re-ask repeats the prompt with the reason and the invalid
//!   reply. After the last invalid reply the reflection fails as unparseable.
//! - `text_key` (optional): a `string` key whose value becomes the entry's text; without it
//!   the text is the whole object as compact JSON.
//!
//! The accepted object is stored on the entry's `extra` as `reply`, with `reply_attempts`.
//! This is the mechanism of OPID's analyzer (arXiv 2606.26790; github jinyangwu/OPID,
//! `opid/analysis.py`: invalid JSON is re-asked, and a final failure gives no teacher signal).

use serde_json::{Map, Value};

use super::{Draft, ReflectionFailure};

/// The `extra` key of a [`cairn_plugin_sdk::ReflectionRequest`] that holds its reply format.
pub const REPLY_FORMAT_KEY: &str = "reply_format";
/// Re-asks after an invalid reply when the format does not say.
pub const DEFAULT_RETRIES: u32 = 2;
/// The most re-asks a format may ask for.
pub const MAX_RETRIES: u32 = 10;
/// Characters of an invalid reply quoted back in a re-ask (its end, where a cut-off reply
/// went wrong).
const QUOTED_CHARS: usize = 2000;
/// JSON objects tried at most per reply (each try parses from one `{`).
const MAX_TRIES: usize = 64;

/// The JSON type a key's value must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonType {
    /// A string that is not empty after trimming.
    String,
    Object,
    Array,
    Number,
    Boolean,
    /// Any value, `null` included.
    Any,
}

impl JsonType {
    fn parse(name: &str) -> Option<JsonType> {
        Some(match name {
            "string" => JsonType::String,
            "object" => JsonType::Object,
            "array" => JsonType::Array,
            "number" => JsonType::Number,
            "boolean" => JsonType::Boolean,
            "any" => JsonType::Any,
            _ => return None,
        })
    }

    /// How the instruction names the type.
    fn words(self) -> &'static str {
        match self {
            JsonType::String => "a non-empty string",
            JsonType::Object => "a JSON object",
            JsonType::Array => "a JSON array",
            JsonType::Number => "a number",
            JsonType::Boolean => "true or false",
            JsonType::Any => "any JSON value",
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            JsonType::String => value.as_str().is_some_and(|s| !s.trim().is_empty()),
            JsonType::Object => value.is_object(),
            JsonType::Array => value.is_array(),
            JsonType::Number => value.is_number(),
            JsonType::Boolean => value.is_boolean(),
            JsonType::Any => true,
        }
    }
}

/// A parsed `reply_format` (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonReply {
    /// The required keys and their types, in the order the format lists them.
    pub keys: Vec<(String, JsonType)>,
    /// Re-asks after an invalid reply.
    pub retries: u32,
    /// The `string` key whose value is the entry's text.
    pub text_key: Option<String>,
}

impl JsonReply {
    /// The format of a request: `None` when its `extra` has no `reply_format` (the entry is
    /// then read with [`super::parse_reply`]); an error naming the key when it is malformed.
    pub fn of(
        request: &cairn_plugin_sdk::ReflectionRequest,
    ) -> Result<Option<JsonReply>, ReflectionFailure> {
        match request.extra.get(REPLY_FORMAT_KEY) {
            None => Ok(None),
            Some(value) => JsonReply::from_value(value).map(Some).map_err(|e| {
                ReflectionFailure::error(format!(
                    "the request's `extra.{REPLY_FORMAT_KEY}` is not a valid reply format: {e}"
                ))
            }),
        }
    }

    /// Parses a `reply_format` object; the error names the offending key.
    pub fn from_value(value: &Value) -> Result<JsonReply, String> {
        let Value::Object(map) = value else {
            return Err("it must be a JSON object with `json_keys`".into());
        };
        if let Some(k) = map
            .keys()
            .find(|k| !matches!(k.as_str(), "json_keys" | "retries" | "text_key"))
        {
            return Err(format!(
                "unknown key `{k}` (the keys are `json_keys`, `retries`, `text_key`)"
            ));
        }
        let keys: Vec<(String, JsonType)> = match map.get("json_keys") {
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| match n.as_str() {
                    Some(s) if !s.is_empty() => Ok((s.to_string(), JsonType::Any)),
                    _ => Err(format!(
                        "`json_keys` lists {n}, which is not a non-empty string"
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Object(typed)) => typed
                .iter()
                .map(|(k, t)| match t.as_str().and_then(JsonType::parse) {
                    Some(ty) if !k.is_empty() => Ok((k.clone(), ty)),
                    _ if k.is_empty() => Err("`json_keys` has an empty key".to_string()),
                    _ => Err(format!(
                        "`json_keys.{k}` is {t}; a type is one of \"string\", \"object\", \
                         \"array\", \"number\", \"boolean\", \"any\""
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(format!(
                    "`json_keys` is {other}; give a list of key names or an object of key → type"
                ))
            }
            None => return Err("`json_keys` is missing".into()),
        };
        if keys.is_empty() {
            return Err("`json_keys` is empty; name at least one key".into());
        }
        let retries = match map.get("retries") {
            None => DEFAULT_RETRIES,
            Some(v) => match v.as_u64() {
                Some(n) if n <= u64::from(MAX_RETRIES) => n as u32,
                _ => {
                    return Err(format!(
                        "`retries` is {v}; it must be an integer from 0 to {MAX_RETRIES}"
                    ))
                }
            },
        };
        let text_key = match map.get("text_key") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) => {
                if !keys
                    .iter()
                    .any(|(name, ty)| name == k && *ty == JsonType::String)
                {
                    return Err(format!(
                        "`text_key` is \"{k}\", which is not a `string` key of `json_keys`"
                    ));
                }
                Some(k.clone())
            }
            Some(other) => return Err(format!("`text_key` is {other}; give a key name")),
        };
        Ok(JsonReply {
            keys,
            retries,
            text_key,
        })
    }

    /// The `"a" (a non-empty string), "b" (a JSON object)` list of the instruction.
    fn key_list(&self) -> String {
        self.keys
            .iter()
            .map(|(k, ty)| format!("\"{k}\" ({})", ty.words()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The instruction that ends a prompt with this format (instead of
    /// [`super::REPLY_FORMAT`]).
    pub fn instruction(&self) -> String {
        format!(
            "Answer with one JSON object and nothing else. It must have the keys {}.",
            self.key_list()
        )
    }

    /// The prompt of a re-ask after `reply` failed for `reason`: the first prompt, the reason,
    /// the end of the invalid reply, and the instruction again.
    pub fn reask(&self, prompt: &str, reply: &str, reason: &str) -> String {
        let chars = reply.chars().count();
        let quoted: String = reply
            .chars()
            .skip(chars.saturating_sub(QUOTED_CHARS))
            .collect();
        format!(
            "{}\n\nYour previous answer could not be used: {reason}.\nPrevious answer:\n{}\n\n\
             Return only one valid JSON object with the keys {}.",
            prompt.trim_end(),
            quoted.trim(),
            self.key_list()
        )
    }

    /// The first JSON object in `reply` (anywhere; a code fence around it is fine) that has
    /// every key with its type; otherwise why not (the first object's fault, or no object).
    pub fn check(&self, reply: &str) -> Result<Map<String, Value>, String> {
        let mut first_fault: Option<String> = None;
        for (at, _) in reply.match_indices('{').take(MAX_TRIES) {
            let mut values = serde_json::Deserializer::from_str(&reply[at..]).into_iter::<Value>();
            let Some(Ok(Value::Object(object))) = values.next() else {
                continue;
            };
            match self.fault(&object) {
                None => return Ok(object),
                Some(fault) => {
                    first_fault.get_or_insert(fault);
                }
            }
        }
        Err(first_fault.unwrap_or_else(|| "the reply holds no JSON object".into()))
    }

    /// Why `object` does not have the format, if it does not.
    fn fault(&self, object: &Map<String, Value>) -> Option<String> {
        self.keys.iter().find_map(|(k, ty)| match object.get(k) {
            None => Some(format!("the JSON object has no key \"{k}\"")),
            Some(v) if !ty.accepts(v) => {
                Some(format!("\"{k}\" is {}, not {}", shape(v), ty.words()))
            }
            Some(_) => None,
        })
    }

    /// The draft of an accepted object, `reasked` re-asks after the first reply.
    pub fn draft(&self, object: Map<String, Value>, reasked: u32) -> Draft {
        let text = match &self.text_key {
            Some(k) => object
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim()
                .to_string(),
            None => Value::Object(object.clone()).to_string(),
        };
        Draft {
            text,
            trigger: None,
            reply: Some(object),
            reasked,
        }
    }
}

/// A value's kind, for a fault message.
fn shape(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(s) if s.trim().is_empty() => "an empty string",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opid() -> JsonReply {
        JsonReply::from_value(&json!({
            "json_keys": {"episode_skill": "string", "step_skills": "object"},
            "text_key": "episode_skill"
        }))
        .unwrap()
    }

    #[test]
    fn formats_parse_with_defaults_and_name_the_bad_key() {
        let f = opid();
        assert_eq!(f.retries, 2);
        assert_eq!(
            f.keys,
            [
                ("episode_skill".to_string(), JsonType::String),
                ("step_skills".to_string(), JsonType::Object)
            ]
        );
        let names = JsonReply::from_value(&json!({"json_keys": ["a", "b"], "retries": 0})).unwrap();
        assert_eq!(names.keys[1], ("b".to_string(), JsonType::Any));
        assert_eq!((names.retries, names.text_key), (0, None));
        for (bad, says) in [
            (json!("x"), "JSON object"),
            (json!({}), "`json_keys` is missing"),
            (json!({"json_keys": []}), "`json_keys` is empty"),
            (json!({"json_keys": {"a": "str"}}), "`json_keys.a`"),
            (json!({"json_keys": [1]}), "`json_keys` lists 1"),
            (
                json!({"json_keys": ["a"], "retries": 11}),
                "`retries` is 11",
            ),
            (
                json!({"json_keys": ["a"], "retries": -1}),
                "`retries` is -1",
            ),
            (json!({"json_keys": ["a"], "text_key": "a"}), "`text_key`"),
            (
                json!({"json_keys": ["a"], "tries": 1}),
                "unknown key `tries`",
            ),
        ] {
            let e = JsonReply::from_value(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn replies_are_checked_key_by_key() {
        let f = opid();
        let good = "Sure:\n```json\n{\"episode_skill\": \" open it first \", \"step_skills\": \
                    {\"1\": \"look\"}, \"episode_summary\": \"x\"}\n```";
        let object = f.check(good).unwrap();
        assert_eq!(object["step_skills"], json!({"1": "look"}));
        let draft = f.draft(object, 1);
        assert_eq!(draft.text, "open it first");
        assert_eq!(draft.reasked, 1);
        assert_eq!(draft.reply.unwrap()["episode_summary"], "x");
        // The first object that fits wins; the fault named is the first object's.
        assert_eq!(
            f.check(r#"{"note": 1} {"episode_skill": "a", "step_skills": {}}"#)
                .unwrap()["episode_skill"],
            "a"
        );
        for (reply, fault) in [
            ("no json here", "the reply holds no JSON object"),
            (
                "{\"episode_skill\": \"a\", \"step_skills\": {",
                "the reply holds no JSON object",
            ),
            (
                r#"{"episode_skill": "a"}"#,
                "the JSON object has no key \"step_skills\"",
            ),
            (
                r#"{"episode_skill": "  ", "step_skills": {}}"#,
                "\"episode_skill\" is an empty string, not a non-empty string",
            ),
            (
                r#"{"episode_skill": "a", "step_skills": ["x"]}"#,
                "\"step_skills\" is an array, not a JSON object",
            ),
        ] {
            assert_eq!(f.check(reply).unwrap_err(), fault, "{reply}");
        }
        let whole = JsonReply::from_value(&json!({"json_keys": ["n"]})).unwrap();
        let object = whole.check(r#"{"n": null, "m": 2}"#).unwrap();
        assert_eq!(whole.draft(object, 0).text, r#"{"n":null,"m":2}"#);
    }

    #[test]
    fn a_reask_repeats_the_prompt_with_the_reason_and_the_reply() {
        let f = opid();
        assert_eq!(
            f.instruction(),
            "Answer with one JSON object and nothing else. It must have the keys \
             \"episode_skill\" (a non-empty string), \"step_skills\" (a JSON object)."
        );
        assert_eq!(
            f.reask("Analyse.\n", "not json", "the reply holds no JSON object"),
            "Analyse.\n\nYour previous answer could not be used: the reply holds no JSON \
             object.\nPrevious answer:\nnot json\n\nReturn only one valid JSON object with the \
             keys \"episode_skill\" (a non-empty string), \"step_skills\" (a JSON object)."
        );
        let long = "x".repeat(2500);
        let reask = f.reask("P", &long, "r");
        assert!(reask.contains(&format!("Previous answer:\n{}\n", "x".repeat(2000))));
        assert!(!reask.contains(&"x".repeat(2001)));
    }
}
