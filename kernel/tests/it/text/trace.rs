//! Multi-turn token bookkeeping on the token cases of `bugs.json`, with their exact ids.

use cairn_kernel::text::{ChatFormat, PrefixMismatch, SpanKind, TokenTrace};
use cairn_kernel::Error;
use serde_json::json;

use super::{msg, qwen3, template, QWEN25};

fn qwen3_format() -> ChatFormat {
    ChatFormat::from_tokenizer(qwen3().clone()).expect("qwen3 has a template and an eos token")
}

fn qwen25_format() -> ChatFormat {
    ChatFormat::new(qwen3().clone(), template(QWEN25)).expect("eos token")
}

fn mask_of(trace: &TokenTrace) -> Vec<u8> {
    trace.loss_mask().to_vec()
}

/// verl #6501: the observation starts with the `\n` (198) the template puts after the
/// assistant's `<|im_end|>`; prompt + generated + observation equals the tokenised full render.
#[test]
fn verl_6501_observation_keeps_the_newline_after_im_end() {
    let format = qwen3_format();
    let user = msg("user", "What is the weather in Paris?");
    let prompt_ids = [
        151644, 872, 198, 3838, 374, 279, 9104, 304, 12095, 30, 151645, 198, 151644, 77091, 198,
    ];
    let generated = [
        151657, 198, 4913, 606, 788, 330, 455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330,
        59604, 95642, 151658, 151645,
    ];
    let expected_observation = [
        198, 151644, 872, 198, 151665, 198, 50, 27297, 11, 220, 17, 15, 34, 198, 151666, 151645,
        198, 151644, 77091, 198,
    ];
    let buggy_observation = &expected_observation[1..];

    let mut trace = TokenTrace::start(&format, vec![user.clone()], None).expect("starts");
    assert_eq!(trace.ids(), prompt_ids);
    trace.push_sampled(&generated);
    let tool = msg("tool", "Sunny, 20C");
    let observation = trace
        .push_observation(&format, std::slice::from_ref(&tool))
        .expect("observes")
        .to_vec();
    assert_eq!(observation, expected_observation);
    assert_eq!(observation[0], 198);
    assert_ne!(observation, buggy_observation);

    let full: Vec<u32> = [&prompt_ids[..], &generated, &expected_observation].concat();
    assert_eq!(trace.ids(), full);
    let assistant = msg(
        "assistant",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    assert_eq!(
        format
            .prompt_ids(&[user, assistant.clone(), tool], None)
            .expect("renders"),
        full
    );
    assert_eq!(
        trace.messages()[1],
        assistant,
        "the assistant message is the decoded sampled text"
    );
    assert!(trace.mismatches().is_empty());

    let mask: Vec<u8> = [
        vec![0; prompt_ids.len()],
        vec![1; generated.len()],
        vec![0; expected_observation.len()],
    ]
    .concat();
    assert_eq!(mask_of(&trace), mask);
    let kinds: Vec<_> = trace
        .spans()
        .iter()
        .map(|s| (s.kind, s.range.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (SpanKind::Prompt, 0..15),
            (SpanKind::Sampled, 15..35),
            (SpanKind::Observation, 35..55)
        ]
    );
}

/// verl #3477: Qwen3 drops the think block of turns before the last user query. The trace keeps
/// the sampled ids, records where the full render differs, and never re-renders history.
#[test]
fn verl_3477_keeps_sampled_think_block() {
    let format = qwen3_format();
    let full_render_ids = [
        151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198, 19,
        151645, 198, 151644, 872, 198, 18889, 220, 18, 30, 151645, 198, 151644, 77091, 198, 151667,
        271, 151668, 271, 16, 17, 151645, 198,
    ];
    let think_block = [151667, 271, 151668, 271];
    let messages = [
        msg("user", "What is 2+2?"),
        msg("assistant", "4"),
        msg("user", "Times 3?"),
        msg("assistant", "12"),
    ];
    assert_eq!(
        format.transcript_ids(&messages, None).expect("renders"),
        full_render_ids
    );
    // Turn-by-turn rendering puts the think block on every assistant turn.
    let first_turn = format
        .transcript_ids(&messages[..2], None)
        .expect("renders");
    assert_eq!(
        first_turn[12..],
        [151644, 77091, 198, 151667, 271, 151668, 271, 19, 151645, 198]
    );
    assert_eq!(
        full_render_ids[12..18],
        [151644, 77091, 198, 19, 151645, 198]
    );

    let mut trace = TokenTrace::start(&format, messages[..1].to_vec(), None).expect("starts");
    let prompt = trace.ids().to_vec();
    assert_eq!(prompt, full_render_ids[..15]);
    let turn1 = [&think_block[..], &[19, 151645]].concat();
    trace.push_sampled(&turn1);
    let observation = trace
        .push_observation(&format, &messages[2..3])
        .expect("observes")
        .to_vec();
    assert_eq!(
        observation,
        [198, 151644, 872, 198, 18889, 220, 18, 30, 151645, 198, 151644, 77091, 198]
    );
    let turn2 = [&think_block[..], &[16, 17, 151645]].concat();
    trace.push_sampled(&turn2);
    let closing = trace.close(&format).expect("closes").to_vec();
    assert_eq!(closing, [198]);

    let kept: Vec<u32> = [&prompt[..], &turn1, &observation, &turn2, &closing].concat();
    assert_eq!(trace.ids(), kept);
    assert_ne!(trace.ids(), full_render_ids);
    assert_eq!(trace.ids().len(), full_render_ids.len() + think_block.len());
    assert_eq!(
        trace.mismatches(),
        [
            PrefixMismatch {
                turn: 0,
                position: 15,
                kept: Some(151667),
                rendered: Some(19)
            },
            PrefixMismatch {
                turn: 1,
                position: 15,
                kept: Some(151667),
                rendered: Some(19)
            },
        ]
    );
    let mask: Vec<u8> = [vec![0; 15], vec![1; 6], vec![0; 13], vec![1; 7], vec![0; 1]].concat();
    assert_eq!(mask_of(&trace), mask);
    assert_eq!(trace.sampled_turns().collect::<Vec<_>>(), [15..21, 34..41]);
}

/// SkyRL #710: mask 1 exactly on the assistant content and its `<|im_end|>`; never on the
/// `<|im_start|>assistant\n` header or the template's `\n` (Qwen2.5 template, Qwen3 tokenizer).
#[test]
fn skyrl_710_assistant_loss_mask() {
    let format = qwen25_format();
    let expected_ids = [
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 13048,
        151645, 198, 151644, 77091, 198, 9707, 0, 151645, 198, 151644, 872, 198, 1359, 68, 151645,
        198, 151644, 77091, 198, 15216, 28374, 0, 151645, 198,
    ];
    let expected_mask = [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 1, 1, 1, 1, 0,
    ];
    let messages = [
        msg("system", "You are a helpful assistant."),
        msg("user", "Hi"),
        msg("assistant", "Hello!"),
        msg("user", "Bye"),
        msg("assistant", "Goodbye!"),
    ];
    assert_eq!(
        format.transcript_ids(&messages, None).expect("renders"),
        expected_ids
    );

    let mut trace = TokenTrace::start(&format, messages[..2].to_vec(), None).expect("starts");
    trace.push_sampled(&[9707, 0, 151645]);
    trace
        .push_observation(&format, &messages[3..4])
        .expect("observes");
    trace.push_sampled(&[15216, 28374]);
    trace.push_sampled(&[0, 151645]);
    assert_eq!(
        trace.pending_turn(),
        [15216, 28374, 0, 151645],
        "chunks join into one turn"
    );
    trace.close(&format).expect("closes");
    assert!(trace.pending_turn().is_empty());
    assert_eq!(trace.ids(), expected_ids);
    assert_eq!(trace.loss_mask(), expected_mask);
    let trainable: Vec<u32> = trace
        .ids()
        .iter()
        .zip(trace.loss_mask())
        .filter(|(_, &m)| m == 1)
        .map(|(&id, _)| id)
        .collect();
    assert_eq!(trainable, [9707, 0, 151645, 15216, 28374, 0, 151645]);
    assert!(trace.mismatches().is_empty());
    assert_eq!(trace.prompt_len(), 20);
}

/// A turn cut off before its end-of-turn token: the template's `<|im_end|>` opens the
/// observation, with mask 0.
#[test]
fn truncated_turn_gets_the_template_end_of_turn_unmasked() {
    let format = qwen25_format();
    let mut trace = TokenTrace::start(&format, vec![msg("user", "Hi")], None).expect("starts");
    let sampled = qwen3().encode("Hello there, how").expect("encodes");
    trace.push_sampled(&sampled);
    let observation = trace
        .push_observation(&format, &[msg("user", "Go on")])
        .expect("observes")
        .to_vec();
    assert_eq!(observation[..2], [151645, 198]);
    let full = format
        .prompt_ids(
            &[
                msg("user", "Hi"),
                msg("assistant", "Hello there, how"),
                msg("user", "Go on"),
            ],
            None,
        )
        .expect("renders");
    assert_eq!(trace.ids(), full);
    let start = trace.ids().len() - observation.len();
    assert!(trace.loss_mask()[start..].iter().all(|&m| m == 0));
}

/// Hermes tool use through two tool rounds. The template closes the *last* tool message with
/// `</tool_response><|im_end|>` but an earlier one with `</tool_response>\n<|im_end|>`, so it is
/// not append-only: the trace keeps the ids the model was actually prompted with, and records
/// the mismatch at round two.
#[test]
fn hermes_tool_rounds_keep_what_the_model_saw() {
    let tools = vec![
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}}}}),
    ];
    let format = ChatFormat::new(
        qwen3().clone(),
        template("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"),
    )
    .expect("eos token");
    let mut messages = vec![msg("user", "Weather in Paris and Rome?")];
    let mut trace =
        TokenTrace::start(&format, messages.clone(), Some(tools.clone())).expect("starts");
    let mut seen_by_model = Vec::new();
    for (round, (city, result)) in [("Paris", "Sunny"), ("Rome", "Rain")]
        .into_iter()
        .enumerate()
    {
        let text = format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>");
        let mut sampled = qwen3().encode(&text).expect("encodes");
        sampled.push(151645);
        seen_by_model = [trace.ids(), &sampled].concat();
        trace.push_sampled(&sampled);
        messages.push(msg("assistant", &text));
        messages.push(msg("tool", result));
        let observation = trace
            .push_observation(&format, &messages[messages.len() - 1..])
            .expect("observes")
            .to_vec();
        let full = format.prompt_ids(&messages, Some(&tools)).expect("renders");
        assert!(
            full.ends_with(&observation),
            "the observation is the render's tail"
        );
        if round == 0 {
            assert_eq!(trace.ids(), full);
        } else {
            assert_eq!(trace.ids(), [&seen_by_model[..], &observation].concat());
            assert_ne!(trace.ids(), full);
        }
    }
    let first_tool_end = seen_by_model
        .iter()
        .position(|&id| id == 151666)
        .expect("</tool_response>")
        + 1;
    assert_eq!(
        trace.mismatches(),
        [PrefixMismatch {
            turn: 1,
            position: first_tool_end,
            kept: Some(151645),
            rendered: Some(198)
        }]
    );
}

#[test]
fn observation_needs_a_sampled_turn() {
    let format = qwen3_format();
    let mut trace = TokenTrace::start(&format, vec![msg("user", "Hi")], None).expect("starts");
    let err = trace
        .push_observation(&format, &[msg("user", "again")])
        .err();
    assert!(matches!(err, Some(Error::Trace(_))), "{err:?}");
    assert_eq!(format.stop_ids(), [151645, 151643]);
    assert_eq!(format.end_of_turn(), 151645);
    let message = format
        .assistant_message(&[9707, 0, 151645])
        .expect("decodes");
    assert_eq!(message, msg("assistant", "Hello!"));
}
