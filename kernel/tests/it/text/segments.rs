//! The multi-turn token cases of docs/bug-cases.md on the path the pipeline runs for a
//! multi-call episode: the gateway renders each request with [`ChatFormat::prompt_ids`] and the
//! episode store merges a call into the previous [`Segment`] only when its prompt ids start
//! with the segment's ids (Agent Lightning's trajectory mode). Exact Qwen3 ids throughout.

use cairn_gateway::{SampledChoice, Segment};
use cairn_kernel::text::ChatFormat;
use cairn_plugin_sdk::FinishReason;
use serde_json::json;

use super::{msg, qwen3, template, QWEN25};

fn qwen3_format() -> ChatFormat {
    ChatFormat::from_tokenizer(qwen3().clone()).expect("qwen3 has a template and an eos token")
}

fn qwen25_format() -> ChatFormat {
    ChatFormat::new(qwen3().clone(), template(QWEN25)).expect("eos token")
}

fn sampled(ids: &[u32]) -> SampledChoice {
    SampledChoice {
        ids: ids.to_vec(),
        logprobs: vec![-0.25; ids.len()],
        finish_reason: FinishReason::Stop,
        tool_calls: 0,
    }
}

fn start(prompt: &[u32], ids: &[u32]) -> Segment {
    Segment::start(prompt, &sampled(ids), (0, 0), 0, None, String::new())
}

/// verl #6501: the ids between a turn and the next generation prompt start with the `\n` (198)
/// the template puts after the assistant's `<|im_end|>`; prompt + generated + observation is
/// the tokenised full render, so the next call merges.
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

    let first = format
        .prompt_ids(std::slice::from_ref(&user), None)
        .expect("renders");
    assert_eq!(first, prompt_ids);
    let assistant = msg(
        "assistant",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    let second = format
        .prompt_ids(&[user, assistant, msg("tool", "Sunny, 20C")], None)
        .expect("renders");
    let full: Vec<u32> = [&prompt_ids[..], &generated, &expected_observation].concat();
    assert_eq!(second, full);

    let mut segment = start(&first, &generated);
    assert_eq!(segment.prefix_of(&second), Ok(()));
    segment.extend(&second, &sampled(&[]), (1, 0));
    let observation = &segment.response_ids[generated.len()..];
    assert_eq!(observation, expected_observation);
    assert_eq!(observation[0], 198);
    assert_ne!(observation, buggy_observation);
    let mask: Vec<u8> = [
        vec![1; generated.len()],
        vec![0; expected_observation.len()],
    ]
    .concat();
    assert_eq!(segment.response_mask, mask);
    assert_eq!(
        segment.response_logprobs[generated.len()..],
        [0.0; 20],
        "observation ids carry log-prob 0"
    );
}

/// verl #3477: Qwen3 drops the think block of turns before the last user query, so the next
/// request's render is not an extension of the sampled ids. The sampled ids are kept as they
/// were and the call starts a new segment; history is never re-rendered into a row.
#[test]
fn verl_3477_keeps_the_sampled_think_block() {
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
    ];
    let first = format.prompt_ids(&messages[..1], None).expect("renders");
    assert_eq!(first, full_render_ids[..15]);
    // Rendered last, the first assistant turn carries the think block...
    let turn1: Vec<u32> = [&think_block[..], &[19, 151645]].concat();
    // ...but once a user query follows, the template renders it without.
    let second = format.prompt_ids(&messages, None).expect("renders");
    assert_eq!(second, full_render_ids[..30]);
    assert_eq!(second[12..18], [151644, 77091, 198, 19, 151645, 198]);

    let segment = start(&first, &turn1);
    assert_eq!(segment.prefix_of(&second), Err(15));
    assert_eq!(
        (segment.response_ids[0], second[15]),
        (151667, 19),
        "kept vs re-rendered id where they part"
    );
    assert_eq!(
        segment.response_ids, turn1,
        "the sampled think block is kept"
    );
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
    ];
    let first = format.prompt_ids(&messages[..2], None).expect("renders");
    assert_eq!(first, expected_ids[..20]);
    let second = format.prompt_ids(&messages, None).expect("renders");
    assert_eq!(second, expected_ids[..34]);

    let mut segment = start(&first, &[9707, 0, 151645]);
    assert_eq!(segment.prefix_of(&second), Ok(()));
    segment.extend(&second, &sampled(&[15216, 28374, 0, 151645]), (1, 0));
    // The row is the transcript up to the last `<|im_end|>` (the closing `\n` is never sampled).
    let ids: Vec<u32> = [&segment.prompt_ids[..], &segment.response_ids].concat();
    assert_eq!(ids, expected_ids[..38]);
    let mask: Vec<u8> = [
        vec![0; segment.prompt_ids.len()],
        segment.response_mask.clone(),
    ]
    .concat();
    assert_eq!(mask, expected_mask[..38]);
    let trainable: Vec<u32> = ids
        .iter()
        .zip(&mask)
        .filter(|(_, &m)| m == 1)
        .map(|(&id, _)| id)
        .collect();
    assert_eq!(trainable, [9707, 0, 151645, 15216, 28374, 0, 151645]);
    assert_eq!(segment.sampled_tokens(), 7);
}

/// A turn cut off before its end-of-turn token: the template's `<|im_end|>` opens the
/// observation, with mask 0 (it was never sampled).
#[test]
fn truncated_turn_gets_the_template_end_of_turn_unmasked() {
    let format = qwen25_format();
    let first = format
        .prompt_ids(&[msg("user", "Hi")], None)
        .expect("renders");
    let cut = qwen3().encode("Hello there, how").expect("encodes");
    let second = format
        .prompt_ids(
            &[
                msg("user", "Hi"),
                msg("assistant", "Hello there, how"),
                msg("user", "Go on"),
            ],
            None,
        )
        .expect("renders");
    let mut segment = start(&first, &cut);
    assert_eq!(segment.prefix_of(&second), Ok(()));
    segment.extend(&second, &sampled(&[]), (1, 0));
    let observation = &segment.response_ids[cut.len()..];
    assert_eq!(observation[..2], [151645, 198]);
    assert!(segment.response_mask[cut.len()..].iter().all(|&m| m == 0));
    assert_eq!(segment.sampled_tokens(), cut.len());
}

/// Hermes tool use through two tool rounds. The template closes the *last* tool message with
/// `</tool_response><|im_end|>` but an earlier one with `</tool_response>\n<|im_end|>`, so it is
/// not append-only: round two's request does not extend the ids the model saw, and starts a
/// new segment at exactly that position.
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
    let mut prompt = format.prompt_ids(&messages, Some(&tools)).expect("renders");
    let mut segment: Option<Segment> = None;
    for (round, (city, result)) in [("Paris", "Sunny"), ("Rome", "Rain")]
        .into_iter()
        .enumerate()
    {
        let text = format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>");
        let mut ids = qwen3().encode(&text).expect("encodes");
        ids.push(151645);
        let seen_by_model: Vec<u32> = [&prompt[..], &ids].concat();
        match segment.as_mut() {
            None => segment = Some(start(&prompt, &ids)),
            Some(s) => s.extend(&prompt, &sampled(&ids), (round as u32, 0)),
        }
        messages.push(msg("assistant", &text));
        messages.push(msg("tool", result));
        let next = format.prompt_ids(&messages, Some(&tools)).expect("renders");
        let s = segment.as_ref().expect("segment");
        if round == 0 {
            assert_eq!(s.prefix_of(&next), Ok(()));
        } else {
            let first_tool_end = seen_by_model
                .iter()
                .position(|&id| id == 151666)
                .expect("</tool_response>")
                + 1;
            assert_eq!(s.prefix_of(&next), Err(first_tool_end));
            assert_eq!(
                (seen_by_model[first_tool_end], next[first_tool_end]),
                (151645, 198)
            );
        }
        prompt = next;
    }
}

/// The ids that end sampling are the end-of-turn id and every `generation_config.json` eos id
/// (trl #7039: Qwen3 stops on `<|im_end|>` and `<|endoftext|>`).
#[test]
fn trl_7039_every_generation_stop_id_ends_sampling() {
    let format = qwen3_format();
    assert_eq!(format.stop_ids(), [151645, 151643]);
    assert_eq!(format.end_of_turn(), 151645);
}
