//! Reading the policy's response text as an action.
//!
//! Three forms are recognised, and the **first one found anywhere in the text wins**, so
//! anything before it (ECHO's `select[1,3]`, a thought) is ignored:
//!
//! * `search[query]`: a search (the keyword in any case, not part of a longer word, so
//!   `research[x]` is not one);
//! * `answer[text]`: the final answer;
//! * a Qwen/Hermes tool call, `<tool_call>{"name": "search", "arguments": {"query": "..."}}
//!   </tool_call>` (`arguments` may also be a JSON string, as OpenAI clients send it; the
//!   closing tag may be missing at the end of the text).
//!
//! The bracket forms run to the first `]` after the `[`; one without a `]`, or with nothing
//! but spaces inside, is invalid.

use serde_json::Value as Json;

/// What a response asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// A search, by `search[...]` or by a `search` tool call.
    Search {
        query: String,
        tool_call: bool,
    },
    Answer(String),
    /// Not an action: the reason, for the next observation (it may name `search`), and
    /// whether it was a malformed search or tool call (refused, not answered, in a slot with
    /// tools off).
    Invalid {
        reason: String,
        tool: bool,
    },
}

/// The earliest position of `keyword[` in `text` that does not continue a word.
fn find_keyword(text: &str, lower: &str, keyword: &str) -> Option<usize> {
    let pattern = format!("{keyword}[");
    let mut from = 0;
    while let Some(i) = lower[from..].find(&pattern) {
        let at = from + i;
        let before = text[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return Some(at);
        }
        from = at + pattern.len();
    }
    None
}

fn invalid(reason: impl Into<String>, tool: bool) -> Action {
    Action::Invalid {
        reason: reason.into(),
        tool,
    }
}

/// Reads `text` (see the module docs).
pub fn parse(text: &str) -> Action {
    // ASCII lower-casing keeps byte offsets, so positions carry over to `text`.
    let lower = text.to_ascii_lowercase();
    let candidates = [
        find_keyword(text, &lower, "search").map(|i| (i, 0)),
        find_keyword(text, &lower, "answer").map(|i| (i, 1)),
        lower.find("<tool_call>").map(|i| (i, 2)),
    ];
    let Some((at, form)) = candidates.into_iter().flatten().min() else {
        return invalid(
            "no action found; reply with search[query] or answer[text]",
            false,
        );
    };
    match form {
        0 | 1 => {
            let keyword = if form == 0 { "search" } else { "answer" };
            let open = at + keyword.len() + 1;
            let Some(close) = text[open..].find(']') else {
                return invalid(format!("`{keyword}[` has no closing `]`"), form == 0);
            };
            let inner = text[open..open + close].trim();
            if inner.is_empty() {
                return invalid(format!("`{keyword}[]` is empty"), form == 0);
            }
            if form == 0 {
                Action::Search {
                    query: inner.to_string(),
                    tool_call: false,
                }
            } else {
                Action::Answer(inner.to_string())
            }
        }
        _ => tool_call(&text[at + "<tool_call>".len()..]),
    }
}

fn tool_call(body: &str) -> Action {
    let body = body.split("</tool_call>").next().unwrap_or(body).trim();
    let Ok(call) = serde_json::from_str::<Json>(body) else {
        return invalid("the <tool_call> block is not valid JSON", true);
    };
    let name = call["name"].as_str().unwrap_or_default();
    if name != "search" {
        return invalid(
            format!(
                "unknown tool `{name}`; the tool is `search`, and the answer is given as \
                 answer[text]"
            ),
            true,
        );
    }
    let arguments = match &call["arguments"] {
        Json::String(s) => serde_json::from_str(s).unwrap_or(Json::Null),
        other => other.clone(),
    };
    match arguments["query"].as_str().map(str::trim) {
        Some(q) if !q.is_empty() => Action::Search {
            query: q.to_string(),
            tool_call: true,
        },
        _ => invalid(
            "the search tool call needs a non-empty `query` argument",
            true,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(q: &str, tool_call: bool) -> Action {
        Action::Search {
            query: q.into(),
            tool_call,
        }
    }

    #[test]
    fn the_first_action_anywhere_wins() {
        assert_eq!(
            parse("search[iron atomic number]"),
            search("iron atomic number", false)
        );
        assert_eq!(parse("select[1,3] search[ iron ]"), search("iron", false));
        assert_eq!(
            parse("I think. Answer[Henry Cavendish] then search[x]"),
            Action::Answer("Henry Cavendish".into())
        );
        assert_eq!(parse("SEARCH[fe] answer[26]"), search("fe", false));
        assert_eq!(parse("research[x] answer[26]"), Action::Answer("26".into()));
        assert!(
            matches!(parse("answer[26"), Action::Invalid { reason: m, tool: false } if m.contains("no closing"))
        );
        assert!(
            matches!(parse("search[  ]"), Action::Invalid { reason: m, tool: true } if m.contains("empty"))
        );
        assert!(
            matches!(parse("go north"), Action::Invalid { reason: m, tool: false } if m.contains("no action"))
        );
    }

    #[test]
    fn tool_calls_parse_in_both_argument_forms() {
        assert_eq!(
            parse(r#"<tool_call>{"name": "search", "arguments": {"query": "iron"}}</tool_call>"#),
            search("iron", true)
        );
        assert_eq!(
            parse(r#"ok <tool_call>{"name":"search","arguments":"{\"query\": \"neon\"}"}"#),
            search("neon", true)
        );
        assert_eq!(
            parse(r#"answer[1] <tool_call>{"name": "search", "arguments": {"query": "x"}}"#),
            Action::Answer("1".into())
        );
        assert!(matches!(
            parse(r#"<tool_call>{"name": "calc", "arguments": {}}</tool_call>"#),
            Action::Invalid { reason: m, tool: true } if m.contains("unknown tool `calc`")
        ));
        assert!(matches!(
            parse(r#"<tool_call>{"name": "search", "arguments": {}}</tool_call>"#),
            Action::Invalid { reason: m, tool: true } if m.contains("`query`")
        ));
        assert!(
            matches!(parse("<tool_call>{oops"), Action::Invalid { reason: m, tool: true } if m.contains("JSON"))
        );
    }
}
