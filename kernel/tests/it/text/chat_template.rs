//! Chat templates render byte-identically to Python jinja2 as transformers sets it up
//! (fixture `chat/renders.json`, written by `scripts/text/gen_chat_fixtures.py`).

use cairn_kernel::text::{ChatTemplate, CivilTime, RenderOptions};
use cairn_kernel::Error;
use serde_json::{Map, Value as Json};

use super::{fixture, qwen3, template, QWEN3};

/// The clock the generator pinned (`FIXED_NOW`).
const FIXED_NOW: CivilTime = CivilTime {
    year: 2024,
    month: 7,
    day: 26,
    hour: 15,
    minute: 4,
    second: 5,
};

fn cases() -> Vec<Json> {
    let text = std::fs::read_to_string(fixture("chat/renders.json")).expect("renders fixture");
    let doc: Json = serde_json::from_str(&text).expect("renders fixture parses");
    doc["cases"].as_array().cloned().expect("cases array")
}

fn options(case: &Json) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
        tools: case["tools"].as_array().cloned(),
        extra: case["extra"].as_object().cloned().unwrap_or_default(),
        now: Some(FIXED_NOW),
    }
}

fn case_template(case: &Json) -> ChatTemplate {
    let special_tokens: Map<String, Json> = case["special_tokens"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let template = match case["source"].as_str() {
        Some(source) => {
            ChatTemplate::new("inline.jinja", source).expect("inline template compiles")
        }
        None => template(case["template"].as_str().expect("template name")),
    };
    template.with_special_tokens(special_tokens)
}

/// Every case renders to the exact bytes Python produced (or fails where Python failed), and
/// the Qwen renders tokenise to the ids Python's `tokenizers` produced.
#[test]
fn renders_match_python_jinja2_byte_for_byte() {
    let cases = cases();
    assert!(cases.len() >= 50, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let label = format!(
            "{} / {}",
            case["template"].as_str().unwrap_or("?"),
            case["case"].as_str().unwrap_or("?")
        );
        let messages = case["messages"].as_array().cloned().expect("messages");
        let rendered = case_template(case).render(&messages, &options(case));
        match (&case["expected"], rendered) {
            (Json::String(expected), Ok(rendered)) => {
                if &rendered != expected {
                    let at = expected
                        .bytes()
                        .zip(rendered.bytes())
                        .take_while(|(a, b)| a == b)
                        .count();
                    failures.push(format!(
                        "{label}: differs at byte {at}\n  python: {:?}\n  rust:   {:?}",
                        &expected[at.saturating_sub(40)..(at + 40).min(expected.len())],
                        &rendered[at.saturating_sub(40)..(at + 40).min(rendered.len())],
                    ));
                } else if let Some(ids) = case.get("expected_ids").and_then(Json::as_array) {
                    let ids: Vec<u32> = ids
                        .iter()
                        .map(|id| id.as_u64().expect("id") as u32)
                        .collect();
                    if qwen3().encode(&rendered).expect("encodes") != ids {
                        failures.push(format!("{label}: token ids differ from Python tokenizers"));
                    }
                }
            }
            (Json::String(_), Err(e)) => {
                failures.push(format!("{label}: python rendered, rust failed: {e}"))
            }
            // Documented divergence (see the case's `rust_lenient`): Rust renders where Python raised.
            (_, Ok(_)) if case["rust_lenient"].is_string() => {}
            (_, Ok(rendered)) => failures.push(format!(
                "{label}: python failed, rust rendered {rendered:?}"
            )),
            (_, Err(e)) => {
                let message = e.to_string();
                if let Some(want) = case["expect_error"].as_str() {
                    if !message.contains(want) {
                        failures.push(format!("{label}: error {message:?} lacks {want:?}"));
                    }
                }
                if !message.starts_with(&format!("chat template `{}`", case_template(case).name()))
                {
                    failures.push(format!(
                        "{label}: error does not name the template: {message}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The Qwen3 template read from `tokenizer_config.json` is the same template.
#[test]
fn tokenizer_config_template_renders_the_qwen3_cases() {
    let from_config = qwen3().chat_template().expect("chat template");
    for case in cases()
        .iter()
        .filter(|case| case["template"] == QWEN3 && case["expected"].is_string())
    {
        let messages = case["messages"].as_array().cloned().expect("messages");
        let rendered = from_config
            .render(&messages, &options(case))
            .expect("renders");
        assert_eq!(
            Some(rendered.as_str()),
            case["expected"].as_str(),
            "{}",
            case["case"]
        );
    }
}

/// `raise_exception` in a real template: the error names the template, the line and the message.
#[test]
fn raise_exception_reports_template_and_line() {
    let case = cases()
        .into_iter()
        .find(|case| case["case"] == "two_calls_raise_exception")
        .expect("case exists");
    let source = std::fs::read_to_string(
        fixture("chat-templates").join(case["template"].as_str().expect("name")),
    )
    .expect("template");
    let line = source
        .lines()
        .position(|l| l.contains("This model only supports single tool-calls"))
        .expect("line")
        + 1;
    let messages = case["messages"].as_array().cloned().expect("messages");
    let err = case_template(&case)
        .render(&messages, &options(&case))
        .err();
    match err {
        Some(Error::Template {
            name,
            line: Some(at),
            detail,
        }) => {
            assert_eq!(name, "meta-llama-Llama-3.1-8B-Instruct.jinja");
            assert_eq!(at, line);
            assert_eq!(
                detail,
                "invalid operation: This model only supports single tool-calls at once!"
            );
        }
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn non_object_message_is_an_error() {
    let err = template(QWEN3)
        .render(&[Json::from("hi")], &RenderOptions::default())
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("chat template `Qwen-Qwen3-0.6B.jinja`: message 0 is not a JSON object: \"hi\"")
    );
}
