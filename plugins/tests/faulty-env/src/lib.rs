//! `faulty-env`: an environment plugin that misbehaves on purpose, so tests (and users checking
//! their deployment) can see that an environment panic, error or hang fails that episode only,
//! and training goes on.
//!
//! The tasks are trivial and deterministic: task `k` asks, at turn `t`, for the word
//! `WORDS[(k + t) % 8]`; saying it earns reward 1, anything else 0; an episode lasts `turns`
//! turns and succeeds when every answer was right. The expert says the word.
//!
//! Config (every key optional):
//! ```json
//! {"train_tasks": 3, "test_tasks": 4, "turns": 2,
//!  "faults": [{"task": 1, "call": "step", "turn": 0, "how": "panic", "times": 1}]}
//! ```
//! A fault fires on task `task` of `split` (`"train"`, the default, or `"test"`: the held-out
//! tasks) in `call` (`start`, the
//! first `observation`, or `step` at turn `turn`), the way `how` says: `panic`, `error`, or
//! `hang` (sleep `hang_ms` milliseconds, default 30 000, then go on). `times` limits how often
//! it fires over the plugin's life (0, the default: every time), so one slot of a group can
//! fail while the others play. `observation` has no error return: an `error` there panics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, Observation, PluginError, Result, Split,
    StepOutcome, TaskInfo, TaskRef,
};
use serde::Deserialize;

const WORDS: [&str; 8] = [
    "apple", "brick", "cloud", "drum", "eagle", "flute", "grape", "house",
];

/// Which call fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Start,
    Observation,
    Step,
}

/// How it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    Panic,
    Error,
    Hang,
}

/// One injected fault.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The task index, in `split`.
    pub task: u64,
    /// `"train"` (the default) or `"test"` (the held-out tasks).
    #[serde(default)]
    pub split: FaultSplit,
    pub call: Call,
    /// The turn, for `step` (0-based).
    #[serde(default)]
    pub turn: u32,
    pub how: How,
    /// Length of a hang, milliseconds.
    #[serde(default = "default_hang_ms")]
    pub hang_ms: u64,
    /// Fire at most this many times (0: every time).
    #[serde(default)]
    pub times: u64,
}

/// The split a fault's task index is in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultSplit {
    #[default]
    Train,
    Test,
}

fn default_hang_ms() -> u64 {
    30_000
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultyEnvConfig {
    pub train_tasks: u64,
    pub test_tasks: u64,
    /// Turns per episode.
    pub turns: u32,
    pub faults: Vec<Fault>,
}

impl Default for FaultyEnvConfig {
    fn default() -> Self {
        FaultyEnvConfig {
            train_tasks: 3,
            test_tasks: 4,
            turns: 2,
            faults: Vec::new(),
        }
    }
}

struct Faults {
    faults: Vec<Fault>,
    /// How often each fault fired.
    fired: Vec<AtomicU64>,
}

impl Faults {
    fn trip(&self, task: TaskRef, call: Call, turn: u32) -> Result<()> {
        for (f, fired) in self.faults.iter().zip(&self.fired) {
            let split = match f.split {
                FaultSplit::Train => Split::Train,
                FaultSplit::Test => Split::Test,
            };
            if split != task.split
                || f.task != task.index
                || f.call != call
                || (call == Call::Step && f.turn != turn)
            {
                continue;
            }
            if f.times > 0 && fired.fetch_add(1, Ordering::SeqCst) >= f.times {
                continue;
            }
            let what = format!("{call:?} of task {} at turn {turn}", task.index);
            match f.how {
                How::Panic => panic!("faulty-env: injected panic in {what}"),
                How::Error => {
                    return Err(PluginError::internal(format!(
                        "faulty-env: injected error in {what}"
                    )))
                }
                How::Hang => std::thread::sleep(std::time::Duration::from_millis(f.hang_ms)),
            }
        }
        Ok(())
    }
}

pub struct FaultyEnv {
    config: FaultyEnvConfig,
    faults: Arc<Faults>,
}

impl FaultyEnv {
    /// Builds the plugin from its JSON config.
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: FaultyEnvConfig = cairn_plugin_sdk::config::parse_config(json)?;
        if config.turns == 0 || config.train_tasks == 0 || config.test_tasks == 0 {
            return Err(PluginError::config(
                "turns, train_tasks and test_tasks must be at least 1",
            ));
        }
        let fired = config.faults.iter().map(|_| AtomicU64::new(0)).collect();
        Ok(FaultyEnv {
            faults: Arc::new(Faults {
                faults: config.faults.clone(),
                fired,
            }),
            config,
        })
    }

    fn check(&self, task: TaskRef) -> Result<()> {
        let n = match task.split {
            Split::Train => self.config.train_tasks,
            Split::Test => self.config.test_tasks,
        };
        if task.index >= n {
            return Err(PluginError::input(format!(
                "{} task {} out of range (0..{n})",
                task.split.as_str(),
                task.index
            )));
        }
        Ok(())
    }
}

/// The word task `k` asks for at turn `t` (held-out tasks are offset past the training ones).
fn word(task: TaskRef, turn: u32) -> &'static str {
    let k = task.index + if task.split == Split::Test { 3 } else { 0 };
    WORDS[((k + u64::from(turn)) % WORDS.len() as u64) as usize]
}

fn id(task: TaskRef) -> String {
    format!("faulty-{}-{}", task.split.as_str(), task.index)
}

impl Environment for FaultyEnv {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: self.config.train_tasks,
            test_tasks: self.config.test_tasks,
            max_turns: self.config.turns,
            task_kinds: vec!["say".into()],
            ..Default::default()
        }
    }

    fn task(&self, task: TaskRef) -> Result<TaskInfo> {
        self.check(task)?;
        Ok(TaskInfo {
            id: id(task),
            kind: "say".into(),
            goal: format!("say the words of task {}", id(task)),
        })
    }

    fn start(&self, task: TaskRef, _seed: u64, _: &ContextVariant) -> Result<Box<dyn Episode>> {
        self.check(task)?;
        self.faults.trip(task, Call::Start, 0)?;
        Ok(Box::new(FaultyEpisode {
            task,
            turn: 0,
            right: 0,
            turns: self.config.turns,
            faults: self.faults.clone(),
        }))
    }
}

struct FaultyEpisode {
    task: TaskRef,
    turn: u32,
    right: u32,
    turns: u32,
    faults: Arc<Faults>,
}

impl FaultyEpisode {
    fn render(&self) -> Observation {
        let w = word(self.task, self.turn);
        Observation {
            text: format!("{}: say {w}", id(self.task)),
            admissible_actions: WORDS.iter().map(|w| w.to_string()).collect(),
            ..Default::default()
        }
    }
}

impl Episode for FaultyEpisode {
    fn observation(&self) -> Observation {
        if self.turn == 0 {
            if let Err(e) = self.faults.trip(self.task, Call::Observation, 0) {
                // `observation` has no error return: an injected error is raised as a panic.
                panic!("{}", e.message);
            }
        }
        self.render()
    }

    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        self.faults.trip(self.task, Call::Step, self.turn)?;
        let right = action.trim() == word(self.task, self.turn);
        self.right += u32::from(right);
        self.turn += 1;
        let done = self.turn >= self.turns;
        Ok(StepOutcome {
            observation: self.render(),
            reward: if right { 1.0 } else { 0.0 },
            done,
            success: done && self.right == self.turns,
            feedback: if right { 1 } else { -1 },
            tool_calls: 0,
            info_json: "{}".into(),
        })
    }

    fn expert_action(&self) -> Option<String> {
        (self.turn < self.turns).then(|| word(self.task, self.turn).to_string())
    }
}

cairn_plugin_sdk::export_environment! {
    name: "faulty-env",
    description: "fault injection: a trivial word task set that panics, errors or hangs on chosen tasks and turns (for tests)",
    create: FaultyEnv::from_config_json,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(index: u64) -> TaskRef {
        TaskRef {
            split: Split::Train,
            index,
        }
    }

    #[test]
    fn the_expert_solves_every_task_and_faults_fire_where_and_as_often_as_configured() {
        let env = FaultyEnv::from_config_json(
            r#"{"faults": [{"task": 1, "call": "step", "turn": 1, "how": "error", "times": 1}]}"#,
        )
        .unwrap();
        for k in 0..3 {
            let mut e = env.start(train(k), 0, &ContextVariant::default()).unwrap();
            let mut last = None;
            while let Some(a) = e.expert_action() {
                match e.step(&a) {
                    Ok(o) => last = Some(o),
                    Err(err) => {
                        assert_eq!(k, 1);
                        assert!(err
                            .message
                            .contains("injected error in Step of task 1 at turn 1"));
                        last = None;
                        break;
                    }
                }
            }
            if k != 1 {
                let o = last.unwrap();
                assert!(o.done && o.success && o.reward == 1.0);
            }
        }
        // `times = 1`: the second episode of task 1 plays through.
        let mut e = env.start(train(1), 0, &ContextVariant::default()).unwrap();
        while let Some(a) = e.expert_action() {
            e.step(&a).unwrap();
        }
        let mut e = env.start(train(0), 0, &ContextVariant::default()).unwrap();
        assert_eq!(e.step("nonsense").unwrap().reward, 0.0);
    }

    #[test]
    fn unknown_keys_and_empty_task_sets_are_refused() {
        assert!(FaultyEnv::from_config_json(r#"{"fault": []}"#).is_err());
        assert!(FaultyEnv::from_config_json(r#"{"turns": 0}"#).is_err());
    }
}
