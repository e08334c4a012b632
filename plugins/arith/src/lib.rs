//! `cairn-arith`: integer arithmetic answered with a number, exported as a Cairn environment
//! plugin. It is the short verifiable task for training a *pretrained* chat model (SmolLM2-135M,
//! `examples/smollm2-*.toml`): the base model already solves some tasks, so GRPO has a signal
//! from the first step, and a wrong answer earns feedback and another try.
//!
//! # Tasks
//!
//! A task is `a op b` with integers `a`, `b` in `min_operand..=max_operand` and `op` one of
//! the configured `ops` (`+`, `-`, `*`; a subtraction always has `a ≥ b`, so answers are never
//! negative). Every such problem is enumerated once; a fixed hash of its text (`"7 + 8"`)
//! puts one problem in `test_share` into the held-out split and the rest into the training
//! split, so the splits are disjoint by construction, whatever the order or the config. Each
//! split is listed in an order fixed by a second hash (so the first N held-out tasks, which
//! `[eval] tasks = N` evaluates, are a spread of the whole split rather than the smallest
//! operands). `train_tasks` and `test_tasks` are the sizes of the two lists; no task repeats.
//!
//! # Turns
//!
//! The first observation is the question:
//!
//! ```text
//! What is 7 + 8? Answer with only the number.
//! ```
//!
//! The answer is the **last number** in the action text (digits with an optional leading
//! minus sign; a comma between digits, as in `1,234`, is skipped; a number with a fractional
//! part, as in `4.5`, is a wrong answer), see [`parse_reply`]. Under the kernel's chat
//! format the action is the first line of the response, so `15`, `15.` and `7 + 8 = 15` all
//! answer 15, while a reply that rambles past `rollout.max_new_tokens` usually ends without
//! the number. A right answer ends the episode: reward 1, `success`, feedback +1. A wrong
//! answer, or a reply with no integer, costs the turn (reward 0, feedback −1); if turns are
//! left, the next observation repeats the question and lists every earlier attempt, for
//! example
//!
//! ```text
//! What is 7 + 8? Answer with only the number.
//! You answered 14. That is wrong. Try again.
//! ```
//!
//! (each turn is a fresh conversation under the kernel's chat format, so the observation
//! carries the history). After `max_turns` turns an unsolved episode ends, not `success`.
//! `info_json` holds `{"turn", "answer", "correct"}` (`answer` is `null` when the reply had
//! no integer, or its last number was too long or not whole). No anchor keys, no tools. The expert answers right at once.
//!
//! # Config
//!
//! `{"ops": ["+", "-"], "min_operand": 0, "max_operand": 20, "max_turns": 2, "test_share": 4}`
//! are the defaults (see [`ArithConfig`]): 672 problems, 498 for training and 174 held out.
//! Unknown keys are a config error naming the key.

use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, Observation, PluginError, Result, Split,
    StepOutcome, TaskInfo, TaskRef,
};
use serde::Deserialize;

/// Largest number of problems a config may enumerate (both splits together), to keep the
/// task lists small in memory (16 bytes a problem).
pub const MAX_PROBLEMS: u64 = 4_000_000;
/// Largest operand a config may ask for (products stay far from `i64` overflow).
pub const MAX_OPERAND: u32 = 1_000_000;
/// Most turns an episode may have.
pub const MAX_TURNS: u32 = 16;

/// Salt of the hash that assigns a problem to a split.
const SPLIT_SALT: u64 = 0x6172_6974_682d_7370; // "arith-sp"
/// Salt of the hash that orders each split.
const ORDER_SALT: u64 = 0x6172_6974_682d_6f72; // "arith-or"

/// The environment's config (`[environment] config = {...}`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArithConfig {
    /// Operators the tasks use, any of `"+"`, `"-"`, `"*"`, each at most once.
    pub ops: Vec<String>,
    /// Smallest operand.
    pub min_operand: u32,
    /// Largest operand (at most [`MAX_OPERAND`]).
    pub max_operand: u32,
    /// Turns an episode may take: 1 is a single answer, more give retries after feedback
    /// (1 to [`MAX_TURNS`]).
    pub max_turns: u32,
    /// One problem in this many is held out (at least 2).
    pub test_share: u32,
}

impl Default for ArithConfig {
    fn default() -> Self {
        ArithConfig {
            ops: vec!["+".into(), "-".into()],
            min_operand: 0,
            max_operand: 20,
            max_turns: 2,
            test_share: 4,
        }
    }
}

/// An arithmetic operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
}

impl Op {
    fn parse(text: &str) -> Result<Op> {
        match text {
            "+" => Ok(Op::Add),
            "-" => Ok(Op::Sub),
            "*" => Ok(Op::Mul),
            other => Err(PluginError::config(format!(
                "`ops`: unknown operator `{other}`; use \"+\", \"-\" or \"*\""
            ))),
        }
    }

    /// The symbol in the question.
    pub fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
            Op::Mul => '*',
        }
    }

    /// The task kind (`TaskInfo::kind`).
    pub fn kind(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
        }
    }
}

/// One problem: `a op b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub a: u32,
    pub op: Op,
    pub b: u32,
}

impl Problem {
    /// `"7 + 8"`: the problem's text, which also decides its split.
    pub fn expression(&self) -> String {
        format!("{} {} {}", self.a, self.op.symbol(), self.b)
    }

    pub fn answer(&self) -> i64 {
        let (a, b) = (i64::from(self.a), i64::from(self.b));
        match self.op {
            Op::Add => a + b,
            Op::Sub => a - b,
            Op::Mul => a * b,
        }
    }

    /// The first observation.
    pub fn question(&self) -> String {
        format!(
            "What is {}? Answer with only the number.",
            self.expression()
        )
    }
}

/// The split a problem belongs to: a fixed hash of its text decides.
pub fn split_of(problem: &Problem, test_share: u32) -> Split {
    if mix(fnv1a(&problem.expression()) ^ SPLIT_SALT).is_multiple_of(u64::from(test_share)) {
        Split::Test
    } else {
        Split::Train
    }
}

/// What a reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The last integer of the text.
    Number(i64),
    /// The last integer has too many digits for an `i64` (a wrong answer).
    TooLong,
    /// The last number has a fractional part, as in `4.5` or `4.0` (a wrong answer).
    Decimal,
    /// The text holds no integer.
    Missing,
}

/// Reads a reply: its last number (digits with an optional `-` directly before them, unless
/// the `-` follows a digit or letter, as in `7-3`; a `,` between two digits is skipped; a `.`
/// between two digits starts a fractional part, which makes it a [`Reply::Decimal`], while a
/// `.` that ends a sentence, as in `15.`, is not part of the number).
pub fn parse_reply(text: &str) -> Reply {
    let chars: Vec<char> = text.chars().collect();
    let mut last = Reply::Missing;
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let negative = i > 0 && chars[i - 1] == '-' && (i < 2 || !chars[i - 2].is_alphanumeric());
        let mut value: Option<i64> = Some(0);
        while i < chars.len() {
            let c = chars[i];
            if let Some(d) = c.to_digit(10) {
                value = value
                    .and_then(|v| v.checked_mul(10))
                    .and_then(|v| v.checked_add(i64::from(d)));
                i += 1;
            } else if c == ','
                && i + 1 < chars.len()
                && chars[i + 1].is_ascii_digit()
                && chars[i - 1].is_ascii_digit()
            {
                i += 1;
            } else {
                break;
            }
        }
        if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            last = Reply::Decimal;
            continue;
        }
        last = match value {
            Some(v) if negative => Reply::Number(-v),
            Some(v) => Reply::Number(v),
            None => Reply::TooLong,
        };
    }
    last
}

/// The arithmetic environment: the two task lists, built once from the config.
#[derive(Clone, Debug)]
pub struct Arith {
    config: ArithConfig,
    train: Vec<Problem>,
    test: Vec<Problem>,
}

impl Arith {
    /// Builds the environment. Errors: an unknown or repeated operator, an empty or too large
    /// operand range, `max_turns` or `test_share` out of range, or a split left empty.
    pub fn new(config: ArithConfig) -> Result<Arith> {
        PluginError::check_config(
            !config.ops.is_empty(),
            "`ops` must name at least one operator",
        )?;
        let mut ops = Vec::new();
        for text in &config.ops {
            let op = Op::parse(text)?;
            PluginError::check_config(
                !ops.contains(&op),
                format!("`ops`: operator `{text}` is listed twice"),
            )?;
            ops.push(op);
        }
        PluginError::check_config(
            config.min_operand <= config.max_operand,
            format!(
                "`min_operand` ({}) must not exceed `max_operand` ({})",
                config.min_operand, config.max_operand
            ),
        )?;
        PluginError::check_config(
            config.max_operand <= MAX_OPERAND,
            format!("`max_operand` must be at most {MAX_OPERAND}"),
        )?;
        PluginError::check_config(
            (1..=MAX_TURNS).contains(&config.max_turns),
            format!("`max_turns` must be 1 to {MAX_TURNS}"),
        )?;
        PluginError::check_config(config.test_share >= 2, "`test_share` must be at least 2")?;
        let width = u64::from(config.max_operand - config.min_operand) + 1;
        let count = width * width * ops.len() as u64;
        PluginError::check_config(
            count <= MAX_PROBLEMS,
            format!(
                "{count} problems is more than {MAX_PROBLEMS}; narrow `min_operand`..`max_operand`"
            ),
        )?;

        let mut train = Vec::new();
        let mut test = Vec::new();
        for &op in &ops {
            for a in config.min_operand..=config.max_operand {
                for b in config.min_operand..=config.max_operand {
                    if op == Op::Sub && a < b {
                        continue;
                    }
                    let p = Problem { a, op, b };
                    match split_of(&p, config.test_share) {
                        Split::Train => train.push(p),
                        Split::Test => test.push(p),
                    }
                }
            }
        }
        for (name, list) in [("training", &train), ("held-out", &test)] {
            PluginError::check_config(
                !list.is_empty(),
                format!(
                    "the {name} split is empty: widen `min_operand`..`max_operand` or change \
                     `test_share`"
                ),
            )?;
        }
        let order = |p: &Problem| (mix(fnv1a(&p.expression()) ^ ORDER_SALT), p.expression());
        train.sort_by_cached_key(order);
        test.sort_by_cached_key(order);
        Ok(Arith {
            config,
            train,
            test,
        })
    }

    /// The plugin's create function: parses the JSON config (empty: the defaults).
    pub fn from_config_json(text: &str) -> Result<Arith> {
        let config = if text.trim().is_empty() {
            ArithConfig::default()
        } else {
            serde_json::from_str(text).map_err(|e| PluginError::config(e.to_string()))?
        };
        Arith::new(config)
    }

    pub fn config(&self) -> &ArithConfig {
        &self.config
    }

    /// The problem of a task. Errors: the index is out of range.
    pub fn problem(&self, task: TaskRef) -> Result<Problem> {
        let list = match task.split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        };
        usize::try_from(task.index)
            .ok()
            .and_then(|i| list.get(i))
            .copied()
            .ok_or_else(|| {
                PluginError::input(format!(
                    "arith has {} {} tasks, no task {}",
                    list.len(),
                    task.split.as_str(),
                    task.index
                ))
            })
    }

    /// Starts an episode, as the concrete type.
    pub fn episode(&self, task: TaskRef) -> Result<ArithEpisode> {
        Ok(ArithEpisode {
            problem: self.problem(task)?,
            max_turns: self.config.max_turns,
            attempts: Vec::new(),
            solved: false,
            done: false,
        })
    }
}

impl Environment for Arith {
    fn info(&self) -> EnvironmentInfo {
        let mut kinds: Vec<String> = Vec::new();
        for text in &self.config.ops {
            let kind = Op::parse(text).expect("validated at construction").kind();
            kinds.push(kind.to_string());
        }
        EnvironmentInfo {
            train_tasks: self.train.len() as u64,
            test_tasks: self.test.len() as u64,
            max_turns: self.config.max_turns,
            anchor_keys: false,
            step_rewards: true,
            feedback: true,
            tools: false,
            task_kinds: kinds,
        }
    }

    fn task(&self, task: TaskRef) -> Result<TaskInfo> {
        let p = self.problem(task)?;
        Ok(TaskInfo {
            id: format!("arith/{}/{}", task.split.as_str(), task.index),
            kind: p.op.kind().to_string(),
            goal: format!("compute {}", p.expression()),
        })
    }

    /// The episode does not depend on `seed`; the variant's injected text is the kernel's to
    /// show.
    fn start(
        &self,
        task: TaskRef,
        _seed: u64,
        _variant: &ContextVariant,
    ) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.episode(task)?))
    }
}

/// A running episode.
#[derive(Clone, Debug)]
pub struct ArithEpisode {
    problem: Problem,
    max_turns: u32,
    /// What each earlier (wrong) turn answered.
    attempts: Vec<Reply>,
    solved: bool,
    done: bool,
}

impl ArithEpisode {
    pub fn problem(&self) -> Problem {
        self.problem
    }

    /// Turns taken so far.
    pub fn turn(&self) -> u32 {
        self.attempts.len() as u32 + u32::from(self.solved)
    }

    pub fn is_done(&self) -> bool {
        self.done
    }
}

impl Episode for ArithEpisode {
    fn observation(&self) -> Observation {
        let mut text = self.problem.question();
        for reply in &self.attempts {
            text.push('\n');
            text.push_str(&match reply {
                Reply::Number(n) => format!("You answered {n}. That is wrong. Try again."),
                Reply::TooLong => "Your number is far too long. That is wrong. Try again.".into(),
                Reply::Decimal => {
                    "Your answer is not a whole number. That is wrong. Try again.".into()
                }
                Reply::Missing => "Your reply has no number. Answer with only the number.".into(),
            });
        }
        Observation {
            text,
            anchor: None,
            admissible_actions: Vec::new(),
            tools: Vec::new(),
        }
    }

    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        if self.done {
            return Err(PluginError::input(format!(
                "the arith episode `{}` is over; start a new one",
                self.problem.expression()
            )));
        }
        let reply = parse_reply(action);
        let correct = reply == Reply::Number(self.problem.answer());
        let turn = self.attempts.len() as u32 + 1;
        if correct {
            self.solved = true;
            self.done = true;
        } else {
            self.attempts.push(reply);
            self.done = turn >= self.max_turns;
        }
        let answer = match reply {
            Reply::Number(n) => serde_json::json!(n),
            Reply::TooLong | Reply::Decimal | Reply::Missing => serde_json::Value::Null,
        };
        Ok(StepOutcome {
            observation: self.observation(),
            reward: if correct { 1.0 } else { 0.0 },
            done: self.done,
            success: correct,
            feedback: if correct { 1 } else { -1 },
            tool_calls: 0,
            info_json: serde_json::json!({"turn": turn, "answer": answer, "correct": correct})
                .to_string(),
        })
    }

    fn expert_action(&self) -> Option<String> {
        (!self.done).then(|| self.problem.answer().to_string())
    }
}

/// FNV-1a, 64 bit: a stable hash of a problem's text (fixed by its published constants, so a
/// problem's split never changes with a crate version).
fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// SplitMix64's output mixer (Steele, Lea and Flood, 2014).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

cairn_plugin_sdk::export_environment! {
    name: "arith",
    description: "integer arithmetic answered with a number, retries after feedback (a short verifiable task for pretrained chat models)",
    create: Arith::from_config_json,
}
