//! Qwen/Hermes `<tool_call>` parsing on the cases' texts, and the template round trip.

use cairn_kernel::text::{arguments_to_objects, parse_tool_calls, RenderOptions, ToolCall};
use serde_json::json;

use super::{msg, qwen3, template, QWEN25, QWEN3};

const WEATHER_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn check(text: &str, content: &str, calls: &[(&str, &str)], malformed: usize) {
    let parsed = parse_tool_calls(text);
    assert_eq!(parsed.content, content, "{text:?}");
    let got: Vec<(&str, &str)> = parsed
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(got, calls, "{text:?}");
    assert_eq!(parsed.malformed.len(), malformed, "{:?}", parsed.malformed);
}

#[test]
fn parses_qwen_and_hermes_tool_calls() {
    // verl-6501's sampled turn, decoded from its ids.
    let generated = [
        151657, 198, 4913, 606, 788, 330, 455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330,
        59604, 95642, 151658,
    ];
    assert_eq!(qwen3().decode(&generated).expect("decodes"), WEATHER_CALL);
    check(
        WEATHER_CALL,
        "",
        &[("get_weather", r#"{"city": "Paris"}"#)],
        0,
    );
    // agent-lightning #326: no arguments.
    check(
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "",
        &[("f", "{}")],
        0,
    );
    check(
        "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2.5], \"y\": \"é\"}}\n</tool_call>\n\
         <tool_call>{\"name\":\"b\",\"arguments\":\"{\\\"q\\\":1}\"}</tool_call>",
        "Let me check.",
        &[("a", r#"{"x": [1, 2.5], "y": "é"}"#), ("b", r#"{"q":1}"#)],
        0,
    );
    check("<tool_call>\nnot json\n</tool_call> done", "done", &[], 1);
    check("<tool_call>{\"arguments\": {}}</tool_call>", "", &[], 1);
    check("ok <tool_call>\n{\"name\": \"f\"", "ok", &[], 1);
    check("plain answer", "plain answer", &[], 0);
}

/// Parsed calls render back through the Qwen templates to the same text the model sampled.
#[test]
fn parsed_calls_render_back_to_the_sampled_text() {
    let call = &parse_tool_calls(WEATHER_CALL).tool_calls[0];
    assert_eq!(
        call.to_openai("call_0"),
        json!({"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}})
    );
    let options = RenderOptions::default();
    for file in [QWEN25, QWEN3] {
        let template = template(file);
        let user = msg("user", "What is the weather in Paris?");
        let raw = template
            .render(&[user.clone(), msg("assistant", WEATHER_CALL)], &options)
            .expect("renders");
        let structured =
            json!({"role": "assistant", "content": "", "tool_calls": [call.to_template()]});
        let parsed = template
            .render(&[user.clone(), structured], &options)
            .expect("renders");
        assert_eq!(parsed, raw, "{file}");

        // OpenAI clients send arguments as strings; Qwen2.5 needs objects.
        let mut openai = vec![
            user,
            json!({"role": "assistant", "content": "", "tool_calls": [call.to_openai("call_0")]}),
        ];
        arguments_to_objects(&mut openai);
        assert_eq!(
            template.render(&openai, &options).expect("renders"),
            raw,
            "{file}"
        );
    }
    assert_eq!(
        ToolCall {
            name: "f".into(),
            arguments: "oops".into()
        }
        .to_template()["function"]["arguments"],
        "oops"
    );
}
