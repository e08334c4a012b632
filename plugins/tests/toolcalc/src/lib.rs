//! `cairn-toolcalc`: a tiny tool-using environment, exported as a Cairn environment plugin. It
//! exists to test the tool path end to end (tool schemas in the prompt, tools-off slots,
//! refused tool calls); it is a test fixture like `faulty`, not a benchmark.
//!
//! # Tasks
//!
//! Task `(split, index)` asks for `a op b` with integers `a` in 100..1000, `b` in 10..100 and
//! `op` one of `+ - *` (by index), e.g. `Compute 123 * 45. Reply with answer: <number>.`. The
//! two splits draw from disjoint index ranges.
//!
//! # Tools
//!
//! A slot with tools on ([`ContextVariant::tools_enabled`]) is offered one tool, `calc`
//! ([`calc_schema`]), in [`Observation::tools`]; the kernel renders it through the chat
//! template. A tool call is a `<tool_call>{"name": "calc", "arguments": {"expression":
//! "123 * 45"}}</tool_call>` block (Qwen/Hermes style); its result is appended to the next
//! observation (`calc(123 * 45) = 5535`). A slot started with tools off is offered no tool, its
//! observation never mentions one, and a tool call is **refused**: not executed, feedback −1,
//! `tool_calls` 0, `info.refused_tool_call = true`.
//!
//! # Rewards and feedback
//!
//! `answer: N` ends the episode: reward 1 and feedback +1 when `N` is right, reward 0 and
//! feedback −1 otherwise. A tool call that runs gives feedback +1 and `tool_calls` 1; anything
//! unparseable gives feedback −1. No anchor keys. The expert calls `calc` once when it may, then
//! answers.

use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, Observation, PluginError, Result, Split,
    StepOutcome, TaskInfo, TaskRef,
};
use serde::Deserialize;
use serde_json::{json, Value as Json};

/// The environment's config (`[environment] config = {...}`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub train_tasks: u64,
    pub test_tasks: u64,
    /// Turn limit of an episode.
    pub max_turns: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            train_tasks: 64,
            test_tasks: 16,
            max_turns: 4,
        }
    }
}

/// The arithmetic environment.
#[derive(Clone, Debug, Default)]
pub struct ToolCalc {
    config: Config,
}

/// Test-split tasks start at this index, so the splits never share a task.
const TEST_OFFSET: u64 = 1 << 20;

impl ToolCalc {
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: Config = if json.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(json).map_err(|e| PluginError::config(e.to_string()))?
        };
        PluginError::check_config(
            config.train_tasks > 0 && config.test_tasks > 0,
            "`train_tasks` and `test_tasks` must be at least 1",
        )?;
        PluginError::check_config(config.max_turns >= 2, "`max_turns` must be at least 2")?;
        Ok(ToolCalc { config })
    }

    fn problem(&self, task: TaskRef) -> Result<Problem> {
        let (count, offset) = match task.split {
            Split::Train => (self.config.train_tasks, 0),
            Split::Test => (self.config.test_tasks, TEST_OFFSET),
        };
        if task.index >= count {
            return Err(PluginError::input(format!(
                "task index {} out of range: the {} split has {count} tasks",
                task.index,
                task.split.as_str()
            )));
        }
        let i = task.index + offset;
        Ok(Problem {
            a: 100 + (i.wrapping_mul(7919) % 900) as i64,
            b: 10 + (i.wrapping_mul(104_729) % 90) as i64,
            op: ['+', '-', '*'][(i % 3) as usize],
            id: format!("calc-{}-{:04}", task.split.as_str(), task.index),
        })
    }
}

/// One task: `a op b`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Problem {
    a: i64,
    b: i64,
    op: char,
    id: String,
}

impl Problem {
    fn expression(&self) -> String {
        format!("{} {} {}", self.a, self.op, self.b)
    }

    fn answer(&self) -> i64 {
        evaluate(&self.expression()).expect("task expressions are valid")
    }
}

/// The `calc` tool's OpenAI-style function schema.
pub fn calc_schema() -> Json {
    json!({
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate `a op b` for integers a and b, op one of + - * /.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "For example \"12 * 34\"."}
                },
                "required": ["expression"]
            }
        }
    })
}

/// `a op b` with integers and one of `+ - * /` (exact division only).
pub fn evaluate(expression: &str) -> std::result::Result<i64, String> {
    let parts: Vec<&str> = expression.split_whitespace().collect();
    let [a, op, b] = parts[..] else {
        return Err(format!("expected `a op b`, got `{expression}`"));
    };
    let number = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| format!("`{s}` is not an integer"))
    };
    let (a, b) = (number(a)?, number(b)?);
    let value = match op {
        "+" => a.checked_add(b),
        "-" => a.checked_sub(b),
        "*" => a.checked_mul(b),
        "/" if b != 0 && a % b == 0 => a.checked_div(b),
        "/" => return Err(format!("{a} / {b} is not an exact integer division")),
        _ => return Err(format!("unknown operator `{op}`; use + - * /")),
    };
    value.ok_or_else(|| format!("`{expression}` overflows"))
}

/// What an action asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// A `<tool_call>` block: the tool's name and its `expression` argument (if any).
    ToolCall {
        name: String,
        expression: Option<String>,
    },
    Answer(i64),
    Invalid,
}

/// Reads the policy's text: a `<tool_call>` block anywhere, else `answer: N` (or a bare
/// integer).
pub fn parse_action(text: &str) -> Action {
    if let Some(start) = text.find("<tool_call>") {
        let body = &text[start + "<tool_call>".len()..];
        let body = body.split("</tool_call>").next().unwrap_or(body).trim();
        let Ok(call) = serde_json::from_str::<Json>(body) else {
            return Action::ToolCall {
                name: String::new(),
                expression: None,
            };
        };
        let name = call["name"].as_str().unwrap_or_default().to_string();
        // OpenAI clients send `arguments` as a JSON string; Qwen templates as an object.
        let arguments = match &call["arguments"] {
            Json::String(s) => serde_json::from_str(s).unwrap_or(Json::Null),
            other => other.clone(),
        };
        let expression = arguments["expression"].as_str().map(str::to_string);
        return Action::ToolCall { name, expression };
    }
    let text = text.trim();
    let value = text
        .strip_prefix("answer:")
        .or_else(|| text.strip_prefix("Answer:"))
        .unwrap_or(text)
        .trim();
    value.parse().map_or(Action::Invalid, Action::Answer)
}

impl Environment for ToolCalc {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: self.config.train_tasks,
            test_tasks: self.config.test_tasks,
            max_turns: self.config.max_turns,
            anchor_keys: false,
            step_rewards: true,
            feedback: true,
            tools: true,
            task_kinds: vec!["arithmetic".into()],
        }
    }

    fn task(&self, task: TaskRef) -> Result<TaskInfo> {
        let p = self.problem(task)?;
        Ok(TaskInfo {
            goal: format!("compute {}", p.expression()),
            id: p.id,
            kind: "arithmetic".into(),
        })
    }

    fn start(
        &self,
        task: TaskRef,
        _seed: u64,
        variant: &ContextVariant,
    ) -> Result<Box<dyn Episode>> {
        Ok(Box::new(CalcEpisode {
            problem: self.problem(task)?,
            tools: variant.tools_enabled,
            log: Vec::new(),
            done: false,
        }))
    }
}

/// A running episode.
#[derive(Clone, Debug)]
pub struct CalcEpisode {
    problem: Problem,
    /// Tools on for this slot (from the variant at `start`).
    tools: bool,
    /// Lines appended after the task text: tool results and complaints, in order.
    log: Vec<String>,
    done: bool,
}

impl CalcEpisode {
    fn called_calc(&self) -> bool {
        self.log.iter().any(|l| l.starts_with("calc("))
    }
}

impl Episode for CalcEpisode {
    fn observation(&self) -> Observation {
        let mut text = format!(
            "Compute {}. Reply with answer: <number>.",
            self.problem.expression()
        );
        for line in &self.log {
            text.push('\n');
            text.push_str(line);
        }
        Observation {
            text,
            anchor: None,
            admissible_actions: Vec::new(),
            tools: if self.tools {
                vec![calc_schema()]
            } else {
                Vec::new()
            },
        }
    }

    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        if self.done {
            return Err(PluginError::input(format!(
                "task {}: step after the episode ended",
                self.problem.id
            )));
        }
        let mut outcome = StepOutcome {
            info_json: "{}".into(),
            ..Default::default()
        };
        match parse_action(action) {
            Action::ToolCall { .. } if !self.tools => {
                // Tools are off for this slot: refuse, never execute.
                self.log
                    .push("Tools are not available here; reply with answer: <number>.".into());
                outcome.feedback = -1;
                outcome.info_json = json!({"refused_tool_call": true}).to_string();
            }
            Action::ToolCall { name, expression } => {
                outcome.tool_calls = 1;
                let result = match (name.as_str(), expression) {
                    ("calc", Some(e)) => evaluate(&e).map(|v| format!("calc({e}) = {v}")),
                    ("calc", None) => Err("calc needs an `expression` argument".into()),
                    (other, _) => Err(format!("unknown tool `{other}`; the tool is `calc`")),
                };
                match result {
                    Ok(line) => {
                        self.log.push(line);
                        outcome.feedback = 1;
                    }
                    Err(e) => {
                        self.log.push(format!("calc error: {e}"));
                        outcome.feedback = -1;
                    }
                }
            }
            Action::Answer(n) => {
                self.done = true;
                outcome.done = true;
                outcome.success = n == self.problem.answer();
                outcome.reward = if outcome.success { 1.0 } else { 0.0 };
                outcome.feedback = if outcome.success { 1 } else { -1 };
            }
            Action::Invalid => {
                self.log
                    .push("Unrecognised action; reply with answer: <number>.".into());
                outcome.feedback = -1;
            }
        }
        outcome.observation = self.observation();
        Ok(outcome)
    }

    fn expert_action(&self) -> Option<String> {
        if self.done {
            None
        } else if self.tools && !self.called_calc() {
            // Spaced like the Qwen and Hermes templates print tool calls.
            Some(format!(
                r#"<tool_call>{{"name": "calc", "arguments": {{"expression": "{}"}}}}</tool_call>"#,
                self.problem.expression()
            ))
        } else {
            Some(format!("answer: {}", self.problem.answer()))
        }
    }
}

cairn_plugin_sdk::export_environment! {
    name: "toolcalc",
    description: "integer arithmetic with an optional `calc` tool (test fixture for tool schemas and tools-off slots)",
    create: ToolCalc::from_config_json,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> ToolCalc {
        ToolCalc::from_config_json("{}").unwrap()
    }

    fn train(index: u64) -> TaskRef {
        TaskRef {
            split: Split::Train,
            index,
        }
    }

    fn variant(tools_enabled: bool) -> ContextVariant {
        ContextVariant {
            label: if tools_enabled { "plain" } else { "tools-off" }.into(),
            tools_enabled,
            ..Default::default()
        }
    }

    const CALL: &str =
        r#"<tool_call>{"name": "calc", "arguments": {"expression": "100 + 10"}}</tool_call>"#;

    #[test]
    fn tasks_are_fixed_by_split_and_index() {
        let e = env();
        let t = e.task(train(0)).unwrap();
        assert_eq!(
            (t.id.as_str(), t.goal.as_str(), t.kind.as_str()),
            ("calc-train-0000", "compute 100 + 10", "arithmetic")
        );
        assert_eq!(e.task(train(1)).unwrap().goal, "compute 819 - 69");
        let test = e
            .task(TaskRef {
                split: Split::Test,
                index: 0,
            })
            .unwrap();
        assert_eq!(test.id, "calc-test-0000");
        let err = e.task(train(64)).unwrap_err().to_string();
        assert!(
            err.contains("task index 64 out of range: the train split has 64 tasks"),
            "{err}"
        );
        let info = e.info();
        assert!(info.tools && info.feedback && !info.anchor_keys);
    }

    #[test]
    fn tools_on_offers_the_schema_and_runs_calls() {
        let mut ep = env().start(train(0), 0, &variant(true)).unwrap();
        let first = ep.observation();
        assert_eq!(first.tools, vec![calc_schema()]);
        assert_eq!(first.text, "Compute 100 + 10. Reply with answer: <number>.");
        assert_eq!(ep.expert_action().unwrap(), CALL);
        let out = ep.step(CALL).unwrap();
        assert_eq!((out.feedback, out.tool_calls, out.done), (1, 1, false));
        assert_eq!(
            out.observation.text,
            "Compute 100 + 10. Reply with answer: <number>.\ncalc(100 + 10) = 110"
        );
        assert_eq!(ep.expert_action().unwrap(), "answer: 110");
        let out = ep.step("answer: 110").unwrap();
        assert_eq!(
            (out.done, out.success, out.reward, out.feedback),
            (true, true, 1.0, 1)
        );
        assert!(ep.step("answer: 110").is_err());
    }

    #[test]
    fn tools_off_offers_nothing_and_refuses_calls() {
        let mut ep = env().start(train(0), 0, &variant(false)).unwrap();
        let first = ep.observation();
        assert!(first.tools.is_empty());
        assert!(!first.text.contains("calc"), "{}", first.text);
        assert_eq!(ep.expert_action().unwrap(), "answer: 110");
        let out = ep.step(CALL).unwrap();
        assert_eq!((out.feedback, out.tool_calls, out.done), (-1, 0, false));
        assert_eq!(out.info_json, r#"{"refused_tool_call":true}"#);
        assert!(!out.observation.text.contains("= 110"), "not executed");
        assert!(out.observation.tools.is_empty());
        let out = ep.step("answer: 111").unwrap();
        assert_eq!(
            (out.done, out.success, out.reward, out.feedback),
            (true, false, 0.0, -1)
        );
    }

    #[test]
    fn actions_and_expressions_parse() {
        assert_eq!(parse_action(" answer: -7 "), Action::Answer(-7));
        assert_eq!(parse_action("42"), Action::Answer(42));
        assert_eq!(parse_action("go north"), Action::Invalid);
        // OpenAI clients send `arguments` as a JSON string.
        assert_eq!(
            parse_action(
                r#"<tool_call>{"name": "calc", "arguments": "{\"expression\": \"6 / 3\"}"}"#
            ),
            Action::ToolCall {
                name: "calc".into(),
                expression: Some("6 / 3".into())
            }
        );
        assert_eq!(evaluate("6 / 3"), Ok(2));
        assert_eq!(evaluate("7 * -3"), Ok(-21));
        assert!(evaluate("7 / 2").unwrap_err().contains("not an exact"));
        assert!(evaluate("1 + x")
            .unwrap_err()
            .contains("`x` is not an integer"));
        let mut ep = env().start(train(0), 0, &variant(true)).unwrap();
        let out = ep
            .step(r#"<tool_call>{"name": "search", "arguments": {}}</tool_call>"#)
            .unwrap();
        assert_eq!((out.feedback, out.tool_calls), (-1, 1));
        assert!(out
            .observation
            .text
            .ends_with("calc error: unknown tool `search`; the tool is `calc`"));
    }

    #[test]
    fn config_keys_are_checked() {
        let e = ToolCalc::from_config_json(r#"{"max_turn": 3}"#)
            .err()
            .unwrap();
        assert!(e.to_string().contains("unknown field `max_turn`"), "{e}");
        let e = ToolCalc::from_config_json(r#"{"max_turns": 1}"#)
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("`max_turns` must be at least 2"),
            "{e}"
        );
    }
}
