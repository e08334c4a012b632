//! Episodes: determinism, the search tool on and off, rewards, feedback, the context budget.

use cairn_plugin_sdk::Environment;
use cairn_search_qa::search_schema;

use super::{env, env_with, expert, info, play, script, task_of, train, words};

#[test]
fn the_same_task_and_seed_give_the_same_episode() {
    let policies: [&[&str]; 2] = [
        &["search[iron]", "junk", "search[iron]", "answer[26]"],
        &[
            "select[1] search[atomic number 1]",
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"neon\"}}</tool_call>",
        ],
    ];
    for index in 0..20 {
        let a = play(&env(), train(index), 0, true, expert);
        let b = play(&env(), train(index), 0, true, expert);
        let c = play(&env(), train(index), 99, true, expert);
        assert_eq!(a, b, "task {index}");
        assert_eq!(a, c, "the seed changes nothing, task {index}");
        assert!(
            a.1.last().unwrap().outcome.success,
            "the expert solves task {index}"
        );
        for p in policies {
            assert_eq!(
                play(&env(), train(index), 1, true, script(p)),
                play(&env(), train(index), 2, true, script(p))
            );
        }
    }
}

#[test]
fn a_search_then_an_answer() {
    let env = env();
    let task = task_of(&env, "who discovered hydrogen");
    let mut ep = env.start(task, 0, &super::variant(true)).unwrap();
    let first = ep.observation();
    assert_eq!(first.tools, vec![search_schema()]);
    assert_eq!(
        first.text,
        "Answer the question about the chemical elements. Reply with search[query] to search an \
         encyclopedia of the elements, or answer[text] to give your final answer.\n\
         Question: who discovered hydrogen\nTurns left: 6."
    );
    assert_eq!(
        first.anchor.as_deref(),
        Some("who discovered hydrogen | no search yet")
    );
    assert_eq!(ep.expert_action().unwrap(), "search[hydrogen discovered]");
    let out = ep.step("search[hydrogen discovered]").unwrap();
    assert_eq!(
        (out.feedback, out.tool_calls, out.done, out.reward),
        (1, 1, false, 0.0)
    );
    let i = info(&out);
    assert_eq!(i["action"], "search");
    assert_eq!(i["results"][0], "hydrogen");
    assert_eq!(i["new_results"], 3);
    assert!(out.observation.text.contains("Latest results, turn 1: search[hydrogen discovered]\n1. hydrogen | Symbol: H | Atomic number: 1 | Atomic weight: 1.0079 |"), "{}", out.observation.text);
    assert!(out
        .observation
        .text
        .contains("Discovered by Henry Cavendish in 1776."));
    assert!(out
        .observation
        .text
        .ends_with("\nQuestion: who discovered hydrogen\nTurns left: 5."));
    assert_eq!(
        out.observation.anchor.as_deref(),
        Some("who discovered hydrogen | last search: hydrogen discovered")
    );
    // The same search again shows nothing new: feedback 0, still a tool call.
    let out = ep.step("search[Hydrogen, discovered!]").unwrap();
    assert_eq!((out.feedback, out.tool_calls), (0, 1));
    assert!(out
        .observation
        .text
        .contains("Turn 1: search[hydrogen discovered]\n1. hydrogen"));
    assert!(out
        .observation
        .text
        .contains("Latest results, turn 2: search[Hydrogen, discovered!]"));
    assert_eq!(ep.expert_action().unwrap(), "answer[Henry Cavendish]");
    let out = ep.step("I know it: answer[henry cavendish.]").unwrap();
    assert_eq!(
        (
            out.done,
            out.success,
            out.reward,
            out.feedback,
            out.tool_calls
        ),
        (true, true, 1.0, 1, 0)
    );
    assert_eq!(info(&out)["gold"], "Henry Cavendish");
    assert!(ep.expert_action().is_none());
    let err = ep.step("answer[x]").unwrap_err().to_string();
    assert!(err.contains("step after the episode ended"), "{err}");
}

#[test]
fn exact_match_and_f1_rewards() {
    for (reward, partial) in [("exact_match", 0.0f32), ("f1", 2.0 * 0.5 / 1.5)] {
        let env = env_with(&format!(r#"{{"reward": "{reward}"}}"#));
        let task = task_of(&env, "who discovered hydrogen");
        let (_, r) = play(&env, task, 0, true, script(&["answer[Cavendish]"]));
        let out = &r[0].outcome;
        assert!(
            (out.reward - partial).abs() < 5e-5,
            "{reward}: {}",
            out.reward
        );
        assert!((out.reward - if reward == "f1" { 0.6667 } else { 0.0 }).abs() < 5e-5);
        // Partly right: not a success, feedback 0.
        assert_eq!((out.done, out.success, out.feedback), (true, false, 0));
        let i = info(out);
        assert!((i["f1"].as_f64().unwrap() - 0.6667).abs() < 5e-5);
        assert_eq!(i["exact_match"], 0.0);
        let (_, r) = play(&env, task, 0, true, script(&["answer[Priestley]"]));
        assert_eq!((r[0].outcome.reward, r[0].outcome.feedback), (0.0, -1));
        let (_, r) = play(
            &env,
            task,
            0,
            true,
            script(&["answer[The Henry Cavendish]"]),
        );
        assert_eq!((r[0].outcome.reward, r[0].outcome.success), (1.0, true));
    }
}

#[test]
fn tools_off_offers_nothing_and_refuses_searches() {
    let env = env();
    let task = task_of(&env, "what is the atomic number of iron");
    let mut ep = env.start(task, 0, &super::variant(false)).unwrap();
    let first = ep.observation();
    assert!(first.tools.is_empty());
    assert_eq!(
        first.text,
        "Answer the question about the chemical elements. Reply with answer[text].\n\
         Question: what is the atomic number of iron\nTurns left: 6."
    );
    assert_eq!(ep.expert_action().unwrap(), "answer[26]");
    for action in [
        "search[iron atomic number]",
        r#"<tool_call>{"name": "search", "arguments": {"query": "iron"}}</tool_call>"#,
        r#"<tool_call>{"name": "calc"}</tool_call>"#,
        "search[iron",
    ] {
        let out = ep.step(action).unwrap();
        assert_eq!(
            (out.feedback, out.tool_calls, out.done),
            (-1, 0, false),
            "{action}"
        );
        let i = info(&out);
        assert_eq!(i["refused_tool_call"], true, "{action}");
        assert_eq!(i["action"], "refused");
        assert!(i.get("results").is_none(), "not run: {action}");
        assert!(
            !out.observation.text.contains("Symbol: Fe"),
            "not run: {action}"
        );
        assert!(out.observation.tools.is_empty());
        assert!(
            !out.observation.text.to_lowercase().contains("search"),
            "{}",
            out.observation.text
        );
        assert!(out
            .observation
            .text
            .contains("refused: tools are not available here"));
    }
    // Junk is invalid, not refused, and the complaint does not mention searching either.
    let out = ep.step("no idea").unwrap();
    assert_eq!((out.feedback, out.tool_calls), (-1, 0));
    assert!(info(&out).get("refused_tool_call").is_none());
    assert!(!out.observation.text.to_lowercase().contains("search"));
    let out = ep.step("answer[26]").unwrap();
    assert_eq!((out.done, out.success, out.reward), (true, true, 1.0));
    // Tools on, the same text runs.
    let (_, r) = play(&env, task, 0, true, script(&["search[iron atomic number]"]));
    assert_eq!((r[0].outcome.feedback, r[0].outcome.tool_calls), (1, 1));
}

#[test]
fn invalid_actions_and_the_turn_limit() {
    let env = env_with(r#"{"max_turns": 3}"#);
    let (_, r) = play(
        &env,
        train(0),
        0,
        true,
        script(&["hello", "answer[]", "search[iron"]),
    );
    let fb: Vec<(i8, u32, bool)> = r
        .iter()
        .map(|x| (x.outcome.feedback, x.outcome.tool_calls, x.outcome.done))
        .collect();
    assert_eq!(fb, [(-1, 0, false), (-1, 0, false), (-1, 0, true)]);
    let last = &r[2].outcome;
    assert_eq!((last.reward, last.success), (0.0, false));
    assert_eq!(info(last)["turn_limit"], true);
    assert!(r[0]
        .outcome
        .observation
        .text
        .contains("Turn 1: invalid: no action found; reply with search[query] or answer[text]"));
    assert!(r[1]
        .outcome
        .observation
        .text
        .contains("Turn 2: invalid: `answer[]` is empty"));
}

/// With a small budget the oldest turns go first, so the evidence of the first search is lost
/// once later searches fill the budget; without one it stays.
#[test]
fn the_context_budget_drops_the_oldest_evidence() {
    let actions = [
        "search[hydrogen discovered]",
        "search[gold]",
        "search[silver]",
        "search[copper]",
    ];
    let budget = 160;
    let small = env_with(&format!(r#"{{"context_budget": {budget}}}"#));
    let full = env();
    let task = task_of(&full, "who discovered hydrogen");
    let (_, tight) = play(&small, task, 0, true, script(&actions));
    let (_, open) = play(&full, task, 0, true, script(&actions));
    for (t, o) in tight.iter().zip(&open) {
        assert!(
            words(&t.outcome.observation.text) <= budget,
            "{}",
            t.outcome.observation.text
        );
        assert!(o.outcome.observation.text.contains("Henry Cavendish") || o.outcome.done);
    }
    assert!(tight[0]
        .outcome
        .observation
        .text
        .contains("Henry Cavendish"));
    let dropped: Vec<u64> = tight
        .iter()
        .take(4)
        .map(|r| info(&r.outcome)["history_dropped"].as_u64().unwrap())
        .collect();
    assert_eq!(dropped, [0, 1, 2, 3]);
    let late = &tight[3].outcome.observation.text;
    assert!(!late.contains("Henry Cavendish"), "{late}");
    assert!(late.contains("(3 earlier turns not shown)"), "{late}");
    assert!(late.contains("Question: who discovered hydrogen"));
    assert!(late.contains("Latest results, turn 4: search[copper]"));
    assert!(open[3].outcome.observation.text.contains("Henry Cavendish"));
    assert_eq!(info(&open[3].outcome)["history_dropped"], 0);
    // The budget cuts the latest results too, from their end, when even they do not fit.
    let tiny = env_with(r#"{"context_budget": 48}"#);
    let (_, r) = play(
        &tiny,
        task,
        0,
        true,
        script(&["search[hydrogen discovered]"]),
    );
    let text = &r[0].outcome.observation.text;
    assert!(words(text) <= 48, "{text}");
    assert!(text.contains("Latest results, turn 1"), "{text}");
}

/// `history = false` shows only what the last action produced: no earlier search, with or
/// without a budget, and a refused or invalid last action still reported.
#[test]
fn without_history_only_the_last_turn_is_shown() {
    let bare = env_with(r#"{"history": false}"#);
    let full = env();
    let task = task_of(&full, "who discovered hydrogen");
    let actions = ["search[hydrogen discovered]", "search[gold]", "nonsense"];
    let (_, r) = play(&bare, task, 0, true, script(&actions));
    let (_, open) = play(&full, task, 0, true, script(&actions));
    let first = &r[0].outcome.observation.text;
    assert!(
        first.contains("Latest results, turn 1: search[hydrogen discovered]"),
        "{first}"
    );
    assert!(first.contains("Henry Cavendish"), "{first}");
    assert_eq!(first, &open[0].outcome.observation.text);
    let second = &r[1].outcome.observation.text;
    assert!(
        second.contains("Latest results, turn 2: search[gold]"),
        "{second}"
    );
    assert!(!second.contains("hydrogen discovered"), "{second}");
    assert!(!second.contains("Henry Cavendish"), "{second}");
    assert!(open[1].outcome.observation.text.contains("Henry Cavendish"));
    let third = &r[2].outcome.observation.text;
    assert!(third.contains("Turn 3: invalid"), "{third}");
    assert!(!third.contains("search[gold]"), "{third}");
    assert!(
        third.contains("Question: who discovered hydrogen"),
        "{third}"
    );
    assert_eq!(info(&r[2].outcome)["history_dropped"], 0);
}
