//! Tools and tools-off slots end to end, on the `toolcalc` test environment loaded through the
//! ABI: the chat prompt renders the observation's tool schema through the template's `tools`
//! argument only when the slot's `ContextVariant::tools_enabled` is true, and a tools-off
//! slot's tool call is refused by the environment (feedback −1, not executed).

use cairn_kernel::backend::{Generation, SamplingParams};
use cairn_kernel::plugins::PluginRegistry;
use cairn_kernel::rollout::prompt::{ChatPrompt, PromptBuilder};
use cairn_kernel::rollout::{play, EpisodeSpec, PlayParams};
use cairn_kernel::text::ChatFormat;
use cairn_plugin_sdk::{ContextVariant, Environment, FinishReason, Split, TaskRef};
use serde_json::json;

use super::plugins::plugin_dir;
use super::text::qwen3;

const TASK: TaskRef = TaskRef {
    split: Split::Train,
    index: 0,
};

fn toolcalc() -> (
    tempfile::TempDir,
    cairn_plugin_sdk::host::foreign::ForeignEnvironment,
) {
    let dir = plugin_dir(&["cairn_toolcalc"]);
    let registry = PluginRegistry::scan(&[dir.path().to_path_buf()]).expect("scan");
    let env = registry
        .environment("toolcalc")
        .expect("toolcalc is built")
        .create_environment("{}")
        .expect("default config");
    (dir, env)
}

fn variant(tools_enabled: bool) -> ContextVariant {
    ContextVariant {
        label: if tools_enabled { "plain" } else { "tools-off" }.into(),
        tools_enabled,
        ..Default::default()
    }
}

fn chat() -> ChatPrompt {
    ChatPrompt {
        format: ChatFormat::from_tokenizer(qwen3().clone()).expect("qwen3 template"),
        system: String::new(),
    }
}

/// The tools-on prompt is the tools-off prompt after a system block that holds the schema; the
/// tools-off prompt is the plain render of the observation, with no tool schema at all.
#[test]
fn tools_off_prompt_differs_exactly_by_the_tool_schema() {
    let (_dir, env) = toolcalc();
    let builder = chat();
    let on = env
        .start(TASK, 0, &variant(true))
        .expect("starts")
        .observation();
    let off = env
        .start(TASK, 0, &variant(false))
        .expect("starts")
        .observation();
    assert_eq!(on.text, off.text);
    let schema = on
        .tools
        .first()
        .cloned()
        .expect("the calc schema crosses the ABI");
    assert_eq!(schema["function"]["name"], "calc");
    assert!(off.tools.is_empty());

    let on_ids = builder.prompt(&variant(true), &on).expect("renders");
    let off_ids = builder.prompt(&variant(false), &off).expect("renders");
    let user = json!({"role": "user", "content": on.text});
    let format = &builder.format;
    assert_eq!(
        on_ids,
        format
            .prompt_ids(
                std::slice::from_ref(&user),
                Some(std::slice::from_ref(&schema))
            )
            .expect("renders")
    );
    assert_eq!(off_ids, format.prompt_ids(&[user], None).expect("renders"));
    // The observation offers the tool, but a tools-off variant hides it.
    assert_eq!(
        builder.prompt(&variant(false), &on).expect("renders"),
        off_ids
    );

    assert!(
        on_ids.ends_with(&off_ids),
        "tools add a block before the user turn"
    );
    let block = qwen3()
        .decode(&on_ids[..on_ids.len() - off_ids.len()])
        .expect("decodes");
    assert!(
        block.starts_with("<|im_start|>system\n# Tools\n")
            && block
                .contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"calc\", ")
            && block.ends_with("</tool_call><|im_end|>\n"),
        "{block}"
    );
    let text = qwen3().decode(&off_ids).expect("decodes");
    assert!(
        !text.contains("calc") && !text.contains("<tools>"),
        "{text}"
    );
}

/// Two slots of one task play the same responses: a `calc` call, then the answer. The
/// tools-on slot runs the call; the tools-off slot's call is refused and not executed.
#[test]
fn a_tools_off_slot_has_its_tool_call_refused() {
    let (_dir, env) = toolcalc();
    let builder = chat();
    let call = qwen3()
        .encode(
            "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"100 + 10\"}}\n</tool_call>",
        )
        .expect("encodes");
    let answer = qwen3().encode("answer: 110").expect("encodes");
    let im_end = builder.format.end_of_turn();
    let specs: Vec<EpisodeSpec> = [true, false]
        .into_iter()
        .enumerate()
        .map(|(i, tools)| EpisodeSpec {
            group_id: 0,
            trajectory_id: i as u64,
            task: TASK,
            task_id: "calc-train-0000".into(),
            seed: 0,
            variant: variant(tools),
        })
        .collect();
    let params = PlayParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 64,
            stop_ids: builder.stop_ids().to_vec(),
            seed: 1,
        },
        max_turns: 4,
        step: 0,
        context_window: None,
        env_timeout: Some(std::time::Duration::from_secs(60)),
        env_name: "toolcalc".into(),
    };
    let mut turn = 0;
    let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
        let body = if turn == 0 { &call } else { &answer };
        turn += 1;
        let ids: Vec<u32> = [&body[..], &[im_end]].concat();
        let generations = prompts
            .iter()
            .map(|_| Generation {
                logprobs: vec![-0.5; ids.len()],
                ids: ids.clone(),
                finish_reason: FinishReason::Stop,
            })
            .collect();
        Ok((generations, 0))
    };
    let env: std::sync::Arc<dyn cairn_plugin_sdk::Environment> = std::sync::Arc::new(env);
    let out = play(&env, &builder, &specs, &params, &mut generate, None).expect("plays");
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    let summary: Vec<(u64, u32, u32, i8, bool)> = out
        .rows
        .iter()
        .map(|r| (r.trajectory_id, r.turn, r.tool_calls, r.feedback, r.success))
        .collect();
    assert_eq!(
        summary,
        [
            (0, 0, 1, 1, true),
            (0, 1, 0, 1, true),
            (1, 0, 0, -1, true),
            (1, 1, 0, 1, true)
        ]
    );
    let refused = &out.rows[2];
    assert_eq!(refused.info["refused_tool_call"], true);
    assert_eq!(refused.variant.label, "tools-off");
    // The next observation has no calc result: the call was not executed.
    assert_eq!(
        out.rows[3].observation,
        "Compute 100 + 10. Reply with answer: <number>.\n\
         Tools are not available here; reply with answer: <number>."
    );
    assert_eq!(
        out.rows[1].observation,
        "Compute 100 + 10. Reply with answer: <number>.\ncalc(100 + 10) = 110"
    );
    // Every prompt of the tools-off slot is rendered without the schema.
    for row in &out.rows[2..] {
        let text = qwen3().decode(&row.prompt_ids).expect("decodes");
        assert!(!text.contains("<tools>"), "{text}");
    }
    let text = qwen3().decode(&out.rows[0].prompt_ids).expect("decodes");
    assert!(text.contains("<tools>"), "{text}");
}

/// A row records the tool schemas its observation offered (`extra.tools`), so
/// `RenderRequest::for_row` with the row's own variant renders its prompt exactly, tools on or
/// off: what a teacher or other-view re-render (EDGE, SDAR, UCOB, OPID) needs on a tool
/// environment. Without the schemas the tools-on prompt would lose its `<tools>` block.
#[test]
fn for_row_renders_a_tool_rows_prompt_exactly() {
    let (_dir, env) = toolcalc();
    let builder = chat();
    let answer = qwen3().encode("answer: 110").expect("encodes");
    let ids: Vec<u32> = [&answer[..], &[builder.format.end_of_turn()]].concat();
    let specs: Vec<EpisodeSpec> = [true, false]
        .into_iter()
        .enumerate()
        .map(|(i, tools)| EpisodeSpec {
            group_id: 0,
            trajectory_id: i as u64,
            task: TASK,
            task_id: "calc-train-0000".into(),
            seed: 0,
            variant: variant(tools),
        })
        .collect();
    let params = PlayParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 64,
            stop_ids: builder.stop_ids().to_vec(),
            seed: 1,
        },
        max_turns: 4,
        step: 0,
        context_window: None,
        env_timeout: Some(std::time::Duration::from_secs(60)),
        env_name: "toolcalc".into(),
    };
    let mut generate = |prompts: &[Vec<u32>], _: &SamplingParams| {
        let generations = prompts
            .iter()
            .map(|_| Generation {
                logprobs: vec![-0.5; ids.len()],
                ids: ids.clone(),
                finish_reason: FinishReason::Stop,
            })
            .collect();
        Ok((generations, 0))
    };
    let env: std::sync::Arc<dyn cairn_plugin_sdk::Environment> = std::sync::Arc::new(env);
    let out = play(&env, &builder, &specs, &params, &mut generate, None).expect("plays");
    assert_eq!(out.rows.len(), 2);
    // The tools-on slot's observation offered `calc`; a slot started with tools off is offered
    // none, and its row records none.
    let names: Vec<Option<String>> = out
        .rows
        .iter()
        .map(|r| {
            r.extra
                .get("tools")
                .map(|t| t[0]["function"]["name"].to_string())
        })
        .collect();
    assert_eq!(names, [Some("\"calc\"".to_string()), None]);
    for row in &out.rows {
        let request = cairn_plugin_sdk::RenderRequest::for_row(row.variant.clone(), row);
        let rendered = builder
            .prompt(&request.variant, &request.observation)
            .expect("renders");
        assert_eq!(rendered, row.prompt_ids, "trajectory {}", row.trajectory_id);
    }
    // The tools-on row's prompt shows the schema, so dropping it would change the render.
    let on = &out.rows[0];
    let mut bare = cairn_plugin_sdk::RenderRequest::for_row(on.variant.clone(), on);
    bare.observation.tools.clear();
    assert_ne!(
        builder
            .prompt(&bare.variant, &bare.observation)
            .expect("renders"),
        on.prompt_ids
    );
}
